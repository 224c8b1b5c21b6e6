"""The checks ``fd-async-copy selftest`` runs against the installed FastDeploy.

Every check compares FastDeploy's **own** code before enabling the plugin with the same code after
enabling it, on the user's device (``cuda`` when Paddle can, else ``host``; on CPU also the
race-detecting ``sim`` backend), and asserts that the plugin's patched path really ran - a
comparison of FastDeploy with itself because the plugin stood down would prove nothing.

A check is a dict ``{"name", "backend", "status": "pass"|"fail"|"skipped", "reason", "figures"}``;
any ``fail`` makes the selftest exit non-zero. On a CPU machine FastDeploy's compiled ops are absent:
its GPU modules are imported through FastDeploy's own ``ops.gpu.tolerant_import_error()`` (as
``tools/check_real_fastdeploy.py`` does), the logprobs checks run on the host backend, and the
stop-flag kernel comparison is skipped with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

from . import kernel_compare

SAMPLER = "model_executor.layers.sample.sampler"
OUTPUT = "worker.output"
RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"  # the logprobs feature guards its save op
OPS = "model_executor.ops.gpu"

#: Widths of the logprobs asked for: none, one, FastDeploy's default max, the whole vocabulary.
def widths(vocab: int) -> tuple[int, ...]:
    return (0, 1, 20, vocab)


DEFAULT_VOCAB = 32_000  # on a GPU
CPU_VOCAB = 2_048  # on CPU Paddle, where top-k over a real vocabulary costs ~0.1 s a call
ROWS = (1, 7, 64)
FULL_VOCAB_ROWS = (1, 5)


class CheckFailed(AssertionError):
    """A check found a difference (the message says which)."""


def _check(name: str, backend: str, status: str, reason: str = "", **figures) -> dict:
    return {"name": name, "backend": backend, "status": status, "reason": reason, "figures": figures}


# --- detection and import ----------------------------------------------------------------------


def detect(root: str = "fastdeploy"):
    """What ``doctor`` reports: the profile read from FastDeploy's source (nothing imported)."""
    from ...profile import detect_profile

    return detect_profile(root)


_scratch: list[str] = []


def _quiet_fastdeploy_environment() -> None:
    """FastDeploy writes ``./log`` and ``/tmp/prom_main_*`` on import: send both to a scratch folder
    (unless the user set them), removed at exit."""
    if "FD_LOG_DIR" in os.environ and "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return
    scratch = tempfile.mkdtemp(prefix="fd-async-copy-selftest-")
    _scratch.append(scratch)
    atexit.register(shutil.rmtree, scratch, True)
    os.environ.setdefault("FD_LOG_DIR", os.path.join(scratch, "log"))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", scratch)


def import_fastdeploy(root: str = "fastdeploy") -> dict:
    """Import the modules the checks need. FastDeploy's compiled ops absent (a CPU machine, a
    source tree): its own ``tolerant_import_error()`` turns every op into None first, so that its
    GPU modules import; ``compiled_ops`` then says so and the kernel comparison is skipped.

    Returns ``{"modules": {rel: module}, "errors": {rel: text}, "compiled_ops": bool,
    "ops_reason": str}``.
    """
    _quiet_fastdeploy_environment()
    out: dict = {"modules": {}, "errors": {}, "compiled_ops": False, "ops_reason": ""}
    with contextlib.redirect_stdout(sys.stderr):  # FastDeploy prints on import
        try:
            ops = importlib.import_module(f"{root}.{OPS}")
        except Exception as exc:  # noqa: BLE001
            ops = None
            out["ops_reason"] = f"{root}.{OPS} does not import ({type(exc).__name__}: {exc})"
        if ops is not None:
            if getattr(ops, "update_inputs_v1", None) is not None:
                out["compiled_ops"] = True
                out["ops_reason"] = f"{root}.{OPS}.update_inputs_v1 is importable"
            else:
                out["ops_reason"] = (f"{root}.{OPS} has no update_inputs_v1 (a CPU machine, or a source tree "
                                     "without FastDeploy's custom ops built)")
                tolerant = getattr(ops, "tolerant_import_error", None)
                if callable(tolerant):
                    tolerant()
        for rel in (OUTPUT, SAMPLER, POSTPROC, RUNNER):
            try:
                out["modules"][rel] = importlib.import_module(f"{root}.{rel}")
            except Exception as exc:  # noqa: BLE001 - reported per check
                out["errors"][rel] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if out["compiled_ops"]:
            out["ops"] = sys.modules.get(f"{root}.{OPS}", ops)
    return out


# --- tensors -----------------------------------------------------------------------------------


def _numpy(t) -> np.ndarray:
    """An owned numpy copy of a Paddle tensor wherever it lives, without a Paddle op on pinned
    memory (read through the pointer for host tensors)."""
    from ...runtime.backend import host_view

    place = t.place
    if place.is_gpu_place():
        return np.array(t.numpy(), copy=True)
    return np.array(host_view(t), copy=True)


def _differences(label: str, want: np.ndarray, got: np.ndarray) -> list[str]:
    if want.dtype != got.dtype:
        return [f"{label}: dtype {got.dtype} != FastDeploy's {want.dtype}"]
    if want.shape != got.shape:
        return [f"{label}: shape {list(got.shape)} != FastDeploy's {list(want.shape)}"]
    if want.tobytes() != got.tobytes():  # bitwise
        width = want.dtype.itemsize
        w_bits = np.frombuffer(want.tobytes(), dtype=f"V{width}")
        g_bits = np.frombuffer(got.tobytes(), dtype=f"V{width}")
        bad = np.nonzero(w_bits != g_bits)[0]
        at = np.unravel_index(int(bad[0]), want.shape) if want.ndim else ()
        return [f"{label}: {len(bad)} of {want.size} values differ bitwise (first at {list(map(int, at))}: "
                f"{got.reshape(-1)[bad[0]].item()!r} vs FastDeploy's {want.reshape(-1)[bad[0]].item()!r})"]
    return []


def _logits(rng, rows: int, vocab: int, device: str):
    import paddle

    values = rng.standard_normal((rows, vocab)).astype("float32") * 4
    if rows and vocab > 3:
        values[0, : min(3, vocab)] = values[0, 0]  # ties: ranks and top-k order must agree too
    return paddle.to_tensor(values, place=_place(device))


def _place(device: str):
    import paddle

    return paddle.CUDAPlace(0) if device == "gpu" else paddle.CPUPlace()


def _synchronize(device: str) -> None:
    if device == "gpu":
        import paddle

        paddle.device.synchronize()


# --- the patched-path assertion ------------------------------------------------------------------


def _copier():
    """The logprobs feature's per-process state (its rings), or None when it is not applied."""
    import fd_async_copy_plugin

    applied = fd_async_copy_plugin._get_manager().applied.get("logprobs")
    return None if applied is None else applied.ctx.state  # the feature's own state (its copier)


def _gather_copies(step) -> tuple[int, int]:
    """(non-blocking, blocking) D2H copies a census step recorded in ``gather_logprobs`` (the
    plugin's copies are labelled ``gather_logprobs.<field>``; FastDeploy's own ``.cpu()`` copies,
    where the census sees them, ``Sampler.gather_logprobs.<field>``)."""
    def ours(site: str) -> bool:
        return "gather_logprobs" in site

    return (sum(ours(s) for s in step.sites("async_d2h")), sum(ours(s) for s in step.sites("blocking_d2h")))


def _is_plugin_result(result) -> bool:
    return type(result).__qualname__.endswith("[fd_async_copy]")


#: Feature states in which the plugin leaves this FastDeploy's code alone although the feature serves
#: its profile (e.g. ``incompatible``: FastDeploy's gather_logprobs is not the body the plugin
#: reproduces). The checks of that feature are skipped and the feature is named untested: like a
#: feature the replica runs did not test, a FAIL of the selftest unless ``--allow-skip``.
UNTESTED_STATES = ("skipped", "incompatible", "passthrough", "partial")


def _not_running(status: dict, feature: str, name: str, backend_name: str) -> dict | None:
    """None when ``feature`` is applied; otherwise the check ``name`` as skipped (untested or native)
    or failed (``failed``, ``pending``: the plugin broke on this FastDeploy)."""
    entry = status["features"].get(feature, {})
    state, why = entry.get("state"), entry.get("reason", "")
    if state == "applied":
        return None
    if state in UNTESTED_STATES:
        return _check(name, backend_name, "skipped", f"{feature} is {state} on this FastDeploy ({why}): not tested",
                      untested_feature=feature)
    if state == "native":
        return _check(name, backend_name, "skipped", f"{feature} is native on this profile ({why})")
    return _check(name, backend_name, "fail", f"{feature} is {state} on this FastDeploy ({why})")


# --- logprobs --------------------------------------------------------------------------------------


class LogprobsCase(SimpleNamespace):
    pass


def logprobs_cases(vocab: int, seed: int = 20260601, rows=ROWS, full_rows=FULL_VOCAB_ROWS):
    """(rows, width, logits seed) for every width; token ids include the argmax and the last id."""
    cases = []
    for width in widths(vocab):
        for n in (full_rows if width == vocab else rows):
            cases.append(LogprobsCase(rows=n, width=width, seed=seed + 7 * len(cases)))
    cases.append(LogprobsCase(rows=0, width=20, seed=seed + 1000))  # an empty batch
    return cases


def _case_inputs(case, vocab: int, device: str):
    import paddle

    rng = np.random.default_rng(case.seed)
    logits = _logits(rng, case.rows, vocab, device)
    ids = rng.integers(0, vocab, size=(case.rows,)).astype("int64")
    if case.rows:
        ids[-1] = vocab - 1
    return logits, paddle.to_tensor(ids, place=_place(device))


def _sampler(modules):
    cls = modules[SAMPLER].Sampler
    return cls.__new__(cls)  # the methods checked need no runner state (FastDeploy's tests do the same)


def _gather(sampler, logits, width: int, token_ids):
    logprobs = sampler.compute_logprobs(logits.clone())
    return logprobs, sampler.gather_logprobs(logprobs.clone(), width, token_ids)


def _fd_arrays(result, device: str) -> list[np.ndarray]:
    _synchronize(device)  # FastDeploy 2.5's own copies are non-blocking into pinned memory
    return [_numpy(t) for t in result]


def _plugin_arrays(result, backend) -> list[np.ndarray]:
    """The plugin's result read the way its consumers read it: through the backend, after the
    copy event (a fresh read of the pinned buffers every time: a reused buffer shows)."""
    out = []
    for t in result:
        if backend.is_pinned(t):
            out.append(_read_after_event(backend, t))
        else:
            out.append(_numpy(t))
    return out


def _read_after_event(backend, t) -> np.ndarray:
    event = backend.event_of(t)  # the event of the copy set that wrote ``t``
    if event is not None:
        backend.wait(event, "selftest")
    return backend.read(t, "selftest")


def run_logprobs_checks(modules: dict, backend_name: str, device: str, vocab: int = DEFAULT_VOCAB,
                        cases=None) -> list[dict]:
    """FastDeploy's ``Sampler`` and ``LogprobsTensors`` before and after ``enable()``."""
    import fd_async_copy_plugin
    from ... import runtime
    from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend

    if SAMPLER not in modules or OUTPUT not in modules:
        return [_check("logprobs", backend_name, "skipped", "FastDeploy's sampler does not import here")]
    cases = cases if cases is not None else logprobs_cases(vocab)
    sampler_cls = modules[SAMPLER].Sampler
    tensors_cls = modules[OUTPUT].LogprobsTensors
    original_gather = sampler_cls.__dict__.get("gather_logprobs")
    original_slice = tensors_cls.__dict__.get("slice_rows")

    # Before: FastDeploy's own code.
    fd_async_copy_plugin.disable()
    sampler = _sampler(modules)
    expected = []
    try:
        for case in cases:
            logits, ids = _case_inputs(case, vocab, device)
            logprobs, result = _gather(sampler, logits, case.width, ids)
            arrays = _fd_arrays(result, device)
            lists = result.tolists() if case.rows else None
            sliced = _slice_expectation(result, case, device)
            expected.append((_numpy(logprobs), arrays, lists, sliced))
    except Exception as exc:  # noqa: BLE001 - nothing to compare with
        return [_check("logprobs", backend_name, "skipped",
                       f"FastDeploy's own gather_logprobs does not run here: {type(exc).__name__}: {exc}")]

    # After: the same calls with the plugin enabled on this backend. Every result is held to the
    # end, so the ring grows a slot per call (its warning is expected here, and silenced).
    quiet = _quiet_ring_warnings()
    checks: list[dict] = []
    try:
        status = fd_async_copy_plugin.enable(features=["logprobs", "sync_scope"], backend=backend_name)
        not_running = _not_running(status, "logprobs", "logprobs", backend_name)
        if not_running is not None:
            # sync_scope does not depend on logprobs: still checked
            return [not_running,
                    _slice_rows_host_check(tensors_cls, original_slice, expected, cases, backend_name, status)]
        if sampler_cls.__dict__.get("gather_logprobs") is original_gather:
            return [_check("logprobs", backend_name, "fail",
                           "logprobs is applied but Sampler.gather_logprobs is FastDeploy's own")]
        backend = replica_backend.current()
        sampler = _sampler(modules)
        held, problems, figures = [], [], {"cases": 0, "async_copies": 0, "rows": 0}
        for case, (want_logprobs, want, want_lists, want_sliced) in zip(cases, expected):
            label = f"rows={case.rows} width={case.width}"
            logits, ids = _case_inputs(case, vocab, device)
            with runtime.collecting() as census:
                census.begin_step()
                logprobs, result = _gather(sampler, logits, case.width, ids)
            step = census.steps[0]
            problems += _differences(f"compute_logprobs {label}", want_logprobs, _numpy(logprobs))
            copies, blocking = _gather_copies(step)
            if not _is_plugin_result(result) or copies != 3 or blocking:
                problems.append(
                    f"gather_logprobs {label}: the plugin's patched path did not run (result "
                    f"{type(result).__qualname__}, {copies} async / {blocking} blocking copies)")
                continue
            figures["async_copies"] += copies
            got = _plugin_arrays(result, backend)
            for name, w, g in zip(("logprob_token_ids", "logprobs", "selected_token_ranks"), want, got):
                problems += _differences(f"gather_logprobs {label} {name}", w, g)
            if case.rows:
                if result.tolists() != want_lists:
                    problems.append(f"tolists() {label} differs")
                problems += _slice_differences(result, case, want_sliced, backend, label)
            held.append((label, result, want))
            figures["cases"] += 1
            figures["rows"] += case.rows
        # Every result is still held: none of their buffers may have been reused by a later call.
        for label, result, want in held:
            for name, w, g in zip(("logprob_token_ids", "logprobs", "selected_token_ranks"), want,
                                  _plugin_arrays(result, backend)):
                problems += [f"held result changed by later calls: {d}" for d in _differences(f"{label} {name}", w, g)]
        copier = _copier()
        ring = getattr(copier, "rings", {}).get("decode")  # the decode ring
        figures["ring_slots"] = len(getattr(ring, "slots", []) or []) if ring is not None else None
        figures["held_results"] = len(held)
        checks.append(_check("logprobs: Sampler.gather_logprobs, compute_logprobs, tolists, slice_rows",
                             backend_name, "fail" if problems else "pass", "; ".join(problems[:8]), **figures))
        checks.append(_slice_rows_host_check(tensors_cls, original_slice, expected, cases, backend_name, status))
    except Exception as exc:  # noqa: BLE001 - the finding, reported as a failed check
        checks.append(_check("logprobs", backend_name, "fail", f"{type(exc).__name__}: {exc}"))
    finally:
        fd_async_copy_plugin.disable()
        quiet.close()
    return checks


def _quiet_ring_warnings():
    stack = contextlib.ExitStack()
    logger = logging.getLogger("fd_async_copy")
    level = logger.level
    logger.setLevel(logging.ERROR)
    stack.callback(logger.setLevel, level)
    return stack


def _slice_expectation(result, case, device):
    if case.rows < 1:
        return None
    start, end = (0, 1) if case.rows == 1 else (1, case.rows)
    sliced = result.slice_rows(start, end)
    return start, end, _fd_arrays(sliced, device)


def _slice_differences(result, case, want_sliced, backend, label) -> list[str]:
    start, end, want = want_sliced
    got = result.slice_rows(start, end)
    problems = []
    for name, w, g in zip(("logprob_token_ids", "logprobs", "selected_token_ranks"), want, [_numpy(t) for t in got]):
        problems += _differences(f"slice_rows({start}, {end}) {label} {name}", w, g)
    return problems


def _slice_rows_host_check(tensors_cls, original_slice, expected, cases, backend_name, status) -> dict:
    """``LogprobsTensors.slice_rows`` itself (``sync_scope`` on 2.5+) on FastDeploy-owned host tensors."""
    import paddle

    name = "sync_scope: LogprobsTensors.slice_rows on host tensors"
    not_running = _not_running(status, "sync_scope", name, backend_name)
    if not_running is not None:
        return not_running
    if tensors_cls.__dict__.get("slice_rows") is original_slice:
        return _check(name, backend_name, "fail", "sync_scope is applied but slice_rows is FastDeploy's own")
    problems, count = [], 0
    for case, (_lp, want, _lists, sliced) in zip(cases, expected):
        if sliced is None:
            continue
        start, end, want_rows = sliced
        host = tensors_cls(*(paddle.to_tensor(a, place=paddle.CPUPlace()) for a in want))
        got = host.slice_rows(start, end)
        for field, w, g in zip(("logprob_token_ids", "logprobs", "selected_token_ranks"), want_rows, got):
            problems += _differences(f"rows={case.rows} width={case.width} {field}", w, _numpy(g))
        count += 1
    return _check(name, backend_name, "fail" if problems else "pass", "; ".join(problems[:8]), slices=count)


# --- prompt logprobs ------------------------------------------------------------------------------


class _ShareInputs(dict):
    """``share_inputs`` as far as ``_get_prompt_logprobs_list`` reads it (2.5+ adds the index map)."""

    def get_index_by_batch_id(self, batch_id):
        return batch_id


def _prompt_runner(modules, vocab: int, device: str, requests, cu_seqlens):
    import paddle

    cls = modules[RUNNER].GPUModelRunner
    runner = cls.__new__(cls)
    runner.fd_config = SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=False),
                                       model_config=SimpleNamespace(logprobs_mode="raw_logprobs"))
    runner.model_config = runner.fd_config.model_config  # the replica reads it from here
    runner.scheduler_config = SimpleNamespace(max_num_seqs=4)
    runner.ori_vocab_size = vocab
    runner.prompt_logprobs_reqs = {r.request_id: r for r in requests}
    runner.in_progress_prompt_logprobs = {}
    runner.share_inputs = _ShareInputs(cu_seqlens_q=paddle.to_tensor(cu_seqlens, dtype="int32", place=_place(device)))
    runner.model = SimpleNamespace(compute_logits=lambda hidden: hidden.clone())
    runner.sampler = _sampler(modules)
    return runner


def _prompt_schedule(vocab: int, seed: int = 7):
    """Two prefill steps: request a (9 prompt tokens, 20 logprobs) in chunks 0-5 and 5-9; request b
    (5 tokens, the whole vocabulary: ``prompt_logprobs=-1``) in one chunk with a's first."""
    rng = np.random.default_rng(seed)
    prompts = {"a": rng.integers(0, vocab, 9).tolist(), "b": rng.integers(0, vocab, 5).tolist()}
    steps = [
        [("a", 0, 0, 5, 20), ("b", 1, 0, 5, -1)],
        [("a", 0, 5, 9, 20)],
    ]
    return prompts, steps, rng


def _run_prompt_schedule(modules, vocab: int, device: str):
    prompts, steps, rng = _prompt_schedule(vocab)
    requests = {}
    outputs = []
    runner = None
    for step in steps:
        cu, rows = [0], 0
        for rid, idx, start, end, k in step:
            req = requests.setdefault(rid, SimpleNamespace(
                request_id=rid, idx=idx, prompt_token_ids=prompts[rid],
                sampling_params=SimpleNamespace(prompt_logprobs=k)))
            req.prefill_start_index, req.prefill_end_index = start, end
            rows += end - start
            cu.append(rows)
        hidden = _logits(rng, rows, vocab, device)
        active = [requests[rid] for rid, *_ in step]
        if runner is None:
            runner = _prompt_runner(modules, vocab, device, active, cu)
        else:
            import paddle

            runner.prompt_logprobs_reqs.update({r.request_id: r for r in active})
            runner.share_inputs["cu_seqlens_q"] = paddle.to_tensor(cu, dtype="int32", place=_place(device))
        with contextlib.redirect_stdout(sys.stderr):
            listed = runner._get_prompt_logprobs_list(hidden)
        outputs.append([None if t is None else [_numpy(f) for f in t] for t in listed])
    return outputs


@contextlib.contextmanager
def _cpu_device_synchronize(device: str):
    """CPU Paddle refuses ``paddle.device.synchronize()`` (FastDeploy 2.5+ calls it for prompt
    logprobs): on CPU there is nothing to wait for, so FastDeploy's own run gets a counting no-op."""
    calls = [0]
    if device != "cpu":
        yield calls
        return
    import paddle

    original = paddle.device.synchronize

    def synchronize(*args, **kwargs):
        calls[0] += 1

    paddle.device.synchronize = synchronize
    try:
        yield calls
    finally:
        paddle.device.synchronize = original


def run_prompt_logprobs_check(modules: dict, backend_name: str, device: str, vocab: int = DEFAULT_VOCAB) -> dict:
    """FastDeploy's own ``GPUModelRunner._get_prompt_logprobs_list`` (on a runner holding only what
    that method reads) before and after enabling: chunked prefill, 20 and whole-vocabulary widths."""
    import fd_async_copy_plugin
    from ... import runtime

    name = "prompt logprobs: GPUModelRunner._get_prompt_logprobs_list"
    if RUNNER not in modules or SAMPLER not in modules:
        return _check(name, backend_name, "skipped", "FastDeploy's GPU model runner does not import here")
    runner_cls = modules[RUNNER].GPUModelRunner
    if "_get_prompt_logprobs_list" not in runner_cls.__dict__:
        return _check(name, backend_name, "skipped", "this FastDeploy has no prompt logprobs")
    try:
        with _cpu_device_synchronize(device) as fd_syncs:
            expected = _run_prompt_schedule(modules, vocab, device)
    except Exception as exc:  # noqa: BLE001
        return _check(name, backend_name, "skipped",
                      f"FastDeploy's own method does not run on this stand-in runner: {type(exc).__name__}: {exc}")
    fd_async_copy_plugin.disable()
    status = fd_async_copy_plugin.enable(features=["logprobs", "sync_scope"], backend=backend_name)
    try:
        not_running = _not_running(status, "logprobs", name, backend_name)
        if not_running is not None:
            return not_running
        with runtime.collecting() as census:
            census.begin_step()
            got = _run_prompt_schedule(modules, vocab, device)
        step = census.steps[0]
        problems = []
        copies, blocking = _gather_copies(step)
        if copies < 3 or blocking:
            problems.append(f"the plugin's patched path did not run ({copies} async / {blocking} blocking "
                            "copies in gather_logprobs)")
        for s, (want_step, got_step) in enumerate(zip(expected, got)):
            for idx, (w, g) in enumerate(zip(want_step, got_step)):
                if (w is None) != (g is None):
                    problems.append(f"step {s} slot {idx}: {'none' if g is None else 'a result'} where FastDeploy "
                                    f"returns {'none' if w is None else 'one'}")
                    continue
                for field, a, b in zip(("logprob_token_ids", "logprobs", "selected_token_ranks"), w or [], g or []):
                    problems += _differences(f"step {s} slot {idx} {field}", a, b)
        return _check(name, backend_name, "fail" if problems else "pass", "; ".join(problems[:8]),
                      prefill_steps=len(expected), async_copies=copies,
                      fastdeploy_device_syncs=fd_syncs[0] if device == "cpu" else "not counted on GPU",
                      plugin_device_syncs=step.count("device_sync"))
    except Exception as exc:  # noqa: BLE001
        return _check(name, backend_name, "fail", f"{type(exc).__name__}: {exc}")
    finally:
        fd_async_copy_plugin.disable()


# --- stop-flag kernels -------------------------------------------------------------------------------


def _paddle_runner(op, variant: str, device: str, flag_on_host: bool, pass_prefill_flag: bool):
    """A ``kernel_compare`` runner around a Paddle op: numpy batch -> tensors on the device (the
    flag on the host for FastDeploy 2.4's op, which dereferences it there) -> back into the batch."""
    import paddle

    names = kernel_compare.arrays(variant)
    place = _place(device)

    def run(batch: dict) -> bool:
        tensors = {}
        for name in names:
            value = batch[name]
            if value is None:
                tensors[name] = None
                continue
            where = paddle.CPUPlace() if (name == "not_need_stop" and flag_on_host) else place
            tensors[name] = paddle.to_tensor(value, place=where)
        args = [tensors[n] for n in names]
        if variant == "v1":
            args.append(int(batch["block_size"]))
            if pass_prefill_flag:
                op(*args, prefill_one_step_stop=bool(batch["prefill_one_step_stop"]))
            else:
                with _env("PREFILL_NODE_ONE_STEP_STOP_V1", "1" if batch["prefill_one_step_stop"] else "0"):
                    op(*args)
        else:
            op(*args)
        _synchronize(device)
        for name in names:
            if tensors[name] is not None and name != "not_need_stop":
                np.copyto(batch[name], _numpy(tensors[name]).reshape(batch[name].shape))
        return bool(_numpy(tensors["not_need_stop"]).reshape(-1)[0])

    return run


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def run_stop_flag_kernel_check(imported: dict, profile: str, backend_name: str, device: str,
                               min_slots: int = kernel_compare.MIN_SLOTS, max_num_seqs: int = 1024) -> list[dict]:
    """FastDeploy's compiled ``update_inputs_v1`` / ``update_inputs`` against the plugin's kernels
    (CUDA on a GPU, the host implementation on CPU) on >= 10,000 random slot states each."""
    name = "stop_flag: FastDeploy's update_inputs_v1 / update_inputs vs the plugin's kernels"
    if profile != "fastdeploy-2.4":
        return [_check(name, backend_name, "skipped",
                       f"profile {profile}: FastDeploy has its own async stop flag (stop_flag is native)")]
    if not imported.get("compiled_ops"):
        return [_check(name, backend_name, "skipped",
                       f"FastDeploy's compiled ops are not importable: {imported.get('ops_reason')}")]
    if backend_name == "sim":
        return [_check(name, backend_name, "skipped", "compared once, on the host backend")]
    try:
        from ...ops import load_ops

        ops = load_ops()
    except Exception as exc:  # noqa: BLE001 - not built: stop_flag is untested (named, and a FAIL
        # of the whole run unless --allow-skip, through the replica runs' skipped stop_flag)
        return [_check(name, backend_name, "skipped", f"the plugin's custom ops do not load: {exc} "
                       "(run fd-async-copy build-ops)")]
    fd_ops = imported["ops"]
    checks = []
    for variant, fd_name in (("v1", "update_inputs_v1"), ("v0", "update_inputs")):
        fd_op = getattr(fd_ops, fd_name, None)
        suffix = "cuda" if device == "gpu" else "host"
        mine = getattr(ops, f"{fd_name}_{suffix}", None)
        label = f"stop_flag kernels: {fd_name} (FastDeploy) vs the plugin's {suffix} kernel"
        if fd_op is None:
            checks.append(_check(label, backend_name, "skipped", f"FastDeploy has no {fd_name} op"))
            continue
        if mine is None:
            checks.append(_check(label, backend_name, "skipped", f"the plugin's {suffix} kernel is not built: "
                                 f"{getattr(ops, 'cuda_why', '')} (fd-async-copy build-ops --require-cuda)"))
            continue
        expected = _paddle_runner(fd_op, variant, device, flag_on_host=True, pass_prefill_flag=False)
        actual = _paddle_runner(mine, variant, device, flag_on_host=device != "gpu", pass_prefill_flag=variant == "v1")
        report = kernel_compare.compare(variant, expected, actual, min_slots=min_slots, max_num_seqs=max_num_seqs,
                                        stop_nums_required=True)
        ok = report["mismatching_batches"] == 0
        checks.append(_check(label, backend_name, "pass" if ok else "fail",
                             "; ".join(report["mismatches"]), **{k: v for k, v in report.items() if k != "mismatches"}))
    return checks


# --- Paddle accessors (issue 10's startup probe) ---------------------------------------------------


ACCESSOR_CHECK = "paddle accessors (startup probe of the CUDA layer)"
#: Where the Paddle-free CUDA layer (issue 10) keeps its startup probe.
PROBE_MODULE = "fd_async_copy_plugin.runtime.probe"


def paddle_accessor_checks(backend_name: str, device: str) -> dict:
    """The startup probe of the Paddle-free CUDA layer (issue 10), reported check by check.

    The selftest's one call of ``runtime.probe.probe_accessors(device, kernels=...)`` (it returns
    ``{"ok", "device", "runtime", "reason", "checks": [{"check", "ok", "detail"}], "seconds"}`` and
    never raises), with the plugin's CUDA stop-flag library when it is built (adds
    ``kernel_order``). Skipped, with the reason, where that module is not in this build or there is
    no CUDA device; the probe raising or returning something else is a failed check.
    """
    if not _probe_present():
        return _check(ACCESSOR_CHECK, backend_name, "skipped", f"not available in this build (no {PROBE_MODULE}: "
                      "the Paddle-free CUDA layer is not installed)")
    if device != "gpu":
        return _check(ACCESSOR_CHECK, backend_name, "skipped", "needs a CUDA device (the probe compares Paddle's GPU "
                      "accessors with the CUDA runtime)")
    try:
        probe = importlib.import_module(PROBE_MODULE)
        import paddle

        where = str(paddle.device.get_device())
        device_id = int(where.split(":")[1]) if ":" in where else 0
        kernels = _cuda_stop_flag_library()
        result = probe.probe_accessors(device_id, kernels=kernels)
    except Exception as exc:  # noqa: BLE001 - the probe itself failing is the finding
        return _check(ACCESSOR_CHECK, backend_name, "fail", f"the probe raised {type(exc).__name__}: {exc}")
    return accessor_report(result, backend_name, with_kernels=kernels is not None)


def _probe_present() -> bool:
    module = sys.modules.get(PROBE_MODULE, False)
    if module is not False:
        return module is not None
    try:
        return importlib.util.find_spec(PROBE_MODULE) is not None
    except (ImportError, ValueError):
        return False


def _cuda_stop_flag_library():
    """The plugin's CUDA stop-flag library for the probe's ``kernel_order`` check (None if not built)."""
    try:
        from ...ops import load_ops

        return load_ops().cuda_library
    except Exception:  # noqa: BLE001 - the probe runs without it
        return None


def accessor_report(result, backend_name: str, with_kernels: bool = False) -> dict:
    """A check dict from a ``probe_accessors`` result: every probe check with its detail in the
    figures (``format_lines`` prints one line each), ``fail`` when any failed."""
    checks = result.get("checks") if isinstance(result, dict) else None
    if not isinstance(checks, list) or not checks or not all(
            isinstance(c, dict) and {"check", "ok", "detail"} <= set(c) for c in checks):
        return _check(ACCESSOR_CHECK, backend_name, "fail", f"the probe returned no checks: {result!r:.300}")
    figures = {"device": result.get("device"), "runtime": result.get("runtime", ""),
               "seconds": result.get("seconds"), "with_kernels": with_kernels,
               "checks": [{"check": c["check"], "ok": bool(c["ok"]), "detail": str(c["detail"])} for c in checks]}
    ok = bool(result.get("ok")) and all(c["ok"] for c in figures["checks"])
    reason = "" if ok else (result.get("reason") or "; ".join(
        f"{c['check']}: {c['detail']}" for c in figures["checks"] if not c["ok"]))
    return _check(ACCESSOR_CHECK, backend_name, "pass" if ok else "fail", reason, **figures)


# --- cost -----------------------------------------------------------------------------------------


def run_cost_check(modules: dict, backend_name: str, device: str, rows: int = 64, width: int = 20,
                   vocab: int = DEFAULT_VOCAB, calls: int = 15, rounds: int = 6) -> dict:
    """Host time per ``gather_logprobs`` call, FastDeploy's own vs the plugin's, alternating rounds.

    Times the call only (what the decode loop waits for before it can go on); the device is drained
    between calls, outside the timing. A figure, not a pass/fail criterion.
    """
    import fd_async_copy_plugin

    name = "cost: host time per gather_logprobs call"
    if SAMPLER not in modules:
        return _check(name, backend_name, "skipped", "FastDeploy's sampler does not import here")
    case = LogprobsCase(rows=rows, width=width, seed=99)
    logits, ids = _case_inputs(case, vocab, device)
    logprobs = _sampler(modules).compute_logprobs(logits)
    samples = {"fastdeploy": [], "plugin": []}
    held = []
    try:
        for _ in range(rounds):
            for label in ("fastdeploy", "plugin"):
                fd_async_copy_plugin.disable()
                if label == "plugin":
                    status = fd_async_copy_plugin.enable(features=["logprobs"], backend=backend_name)
                    not_running = _not_running(status, "logprobs", name, backend_name)
                    if not_running is not None:
                        return not_running
                sampler = _sampler(modules)
                for i in range(calls + 3):
                    source = logprobs.clone()
                    _synchronize(device)
                    started = time.perf_counter()
                    result = sampler.gather_logprobs(source, width, ids)
                    elapsed = time.perf_counter() - started
                    held = [result]  # the previous step's result is released, as in FastDeploy
                    _synchronize(device)
                    if i >= 3:
                        samples[label].append(elapsed * 1e6)
        del held
    finally:
        fd_async_copy_plugin.disable()
    fd_us, plugin_us = statistics.median(samples["fastdeploy"]), statistics.median(samples["plugin"])
    return _check(name, backend_name, "pass", "", rows=rows, width=width, vocab=vocab, calls=calls * rounds,
                  fastdeploy_median_us=round(fd_us, 1), plugin_median_us=round(plugin_us, 1),
                  ratio_plugin_over_fastdeploy=round(plugin_us / fd_us, 3) if fd_us else None)


# --- the whole run ----------------------------------------------------------------------------------


def environment() -> dict:
    info = {"python": platform.python_version()}
    try:
        info["plugin"] = importlib.metadata.version("fd-async-copy-plugin")
    except importlib.metadata.PackageNotFoundError:
        info["plugin"] = "not installed (source tree)"
    try:
        import paddle

        info["paddle"] = paddle.__version__
        info["paddle_cuda_build"] = bool(paddle.is_compiled_with_cuda())
        from ...runtime.cuda import cuda_available

        ok, why = cuda_available()
        info["cuda"] = why
        if ok:
            with contextlib.suppress(Exception):
                info["gpu"] = paddle.device.cuda.get_device_name(0)
            with contextlib.suppress(Exception):
                info["cuda_version"] = paddle.version.cuda()
    except Exception as exc:  # noqa: BLE001
        info["paddle"] = f"not importable: {exc}"
    return info


def run(backends: list[str], root: str = "fastdeploy", vocab: int | None = None,
        kernel_slots: int = kernel_compare.MIN_SLOTS, max_num_seqs: int = 1024, cost: bool = True) -> dict:
    """Every FastDeploy-facing check; ``{"present", "profile", ..., "checks": [...], "ok"}``."""
    info = detect(root)
    report = {"present": info.profile != "absent", "root": root, "profile": info.profile,
              "fastdeploy_version": info.version, "location": info.location, "profile_reason": info.reason,
              "checks": [], "ok": True}
    if info.profile == "absent":
        report["note"] = f"no FastDeploy importable as {root!r}: only the reference replica was checked"
        return report
    if info.profile == "unknown":
        report["note"] = (f"FastDeploy found but not recognised ({info.reason}): the plugin leaves it untouched, "
                          "nothing to compare")
        return report
    imported = import_fastdeploy(root)
    report["compiled_ops"] = imported["compiled_ops"]
    report["ops_reason"] = imported["ops_reason"]
    report["import_errors"] = imported["errors"]
    modules = imported["modules"]
    from ...runtime.cuda import cuda_available

    device = "gpu" if cuda_available()[0] else "cpu"
    vocab = vocab or (DEFAULT_VOCAB if device == "gpu" else CPU_VOCAB)
    report["device"] = device
    report["vocab"] = vocab
    started = time.perf_counter()

    def guarded(name: str, backend_name: str, check, *args, **kwargs) -> list[dict]:
        try:
            result = check(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, not a crash
            import fd_async_copy_plugin

            fd_async_copy_plugin.disable()
            return [_check(name, backend_name, "fail", f"{type(exc).__name__}: {exc}")]
        return result if isinstance(result, list) else [result]

    for backend_name in backends:
        report["checks"] += guarded("logprobs", backend_name, run_logprobs_checks, modules, backend_name, device, vocab)
        report["checks"] += guarded("prompt logprobs", backend_name, run_prompt_logprobs_check, modules, backend_name,
                                    device, vocab)
    first = backends[0]
    report["checks"] += guarded("stop_flag kernels", first, run_stop_flag_kernel_check, imported, info.profile, first,
                                device, kernel_slots, max_num_seqs)
    report["checks"] += guarded(ACCESSOR_CHECK, first, paddle_accessor_checks, first, device)
    if cost:
        report["checks"] += guarded("cost", first, run_cost_check, modules, first, device, vocab=vocab)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["ok"] = not any(c["status"] == "fail" for c in report["checks"])
    report["untested"] = {c["figures"]["untested_feature"]: c["reason"] for c in report["checks"]
                          if c["status"] == "skipped" and "untested_feature" in c["figures"]}
    return report


def format_lines(report: dict) -> list[str]:
    lines = []
    if not report["present"]:
        lines.append(f"fd-async-copy selftest: {report['note']}")
        return lines
    where = report.get("location") or report["root"]
    lines.append(f"fd-async-copy selftest: installed FastDeploy {report['fastdeploy_version']} ({report['profile']}) "
                 f"at {where}, plugin off vs on")
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
        return lines
    lines.append(f"  device {report.get('device')}; FastDeploy's compiled ops: "
                 f"{'present' if report.get('compiled_ops') else 'absent'} ({report.get('ops_reason')})")
    for rel, error in (report.get("import_errors") or {}).items():
        lines.append(f"  import {rel}: {error}")
    for check in report["checks"]:
        word = {"pass": "ok", "fail": "FAIL", "skipped": "skipped"}[check["status"]]
        lines.append(f"  [{check['backend']:4s}] {word:7s} {check['name']}")
        figures = check["figures"]
        if check["name"].startswith("cost") and check["status"] == "pass":
            lines.append(f"                 FastDeploy {figures['fastdeploy_median_us']} us, plugin "
                         f"{figures['plugin_median_us']} us per call (median of {figures['calls']}; rows "
                         f"{figures['rows']}, width {figures['width']}, vocab {figures['vocab']}): ratio "
                         f"{figures['ratio_plugin_over_fastdeploy']}")
        elif check["name"].startswith("stop_flag kernels") and "slots" in figures:
            lines.append(f"                 {kernel_compare.summary(dict(figures, mismatches=[]))}")
        elif check["name"] == ACCESSOR_CHECK and "checks" in figures:
            lines.append(f"                 gpu:{figures['device']}, {figures['runtime']}, {figures['seconds']} s"
                         f"{'' if figures['with_kernels'] else '; no kernel_order (CUDA kernels not built)'}")
            for probe_check in figures["checks"]:
                word = "ok" if probe_check["ok"] else "FAILED"
                lines.append(f"                 {probe_check['check']}: {word} ({probe_check['detail']})")
            if check["status"] == "fail":
                continue  # the reason repeats the failed checks
        elif figures and check["status"] == "pass":
            lines.append("                 " + ", ".join(f"{k}={v}" for k, v in figures.items()))
        if check["reason"]:
            lines.append(f"                 {check['reason']}")
    return lines
