"""Section 2: replica fidelity - signatures, fields, import lists and share_inputs keys."""

from __future__ import annotations

import ast

from .common import (
    CORE_SHARE_INPUT_KEYS,
    FIELD_POINTS,
    INPUT_BATCH,
    OPS_IMPORTERS,
    POSTPROC,
    POSTPROC_IMPORTERS,
    REPLICA_PACKAGE,
    RUNNER,
    Report,
    SIGNATURE_POINTS,
)
from .side import Side
from .signatures import (
    compare_signatures,
    describe_signature,
    format_params,
    missing_and_extra,
    record_fields,
)
from .source import cuda_import_names, imports_from, is_cuda_guard, share_input_specs


def choose_replica(requested: str, profile: str | None, report: Report) -> str | None:
    if requested == "none":
        return None
    if requested in ("fd24", "fd25", "fddev"):
        return f"{REPLICA_PACKAGE}.{requested}"
    if requested != "auto":
        return requested
    mapping = {"fastdeploy-2.4": "fd24", "fastdeploy-2.5": "fd25", "fastdeploy-2.6+": "fddev"}
    if profile not in mapping:
        report.add("surface", "replica", "SKIP", f"no replica for profile {profile!r}; pass --replica")
        return None
    return f"{REPLICA_PACKAGE}.{mapping[profile]}"


def _both_sides(points, read, fd: Side, rep: Side):
    """(rel, name, (real, route), (replica, route)) per point present on at least one side; a
    point absent on both sides belongs to another FastDeploy line."""
    for rel, name in points:
        real, mine = read(fd, rel, name), read(rep, rel, name)
        if real[0] is not None or mine[0] is not None:
            yield rel, name, real, mine


def _lacks_and_adds(real: list, mine: list, who: str) -> list[str]:
    """What ``who`` lacks and adds compared with FastDeploy's list, as report phrases."""
    missing = [n for n in real if n not in mine]
    extra = [n for n in mine if n not in real]
    return ([f"{who} lacks " + ", ".join(missing)] if missing else []) + (
        [f"{who} adds " + ", ".join(extra)] if extra else []
    )


def check_signatures(fd: Side, rep: Side, report: Report) -> None:
    for rel, qualname, (real, real_route), (mine, mine_route) in _both_sides(
        SIGNATURE_POINTS, describe_signature, fd, rep
    ):
        item = f"{rel}:{qualname}"
        if real is None:
            report.add("signature", item, "EXTRA", f"replica defines it, FastDeploy does not ({mine_route})")
        elif mine is None:
            where = "module absent" if rep.resolve(rel) is None else "not defined"
            report.add("signature", item, "MISSING", f"replica: {where}; FD {format_params(real[1])}")
        else:
            diff = compare_signatures(real, mine)
            route = f"[{real_route}/{mine_route}]"
            if diff:
                report.add("signature", item, "MISMATCH", f"{diff} {route}")
            else:
                report.add("signature", item, "OK", f"{format_params(real[1])} {route}")


def check_fields(fd: Side, rep: Side, report: Report) -> None:
    for rel, cls_name, (real, real_route), (mine, mine_route) in _both_sides(FIELD_POINTS, record_fields, fd, rep):
        item = f"{rel}:{cls_name} fields"
        if real is None:
            report.add("fields", item, "EXTRA", "replica defines it, FastDeploy does not")
            continue
        if mine is None:
            report.add("fields", item, "MISSING", "replica does not define it; FD: " + ", ".join(n for n, _ in real))
            continue
        rnames, pnames = [n for n, _ in real], [n for n, _ in mine]
        notes = []
        if rnames != pnames:
            notes.extend(missing_and_extra(rnames, pnames))
            common_r = [n for n in rnames if n in pnames]
            common_p = [n for n in pnames if n in rnames]
            if common_r != common_p:
                notes.append("order differs: FD " + ", ".join(common_r) + " | replica " + ", ".join(common_p))
        rdef = {n for n, d in real if d}
        pdef = {n for n, d in mine if d}
        shared = set(rnames) & set(pnames)
        if (rdef & shared) != (pdef & shared):
            only_fd = sorted((rdef - pdef) & shared)
            only_rep = sorted((pdef - rdef) & shared)
            if only_fd:
                notes.append("default in FD only: " + ", ".join(only_fd))
            if only_rep:
                notes.append("default in replica only: " + ", ".join(only_rep))
        route = f"[{real_route}/{mine_route}]"
        if notes:
            report.add("fields", item, "MISMATCH", "; ".join(notes) + f" {route}")
        else:
            report.add("fields", item, "OK", f"{len(rnames)} fields in order {route}")


def check_import_lists(fd: Side, rep: Side, report: Report) -> None:
    # Op names the modules take from ops.gpu (the CUDA branch of FastDeploy's platform switch).
    for rel in OPS_IMPORTERS:
        item = f"{rel}: from ops.gpu import"
        real = cuda_import_names(fd.tree(rel), ("ops.gpu",))
        if rep.tree(rel) is None:
            report.add("imports", item, "MISSING", f"replica module absent; FD imports {len(real)}: {', '.join(real)}")
            continue
        # The replica may name its op module differently; accept any `...ops` / `...gpu` source.
        mine = cuda_import_names(rep.tree(rel), ("ops.gpu", "ops", "gpu", "ops_gpu", "gpu_ops"))
        detail = _lacks_and_adds(real, mine, "replica")
        if detail:
            report.add("imports", item, "MISMATCH", "; ".join(detail))
        else:
            report.add("imports", item, "OK", f"{len(real)} names: {', '.join(real)}")
        other = [(names, guard) for names, guard in imports_from(fd.tree(rel), ("ops.gpu",))
                 if not is_cuda_guard(guard)]
        for names, guard in other:
            positive = [c for c in guard if not c.startswith("not (")] or ["else"]
            report.add("imports", f"{rel}: ops.gpu if {' and '.join(positive)}", "INFO", ", ".join(names))

    # Names the runners take from pre_and_post_process: patched where imported (surface §2.7).
    replica_post = rep.tree(POSTPROC)
    replica_defs = set()
    if replica_post is not None:
        for node in replica_post.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                replica_defs.add(node.name)
            elif isinstance(node, ast.Assign):
                replica_defs.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                replica_defs.update((a.asname or a.name).split(".")[0] for a in node.names)
    for rel in POSTPROC_IMPORTERS:
        real_groups = imports_from(fd.tree(rel), ("pre_and_post_process",))
        real = [n for names, _ in real_groups for n in names]
        if not real:
            continue
        item = f"{rel}: from pre_and_post_process import"
        undefined = [n for n in real if replica_post is not None and n not in replica_defs]
        if replica_post is None:
            report.add("imports", item, "MISSING", "replica has no pre_and_post_process; FD: " + ", ".join(real))
            continue
        if rep.tree(rel) is None:
            status = "MISSING" if undefined else "INFO"
            detail = f"FD imports {', '.join(real)}; replica has no {rel.rsplit('.', 1)[1]}"
            if undefined:
                detail += "; replica pre_and_post_process lacks " + ", ".join(undefined)
            else:
                detail += " (all names exist in the replica's pre_and_post_process)"
            report.add("imports", item, status, detail)
            continue
        mine = [n for names, _ in imports_from(rep.tree(rel), ("pre_and_post_process",)) for n in names]
        detail = _lacks_and_adds(real, mine, "replica runner")
        if detail or undefined:
            if undefined:
                detail.append("replica pre_and_post_process lacks " + ", ".join(undefined))
            report.add("imports", item, "MISMATCH", "; ".join(detail))
        else:
            report.add("imports", item, "OK", ", ".join(real))


def _share_inputs_function(side: Side):
    """The function that creates share_inputs on this side, and where it was found."""
    for rel, qualname, style in (
        (RUNNER, "GPUModelRunner._init_share_inputs", "dict"),
        (INPUT_BATCH, "InputBatch.init_share_inputs", "attr"),
    ):
        node = side.ast_def(rel, qualname)
        if node is not None:
            return share_input_specs(node, style), f"{rel}:{qualname}"
    return None, None


def fd_share_inputs(fd: Side, report: Report):
    """FastDeploy's share_inputs keys with dtype/shape/placement; core keys listed as facts."""
    real, real_where = _share_inputs_function(fd)
    if real is None:
        report.add("fd share_inputs", "initialiser", "INFO",
                   "no GPUModelRunner._init_share_inputs / InputBatch.init_share_inputs found")
        return None, None
    report.facts["share_inputs_keys_fd"] = {
        "where": real_where,
        "count": len(real),
        "keys": {k: [s.text() + (f" if {s.guard}" if s.guard else "") for s in v] for k, v in real.items()},
    }
    report.add("fd share_inputs", "initialiser", "INFO", f"{real_where}: {len(real)} keys")
    for core in CORE_SHARE_INPUT_KEYS:
        present = [k for k in (core, f"self.{core}") if k in real]
        for key in present:
            text = " | ".join(s.text() + (f" [if {s.guard}]" if s.guard else "") for s in real[key])
            report.add("fd share_inputs", key, "INFO", text)
        if not present:
            report.add("fd share_inputs", core, "INFO", "absent")
    return real, real_where


def fd_import_lists(fd: Side, report: Report) -> None:
    """FastDeploy's own import lists at the patch points (reported with or without a replica)."""
    for rel in OPS_IMPORTERS:
        names = cuda_import_names(fd.tree(rel), ("ops.gpu",))
        report.add("fd imports", f"{rel}: from ops.gpu import", "INFO", f"{len(names)}: {', '.join(names)}")
    for rel in POSTPROC_IMPORTERS:
        names = [n for group, _ in imports_from(fd.tree(rel), ("pre_and_post_process",)) for n in group]
        if names:
            report.add("fd imports", f"{rel}: from pre_and_post_process import", "INFO", ", ".join(names))


def check_share_inputs(fd: Side, rep: Side, report: Report) -> None:
    real, real_where = _share_inputs_function(fd)
    mine, mine_where = _share_inputs_function(rep)
    if real is None:
        report.add("share_inputs", "initialiser", "SKIP",
                   "FastDeploy: no _init_share_inputs / InputBatch.init_share_inputs")
        return
    if mine is None:
        report.add("share_inputs", "initialiser", "MISSING",
                   f"replica has no {real_where.split(':')[1]}; FD creates {len(real)} keys there")
        return
    if real_where != mine_where:
        report.add("share_inputs", "initialiser", "MISMATCH", f"FD {real_where}, replica {mine_where}")
    else:
        report.add("share_inputs", "initialiser", "OK", f"{real_where}: FD {len(real)} keys, replica {len(mine)}")
    for key in sorted(mine):
        if key not in real:
            report.add("share_inputs", key, "EXTRA", "replica creates it, FastDeploy does not: " + mine[key][0].text())
            continue
        notes = []
        for attr in ("dtype", "shape", "place"):
            real_values = {getattr(s, attr) for s in real[key] if getattr(s, attr)}
            mine_values = {getattr(s, attr) for s in mine[key] if getattr(s, attr)}
            if real_values and mine_values and not mine_values <= real_values:
                notes.append(f"{attr} FD {sorted(real_values)} vs replica {sorted(mine_values)}")
        fd_text = " | ".join(s.text() + (f" [if {s.guard}]" if s.guard else "") for s in real[key])
        if notes:
            report.add("share_inputs", key, "MISMATCH", "; ".join(notes) + f" (FD: {fd_text})")
        else:
            report.add("share_inputs", key, "OK", fd_text)
    absent = sorted(k for k in real if k not in mine)
    def is_core(key: str) -> bool:
        return key.removeprefix("self.") in CORE_SHARE_INPUT_KEYS

    for key in (k for k in absent if is_core(k)):
        report.add("share_inputs", key, "MISSING", "FD: " + " | ".join(s.text() for s in real[key]))
    rest = [k for k in absent if not is_core(k)]
    if rest:
        # '*' marks keys FastDeploy creates only under a condition (speculative decoding, EP, ...).
        names = [k + ("*" if all(s.guard for s in real[k]) else "") for k in rest]
        report.add("share_inputs", "other FD keys", "INFO",
                   f"{len(rest)} not in the replica (* = conditional in FD): " + ", ".join(names))
