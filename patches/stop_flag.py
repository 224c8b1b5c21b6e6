"""Features ``stop_flag`` and ``sampled_tokens``: backport of FastDeploy PR #6176 to FastDeploy 2.4.

Why:    Every FastDeploy 2.4 decode step ends with a blocking D2H copy inside the compiled
        ``update_inputs_v1``/``update_inputs`` op (to bring ``not_need_stop`` to the host) and another
        inside ``save_output``/``save_output_topk`` (the sampled tokens). The 2.4 op cannot be fixed
        from Python: given a pinned flag it races, given a device flag it crashes
        (fastdeploy-surface.md §5.1, §10).
How:    ``share_inputs`` gains ``not_need_stop_device`` (device bool [1]; alias
        ``not_need_stop_gpu``), ``not_need_stop_pinned`` (the pinned host flag) and a pinned
        ``sampled_token_ids`` [max_num_seqs, 1] int64. FastDeploy's update op names are rebound to
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

import functools
import inspect
import logging

import numpy as np
import paddle

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.ops.stop_flag_library import MAX_BATCH
from fd_async_copy_plugin.registry.patch import Feature, IncompatibleError, Patch, Target

from ._consumers import add_substitute, build_guard, remove_substitute

log = logging.getLogger("fd_async_copy")

RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"

_UPDATE_V1_PARAMS = 14  # 13 tensors (with stop_nums) + block_size: FastDeploy 2.4's signature


class StopFlagState:
    """The stop flag and sampled-token buffers of one GPUModelRunner's ``share_inputs``."""

    def __init__(self, share_inputs, max_num_seqs: int, backend, ops, copy_tokens: bool) -> None:
        self.backend = backend
        self.ops = ops
        self.legacy = share_inputs["not_need_stop"]  # FastDeploy 2.4's pageable host flag
        # On the place of FastDeploy's own device buffers (the GPU in a worker; the CPU in tests).
        self.device = paddle.to_tensor([False], dtype="bool", place=share_inputs["stop_flags"].place)
        self.pinned = backend.new_pinned([1], "bool", "not_need_stop_pinned")
        self.tokens = backend.new_pinned([max_num_seqs, 1], "int64", "sampled_token_ids") if copy_tokens else None
        self.max_num_seqs = max_num_seqs
        self.flag_pending = False  # a flag copy was issued and not applied to the legacy flag yet
        self.token_source = None  # this step's device sampled_token_ids, mirrored in self.tokens
        self._reset_host_buffers()
        share_inputs["not_need_stop_device"] = self.device
        share_inputs["not_need_stop_gpu"] = self.device  # name used by #6176's first version
        share_inputs["not_need_stop_pinned"] = self.pinned
        if self.tokens is not None:
            share_inputs["sampled_token_ids"] = self.tokens

    PINNED_KEYS = ("not_need_stop_pinned", "sampled_token_ids")

    def detach(self, share_inputs) -> None:
        """Hand the runner back to FastDeploy's own path (``disable()``): the legacy flag made
        current, and the keys the plugin added removed - FD 2.4's reset would ``fill_()`` them."""
        self.sync("disable")
        added = {
            "not_need_stop_device": self.device,
            "not_need_stop_gpu": self.device,
            "not_need_stop_pinned": self.pinned,
            "sampled_token_ids": self.tokens,
        }
        for key, value in added.items():
            if value is not None and share_inputs.get(key) is value:
                del share_inputs[key]

    def _reset_host_buffers(self) -> None:
        # Host->pinned memcpy through Tensor.copy_ (no Paddle op, the buffer stays pinned).
        self.pinned.copy_(paddle.to_tensor([False]).cpu(), True)
        if self.tokens is not None:
            self.tokens.copy_(paddle.full([self.max_num_seqs, 1], -1, dtype="int64").cpu(), True)

    def after_update(self, topk_ids) -> None:
        """Right after the update op: copy the device flag (and final tokens) to pinned, record."""
        self.backend.copy_d2h(self.pinned, self.device, "not_need_stop")
        if self.tokens is not None and topk_ids is not None:
            self.backend.copy_d2h(self.tokens, topk_ids, "sampled_token_ids")
            self.token_source = topk_ids
        self.backend.record("post_process")
        self.flag_pending = True

    def sync(self, reader: str) -> None:
        """Make the legacy flag current: wait for the flag copy's event, then write it through."""
        if not self.flag_pending:
            return
        value = bool(self.backend.to_host(self.pinned, reader).numpy()[0])
        self.ops.set_stop(self.legacy, value)
        self.flag_pending = False

    def host_tokens(self, reader: str):
        return self.backend.to_host(self.tokens, reader)

    def reset(self) -> None:
        self.sync("reset_share_inputs")  # a copy still in flight would land over the reset
        self.token_source = None
        self._reset_host_buffers()
        self.ops.set_stop(self.legacy, False)


class _Registry:
    """Maps a runner's legacy flag tensor (what FastDeploy passes to ops) to its state."""

    def __init__(self) -> None:
        self.by_flag: dict[int, tuple[object, StopFlagState]] = {}
        self.runners: list = []

    def add(self, state: StopFlagState, runner) -> None:
        self.by_flag[id(state.legacy)] = (state.legacy, state)
        self.runners.append(runner)

    def detach_all(self) -> None:
        for runner in self.runners:
            state = runner.__dict__.pop("_fdac_stop", None)
            if state is not None:
                state.detach(runner.share_inputs)
        self.runners.clear()
        self.by_flag.clear()

    def for_flag(self, flag) -> StopFlagState | None:
        entry = self.by_flag.get(id(flag))
        return entry[1] if entry is not None and entry[0] is flag else None

    def for_tokens(self, tokens) -> StopFlagState | None:
        for _, state in self.by_flag.values():
            if state.token_source is not None and state.token_source is tokens:
                return state
        return None

    def all(self):
        return [state for _, state in self.by_flag.values()]

    def substitute(self, value, reader: str):
        """For the save consumers: FastDeploy's flag made current (same object), the step's device
        sampled tokens swapped for their pinned copy read after the event."""
        state = self.for_flag(value)
        if state is not None:
            state.sync(reader)
            return value
        state = self.for_tokens(value)
        if state is not None:
            return state.host_tokens(reader)
        return value


# --- runner patches -----------------------------------------------------------------------------


def _is_cuda_runner(runner_module) -> bool:
    platform = getattr(runner_module, "current_platform", None)
    return platform is None or platform.is_cuda()


def build_init_share_inputs(original, ctx):
    registry: _Registry = ctx.state["stop_flag"]
    runner_module = ctx.module(RUNNER)
    copy_tokens = "sampled_tokens" in ctx.features

    @functools.wraps(original)
    def _init_share_inputs(self, max_num_seqs: int):
        original(self, max_num_seqs)
        if not _is_cuda_runner(runner_module):
            return  # DCU/Iluvatar subclasses on their platforms keep FastDeploy 2.4's behaviour
        on_gpu = self.share_inputs["stop_flags"].place.is_gpu_place()
        if on_gpu != (ctx.backend.name == "cuda"):
            where = "GPU" if on_gpu else "CPU"
            _stand_down(ctx, f"backend {ctx.backend.name!r} cannot update FastDeploy's {where} buffers; "
                             f"use FD_ASYNC_COPY_BACKEND={'cuda' if on_gpu else 'host'}")
            return
        if on_gpu:
            problem = probe_accessors(ctx, self.share_inputs["stop_flags"].place) or ctx.state.setdefault(
                "cuda_probe", probe_cuda_kernels(ctx.ops, self.share_inputs["stop_flags"].place)
            )
            if problem:
                _stand_down(ctx, problem)
                return
        if int(max_num_seqs) > MAX_BATCH:
            reason = (
                f"max_num_seqs={max_num_seqs} exceeds {MAX_BATCH}, the one-block limit of the stop-flag "
                "kernels (FastDeploy's own update kernels have the same limit but miscount silently); "
                "lower max_num_seqs"
            )
            _stand_down(ctx, reason)
            return
        state = StopFlagState(self.share_inputs, int(max_num_seqs), ctx.backend, ctx.ops, copy_tokens)
        registry.add(state, self)
        self._fdac_stop = state

    return _init_share_inputs


def probe_accessors(ctx, place) -> str:
    """The cuda backend's startup probe on this device, with the stop-flag kernels (see
    ``runtime/probe.py``): "" when Paddle's accessors agree with the CUDA layer, else why not."""
    ensure = getattr(ctx.backend, "ensure_probed", None)
    if ensure is None:
        return ""
    from fd_async_copy_plugin.runtime.cuda import AccessorProbeError

    try:
        ensure(place.gpu_device_id(), kernels=ctx.ops.cuda_library)
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

        ops.update_inputs_v1_cuda(
            full([1, 1], True, "bool"), full([1], False, "bool"), full([1, 1], 0, "int32"),
            full([1, 1], 0, "int32"), full([1, 1], 0, "int32"), full([1, 1], 0, "int32"),
            full([1, 1], 1, "int64"), full([1, 1], 0, "int64"), full([1, 1], 0, "int64"),
            full([1, 1], 0, "int32"), None, full([1, 1], 0, "int64"), full([1], False, "bool"), 1,
            False,
        )
        if place.is_gpu_place():
            paddle.device.synchronize()  # once, at construction: surfaces launch errors here
    except Exception as exc:
        return f"the CUDA stop-flag kernel cannot run here ({type(exc).__name__}: {exc}); rebuild with " \
               "FD_ASYNC_COPY_CUDA_ARCHS set for this GPU (`fd-async-copy build-ops --force`)"
    return ""


def _stand_down(ctx, reason: str) -> None:
    """This runner keeps FastDeploy's own stop-flag path (strict mode: refuse to start)."""
    if ctx.strict:
        raise ValueError(f"fd_async_copy stop_flag: {reason}")
    log.error("fd_async_copy: %s; this runner keeps FastDeploy's own stop-flag path", reason)
    ctx.stand_down(reason)


def build_reset_share_inputs(original, ctx):
    @functools.wraps(original)
    def reset_share_inputs(self, *args, **kwargs):
        state = getattr(self, "_fdac_stop", None)
        if state is None:
            return original(self, *args, **kwargs)
        # FastDeploy 2.4's reset fill_()s every key it names, sampled_token_ids included: a Paddle
        # op on a pinned tensor would move it to the GPU. Hide the pinned keys and reset them here.
        hidden = {k: self.share_inputs.pop(k) for k in StopFlagState.PINNED_KEYS if k in self.share_inputs}
        try:
            state.sync("reset_share_inputs")
            return original(self, *args, **kwargs)
        finally:
            self.share_inputs.update(hidden)
            state.reset()

    return reset_share_inputs


def build_insert(original, ctx):
    @functools.wraps(original)
    def insert(self, *args, **kwargs):
        state = getattr(self, "_fdac_stop", None)
        if state is not None:
            state.sync(original.__name__)  # the insertion's write must be the last one
        result = original(self, *args, **kwargs)
        if state is not None:
            state.ops.set_stop(state.pinned, bool(state.ops.get_stop(state.legacy).item()))
        return result

    return insert


def build_not_need_stop(original, ctx):
    @functools.wraps(original)
    def not_need_stop(self) -> bool:
        state = getattr(self, "_fdac_stop", None)
        if state is None:
            return original(self)
        state.sync("not_need_stop")
        return bool(state.ops.get_stop(state.legacy).item())

    return not_need_stop


# --- post-processing patches --------------------------------------------------------------------


def check_update_inputs_v1(original, ctx) -> None:
    if original is None:
        raise IncompatibleError("update_inputs_v1 is not available (FastDeploy's ops are not compiled)")
    try:
        params = inspect.signature(original).parameters.values()
    except (TypeError, ValueError):
        return  # a pybind function: no introspectable signature
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return  # FastDeploy's op wrappers forward *args: nothing to count
    count = len(params)
    if count != _UPDATE_V1_PARAMS:
        raise IncompatibleError(f"update_inputs_v1 takes {count} arguments, FastDeploy 2.4's takes {_UPDATE_V1_PARAMS}")


def _device_op(ctx, name: str):
    if ctx.backend.name == "cuda":
        op = getattr(ctx.ops, f"{name}_cuda", None)
        if op is None:
            raise IncompatibleError(f"the CUDA {name} kernel library is not built: {ctx.ops.cuda_why}")
        return op
    return getattr(ctx.ops, f"{name}_host")


def build_update_inputs_v1(original, ctx):
    registry: _Registry = ctx.state["stop_flag"]
    device_op = _device_op(ctx, "update_inputs_v1")

    def update_inputs_v1(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                         step_seq_lens_decoder, prompt_lens, topk_ids, input_ids, block_tables, stop_nums,
                         next_tokens, is_block_step, block_size):
        state = registry.for_flag(not_need_stop)
        if state is None:
            return original(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                            step_seq_lens_decoder, prompt_lens, topk_ids, input_ids, block_tables, stop_nums,
                            next_tokens, is_block_step, block_size)
        device_op(stop_flags, state.device, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                  step_seq_lens_decoder, prompt_lens, topk_ids, input_ids, block_tables, stop_nums,
                  next_tokens, is_block_step, block_size)
        state.after_update(topk_ids)

    update_inputs_v1.__wrapped__ = original
    return update_inputs_v1


def build_update_inputs(original, ctx):
    registry: _Registry = ctx.state["stop_flag"]
    device_op = _device_op(ctx, "update_inputs")

    def update_inputs(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                      input_ids, stop_nums, next_tokens, is_block_step):
        state = registry.for_flag(not_need_stop)
        if state is None:
            return original(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                            input_ids, stop_nums, next_tokens, is_block_step)
        device_op(stop_flags, state.device, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                  input_ids, stop_nums, next_tokens, is_block_step)
        # update_inputs does not rewrite the sampled tokens: they are final already.
        state.after_update(next_tokens)

    update_inputs.__wrapped__ = original
    return update_inputs


def build_post_process(original, ctx):
    registry: _Registry = ctx.state["stop_flag"]

    @functools.wraps(original)
    def post_process(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            # Dummy runs and pooling skip the save: the flag is still made current before any code
            # outside post_process can read share_inputs["not_need_stop"].
            for state in registry.all():
                state.sync("post_process")

    return post_process


class StopFlagFeature(Feature):
    name = "stop_flag"
    mirrors = "FastDeploy PR #6176 (device-side not_need_stop, get_stop/set_stop, event-synced save)"
    profiles = {
        "fastdeploy-2.4": "apply",
        "fastdeploy-2.5": "native: FastDeploy 2.5 has PR #6176",
        "fastdeploy-2.6+": "native: FastDeploy 2.6+ has PR #6176 and #6356",
    }
    needs_ops = True

    def patches(self, ctx):
        guards = [
            Patch(Target(POSTPROC, name), build_guard(name))
            for name in ("save_output", "save_output_topk", "_build_stream_transfer_data")
        ]
        return [
            Patch(Target(RUNNER, "GPUModelRunner._init_share_inputs"), build_init_share_inputs),
            Patch(Target(RUNNER, "GPUModelRunner.reset_share_inputs"), build_reset_share_inputs),
            Patch(Target(RUNNER, "GPUModelRunner.insert_tasks_v1"), build_insert),
            Patch(Target(RUNNER, "GPUModelRunner.insert_prefill_inputs"), build_insert),
            Patch(Target(RUNNER, "GPUModelRunner.not_need_stop"), build_not_need_stop),
            Patch(Target(POSTPROC, "update_inputs_v1"), build_update_inputs_v1, check_update_inputs_v1),
            Patch(Target(POSTPROC, "update_inputs"), build_update_inputs),
            *guards,
            Patch(Target(POSTPROC, "post_process"), build_post_process),
            Patch(Target(RUNNER, "post_process"), build_post_process),
            Patch(Target("worker.metax_model_runner", "post_process", required=False), build_post_process),
            Patch(Target("worker.gcu_model_runner", "post_process", required=False), build_post_process),
        ]

    def prepare(self, ctx):
        ctx.state["stop_flag"] = registry = _Registry()
        add_substitute(registry.substitute)

    def teardown(self, ctx):
        registry = ctx.state.pop("stop_flag", None)
        if registry is not None:
            remove_substitute(registry.substitute)
            registry.detach_all()


class SampledTokensFeature(Feature):
    """Declares the pinned ``sampled_token_ids`` mirror; the copy itself rides on ``stop_flag``'s
    post-update event (one event per step), so it requires that feature."""

    name = "sampled_tokens"
    mirrors = "FastDeploy PR #6176 (pinned sampled_token_ids, event-synced save)"
    profiles = dict(StopFlagFeature.profiles)
    requires = ("stop_flag",)

    def patches(self, ctx):
        return []

    def modules(self, ctx):
        # Applied in the same import callback as stop_flag, right after it.
        return StopFlagFeature().modules(ctx)


FEATURES = [StopFlagFeature(), SampledTokensFeature()]
