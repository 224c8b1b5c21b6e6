"""``fd-async-copy selftest``: decode on the reference FastDeploy with the plugin off and on.

Outputs (tokens, stop decisions, logprobs, prompt logprobs, every saved message and ZMQ payload)
must be bit-identical. On the race-detecting simulator (``sim``) both runs are also compared with a
synchronous reference (unpatched, ``host`` backend): the plugin's run must equal it; where unpatched
FastDeploy differs from it (FD 2.5's overlap schedule has its own races), that is reported as
FastDeploy's own race, not as a plugin failure. Then, when a FastDeploy is installed (detected as ``doctor`` does), its own
code is checked before and after enabling the plugin (``fd_async_copy_plugin/testing/selftest_fd``). With
backend ``auto`` it uses ``cuda`` where Paddle can (real pinned memory and events), otherwise
``host``; on CPU it also runs the race-detecting simulator (``sim``).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time

from ..registry.plan import REFUSED_IN_STRICT_MODE


def _backends(requested: str) -> tuple[list[str], str]:
    from ..runtime.cuda import cuda_available

    if requested != "auto":
        return [requested], ""
    ok, why = cuda_available()
    if ok:
        return ["cuda"], ""
    return ["host", "sim"], f"CUDA unavailable ({why}): ran host and sim instead of cuda"


def run(args) -> int:
    if getattr(args, "real_steps", False):
        return run_real_steps(args)
    from ..testing import harness
    from ..testing.harness import census_row, selftest_scenarios

    from .version import versions

    backends, note = _backends(args.backend)
    report = {"versions": versions(), "backends": backends, "note": note, "scenarios": [], "ok": True, "skipped": {}}
    started = time.perf_counter()
    scenarios = list(selftest_scenarios(args.steps))
    total = len(scenarios) * len(backends)
    for scenario in scenarios:
        for backend in backends:
            entry = {"scenario": scenario.name, "backend": backend}
            _progress(len(report["scenarios"]) + 1, total, entry, started)
            try:
                judged = harness.judge_scenario(scenario, backend)
            except Exception as exc:  # report, do not hide: a selftest failure is the signal
                entry.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                report["ok"] = False
                report["scenarios"].append(entry)
                _done(entry)
                continue
            plugin = judged.plugin
            features = (plugin.status or {}).get("features", {})
            # a scenario built for a feature that did not apply (e.g. overlap without the custom ops)
            # compares against a schedule the plugin did not run: not tested, named as skipped below
            not_run = [n for n in scenario.features or () if features.get(n, {}).get("state") not in ("applied", "pending")]
            diffs = [] if not_run else judged.differences
            entry.update(
                ok=not diffs and not judged.truncated,
                not_compared=not_run,
                differences=diffs[:10],
                # on a racy backend: compared with the synchronous reference (unpatched on host);
                # unpatched FastDeploy's own race there is reported, not counted against the plugin
                compared_with="synchronous reference (unpatched, host backend)" if judged.reference else "unpatched",
                fastdeploy_race=[] if not_run else judged.fastdeploy_race[:5],
                steps=plugin.result.steps,
                requests=len(plugin.result.outputs),
                messages=len(plugin.result.messages),
                features={n: f["state"] for n, f in features.items()},
                feature_reasons={n: f["reason"] for n, f in features.items()},
                census_unpatched=census_row(judged.base or judged.reference, skip=0),
                census_plugin=census_row(plugin, skip=0),
            )
            report["ok"] &= entry["ok"]
            report["scenarios"].append(entry)
            _done(entry)
            for name, state in entry["features"].items():
                if state in REFUSED_IN_STRICT_MODE:  # not tested by this run: say so
                    report["skipped"].setdefault(name, f"{state}: {entry['feature_reasons'][name]}")
    # The FastDeploy installed here, if any (fd_async_copy_plugin/testing/selftest_fd): its own code before
    # and after enabling the plugin. Without one, it says that only the replica was checked.
    from ..testing.selftest_fd import checks as fd_checks

    print("selftest: checking the installed FastDeploy, if any ...", file=sys.stderr, flush=True)
    report["environment"] = fd_checks.environment()
    report["fastdeploy"] = fd_checks.run(backends, root=getattr(args, "root", "fastdeploy"))
    report["ok"] &= report["fastdeploy"]["ok"]
    for name, why in report["fastdeploy"].get("untested", {}).items():  # e.g. logprobs incompatible there
        report["skipped"].setdefault(f"{name} (installed FastDeploy)", why)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["allow_skip"] = bool(getattr(args, "allow_skip", False))
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0 if report["ok"] and (report["allow_skip"] or not report["skipped"]) else 1


def _progress(index: int, total: int, entry: dict, started: float) -> None:
    """One line per workload on stderr as it runs (stdout keeps the report, or the JSON)."""
    print(f"selftest [{index:2d}/{total}] {time.perf_counter() - started:5.1f} s  [{entry['backend']}] "
          f"{entry['scenario']} ...", end="", file=sys.stderr, flush=True)


def _done(entry: dict) -> None:
    verdict = "ok" if entry["ok"] else ("ERROR" if "error" in entry else "MISMATCH")
    if entry["ok"] and entry.get("fastdeploy_race"):
        verdict = "ok (FastDeploy's own race seen; the plugin matches the synchronous reference)"
    if entry.get("not_compared"):
        verdict = "not compared"
    print(f" {verdict}", file=sys.stderr, flush=True)


def result_line(report: dict) -> str:
    """PASS only when every scenario and every check against the installed FastDeploy agreed and no
    feature was left out. Checks against FastDeploy that cannot run on this machine (skipped, with
    their reason above) are named too; they do not fail the run."""
    skipped = report["skipped"]
    names = ", ".join(sorted(skipped))
    if not report["ok"]:
        verdict = "FAIL: outputs differ or a run failed"
    elif skipped and not report["allow_skip"]:
        verdict = f"FAIL: not tested: {names} (see below; --allow-skip accepts this)"
    elif skipped:
        verdict = f"PASS with {names} skipped (--allow-skip)"
    else:
        verdict = "PASS"
    fastdeploy = report.get("fastdeploy") or {}
    if fastdeploy.get("present") is False:
        verdict += "; reference replica only (no FastDeploy installed)"
    not_run = sorted({c["name"].split(":")[0].split(" (")[0] for c in fastdeploy.get("checks", [])
                      if c["status"] == "skipped" and "untested_feature" not in c["figures"]})
    if not_run:  # cannot run here (e.g. FastDeploy's compiled ops absent): said, not failed
        verdict += f"; skipped against FastDeploy: {', '.join(not_run)} (reasons above)"
    return f"  result: {verdict} ({report['seconds']} s)"


def format_report(report: dict) -> str:
    lines = ["fd-async-copy selftest: reference FastDeploy, plugin off vs on"]
    if report["note"]:
        lines.append(f"  note: {report['note']}")
    for entry in report["scenarios"]:
        verdict = "bit-identical" if entry["ok"] else "MISMATCH"
        if entry.get("not_compared"):
            verdict = f"not compared ({', '.join(entry['not_compared'])} not applied)"
        lines.append(f"  [{entry['backend']:4s}] {entry['scenario']}")
        if "error" in entry:
            lines.append(f"         ERROR {entry['error']}")
            continue
        applied = ", ".join(f"{n}={s}" for n, s in entry["features"].items())
        before, after = entry["census_unpatched"], entry["census_plugin"]
        lines.append(
            f"         {verdict}: {entry['requests']} requests, {entry['steps']} steps, {entry['messages']} saved messages"
        )
        lines.append(f"         features: {applied}")
        lines.append(
            "         per step on patched paths: blocking D2H "
            f"{before['blocking_d2h']:.2f} -> {after['blocking_d2h']:.2f}, event waits "
            f"{before['event_wait']:.2f} -> {after['event_wait']:.2f},"
        )
        lines.append(f"         device syncs {before['device_sync']:.2f} -> {after['device_sync']:.2f}")
        for diff in entry.get("differences", []):
            lines.append(f"         - {diff}")
        if entry.get("fastdeploy_race"):
            lines.append("         FastDeploy's own race: unpatched FastDeploy differs from the synchronous reference "
                         "(unpatched, host backend) on this backend; the plugin matches the reference:")
            lines += [f"         - {diff}" for diff in entry["fastdeploy_race"]]
    if "fastdeploy" in report:
        from ..testing.selftest_fd.checks import format_lines

        lines += format_lines(report["fastdeploy"])
    lines.append(result_line(report))
    for name, why in sorted(report["skipped"].items()):
        lines.append(f"    {name}: {why}")
    return "\n".join(_wrapped(lines))


def _wrapped(lines: list[str], width: int = 100) -> list[str]:
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out += textwrap.wrap(line, width, subsequent_indent=indent) if len(line) > width else [line]
    return out


def run_real_steps(args) -> int:
    """``--real-steps``: ``testing/real_steps`` in a child process (it rebinds FastDeploy's ops module
    and platform for good), its report on stdout, its exit status returned."""
    import os
    import subprocess

    if args.fd_root and not os.path.isdir(os.path.join(args.fd_root, "fastdeploy")):
        print(f"selftest --real-steps: --fd-root {args.fd_root!r} holds no fastdeploy/ folder", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "fd_async_copy_plugin.testing.real_steps", "--steps", str(min(args.steps, 48))]
    if args.fd_root:
        command += ["--fd-root", args.fd_root]
    if args.json:
        command.append("--json")
    return subprocess.call(command)
