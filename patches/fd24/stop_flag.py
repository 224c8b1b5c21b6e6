"""Feature ``stop_flag`` (option ``sampled_tokens``): backport of FastDeploy PR #6176 to FastDeploy 2.4.

Why:    Every FastDeploy 2.4 decode step ends with a blocking D2H copy inside the compiled
        ``update_inputs_v1``/``update_inputs`` op (to bring ``not_need_stop`` to the host) and another
        inside ``save_output``/``save_output_topk`` (the sampled tokens). The 2.4 op cannot be fixed
        from Python: given a pinned flag it races, given a device flag it crashes
        (fastdeploy-surface.md §5.1, §10).
How:    ``share_inputs`` gains ``not_need_stop_device`` (device bool [1]; alias
        ``not_need_stop_gpu``), ``not_need_stop_pinned`` (the pinned host flag) and, with the
        ``sampled_tokens`` option, a pinned ``sampled_token_ids`` [max_num_seqs, 1] int64. FastDeploy's update op names are rebound to
        our ops (``custom_ops/``), which write the device flag with no host copy; right after them
        the device flag and the final sampled tokens are copied non-blocking into the pinned buffers
        and one event is recorded. The save consumers (``save_output``, ``save_output_topk``, the ZMQ
        payload builder) wait on that event - the step's one host wait - and read the pinned copies.
        ``share_inputs["not_need_stop"]`` stays FastDeploy 2.4's *pageable* flag: 2.4-style code
        (``[0]``, ``bool()``, ``.numpy()``, ``speculate_update``) keeps working and cannot move a
        pinned buffer to the GPU (Paddle does that to a pinned tensor any op touches - the bug
        #6176 tripped over). It is refreshed from the pinned flag after the event, and is correct
        whenever code outside ``post_process`` reads it. ``not_need_stop()`` returns a Python bool
        through ``get_stop``.
Mirrors: FastDeploy PR #6176.
FD:     2.4 only (2.5+ have #6176: ``native``). Speculative decoding (``post_process_specualate``)
        stays on the 2.4 path; non-CUDA runners (Metax, GCU, XPU, ...) and non-CUDA platforms are
        left untouched (no state is created for them, so every wrapper passes through).
Delete: when FastDeploy 2.4 is no longer served.
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import paddle

from fd_async_copy_plugin.ops import OpsUnavailable, load_ops as load_stop_flag_ops  # (tests replace it)
from fd_async_copy_plugin.ops.stop_flag_library import MAX_BATCH
from fd_async_copy_plugin.registry.patch import IncompatibleError, Patch, Target

from ..common import add_substitute, remove_substitute
from ..runner import FeatureRunners, RunnerFeature, is_cuda_runner, line, runner_state

log = logging.getLogger("fd_async_copy")

RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"

_UPDATE_V1_PARAMS = 14  # 13 tensors (with stop_nums) + block_size: FastDeploy 2.4's signature


class StopFlagState:
    """The stop flag and sampled-token buffers of one GPUModelRunner's ``share_inputs``."""

    def __init__(self, share_inputs, max_num_seqs: int, backend, ops, copy_tokens: bool, runner_state) -> None:
        self.backend, self.share_inputs, self.ops, self.max_num_seqs = backend, share_inputs, ops, max_num_seqs
        self.runner = runner_state  # runner.RunnerState: what the other parts need after the update op
        self.legacy = share_inputs["not_need_stop"]  # FastDeploy 2.4's pageable host flag
        # On the place of FastDeploy's own device buffers (the GPU in a worker; the CPU in tests).
        self.device = paddle.to_tensor([False], dtype="bool", place=share_inputs["stop_flags"].place)
        self.pinned = backend.new_pinned([1], "bool", "not_need_stop_pinned")
        self.tokens = backend.new_pinned([max_num_seqs, 1], "int64", "sampled_token_ids") if copy_tokens else None
        self.flag_pending = False  # a flag copy was issued and not applied to the legacy flag yet
        self.token_source = None  # this step's device sampled_token_ids, mirrored in self.tokens
        self._reset_host_buffers()
        # (``not_need_stop_gpu``: the name #6176's first version used)
        self.added = {"not_need_stop_device": self.device, "not_need_stop_gpu": self.device,
                      "not_need_stop_pinned": self.pinned, "sampled_token_ids": self.tokens}
        if self.tokens is None:
            del self.added["sampled_token_ids"]
        share_inputs.update(self.added)

    PINNED_KEYS = ("not_need_stop_pinned", "sampled_token_ids")

    def detach(self) -> None:
        """Hand the runner back to FastDeploy's own path (``disable()``): the legacy flag made
        current, and the keys the plugin added removed - FD 2.4's reset would ``fill_()`` them."""
        self.sync("disable")
        for key, value in self.added.items():
            if self.share_inputs.get(key) is value:
                del self.share_inputs[key]

    def _reset_host_buffers(self) -> None:
        # Host->pinned memcpy through Tensor.copy_ (no Paddle op, the buffer stays pinned). The
        # sources are made on the host: ``paddle.full(...).cpu()`` would be a GPU allocation and a
        # blocking D2H in a worker (device tracking catches it).
        self.pinned.copy_(paddle.to_tensor(np.array([False]), place=paddle.CPUPlace()), True)
        if self.tokens is not None:
            minus_one = np.full([self.max_num_seqs, 1], -1, dtype="int64")
            self.tokens.copy_(paddle.to_tensor(minus_one, place=paddle.CPUPlace()), True)

    def after_update(self, topk_ids) -> None:
        """Right after the update op: copy the device flag (and final tokens) to pinned with the
        other parts' copies (step_syncs, overlap), then record: the step's copies in one batch."""
        copies = [(self.pinned, self.device, "not_need_stop")]
        if self.tokens is not None and topk_ids is not None:
            copies.append((self.tokens, topk_ids, "sampled_token_ids"))
            self.token_source = topk_ids
        self.backend.copy_d2h_many(copies + self.runner.step_copies(), "post_process")
        self.flag_pending = True

    def sync(self, reader: str) -> None:
        """Make the legacy flag current: wait for the flag copy's event, then write it through."""
        if self.flag_pending:
            self.ops.set_stop(self.legacy, bool(self.backend.host_array(self.pinned, reader)[0]))
            self.flag_pending = False

    def flag(self, reader: str) -> bool:
        """``not_need_stop()``: the legacy flag made current, as a Python bool."""
        self.sync(reader)
        return bool(self.ops.get_stop(self.legacy).item())

    def hide_pinned(self) -> dict:
        """FastDeploy 2.4's reset ``fill_()``s every key it names, ``sampled_token_ids`` included: a
        Paddle op on a pinned tensor would move it to the GPU. The pinned keys, taken out (put them
        back with ``share_inputs.update``; ``reset()`` resets them)."""
        return {k: self.share_inputs.pop(k) for k in self.PINNED_KEYS if k in self.share_inputs}

    def after_insert(self) -> None:
        """After an insert wrote the legacy flag: the pinned flag follows it."""
        self.ops.set_stop(self.pinned, bool(self.ops.get_stop(self.legacy).item()))

    def host_tokens(self, reader: str):
        return self.backend.to_host(self.tokens, reader)

    def reset(self) -> None:
        self.sync("reset_share_inputs")  # a copy still in flight would land over the reset
        self.token_source = None
        self._reset_host_buffers()
        self.ops.set_stop(self.legacy, False)


class StopFlagRunners(FeatureRunners):
    """The feature's state (``ctx.state``): the loaded ops, whether sampled tokens are mirrored, and
    each patched runner's ``StopFlagState``, also found by its legacy flag tensor (what FastDeploy
    passes to the ops)."""

    def __init__(self, ops, copy_tokens: bool, device_ops: dict) -> None:
        super().__init__("stop_flag", "stop")
        # device_ops: FastDeploy's update op name -> the plugin's (host or CUDA)
        self.ops, self.device_ops, self.copy_tokens = ops, device_ops, copy_tokens
        self.cuda_probe: str | None = None  # the CUDA kernel probe's result, once per process

    def for_flag(self, flag) -> StopFlagState | None:
        return next((state for state in self.parts() if state.legacy is flag), None)

    def substitute(self, value, reader: str):
        """For the save consumers: FastDeploy's flag made current (same object), the step's device
        sampled tokens swapped for their pinned copy read after the event."""
        for state in self.parts():
            if state.legacy is value:
                state.sync(reader)
                return value
            if value is not None and state.token_source is value:
                return state.host_tokens(reader)
        return value

    def after_post_process(self, share_inputs) -> None:
        """Dummy runs and pooling skip the save: the flag is still made current before any code
        outside post_process can read ``share_inputs["not_need_stop"]``. Only the calling runner's
        (FD passes its share_inputs by keyword; another runner's flag is its own business: runners on
        several threads, docs/tensor-parallel.md), and not while overlap defers the step's save."""
        for state in self.parts():
            if (share_inputs is None or state.share_inputs is share_inputs) and not state.runner.save_deferred():
                state.sync("post_process")


# --- runner patches -----------------------------------------------------------------------------


def set_up(ctx, runner, max_num_seqs: int) -> None:
    """After FastDeploy's ``_init_share_inputs``: the runner's stop part, or why it keeps FastDeploy's
    own path (recorded for this runner only)."""
    registry: StopFlagRunners = ctx.state
    if not is_cuda_runner(ctx.module(RUNNER)):
        return  # DCU/Iluvatar subclasses on their platforms keep FastDeploy 2.4's behaviour
    if getattr(runner, "speculative_decoding", False):  # its configuration, not a problem: INFO
        registry.stand_down(runner, "speculative decoding: FastDeploy's speculative path (post_process_specualate, "
                                    "speculate_update) writes the stop flag and saves the tokens", logging.INFO)
        return
    place = runner.share_inputs["stop_flags"].place
    on_gpu, reason = place.is_gpu_place(), ""
    if on_gpu != (ctx.backend.name == "cuda"):
        reason = (f"backend {ctx.backend.name!r} cannot update FastDeploy's {'GPU' if on_gpu else 'CPU'} "
                  f"buffers; use FD_ASYNC_COPY_BACKEND={'cuda' if on_gpu else 'host'}")
    elif on_gpu:
        reason = probe_accessors(ctx.backend, registry.ops, place)
        if not reason and registry.cuda_probe is None:
            registry.cuda_probe = probe_cuda_kernels(registry.ops, place)
        reason = reason or registry.cuda_probe
    if not reason and int(max_num_seqs) > MAX_BATCH:
        reason = (f"max_num_seqs={max_num_seqs} exceeds {MAX_BATCH}, the one-block limit of the stop-flag "
                  "kernels (FastDeploy's own update kernels have the same limit but miscount silently); "
                  "lower max_num_seqs")
    if not reason:
        registry.add(runner, StopFlagState(runner.share_inputs, int(max_num_seqs), ctx.backend, registry.ops,
                                           registry.copy_tokens, runner_state(runner, create=True)))
    elif ctx.strict:  # this runner keeps FastDeploy's own stop-flag path (strict mode: refuse to start)
        raise ValueError(f"fd_async_copy stop_flag: {reason}")
    else:  # recorded for this runner only: other runners of the process may run patched
        registry.stand_down(runner, reason)


def probe_accessors(backend, ops, place) -> str:
    """The cuda backend's startup probe on this device, with the stop-flag kernels (see
    ``runtime/probe.py``): "" when Paddle's accessors agree with the CUDA layer, else why not."""
    ensure = getattr(backend, "ensure_probed", None)
    if ensure is None:
        return ""
    from fd_async_copy_plugin.runtime.cuda import AccessorProbeError

    try:
        ensure(place.gpu_device_id(), kernels=ops.cuda_library)
    except AccessorProbeError as exc:
        return str(exc)
    return ""


def probe_cuda_kernels(ops, place) -> str:
    """Launch the update kernel once on a 1-slot batch at runner construction; "" when it ran.

    A kernel that cannot run on this GPU (e.g. built for other architectures) must stand the
    feature down here, not raise in the middle of the first decode step. UNVERIFIED ON GPU.
    """
    try:
        def full(shape, value, dtype):
            return paddle.to_tensor(np.full(shape, value, dtype=dtype), place=place)

        ops.update_inputs_v1_cuda(full([1, 1], True, "bool"), full([1], False, "bool"),
                                  *(full([1, 1], 0, "int32") for _ in range(4)), full([1, 1], 1, "int64"),
                                  full([1, 1], 0, "int64"), full([1, 1], 0, "int64"), full([1, 1], 0, "int32"),
                                  None, full([1, 1], 0, "int64"), full([1], False, "bool"), 1, False)
        if place.is_gpu_place():
            paddle.device.synchronize()  # once, at construction: surfaces launch errors here
    except Exception as exc:
        return f"the CUDA stop-flag kernel cannot run here ({type(exc).__name__}: {exc}); rebuild with " \
               "FD_ASYNC_COPY_CUDA_ARCHS set for this GPU (`fd-async-copy build-ops --force`)"
    return ""


# --- post-processing patches --------------------------------------------------------------------


def check_update_inputs_v1(original, ctx) -> None:
    if original is None:
        raise IncompatibleError("update_inputs_v1 is not available (FastDeploy's ops are not compiled)")
    try:
        params = inspect.signature(original).parameters.values()
    except (TypeError, ValueError):
        return  # a pybind function: no introspectable signature
    # (FastDeploy's op wrappers forward *args: nothing to count)
    if len(params) != _UPDATE_V1_PARAMS and not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise IncompatibleError(f"update_inputs_v1 takes {len(params)} arguments, FastDeploy 2.4's takes "
                                f"{_UPDATE_V1_PARAMS}")


class StopFlagFeature(RunnerFeature):
    name = "stop_flag"
    mirrors = "FastDeploy PR #6176 (device-side not_need_stop, get_stop/set_stop, event-synced save)"
    profiles = {"fastdeploy-2.4": "apply", "fastdeploy-2.5": "native: FastDeploy 2.5 has PR #6176",
                "fastdeploy-2.6+": "native: FastDeploy 2.6+ has PR #6176 and #6356"}
    options = {"sampled_tokens": "mirrors FastDeploy PR #6176 (pinned sampled_token_ids, copied under the "
                                 "stop flag's event)"}
    patches = (
        *(Patch(Target(RUNNER, f"GPUModelRunner.{name}"), line(name), step=True) for name in (
            "_init_share_inputs", "reset_share_inputs", "insert_tasks_v1", "insert_prefill_inputs",
            "not_need_stop", "execute_model")),
        Patch(Target(POSTPROC, "update_inputs_v1"), line("update_inputs_v1"), check_update_inputs_v1, producer=True),
        Patch(Target(POSTPROC, "update_inputs"), line("update_inputs"), producer=True),
        *(Patch(Target(POSTPROC, name), line(name))
          for name in ("save_output", "save_output_topk", "_build_stream_transfer_data", "post_process")),
        # post_process as the runner modules imported it (Metax's and GCU's where they are loaded)
        *(Patch(Target(module, "post_process", required=module == RUNNER), line("post_process"))
          for module in (RUNNER, "worker.metax_model_runner", "worker.gcu_model_runner")))

    def unavailable(self, backend: str) -> str:
        try:
            ops = load_stop_flag_ops()
        except OpsUnavailable as exc:
            return str(exc) if str(exc).startswith("custom ops unavailable") else f"custom ops unavailable: {exc}"
        if backend == "cuda" and not ops.has_cuda_kernels:
            return f"the CUDA stop-flag kernel library is not usable: {ops.cuda_why}"
        return ""

    def prepare(self, ctx) -> StopFlagRunners:
        ops = load_stop_flag_ops()
        kind = "cuda" if ctx.backend.name == "cuda" else "host"  # (``unavailable``: cuda has its kernels)
        device_ops = {name: getattr(ops, f"{name}_{kind}") for name in ("update_inputs_v1", "update_inputs")}
        registry = StopFlagRunners(ops, "sampled_tokens" in ctx.options, device_ops)
        add_substitute(registry.substitute)
        return registry

    def quiesce(self, ctx) -> None:
        # disable(): the update ops are FastDeploy's again; make every legacy flag current before the
        # save guards go (FD's own save reads it right away, maybe on another thread).
        for state in ctx.state.parts() if isinstance(ctx.state, StopFlagRunners) else ():
            state.sync("disable")

    def teardown(self, ctx):
        if ctx.state is not None:
            remove_substitute(ctx.state.substitute)
        super().teardown(ctx)


FEATURES = [StopFlagFeature()]
