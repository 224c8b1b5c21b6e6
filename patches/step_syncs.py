"""Feature ``step_syncs``: one host wait per FastDeploy 2.4 decode step (the save event); no wait for
the forward at FastDeploy 2.5's sampler.

Why:    With the stop-flag and logprob backports, a plain FastDeploy 2.4 decode step still blocks the
        host at five points (fd24-step-syncs.md): **T** ``top_p_sampling`` gets the CPU tensor
        ``infer_seed`` as ``topp_seed``, so Paddle synchronizes the stream (forward, logits,
        penalties) before copying it; **S1** ``get_padding_offset`` copies the token count to the
        host; **S2** ``np.max(bad_tokens_len.numpy())``; **S3/S7** ``exist_prefill()`` reads
        ``seq_lens_encoder``; **I1** ``insert_tasks_v1`` reads ``is_block_step[idx]`` for a DECODE
        task, and every insert writes block-table rows with a synchronous pageable H2D. As long as
        T drains the stream the host stays serialized with the GPU.
How:    A host shadow of the step state the host needs (``seq_lens_this_time`` buffer,
        ``seq_lens_encoder``, ``is_block_step``, ``step_seq_lens_decoder``, ``bad_tokens_len``,
        ``block_tables``), kept exact without reproducing FastDeploy's insert code:
        - the host's own writes are observed where FastDeploy makes them (``_tensor_watch``: during
          the insert functions ``share_inputs`` hands out a stand-in for each watched tensor, whose
          ``__setitem__`` is applied to the shadow too, with the same key and value; a write made
          past it loses that shadow until reloaded);
        - what the device changes in a step is copied into pinned buffers right after the update op,
          under the stop flag's event (the one the save waits on), and read at the next insert;
        - ``recover_decode_task`` (run at the start of ``_prepare_inputs``) is replayed on the
          shadow (recover_decode_task.cu: a block-step slot whose next block exists resumes).
        With it: T - ``infer_seed`` and its increment live on the device (as develop's #6765), so
        ``top_p_sampling`` gets a device input and insert-time seed writes are device fills;
        S1 - ``get_padding_offset`` gets the count as a host tensor (the 2.4 op then copies host to
        host), and the device count is copied under the step's event and compared at the next
        step (a mismatch stands S1 down for the runner, logged); S2 - ``bad_tokens_len.numpy()``
        inside ``_prepare_inputs`` answers from the shadow (as #5548); S3/S7 - ``exist_prefill()``
        answers ``any(seq_lens_encoder > 0)`` from the shadow (as #6172's host flag); I1 - the
        block-step flag read answers from the shadow, and block-table rows are written into a
        pinned mirror and copied to the device asynchronously on the stream (as #6356).
        Whenever the host cannot know (the shadow lost track, dummy/profile runs, non-V1 scheduler,
        speculative decoding, a block column outside the table), FastDeploy's own synchronous path
        runs; every such step is counted by cause (``status()``: the runner's ``fallbacks``).
Mirrors: FastDeploy #6765/#6668 (T), #5440/#6170 (S1), #5548 (S2), #6172 (S3/S7), #6356 (I1).
FD:     2.4, with ``stop_flag`` active on the runner (its event covers the snapshot). 2.5 has
        S1/S2/S3 fixed itself; there T is removed (the seed and its increment moved to the device
        after ``GPUModelRunner.__init__``) and its two short ``token_num_event`` waits
        (``_prepare_inputs`` :1332-1341, ``_postprocess`` :2365-2371): ``TokenShadow`` keeps the
        same kind of exact host shadow, its snapshot copied right after ``update_inputs_v1`` and
        taken after the save's own wait on post_process_event (no wait of its own); FD's
        ``create_event()`` made inside ``_prepare_inputs`` is a ``DeferredEvent`` whose wait is
        owed and runs only before a read of the pinned counts the shadow does not answer (counted
        by cause). No other feature needed. I1 stays on 2.5. develop has all of them fixed.
Code:   FD 2.4's shadow in ``fd24/step_syncs.py``, FD 2.5's in ``fd25/step_syncs.py``.
Delete: ``fd24/step_syncs.py`` when FastDeploy 2.4 is no longer served; ``fd25/step_syncs.py`` with 2.5.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys

import numpy as np
import paddle

from fd_async_copy_plugin.registry.patch import IncompatibleError, Junction, Patch, Target

from .runner import FeatureRunners, RunnerFeature, line
from ._tensor_watch import CREATE_EVENT, HOST_TYPES, Watched, basic_key, host_value, _UNKNOWN

RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"
INPUT_BATCH = "worker.input_batch"
log = logging.getLogger("fd_async_copy")
FD24, FD25 = ("fastdeploy-2.4",), ("fastdeploy-2.5",)
#: what the device changes during a step (the update op), copied to pinned buffers after it
SNAPSHOT = ("this_time", "enc", "block_step", "step_dec")


class _Mirror(Watched):
    """A watched tensor whose host writes are applied to the shadow too (``shadow.host_write``; FD
    2.4's ``StepShadow`` and FD 2.5's ``TokenShadow``); a write it cannot follow loses that shadow."""

    def __init__(self, shadow, name: str, tensor) -> None:
        super().__init__(tensor)
        self.shadow, self.name = shadow, name

    def setitem(self, key, value) -> None:
        self.tensor[key] = value  # FastDeploy's write, as Paddle makes it
        v = value if type(value) in HOST_TYPES else host_value(value, self.tensor)
        if v is _UNKNOWN or not (type(key) is slice or basic_key(key)):
            self.shadow.lose(self.name, f"a write FastDeploy made to {self.name} with a device value or a mask")
        else:
            self.shadow.host_write(self.name, key, v)

    def unseen(self) -> None:
        self.shadow.fallback(f"a write to {self.name} past the watch (an earlier reference or another thread)")
        self.shadow.lose(self.name, "a write FastDeploy made past the watch")


class Shadow:
    """The host's exact copy of part of one runner's step state (FD 2.4's ``StepShadow``, FD 2.5's
    ``TokenShadow``): ``tensors`` (name -> FastDeploy's tensor), ``snap`` (their pinned copies),
    ``arrays`` (the host values) and ``_known`` (every name; a write it cannot follow loses it)."""

    #: the names only the host writes: once lost, only a load brings them back
    host_written: tuple = ("tables",)
    lost_until = "the next snapshot or reload"

    def __init__(self, runner, backend, block_size: int, tensors: dict, served, fallbacks, modules) -> None:
        self.backend, self.glue = backend, backend.glue
        self.modules = modules  # FastDeploy's runner and post-process modules
        self.block_size, self.share_inputs, self.tensors = int(block_size), runner.share_inputs, tensors
        self.snap = {name: backend.new_pinned(self.glue.shape(t), self.glue.dtype(t), f"step_syncs.{name}", True)
                     for name, t in tensors.items()}  # (private: FastDeploy gets host arrays of them)
        self.arrays: dict[str, np.ndarray] = {}
        self._known: dict[str, bool] = dict.fromkeys(tensors, False)
        self.served, self.fallbacks = served, fallbacks
        #: FD 2.5: the event of an issued snapshot not taken yet, and the host writes (and
        #: recover replays) made and names lost since it was issued (FD 2.4 takes it before an insert)
        self.pending, self.log, self.lost_while_pending = None, [], set()

    def known(self, *names: str) -> bool:
        return all(map(self._known.__getitem__, names))

    def lose(self, name: str, why: str) -> None:
        if self._known[name]:
            log.info("fd_async_copy step_syncs: lost track of %s (%s); FastDeploy's own path until %s",
                     name, why, self.lost_until)
        self._known[name] = False
        if self.pending is not None:
            self.lost_while_pending.add(name)

    def lose_all(self, why: str) -> None:
        for name in self._known:
            self.lose(name, why)

    def fallback(self, cause: str) -> None:
        self.fallbacks[cause] += 1

    def host_write(self, name: str, key, value) -> None:
        """FastDeploy's host write to the tensor behind ``name`` (``_Mirror``), on its shadow too;
        while a snapshot of ``name`` is in flight (FD 2.5's ``pending``) it is kept for after it."""
        if self.pending is not None and name in SNAPSHOT:
            self.log.append((name, key, np.array(value, copy=True)))
            return
        if not self._known[name]:
            return
        try:
            self.arrays[name][key] = value
        except Exception as exc:  # never fail FastDeploy's write: the shadow of it is lost instead
            self.lose(name, f"a write FastDeploy made to {name} it cannot follow ({exc})")

    def load(self, why: str) -> None:
        """Every shadow from the device (copies, one event, one wait): at construction and after a
        dummy run, a reset or a write the host could not follow - never in a plain decode step."""
        backend = self.backend
        for name, t in self.tensors.items():
            backend.copy_d2h(self.snap[name], t, f"step_syncs.load.{name}")
        backend.wait(backend.record("step_syncs.load"), f"step_syncs.load({why})")
        for name in self.tensors:
            self.arrays[name] = backend.read(self.snap[name], f"step_syncs.load.{name}")
            self._known[name] = True
        self.pending, self.log, self.lost_while_pending = None, [], set()
        self.fallbacks[f"shadow loaded ({why})"] += 1

    def ensure_loaded(self) -> None:
        if not self.known(*self.host_written):
            self.load("after a dummy run, a reset or an untracked write")


def replay_recover(arrays: dict, num_running: int, block_size: int) -> bool:
    """recover_decode_task.cu on host arrays, in place: a block-step slot whose next block exists
    resumes decoding. False (nothing changed) when a block column is outside the table."""
    this_time, block_step = arrays["this_time"].reshape(-1), arrays["block_step"].reshape(-1)
    step_dec, enc, tables = arrays["step_dec"].reshape(-1), arrays["enc"].reshape(-1), arrays["tables"]
    slots = block_step[:num_running].nonzero()[0]
    cols = [int(step_dec[i]) // block_size for i in slots]
    if any(c < 0 or c >= tables.shape[1] for c in cols):
        return False
    for i, col in zip(slots, cols):
        if tables[i, col] != -1:
            block_step[i] = False
            this_time[i] = 1
            enc[i] = 0
    return True


class RunnerSyncs:
    """One runner's step_syncs part: the device seed, and on FastDeploy 2.4 the shadow."""

    def __init__(self, shadow=None, registry: FeatureRunners | None = None) -> None:
        #: FD 2.4's ``StepShadow``; FD 2.5's ``TokenShadow``, or None where the seed is all it moves
        self.shadow = shadow
        self.registry = registry  # the feature's runners (a runner stood down mid-run)
        self.increment = None  # the device copy of runner.infer_seed_increment
        self.seed = None  # FastDeploy 2.5: the device infer_seed made at construction
        # what was answered on the host, and why FastDeploy's own path ran (the shadow's counters on 2.4)
        self.served = shadow.served if shadow is not None else collections.Counter()
        self.fallbacks = shadow.fallbacks if shadow is not None else collections.Counter()
        self.token_off = ""  # FastDeploy 2.5: why this runner has no token-count shadow ("" when it has)
        #: FastDeploy 2.5: the last step's token_num_event(s) whose wait the plugin skipped
        self.unwaited: list = []

    def report(self) -> dict:
        return {"reason": getattr(self.shadow, "s1_off", "") or self.token_off, "fallbacks": dict(self.fallbacks),
                "served": dict(self.served)}


def _device_copy(t, like):
    """``t`` as a tensor on FastDeploy's device (made as FastDeploy makes its buffers: no place)."""
    out = paddle.to_tensor(np.array(t.numpy()))
    if str(out.place) != str(like.place):
        raise ValueError(f"a new tensor lands on {out.place}, FastDeploy's buffers on {like.place}")
    return out


def own_path_reason(runner, runner_module) -> str:
    """Why this runner's step cannot use the shadow ("" when it can)."""
    envs = getattr(runner_module, "envs", None) or sys.modules.get(runner_module.__name__.split(".worker.")[0] + ".envs")
    if envs is not None and not getattr(envs, "ENABLE_V1_KVCACHE_SCHEDULER", True):
        return "non-V1 scheduler (step_cuda rewrites the step state on the device)"
    if getattr(runner, "speculative_decoding", False):
        return "speculative decoding"
    if getattr(getattr(runner, "parallel_config", None), "use_ep", False):
        return "expert parallelism (an idle step returns before the update op: no snapshot)"
    return ""


def shadow_not_exact(runner, runner_module, postproc) -> str:
    """Why no shadow answer may be served for ``runner`` now ("" when they may): the runner's own
    path (``own_path_reason``), or the update op is no longer the plugin's (a reloaded FastDeploy
    module): then no snapshot follows the device's changes."""
    why = own_path_reason(runner, runner_module)
    if not why and Junction.at(postproc, "update_inputs_v1") is None:
        why = "update_inputs_v1 is FastDeploy's own again (module reloaded?): no snapshot of the step"
    return why


def check_get_padding_offset(original, ctx) -> None:
    if original is None:
        raise IncompatibleError("get_padding_offset is not available (FastDeploy's ops are not compiled)")


def _on_line(profiles, *names, step=()) -> tuple:
    return tuple(Patch(Target(RUNNER, f"GPUModelRunner.{n}"), line(n), profiles=profiles, step=n in step)
                 for n in names)


class StepSyncsFeature(RunnerFeature):
    name = "step_syncs"
    mirrors = ("FastDeploy #6765/#6668 (device sampling seed), #5440/#6170 (host token count), #5548 "
               "(bad_tokens_len), #6172 (exist_prefill flag), #6356 (block-step flag, async block tables)")
    profiles = {
        "fastdeploy-2.4": "apply",
        "fastdeploy-2.5": "apply",
        "fastdeploy-2.6+": "native: FastDeploy develop removed T (#6668/#6765), S1, S2, S3/S7 and I1 (#6356)",
    }
    requires = ("stop_flag",)
    patches = (
        *_on_line(FD24, "_init_share_inputs", "reset_share_inputs", "insert_tasks_v1", "insert_prefill_inputs",
                  "_dummy_prefill_inputs", "_prepare_inputs", "exist_prefill", step=("exist_prefill",)),
        Patch(Target(POSTPROC, "get_padding_offset"), line("get_padding_offset"), check_get_padding_offset,
              profiles=FD24),
        *_on_line(FD25, "__init__", "_prepare_inputs", "_postprocess", "_save_model_output", "insert_tasks_v1",
                  step=("__init__",)),
        Patch(Target(POSTPROC, "update_inputs_v1"), line("update_inputs_v1"), profiles=FD25),
        *(Patch(Target(INPUT_BATCH, f"InputBatch.{n}"), line(f"input_batch_{n}"), profiles=FD25)
          for n in ("reset_share_inputs", "swap_states")),
        dataclasses.replace(CREATE_EVENT, profiles=FD25))

    def mirrors_in(self, profile: str) -> str:
        if profile in FD25:
            return ("FastDeploy #6765 (the sampling seed on the device); 2.5's two token_num_event waits "
                    "answered from a host shadow (the block-table waits stay)")
        return self.mirrors

    def required(self, profile: str) -> tuple[str, ...]:
        # 2.4: the shadow's snapshot rides on stop_flag's event; 2.5 moves the seed only
        return self.requires if profile in FD24 else ()

    def prepare(self, ctx) -> FeatureRunners:
        return FeatureRunners(self.name, "syncs")


FEATURES = [StepSyncsFeature()]
