"""Output and command line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys

from .common import FD_ROOT, Report
from .side import Side
from .environment import check_imports_status, import_fastdeploy, prepare_environment
from .profile_check import check_profile
from .fidelity import (
    check_fields,
    check_import_lists,
    check_share_inputs,
    check_signatures,
    choose_replica,
    fd_import_lists,
    fd_share_inputs,
)
from .behaviour import check_behaviour
from .overlap import check_overlap
from .tensor_parallel import check_tensor_parallel
from .step_syncs import check_step_syncs
from .census_dev import check_census_dev


def render(report: Report) -> str:
    lines = []
    lines.append(f"FastDeploy: {report.facts.get('fastdeploy_location', '?')}")
    for key in ("paddle", "paddle_cuda", "ops_gpu", "fastdeploy___version__", "fastdeploy_hasattr_always_true",
                "replica_root"):
        if key in report.facts:
            lines.append(f"  {key}: {report.facts[key]}")
    width = max((len(r.item) for r in report.rows), default=10)
    width = min(width, 70)
    section = None
    for row in report.rows:
        if row.section != section:
            section = row.section
            lines.append("")
            lines.append(f"== {section}")
        lines.append(f"  {row.status:<8} {row.item:<{width}}  {row.detail}")
    counts: dict[str, int] = {}
    for row in report.rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    lines.append("")
    lines.append("summary: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def run(args) -> Report:
    report = Report(fd_src=args.fd_src)
    prepare_environment(args.fd_src, report)
    try:
        fd = Side(FD_ROOT, "FastDeploy")
        import_fastdeploy(fd, report)
        check_imports_status(fd, report, "environment")
        profile = check_profile(fd, args.fd_src, report)
        fd_share_inputs(fd, report)
        fd_import_lists(fd, report)
        check_step_syncs(fd, report, profile)
        check_overlap(fd, report, profile)
        check_tensor_parallel(fd, report, args.fd_src)  # rows (t): the rank rules, every profile
        check_census_dev(fd, report, profile)  # rows (dev): develop's census assumptions
        replica_root = choose_replica(args.replica, profile, report)
        if replica_root is not None:
            report.facts["replica_root"] = replica_root
            try:
                present = importlib.util.find_spec(replica_root) is not None
            except (ImportError, ValueError):
                present = False
            if not present:
                report.add("surface", "replica", "SKIP", f"{replica_root} does not exist (yet)")
            else:
                rep = Side(replica_root, "replica")
                check_imports_status(rep, report, "replica")
                check_signatures(fd, rep, report)
                check_fields(fd, rep, report)
                check_import_lists(fd, rep, report)
                check_share_inputs(fd, rep, report)
                if replica_root.endswith(".fd24"):
                    check_step_syncs(rep, report, profile, replica=True)
                    check_overlap(rep, report, profile, replica=True)
                elif replica_root.endswith(".fd25") and profile == "fastdeploy-2.5":
                    check_step_syncs(rep, report, profile, replica=True)  # (d25): the seed on the device
                elif replica_root.endswith(".fddev"):
                    check_census_dev(rep, report, profile, replica=True)  # (dev): the same rows, on the replica
                if not args.no_behaviour:
                    check_behaviour(fd, rep, report)
    finally:
        scratch = report.facts.get("scratch_dir")
        if scratch and not args.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=sys.modules[__package__].__doc__.split("\n\n")[0])
    parser.add_argument("--fd-src", help="FastDeploy checkout (holds fastdeploy/) or the fastdeploy package folder; "
                                         "default: the installed fastdeploy")
    parser.add_argument("--replica", default="auto",
                        help="auto (by detected profile), fd24, fd25, fddev, none, or a dotted module root")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any MISMATCH, MISSING or EXTRA")
    parser.add_argument("--no-behaviour", action="store_true",
                        help="skip running Sampler/LogprobsTensors methods on both sides")
    parser.add_argument("--keep-scratch", action="store_true", help="keep FastDeploy's log/metrics scratch folder")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        out = {
            "fd_src": report.fd_src,
            "facts": report.facts,
            "rows": [r.as_dict() for r in report.rows],
            "problems": len(report.problems()),
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(report))
    if args.strict and report.problems():
        return 1
    return 0
