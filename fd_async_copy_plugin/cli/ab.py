"""``fd-async-copy ab``: the A/B serving check (see ``fd_async_copy_plugin.serving_ab``).

Exit codes: 0 every request bit-identical; 1 at least one divergence (including a request that
failed on one server only); 3 inconclusive (requests failed on both servers, the control run
diverged, or nothing was compared); 4 a server could not be started or is not reachable (checked
before any request is sent); 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import urllib.parse
from pathlib import Path

EXIT_LAUNCH_FAILED = 4
#: ``ab --help``'s summary of the exit codes (the module docstring and docs/gpu-acceptance.md in full)
EXIT_CODES = ("Exit 0: identical; 1: divergent; 2: bad arguments; 3: inconclusive; "
              "4: a server did not start or is not reachable.")


def _widths() -> str:
    """The request set's logprob widths as the help names them: none/0/5/20."""
    from ..serving_ab.request_set import TOP_LOGPROBS

    return "/".join("none" if k is None else str(k) for k in TOP_LOGPROBS)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "ab",
        help="send the same greedy requests to an unpatched and a patched FastDeploy server; outputs must be bit-identical",
        description=(
            "A/B serving check. Sends a fixed, seeded set of OpenAI-compatible requests (completions and chat, "
            f"streaming and not, logprobs top-k {_widths()}, prompt_logprobs, max_tokens 1 and long) to BASE "
            "(FastDeploy without the plugin) and CANDIDATE (with it), compares token ids, text and logprobs "
            "bit for bit, and reports tokens/s and time per output token side by side. " + EXIT_CODES
        ),
    )
    servers = p.add_argument_group("servers (either two URLs, or --model-path to start both)")
    servers.add_argument("--base-url", help="running server WITHOUT the plugin, e.g. http://127.0.0.1:8180")
    servers.add_argument("--candidate-url", help="running server WITH the plugin (FD_PLUGINS=fd_async_copy FD_ASYNC_COPY=1)")
    servers.add_argument(
        "--model-path",
        help="start both servers here, one after the other: python -m fastdeploy.entrypoints.openai.api_server "
        "--model PATH ..., base with the plugin off, candidate with FD_PLUGINS=fd_async_copy FD_ASYNC_COPY=1",
    )
    servers.add_argument(
        "--server-args",
        default="",
        help="extra api_server arguments for both launched servers, one shell-quoted string "
        "(e.g. \"--max-model-len 4096 --max-num-seqs 32\")",
    )
    servers.add_argument(
        "--base-features", metavar="FEATURES",
        help="launch the base WITH the plugin and these FD_ASYNC_COPY_FEATURES (e.g. all), to measure what the "
             "candidate's features add (e.g. --candidate-features all,overlap)")
    servers.add_argument("--candidate-features", metavar="FEATURES",
                         help="the launched candidate's FD_ASYNC_COPY_FEATURES (default: as in the environment)")
    servers.add_argument("--server-python", default=sys.executable, help="python that runs the launched servers")
    servers.add_argument("--server-log-dir", default=None,
                         help="launched servers' logs (base.log, candidate.log); default: a new folder under "
                              "the temporary directory, named on stderr")
    servers.add_argument("--server-start-timeout", type=float, default=1200.0, help="seconds to wait for /health (default 1200)")

    req = p.add_argument_group("requests")
    req.add_argument("--model", help="model name sent in requests (default: the first id of the base's /v1/models, else 'default')")
    req.add_argument("--requests", type=int, default=64, help="number of requests (default 64; each block of 32 covers every combination)")
    req.add_argument("--seed", type=int, default=0, help="seed of the request set (default 0)")
    req.add_argument("--concurrency", type=int, default=8, help="concurrent clients per server (default 8)")
    req.add_argument("--max-tokens", type=int, default=128, help="max_tokens of the long requests (default 128; the short ones use 1)")
    req.add_argument(
        "--no-prompt-logprobs",
        action="store_true",
        help="do not ask for prompt_logprobs (servers without FD_USE_GET_SAVE_OUTPUT_V1=1 reject them)",
    )
    req.add_argument("--warmup", type=int, default=2, help="unscored warm-up requests per server (default 2)")
    req.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    req.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default $OPENAI_API_KEY)")
    req.add_argument(
        "--control",
        action="store_true",
        help="also run the base set twice and compare base with itself, to see whether the server is "
        "deterministic at this concurrency (exit 3 if it is not)",
    )

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    out.add_argument("--show", type=int, default=5, help="divergences shown in the text report (default 5)")
    return p


def _validate(args) -> str | None:
    urls = args.base_url is not None or args.candidate_url is not None
    if args.model_path and urls:
        return "give either --base-url and --candidate-url, or --model-path, not both"
    if not args.model_path and not (args.base_url and args.candidate_url):
        return "give --base-url and --candidate-url (two running servers), or --model-path to start them"
    for name in ("requests", "concurrency"):
        if getattr(args, name) < 1:
            return f"--{name} must be >= 1"
    if args.max_tokens < 2:
        return "--max-tokens must be >= 2"
    if (args.base_features or args.candidate_features) and not args.model_path:
        return "--base-features/--candidate-features set the launched servers' features: use them with --model-path"
    for flag, value in (("--base-features", args.base_features), ("--candidate-features", args.candidate_features)):
        if value is not None:
            from ..config import ConfigError, parse_features
            from ..registry.catalog import feature_catalog

            try:
                parse_features(value, source=flag, catalog=feature_catalog())
            except ConfigError as exc:
                return str(exc)
    for flag, url in (("--base-url", args.base_url), ("--candidate-url", args.candidate_url)):
        if url is not None:
            parsed = urllib.parse.urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                return f"{flag} {url!r} is not an http(s) URL like http://127.0.0.1:8180"
    return None


def options_from_args(args):
    from ..serving_ab import ABOptions

    return ABOptions(
        requests=args.requests,
        seed=args.seed,
        concurrency=args.concurrency,
        model=args.model,
        long_max_tokens=args.max_tokens,
        prompt_logprobs=not args.no_prompt_logprobs,
        timeout=args.timeout,
        warmup=args.warmup,
        control=args.control,
        api_key=args.api_key,
    )


def launch_options_from_args(args):
    from ..serving_ab import LaunchOptions

    return LaunchOptions(
        model_path=args.model_path,
        python=args.server_python,
        server_args=tuple(shlex.split(args.server_args)),
        log_dir=Path(args.server_log_dir) if args.server_log_dir else _temporary_log_dir(),
        start_timeout=args.server_start_timeout,
        base_features=args.base_features,
        candidate_features=args.candidate_features,
    )


def _temporary_log_dir() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="fd-async-copy-ab-logs-"))


def run(args) -> int:
    from ..serving_ab import run_ab, run_ab_launching
    from ..serving_ab.launcher import ServerStartError

    problem = _validate(args)
    if problem:
        print(f"fd-async-copy ab: error: {problem}", file=sys.stderr)
        return 2
    opts = options_from_args(args)
    try:
        if args.model_path:
            report = run_ab_launching(launch_options_from_args(args), opts, os.environ)
        else:
            report = run_ab(args.base_url, args.candidate_url, opts)
    except ServerStartError as exc:
        print(f"fd-async-copy ab: {exc}", file=sys.stderr)
        return EXIT_LAUNCH_FAILED
    except ValueError as exc:  # arguments were checked above: this is a failure of the check itself
        print(f"fd-async-copy ab: could not complete the comparison: {exc}", file=sys.stderr)
        from ..serving_ab.report import EXIT_INCONCLUSIVE

        return EXIT_INCONCLUSIVE
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.render_text(max_divergences=args.show))
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python -m fd_async_copy_plugin.cli.ab ...`` (same options as ``fd-async-copy ab``)."""
    parser = argparse.ArgumentParser(prog="fd-async-copy")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["ab", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
