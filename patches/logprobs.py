"""Feature ``logprobs``: logprob D2H copies into preallocated, reused pinned buffers.

Why:    With ``--enable-logprob``, FastDeploy 2.4's ``Sampler.gather_logprobs`` ends with three
        blocking ``.cpu()`` copies: the host stalls every step until the GPU drains. FD 2.5
        (PR #6362) made them non-blocking but allocates three new pinned tensors (plus three
        pageable ones and three host memcpys of uninitialised data) every step; freeing pinned
        memory in a loop is a hidden device sync (~1.2-2.5 ms per free on an H200).
How:    The same maths, then ``copy_d2h`` of the three results into a slot of a ``PinnedRing``
        (allocated once, grown once when a request asks for more, never freed in the loop) and one
        recorded event. The returned ``LogprobsTensors`` is a subclass whose fields are the pinned
        buffers; every consumer waits on the event at the last moment: the save op guard
        (``save_output_topk``), ``slice_rows``/``tolists`` (ZMQ output path), prompt logprobs (which
        receive host-owned tensors), and 2.4's Keep-Sampling-Mask renormalisation in
        ``post_process_normal`` (the only consumer that reads before the save). A slot is reused only
        when nothing references its buffers any more (see ``runtime/ring.py``).
Mirrors: FastDeploy PR #6362 (async logprob copy).
FD:     2.4 (backport), 2.5 and 2.6+/develop (replaces the per-step pinned allocations). Not for the
        speculative/MTP samplers (their ``gather_logprobs`` return GPU tensors; left untouched) nor
        non-CUDA platforms sharing ``Sampler`` (XPU, Iluvatar, GCU, DCU, Metax: original code runs).
        FastDeploy's CPU platform takes the patched path on the ``host``/``sim`` backends (selftest).
Delete: when FastDeploy's ``gather_logprobs`` copies into preallocated pinned buffers.
"""

from __future__ import annotations

import ast
import logging
import threading
import weakref

import numpy as np
import paddle

from fd_async_copy_plugin import fd_identity, runtime
from fd_async_copy_plugin.config import DEFAULT_RING_MAX_BYTES
from fd_async_copy_plugin.registry.patch import Feature, IncompatibleError, Junction, Patch, Target, wraps

from .runner import line
from .step import prompt_runner

log = logging.getLogger("fd_async_copy")

SAMPLER = "model_executor.layers.sample.sampler"
POSTPROC = "model_executor.pre_and_post_process"
RUNNER = "worker.gpu_model_runner"

FIELDS = ("logprob_token_ids", "logprobs", "selected_token_ranks")
DTYPES = {"logprob_token_ids": "int64", "logprobs": "float32", "selected_token_ranks": "int64"}
LABELS = {field: f"gather_logprobs.{field}" for field in FIELDS}  # each copy's census label
#: FastDeploy's default ``max_logprobs``; the ring grows once if a request asks for more.
DEFAULT_MAX_LOGPROBS = 20
RING_SLOTS = 2  # FD 2.5's overlap schedule still references step N's output when step N+1 gathers
#: Largest pinned buffer (bytes) the rings reserve or grow to for one field. A step that needs more
#: (e.g. whole-vocabulary logprobs for a long prompt chunk) is copied with FastDeploy 2.4's blocking
#: copies instead: correct and bounded, never a multi-GB pinned allocation in the decode loop.
MAX_PINNED_BYTES = 64 << 20
_ITEM_BYTES = {field: np.dtype(dtype).itemsize for field, dtype in DTYPES.items()}

#: dtypes a pinned buffer can hold (numpy's: no bfloat16)
_PINNED_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"})


#: What the statements after the maths may call: the copies the plugin replaces (FastDeploy's
#: ``.cpu()`` / pinned ``empty_like`` + ``copy_``).
_COPY_CALLS = {"cpu", "empty_like", "pin_memory", "copy_", "is_cuda", "LogprobsTensors"}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def check_gather_logprobs(original, ctx) -> None:
    """The maths must be exactly FastDeploy's (normalised-AST digest, ``fd_identity``); what follows
    it may only copy the three results and return them as ``LogprobsTensors``. (The digest covers
    the parameters too: the replacement's ``(self, logprobs, num_logprobs, token_ids)``.)"""
    try:
        node = fd_identity.function_node(original)
        maths = fd_identity.gather_logprobs_maths(node)
    except (OSError, TypeError, SyntaxError, ValueError) as exc:
        raise IncompatibleError(f"cannot read Sampler.gather_logprobs source: {exc}") from exc
    problem = fd_identity.check("Sampler.gather_logprobs.maths", getattr(ctx, "profile", None),
                                fd_identity.digest(maths, node.args))
    if problem:
        raise IncompatibleError(problem)
    tail = node.body[len(maths):]
    others = sorted({_call_name(n) or "?" for s in tail for n in ast.walk(s) if isinstance(n, ast.Call)} - _COPY_CALLS)
    if others:
        raise IncompatibleError(f"Sampler.gather_logprobs does more than copy its results after the maths (calls "
                                f"{others}): the plugin replaces those statements, so FastDeploy runs unpatched")
    last = tail[-1] if tail else None
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Call)
            and _call_name(last.value) == "LogprobsTensors" and len(last.value.args) == 3):
        raise IncompatibleError("Sampler.gather_logprobs does not end with `return LogprobsTensors(a, b, c)`")


class LogprobsCopier:
    """Per-process state of the feature: the pinned rings and the prompt-logprobs mode flag.

    Decode results go through a 2-slot ring and are handed out as ``AsyncLogprobsTensors``;
    prompt-logprob results (copied by FastDeploy into its own CPU buffers right away) go through a
    separate 1-slot ring and are handed back host-owned, so prompt sizes never inflate the decode
    ring. Buffers are capped at ``MAX_PINNED_BYTES``.
    """

    def __init__(self, backend, logprobs_tensors_cls, ring_max_bytes: int | None = None,
                 stand_down=lambda reason: None, strict: bool = False) -> None:
        self.backend, self.base, self.stand_down, self.strict = backend, logprobs_tensors_cls, stand_down, strict
        self.unusable = ""  # set when the backend cannot be trusted here (accessor probe failed)
        self.AsyncLogprobsTensors = make_async_class(logprobs_tensors_cls, backend)
        self.rings: dict[str, runtime.PinnedRing] = {}
        self.max_rows = 0  # FastDeploy's max_num_seqs (a decode buffer grows to every sequence's row)
        self._lock = threading.RLock()  # producers on several threads (see ``copy``)
        #: Cap of each ring's pinned bytes (FD_ASYNC_COPY_RING_MAX_BYTES); steps beyond it are
        #: copied blocking and counted in ``capped_steps``.
        self.ring_max_bytes = DEFAULT_RING_MAX_BYTES if ring_max_bytes is None else ring_max_bytes
        self.capped_steps = self.async_steps = 0  # copied blocking (a cap) / non-blocking
        #: runners built while the feature is applied, by whether they decode speculatively (their
        #: SpeculativeSampler/MTPSampler gather with FastDeploy's own code: this feature never runs)
        self.speculative_runners, self.plain_runners = weakref.WeakSet(), weakref.WeakSet()
        #: steps copied FastDeploy's blocking way because a result's dtype has no pinned buffer
        #: (bfloat16: numpy has none), by dtype; a float64 or float16 result gets a ring of its own
        self.dtype_steps: dict[str, int] = {}
        self.closed = False

    def note_runner(self, runner) -> None:
        """A runner FastDeploy built (after its ``__init__``): a speculative one never calls
        ``Sampler.gather_logprobs`` (``status()`` then does not claim the feature runs for it)."""
        (self.speculative_runners if getattr(runner, "speculative_decoding", False) else self.plain_runners).add(runner)

    def close(self) -> None:
        """``disable()``: wait for producers inside ``copy`` (the lock), refuse new async copies,
        and complete every copy issued, so results already handed out read correctly once the
        consumer guards are gone (FastDeploy's own code reads them without waiting)."""
        with self._lock:
            self.closed = True
            self.backend.stream_synchronize("disable")

    def _elements(self, rows: int, columns: int) -> dict[str, int]:
        return {"logprob_token_ids": rows * columns, "logprobs": rows * columns, "selected_token_ranks": rows}

    def _reserve(self, rows: int, columns: int, prompt: bool, items: dict) -> dict[str, int]:
        """What a growing buffer grows to: every sequence's row (decode) if that fits the cap."""
        wanted = self._elements(rows if prompt else max(rows, self.max_rows), columns)
        return {f: n if n * items[f] <= MAX_PINNED_BYTES else 0 for f, n in wanted.items()}

    def _new_ring(self, sampler, kind: str, prompt: bool, rows: int, columns: int, dtypes, items):
        guided = getattr(sampler, "guided_decoding", None)  # keeps max_num_seqs (FD 2.4, 2.5, develop)
        self.max_rows = self.max_rows or int(getattr(guided, "max_num_seqs", 0) or 0)
        capacity = self._reserve(rows, max(columns, DEFAULT_MAX_LOGPROBS + 1), prompt, items)
        self.rings[kind] = runtime.PinnedRing(self.backend, f"logprobs.{kind}", dict(dtypes),
                                              {f: max(1, n) for f, n in capacity.items()},
                                              slots=1 if prompt else RING_SLOTS, max_bytes=self.ring_max_bytes)
        return self.rings[kind]

    def _blocking(self, sources: dict):
        """FastDeploy 2.4's three blocking copies, as FastDeploy's own ``LogprobsTensors``."""
        return self.base(*(self.backend.blocking_d2h(sources[f], LABELS[f]) for f in FIELDS))

    def copy(self, sampler, indices, top_logprobs, token_ranks):
        """Issue the three non-blocking copies and record one event; return the result."""
        sources = {"logprob_token_ids": indices, "logprobs": top_logprobs, "selected_token_ranks": token_ranks}
        if not self.unusable:
            self.unusable = problem = self.backend.unusable_for(indices)  # the accessor probe, once per device
            if problem:
                if self.strict:
                    raise RuntimeError(f"fd_async_copy logprobs: {problem}")
                log.error("fd_async_copy: %s; logprobs are copied FastDeploy's blocking way", problem)
                self.stand_down(problem)
        if self.unusable:
            return self._blocking(sources)
        dtypes = {f: str(sources[f].dtype).rsplit(".", 1)[-1] for f in FIELDS}
        prompt = prompt_runner() is not None
        kind = "prompt" if prompt else "decode"
        if dtypes == DTYPES:  # bytes per element of each field
            items = _ITEM_BYTES
        elif all(d in _PINNED_DTYPES for d in dtypes.values()):
            # FastDeploy's gather on float64 (or fp16 without the fp32 upcast): a ring of its own
            items = {f: np.dtype(d).itemsize for f, d in dtypes.items()}
            kind = f"{kind}.{'.'.join(dtypes[f] for f in FIELDS)}"
        else:  # no pinned buffer of that dtype: FastDeploy's own copies, counted
            other = ",".join(sorted({d for d in dtypes.values() if d not in _PINNED_DTYPES}))
            self.dtype_steps[other] = self.dtype_steps.get(other, 0) + 1
            if self.dtype_steps[other] == 1:
                log.warning("fd_async_copy: %s logprobs have no pinned buffer; such steps are copied "
                            "FastDeploy's blocking way (counted in status())", other)
            return self._blocking(sources)
        rows, columns = int(indices.shape[0]), int(indices.shape[-1])
        # One producer at a time from acquire until the result references the slot: a slot is "free"
        # while nothing references it, so two threads must never pick the same one.
        with self._lock:
            if self.closed:  # disable() is restoring FastDeploy: a late call gets host-owned data
                return self._blocking(sources)
            try:
                if any(n * items[f] > MAX_PINNED_BYTES for f, n in self._elements(rows, columns).items()):
                    raise runtime.RingFull(f"{rows} x {columns} logprobs exceed the pinned cap")
                ring = self.rings.get(kind) or self._new_ring(sampler, kind, prompt, rows, columns, dtypes, items)
                # A free slot, the three copies, then their event (each source's facts read once). A
                # wider request (more top logprobs, or -1 = the vocabulary) grows a slot for every row.
                slot, _ = ring.fill("gather_logprobs", sources, LABELS, "gather_logprobs",
                                    reserve=lambda: self._reserve(rows, columns, prompt, items))
            except runtime.RingFull as exc:
                # A consumer lags far behind, or the rows are huge (one buffer over MAX_PINNED_BYTES):
                # no more page-locked memory; this step is copied FastDeploy 2.4's blocking way
                # (counted), the ring stays as it is.
                self.capped_steps += 1
                level = logging.WARNING if self.capped_steps == 1 else logging.DEBUG
                log.log(level, "fd_async_copy: %s; step copied blocking (%d so far)", exc, self.capped_steps)
                return self._blocking(sources)
            result = self.AsyncLogprobsTensors(*map(slot.buffers.__getitem__, FIELDS))  # (no Python frame a field)
            self.async_steps += 1
            del slot
        # Prompt logprobs: FastDeploy copies them into its own CPU buffers right away: hand it
        # host-owned tensors (one event-scoped wait per chunk; 2.5 does a device-wide sync here).
        return result.materialize("prompt_logprobs") if prompt else result


def make_async_class(base, backend):
    """A subclass of FastDeploy's ``LogprobsTensors`` whose fields are pinned ring buffers."""

    class AsyncLogprobsTensors(base):
        """``LogprobsTensors`` backed by pinned buffers, valid once their copy set's event completed
        (each buffer keeps it: ``CopyBackend.event_of``).

        Consumers never run Paddle ops on the fields: every method below reads through
        ``backend.to_host``, which waits on the copy event first.
        """

        def materialize(self, reader: str = "logprobs"):
            """Host-owned ``LogprobsTensors`` (pageable CPU tensors), after the copy event."""
            if "_host_copies" not in self.__dict__:
                self.__dict__["_host_copies"] = base(*(backend.to_host(field, reader) for field in self))
            return self.__dict__["_host_copies"]

        def slice_rows(self, start: int, end: int):
            # FD's rows (its body is checked: fd_identity), O(rows sliced): only those rows are read.
            return base(*(backend.to_host(field, "slice_rows", start, end) for field in self))

        def tolists(self):
            return self.materialize("tolists").tolists()

        def __reduce__(self):
            # Pickled (e.g. onto a queue) as FastDeploy's own class with host-owned data.
            return (base, tuple(self.materialize("pickle")))

    AsyncLogprobsTensors.__qualname__ = f"{base.__qualname__}[fd_async_copy]"
    return AsyncLogprobsTensors


def check_slice_rows(original, ctx) -> None:
    """The plugin's ``slice_rows`` (here for pinned results, ``sync_scope`` for every result) is
    FastDeploy's rows: only where FastDeploy's body is exactly the known one (``fd_identity``)."""
    if problem := fd_identity.slice_rows_problem(original, getattr(ctx, "profile", None)):
        raise IncompatibleError(problem)


def keeps_fastdeploy_code(platform, backend) -> bool:
    """Whether ``gather_logprobs`` runs FastDeploy's own code on this platform.

    Non-CUDA accelerators that share ``Sampler`` (XPU, Iluvatar, GCU, DCU, Metax) do. FastDeploy's
    CPU platform (a CPU build of Paddle, where only host-memory backends - ``host`` and those derived
    from it - can run: ``auto`` and ``cuda`` stand down) takes the patched path with synchronous copies: that is how the plugin
    is checked against a real FastDeploy without a GPU (``fd-async-copy selftest``).
    """
    if platform is None or platform.is_cuda():
        return False
    is_cpu = getattr(platform, "is_cpu", None)
    return not (isinstance(backend, runtime.HostBackend) and callable(is_cpu) and is_cpu())


def build_gather_logprobs(original, ctx):
    sampler_module, copier, postproc = ctx.module(SAMPLER), ctx.state, ctx.module(POSTPROC)
    batched_count_greater_than = sampler_module.batched_count_greater_than
    platform = getattr(sampler_module, "current_platform", None)

    def reloaded() -> bool:
        """FastDeploy's own save op is bound again (what ``importlib.reload`` does): the plugin's
        junction is no longer installed on it (an op that resolved to None - not compiled - has none).
        Results would reach an unguarded save: finish what was issued and stand down, for good."""
        if vars(postproc).get("save_output_topk") is None or Junction.at(postproc, "save_output_topk"):
            return False
        copier.close()
        reason = (f"{postproc.__name__} was reloaded: save_output_topk is FastDeploy's own again, so "
                  "logprobs run FastDeploy's own path (disable() and enable() to patch the new module)")
        log.error("fd_async_copy: %s", reason)
        ctx.stand_down(reason)
        return True

    @wraps(original)
    def gather_logprobs(self, logprobs, num_logprobs, token_ids):
        # Not CUDA (XPU/Iluvatar/...: untouched), or the consumer guards are gone.
        if keeps_fastdeploy_code(platform, ctx.backend) or copier.closed or reloaded():
            return original(self, logprobs, num_logprobs, token_ids)
        # The maths of FastDeploy's gather_logprobs, unchanged (bit-identical results).
        assert token_ids.dtype == paddle.int64
        logprobs.clip_(min=paddle.finfo(logprobs.dtype).min)
        if len(token_ids.shape) < len(logprobs.shape):
            token_ids = token_ids.unsqueeze(-1)
        token_logprobs = paddle.take_along_axis(logprobs, token_ids, axis=-1)
        token_ranks = batched_count_greater_than(logprobs, token_logprobs)
        if num_logprobs >= 1:
            topk_logprobs, topk_indices = paddle.topk(logprobs, num_logprobs, axis=-1)
            indices = paddle.concat([token_ids, topk_indices], axis=1)
            top_logprobs = paddle.concat([token_logprobs, topk_logprobs], axis=1)
        else:
            indices = token_ids
            top_logprobs = token_logprobs
        # Only the copies differ: non-blocking, into reused pinned buffers, one event.
        return copier.copy(self, indices, top_logprobs, token_ranks)

    return gather_logprobs


class LogprobsFeature(Feature):
    name = "logprobs"
    mirrors = "FastDeploy PR #6362 (async logprob copy), with preallocated pinned buffers"
    profiles = {"fastdeploy-2.4": "apply", "fastdeploy-2.5": "apply", "fastdeploy-2.6+": "apply"}
    # Consumers first, the producer last: an apply (or revert) never leaves a window where
    # gather_logprobs hands out pinned buffers to an unguarded consumer.
    patches = (
        Patch(Target(RUNNER, "GPUModelRunner.__init__"), line("__init__")),
        Patch(Target(POSTPROC, "save_output_topk"), line("save_output_topk")),
        Patch(Target(POSTPROC, "post_process_normal"), line("post_process_normal"), profiles=("fastdeploy-2.4",)),
        Patch(Target(RUNNER, "GPUModelRunner._get_prompt_logprobs_list"), line("_get_prompt_logprobs_list")),
        Patch(Target(SAMPLER, "Sampler.gather_logprobs"), build_gather_logprobs, check_gather_logprobs,
              producer=True))

    def check(self, ctx) -> None:
        # FastDeploy's gather_logprobs builds the LogprobsTensors (of worker.output) its module
        # imported: the plugin's result class subclasses that very class.
        tensors = getattr(ctx.module(SAMPLER), "LogprobsTensors", None)
        if not isinstance(tensors, type):
            raise IncompatibleError(f"{SAMPLER} no longer imports LogprobsTensors")
        # ... and re-implements its slice_rows for pinned results: only where it is exactly FD's.
        check_slice_rows(getattr(tensors, "slice_rows", None), ctx)

    def prepare(self, ctx) -> LogprobsCopier:
        return LogprobsCopier(ctx.backend, ctx.module(SAMPLER).LogprobsTensors, stand_down=ctx.stand_down,
                              strict=ctx.strict, ring_max_bytes=getattr(ctx.settings, "ring_max_bytes", None))

    def report(self, ctx) -> dict | None:
        """Not ``applied`` while steps are copied the blocking way (a ring or buffer cap), counted."""
        copier = ctx.state
        speculative = len(copier.speculative_runners) if isinstance(copier, LogprobsCopier) else 0
        if not isinstance(copier, LogprobsCopier) or not (copier.capped_steps or copier.dtype_steps or speculative):
            return None
        total = copier.capped_steps + sum(copier.dtype_steps.values()) + copier.async_steps
        reasons = [f"{speculative} runner(s) decode speculatively: their speculative sampler gathers logprobs "
                   "with FastDeploy's own code (left untouched)"] if speculative else []
        if copier.capped_steps:
            reasons.append(f"{copier.capped_steps} of {total} steps copied FastDeploy's blocking way: over the "
                           f"pinned cap (FD_ASYNC_COPY_RING_MAX_BYTES={copier.ring_max_bytes}, or 64 MiB a buffer)")
        reasons += [f"{n} of {total} steps copied FastDeploy's blocking way: {dtype} logprobs have no pinned "
                    "buffer" for dtype, n in sorted(copier.dtype_steps.items())]
        partial = copier.async_steps or (speculative and len(copier.plain_runners))
        return {"state": "partial" if partial else "passthrough", "runners": [], "reason": "; ".join(reasons)}

    def quiesce(self, ctx) -> None:
        if isinstance(ctx.state, LogprobsCopier):
            ctx.state.close()


FEATURES = [LogprobsFeature()]
