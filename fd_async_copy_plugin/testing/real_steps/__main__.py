"""``python -m fd_async_copy_plugin.testing.real_steps``: see ``check.py``; ``fd-async-copy selftest
--real-steps`` runs this in a child process."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fd_async_copy_plugin.testing.real_steps",
                                     description="real FastDeploy decode steps on CPU: plugin off vs on, bit for bit")
    parser.add_argument("--fd-root", default=None, help="folder holding fastdeploy/ (default: the installed one)")
    parser.add_argument("--steps", type=int, default=24, help="longest request's max_tokens (default 24)")
    parser.add_argument("--no-counts", action="store_true", help="skip the sync check's counts")
    parser.add_argument("--no-compare", action="store_true", help="skip the bit-identity runs")
    parser.add_argument("--config", action="append", default=None,
                        help="only this configuration (by name; repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report: dict = {"ok": True, "rows": [], "counts": []}
    try:
        with contextlib.redirect_stdout(sys.stderr):  # FastDeploy prints; the report owns stdout
            from .environment import prepare

            prepared = prepare(args.fd_root)
    except Exception as exc:  # noqa: BLE001 - one line, no traceback: the tree cannot step here
        print(f"real-steps: cannot step this FastDeploy: {type(exc).__name__}: {exc}".splitlines()[0])
        return 2
    from . import check

    report.update(line=prepared.line, fastdeploy=prepared.fastdeploy_file)
    with contextlib.redirect_stdout(sys.stderr):
        if not args.no_compare:
            configs = [c for c in check.configurations(prepared.line) if not args.config or c.name in args.config]
            for scenario in check.scenarios(prepared.line, args.steps):
                print(f"real-steps: {scenario.name} ...", file=sys.stderr, flush=True)
                for row in check.compare(scenario, configs):
                    report["rows"].append(vars(row))
                    report["ok"] &= row.ok
        if not args.no_counts:
            print("real-steps: sync check counts ...", file=sys.stderr, flush=True)
            report["counts"] = check.counts()
            report["ok"] &= not any(r.get("error") for r in report["counts"])  # the figures inform; a failed run fails
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        print()
    else:
        print(f"fd-async-copy real steps: FastDeploy {prepared.line} at {prepared.fastdeploy_file}")
        last = None
        for row in report["rows"]:
            if row["scenario"] != last:
                print(f"  {row['scenario']}")
                last = row["scenario"]
            print(f"    {'ok ' if row['ok'] else 'BAD'} {row['configuration']:36s} {row['detail']} ({row['seconds']} s)")
        if report["counts"]:
            print("  sync check (FD_ASYNC_COPY_SYNC_CHECK=count) on these steps:")
            for line in check.format_counts(report["counts"]):
                print(line)
        print(f"  result: {'PASS' if report['ok'] else 'FAIL'} ({report['seconds']} s)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
