"""Section 3: behaviour of the pure-tensor patch points, run on both sides with the same inputs."""

from __future__ import annotations

import contextlib
import importlib.util
import sys

from .common import OUTPUT, Report, SAMPLER
from .side import Side


def _place_kind(tensor) -> str:
    place = str(getattr(tensor, "place", "?")).lower()
    if "pinned" in place:
        return "pinned"
    if "cpu" in place:
        return "cpu"
    return "device" if "gpu" in place or "xpu" in place else place


def _tensor_summary(tensor):
    import numpy as np

    return np.asarray(tensor.numpy()), str(tensor.dtype).rsplit(".", 1)[-1], list(tensor.shape), _place_kind(tensor)


def _compare_tensors(name: str, real, mine) -> list[str]:
    import numpy as np

    r_val, r_dtype, r_shape, r_place = _tensor_summary(real)
    m_val, m_dtype, m_shape, m_place = _tensor_summary(mine)
    notes = []
    if r_dtype != m_dtype:
        notes.append(f"{name} dtype {r_dtype} vs {m_dtype}")
    if r_shape != m_shape:
        notes.append(f"{name} shape {r_shape} vs {m_shape}")
    elif not np.array_equal(r_val, m_val):
        diff = np.abs(r_val.astype("float64") - m_val.astype("float64")).max()
        notes.append(f"{name} values differ (max abs diff {diff:.3g})")
    if r_place != m_place:
        notes.append(f"{name} place {r_place} vs {m_place}")
    return notes


def _describe_value_difference(name: str, real, mine) -> str:
    import numpy as np

    try:
        r, m = np.asarray(real, dtype="float64"), np.asarray(mine, dtype="float64")
    except (TypeError, ValueError):
        return f"{name}: {real!r} vs {mine!r}"
    if r.shape != m.shape:
        return f"{name} shape {list(r.shape)} vs {list(m.shape)}"
    return f"{name} values differ (max abs diff {np.abs(r - m).max():.3g})"


def _behaviour_inputs():
    import numpy as np
    import paddle

    rng = np.random.default_rng(20240601)
    logits = paddle.to_tensor(rng.standard_normal((4, 64)).astype("float32"))
    token_ids = paddle.to_tensor(np.array([1, 5, 7, 63], dtype="int64"))
    return logits, token_ids


def check_behaviour(fd: Side, rep: Side, report: Report) -> None:
    """Same inputs through FastDeploy's and the replica's Sampler/LogprobsTensors; bitwise compare.

    Only the methods that need no runner state are run (on a ``Sampler.__new__`` instance), which
    is what FastDeploy's own CPU tests do. Everything is small: 4 rows, vocabulary 64.
    """
    section = "behaviour"
    if importlib.util.find_spec("paddle") is None:
        report.add(section, "paddle", "SKIP", "paddle is not importable")
        return
    sides = {}
    for side in (fd, rep):
        sampler = side.obj(SAMPLER, "Sampler") if side.load(SAMPLER) is not None else None
        tensors = side.obj(OUTPUT, "LogprobsTensors") if side.load(OUTPUT) is not None else None
        sides[side.label] = (sampler, tensors)
    (fd_sampler, fd_tensors), (rep_sampler, rep_tensors) = sides[fd.label], sides[rep.label]

    def run_both(item: str, call):
        """call(sampler_cls, tensors_cls) -> list of (name, tensor) or other comparable value."""
        results = []
        for sampler, tensors in ((fd_sampler, fd_tensors), (rep_sampler, rep_tensors)):
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    results.append(("ok", call(sampler, tensors)))
            except Exception as exc:  # noqa: BLE001 - a failing call is the finding
                results.append(("error", f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))
        (fd_state, fd_value), (rep_state, rep_value) = results
        if fd_state == "error" and rep_state == "error":
            report.add(section, item, "SKIP", f"fails on both sides: FD {fd_value}; replica {rep_value}")
            return
        if fd_state == "error":
            report.add(section, item, "INFO", f"FastDeploy call fails here ({fd_value}); replica runs")
            return
        if rep_state == "error":
            report.add(section, item, "MISMATCH", f"replica raises {rep_value}; FastDeploy runs")
            return
        notes = []
        for (name, real), (_name, mine) in zip(fd_value, rep_value):
            if hasattr(real, "numpy") and hasattr(mine, "numpy"):
                notes.extend(_compare_tensors(name, real, mine))
            elif real != mine:
                notes.append(_describe_value_difference(name, real, mine))
        if len(fd_value) != len(rep_value):
            notes.append(f"{len(fd_value)} results vs {len(rep_value)}")
        if notes:
            report.add(section, item, "MISMATCH", "; ".join(notes))
        else:
            report.add(section, item, "OK", "bitwise equal: " + ", ".join(n for n, _ in fd_value))

    logits, token_ids = _behaviour_inputs()

    def fields(result):
        return [(n, getattr(result, n)) for n in ("logprob_token_ids", "logprobs", "selected_token_ranks")]

    for label, side, rel, obj in ((fd.label, fd, SAMPLER, fd_sampler), (rep.label, rep, SAMPLER, rep_sampler),
                                  (fd.label, fd, OUTPUT, fd_tensors), (rep.label, rep, OUTPUT, rep_tensors)):
        if obj is None:
            why = side.import_errors.get(rel, "not defined")
            report.add(section, f"{label} {rel}", "SKIP", f"not importable ({why}): its probes are skipped")
    if fd_sampler is not None and rep_sampler is not None:
        run_both("Sampler.compute_logprobs(logits)",
                 lambda S, T: [("logprobs", S.__new__(S).compute_logprobs(logits.clone()))])
        for k in (0, 3):
            for label, ids in (("[N]", token_ids), ("[N,1]", token_ids.unsqueeze(-1))):
                run_both(
                    f"Sampler.gather_logprobs(k={k}, token_ids {label})",
                    lambda S, T, k=k, ids=ids: fields(
                        S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), k, ids.clone())
                    ),
                )
    if fd_tensors is not None and rep_tensors is not None:
        run_both("LogprobsTensors.empty_cpu(2, 3)", lambda S, T: [
            (n, (str(t.dtype).rsplit(".", 1)[-1], list(t.shape), _place_kind(t)))
            for n, t in fields(T.empty_cpu(2, 3))
        ])

        def sliced(S, T):
            result = S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), 3, token_ids.clone())
            return fields(result.slice_rows(1, 3))

        def listed(S, T):
            result = S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), 3, token_ids.clone())
            lists = result.tolists()
            return [(n, getattr(lists, n)) for n in ("logprob_token_ids", "logprobs", "sampled_token_ranks")]

        if fd_sampler is not None and rep_sampler is not None:
            run_both("LogprobsTensors.slice_rows(1, 3)", sliced)
            run_both("LogprobsTensors.tolists()", listed)
