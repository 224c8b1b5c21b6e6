"""``fd-async-copy``: doctor, selftest, bench, ab, build-ops."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

from ..registry.plan import PADDLE_INSTALL_HINT

DESCRIPTION = (
    "Asynchronous GPU->host output copies for FastDeploy. Commands: doctor (what the plugin would "
    "do here), selftest, bench, ab (A/B serving check), build-ops (compile the custom ops)."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fd-async-copy", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print the plugin's version (and git describe in a checkout)")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="inspect Paddle, FastDeploy and what the plugin would do (patches nothing)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output (the status() shape)")
    doctor.add_argument("--root", default="fastdeploy", help="FastDeploy root module (default: fastdeploy)")

    selftest = sub.add_parser("selftest", help="decode on the reference FastDeploy replica with the plugin off and on; outputs must be bit-identical")
    selftest.add_argument("--steps", type=_selftest_steps, default=48, help="decode steps per run, 1 to 512 (default 48)")
    selftest.add_argument(
        "--backend", default="auto", choices=("auto", "cuda", "host", "sim"),
        help="auto: cuda if usable, else host and sim (default auto)",
    )
    selftest.add_argument(
        "--allow-skip", action="store_true",
        help="exit 0 even when a feature was not tested (skipped, e.g. custom ops not built)",
    )
    selftest.add_argument("--json", action="store_true", help="machine-readable output")
    selftest.add_argument(
        "--real-steps", action="store_true",
        help="step FastDeploy's own GPUModelRunner on CPU (our ports of its ops, a tiny model): plugin off vs on, "
        "bit for bit, and the sync check's counts (a child process)",
    )
    selftest.add_argument("--fd-root", metavar="TREE", default=None,
                          help="with --real-steps: the folder holding fastdeploy/ (default: the installed FastDeploy)")

    bench = sub.add_parser("bench", help="side-by-side host time per decode step and sync census, plugin off vs on")
    # None: the default of the mode (--smoke or not); a size given explicitly is used as given
    bench.add_argument("--batch", type=_positive, help="requests decoded together (default 128; --smoke 16)")
    bench.add_argument("--top-k", type=_positive, help="logprobs per token, at most --vocab (default 20)")
    bench.add_argument("--vocab", type=_positive, help="vocabulary size, at least 4 (default 1024; --smoke 512)")
    bench.add_argument("--steps", type=_positive,
                       help="decode steps per run, more than the 3 warm-up steps (default 60; --smoke 12)")
    bench.add_argument("--repeats", type=_positive, help="alternating off/on rounds (default 5; --smoke 2)")
    bench.add_argument("--smoke", action="store_true", help="tiny default sizes, for CI (sizes given explicitly are kept)")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    bench.add_argument("--trace", metavar="FILE", help="also write a Chrome trace-event JSON of decode steps, one track per variant (Perfetto)")
    bench.add_argument("--trace-steps", type=_positive, default=8, help="decode steps per variant in --trace (default 8)")

    build = sub.add_parser(
        "build-ops",
        help="compile the custom ops (pybind get_stop/set_stop, host and CUDA update kernels); "
        "options: --verbose --force --no-cuda --require-cuda --json",
        add_help=False,  # every option, --help included, goes to the build tool
    )

    try:
        from . import ab
    except ImportError:  # pragma: no cover - ab ships with the package
        ab = None
    if ab is not None:
        ab.add_parser(sub)
    return parser


class _VersionAction(argparse.Action):
    """``--version``, computed only when asked (git describe runs a subprocess)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from .version import version_line

        print(version_line())
        parser.exit()


#: warnings the plugin's own imports trigger, which say nothing to its user: Paddle's import of
#: paddle.utils.cpp_extension warns about ccache (a 300-column line) whatever the command, and the
#: replica builds tensors from tensors (``paddle.to_tensor(t)``) on purpose.
QUIET_WARNINGS = ("No ccache found", "To copy construct from a tensor")


def silence_own_warnings() -> None:
    for text in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{text}", category=UserWarning)


def _paddle_missing() -> str:
    """Why Paddle cannot be imported here, or "" when it can."""
    try:
        import paddle  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return ""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _selftest_steps(text: str) -> int:
    """1 to ``MAX_SELFTEST_STEPS``: every value sizes the scenarios so that they run (issue 41)."""
    value = _positive(text)
    maximum = 512  # harness.MAX_SELFTEST_STEPS (not imported here: it imports Paddle)
    if value > maximum:
        raise argparse.ArgumentTypeError(f"{value} is more than {maximum}")
    return value


def main(argv: list[str] | None = None) -> int:
    silence_own_warnings()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "build-ops":
        # the command's own usage, not the top-level one
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "bench":
        # Sizes first (no Paddle needed): a run that would time nothing or end in a Paddle error is
        # refused before any work, with the option to change.
        from .bench import resolve_sizes

        problem = resolve_sizes(args)
        if problem:
            print(f"fd-async-copy bench: error: {problem}", file=sys.stderr)
            return 2
    if args.command in ("selftest", "bench"):
        # Both decode on the replica, which runs on Paddle: without it, one line naming the Paddle
        # to install (as doctor and build-ops say it), not a traceback; with --json, a JSON object.
        missing = _paddle_missing()
        if missing:
            error = f"Paddle is not importable ({missing}): {PADDLE_INSTALL_HINT}"
            if args.json:
                from .version import versions

                print(json.dumps({"ok": False, "command": args.command, "error": error, "versions": versions()},
                                 indent=2))
            print(f"fd-async-copy {args.command} FAILED: {error}", file=sys.stderr)
            return 1
        # These enable and disable the plugin many times; its per-feature log lines would bury the report.
        logging.getLogger("fd_async_copy").setLevel(logging.WARNING)
    if args.command == "selftest" and args.backend == "cuda":
        from ..runtime.cuda import cuda_available

        usable, why = cuda_available()
        if not usable:
            print(f"fd-async-copy selftest: error: --backend cuda needs a CUDA build of Paddle with a GPU ({why}); "
                  "use --backend auto (host and sim here) or host", file=sys.stderr)
            return 2
    if args.command == "doctor":
        from . import doctor

        return doctor.run(args)
    if args.command == "selftest":
        from . import selftest

        return selftest.run(args)
    if args.command == "bench":
        from . import bench

        return bench.run(args)
    if args.command == "build-ops":
        from .build_ops import main_build_ops

        return main_build_ops(extra)
    if args.command == "ab":
        from . import ab

        return ab.run(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
