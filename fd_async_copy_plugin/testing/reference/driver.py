"""A deterministic decode driver for the FastDeploy replica (unpatched or patched).

It plays the parts of FastDeploy around the GPU model runner: the V1 scheduler (slots, KV blocks,
prefill chunks, block steps), the worker loop (``worker_process.event_loop_normal``) and the
engine's TokenProcessor (reading saved messages / ZMQ payloads). The runner itself is whatever
the replica root provides - so the same driver runs ``fd24`` or ``fd25``, with or without the
plugin's patches, and two runs can be compared bit for bit.

API
---
``run_decode(root, config, requests=(), arrivals=None, max_steps=256, on_step=None) -> DecodeResult``

- ``root``: module root of a replica, ``"fd_async_copy_plugin.testing.reference.fd24"`` or ``...fd25``
  (``ROOTS`` in ``reference/__init__.py``); patches applied to that root are in effect.
- ``config``: ``DriverConfig``.
- ``requests``: ``Request``s that arrive at step 0; ``arrivals``: ``{step: [Request, ...]}`` for
  requests inserted mid-run (FIFO; a request waits while no slot or KV block is free).
- ``max_steps``: bound on loop iterations; the result says ``truncated`` when it was hit.
- ``on_step(step, runner)``: called after each step's outputs were read.

Per loop iteration ("step") the driver calls ``census.begin_step()``, schedules (new prefills,
next prefill chunks, KV blocks for running requests; a DECODE task when a request got a block),
inserts tasks (``insert_tasks_v1`` / ``insert_prefill_inputs``), checks ``not_need_stop()``
(skipped with the overlap schedule, as in 2.5, and on develop, whose runner has none), calls
``execute_model(tasks, real_bsz)`` and
``exist_prefill()``, then reads the step's outputs.

Semantics worth knowing (they are FastDeploy's):

- All requests must share ``eos_token_ids`` (``share_inputs["eos_token_id"]`` is global).
- A request finishes when its token is one of the eos ids. Hitting ``max_tokens`` or a stop
  sequence makes the ops replace that step's token by ``eos_token_ids[0]``; so ``token_ids`` of a
  finished request ends with an eos id and has at most ``max_tokens`` entries. Stop sequences are
  matched one step late (the sequence ends the output, then the eos).
- ``stop_reason``: ``"length"`` (``max_tokens`` reached), ``"stop"`` (the tokens before the eos end
  with a stop sequence), ``"eos"``; ``None`` while unfinished.
- Per-token logprobs come from ``save_output_topk`` messages (at most 20 top logprobs, K fixed
  by the op) or, with ``save_output_v1``, from the ZMQ payloads (any K, including -1 = vocab).
  Prompt logprobs only travel on the ZMQ path.
- Block steps: with ``num_gpu_blocks`` small, a running request that finds no free KV block for
  its next position is stopped by ``update_inputs_v1`` (``is_block_step``); the driver hands it a
  block (a DECODE task) as soon as one is free, and ``recover_decode_task`` resumes it.
- Preemption (``DriverConfig(preemption=True)``, FD 2.4's ``ResourceManagerV1._trigger_preempt``
  and the TokenProcessor's reschedule, resource_manager_v1.py:253-312, token_processor.py:185-193,
  730-735): instead of block-stepping, a running request that finds no free KV block preempts
  running requests, last admitted first, until its blocks fit (itself last). A victim gets a
  PREEMPTED task, loses its blocks and keeps its slot; the first negative row of its slot in a
  later message (or a message whose batch no longer reaches the slot) puts it back at the front of
  the waiting queue, and it is prefilled again with its prompt plus every token received so far,
  in the same slot. No new request is admitted in a step that preempted. A victim whose last
  token (received after the preemption) is an eos finishes as usual. FD 2.5 (a root whose
  ``config`` has ``PREEMPTED_TOKEN_ID``): the scheduler is the same (2.5 resource_manager_v1.py:
  260-271, 347-400, 885, 964-1004), the runner flags the slot in ``preempted_idx`` and the save
  sends its row as -9 (one step late with the overlap schedule); the TokenProcessor reschedules on
  that -9 row only and skips other negative rows (2.5 token_processor.py:786-802; its
  batch-reach check is on the ZMQ path only, :193-211).

Result: ``DecodeResult`` with ``outputs`` (``RequestOutput`` per request id), ``messages`` (every
``SavedMessage`` in send order), ``zmq_payloads`` (one list of row dicts per payload, plain
numpy/lists), ``sampling_masks`` (KSM side channel), step counts, and ``differences(other)`` /
``assert_same(other)`` for bit-exact comparison.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np

from ...runtime import census
from . import paddle_device
from .message_queue import K as TOPK_COLUMNS
from .message_queue import SavedMessage, get_queue
from .zmq_sink import drop_sink, get_sink


@dataclass
class Request:
    """A user request, before scheduling."""

    request_id: str
    prompt_token_ids: list
    max_tokens: int
    eos_token_ids: list
    stop_seqs: Optional[list] = None  # list of token-id lists
    logprobs: Optional[int] = None  # top logprobs per token; -1 = whole vocabulary
    prompt_logprobs: Optional[int] = None
    min_tokens: int = 1
    top_p: float = 1.0
    top_k: int = 0
    temperature: float = 1.0
    temp_scaled_logprobs: bool = False
    top_p_normalized_logprobs: bool = False
    #: sampling seed (``top_p < 1`` rows draw with the slot's ``infer_seed``); None: ``default_seed``
    seed: Optional[int] = None
    #: ``bad_words_token_ids``: ids banned for this request
    bad_words: Optional[list] = None


@dataclass
class DriverConfig:
    max_num_seqs: int = 8
    vocab_size: int = 1024
    hidden_size: int = 32
    block_size: int = 16
    max_model_len: int = 128
    #: KV blocks in the pool; None = enough that no request ever waits for one.
    num_gpu_blocks: Optional[int] = None
    enc_dec_block_num: int = 2
    enable_logprob: bool = False
    max_logprobs: int = 20
    #: ENABLE_V1_KVCACHE_SCHEDULER (insert_tasks_v1 / update_inputs_v1); else the legacy path.
    use_v1_scheduler: bool = True
    #: FD_USE_GET_SAVE_OUTPUT_V1: outputs through _build_stream_transfer_data and the ZMQ thread.
    save_output_v1: bool = False
    #: Largest prefill chunk (prompt tokens per step); None = whole prompts.
    chunk_size: Optional[int] = None
    #: 2.5 only: enable_overlap_schedule (save one step late).
    overlap: bool = False
    #: 2.4 only: Keep-Sampling-Mask.
    keep_sampling_mask: bool = False
    eos_tokens_lens: int = 1
    max_stop_seqs_num: int = 5
    stop_seqs_max_len: int = 8
    model_seed: int = 2024
    #: Run the runner's ``_dummy_run`` warm-up before the first step.
    warmup: bool = False
    #: V1 scheduler, msg-queue output path: preempt instead of block-stepping (module doc).
    preemption: bool = False
    #: the model's per-token layer depends on the packed row count, as a GPU GEMM's kernel choice
    #: does (``TinyModel(rows_dependent_gemm=True)``): padded rows can then change real rows' bits
    rows_dependent_gemm: bool = False
    #: the model's MoE stand-in: rows routed to this many experts by token id, each expert's bits
    #: depending on its own row count (``TinyModel(moe_experts=...)``): padding rows' contents can
    #: then change real rows' bits
    moe_experts: int = 0
    #: fd24 only: FD 2.4's CUDA-graph decode (``use_cudagraph``, captured sizes 1, 2, 4, 8, 16, ...
    #: up to ``max_num_seqs``): a decode-only step's forward runs on the static buffers' first
    #: captured-size rows (``cuda_graph.py``); ``DecodeResult.graph_replays`` records what it read
    cuda_graph: bool = False
    #: msg-queue output path: the engine (TokenProcessor) takes each message this many steps after
    #: it was sent, as a token-processor thread that falls behind does. With 1, an unpatched run
    #: sees outputs when a run with the plugin's ``overlap`` schedule sees them.
    engine_lag: int = 0


@dataclass
class TokenLogprobs:
    """Logprobs of one generated token: ids/values of column 0 (the token) and the top-k."""

    token_ids: list
    logprobs: list
    rank: int


@dataclass
class RequestOutput:
    request_id: str
    slot: int = -1
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # TokenLogprobs per token, when requested
    prompt_logprobs: Optional[dict] = None  # {"token_ids", "logprobs", "ranks"} numpy arrays
    finished: bool = False
    stop_reason: Optional[str] = None
    first_token_step: Optional[int] = None
    finish_step: Optional[int] = None
    #: one ``[tokens received when preempted, tokens received when rescheduled]`` per preemption
    #: (the second is None when the request finished first: its eos was still in flight)
    preemptions: list = field(default_factory=list)


@dataclass
class DecodeResult:
    outputs: dict
    messages: list
    zmq_payloads: list
    sampling_masks: list
    steps: int
    executed_steps: int
    truncated: bool
    #: PREEMPTED tasks the scheduler sent (``DriverConfig.preemption``)
    preemptions: int = 0
    #: ``DriverConfig.cuda_graph``: every replay, (captured size, token count, the two static
    #: buffers' shapes, their first captured-size rows) - what the graph read (``cuda_graph.py``)
    graph_replays: list = field(default_factory=list)

    def differences(self, other: "DecodeResult") -> list:
        """Human-readable differences; empty when the two runs are bit-identical."""
        out = []
        if sorted(self.outputs) != sorted(other.outputs):
            out.append(f"request ids differ: {sorted(self.outputs)} vs {sorted(other.outputs)}")
        for rid in sorted(set(self.outputs) & set(other.outputs)):
            a, b = self.outputs[rid], other.outputs[rid]
            for name in ("token_ids", "finished", "stop_reason", "first_token_step", "finish_step", "preemptions"):
                if getattr(a, name) != getattr(b, name):
                    out.append(f"{rid}.{name}: {getattr(a, name)!r} vs {getattr(b, name)!r}")
            if _canonical(a.logprobs) != _canonical(b.logprobs):
                out.append(f"{rid}.logprobs differ")
            if _canonical(a.prompt_logprobs) != _canonical(b.prompt_logprobs):
                out.append(f"{rid}.prompt_logprobs differ")
        if len(self.messages) != len(other.messages):
            out.append(f"message count: {len(self.messages)} vs {len(other.messages)}")
        for i, (m, n) in enumerate(zip(self.messages, other.messages)):
            if not m.same_as(n):
                out.append(f"message {i} ({m.kind}) differs")
        if _canonical(self.zmq_payloads) != _canonical(other.zmq_payloads):
            out.append("zmq payloads differ")
        if _canonical(self.sampling_masks) != _canonical(other.sampling_masks):
            out.append("sampling masks differ")
        if len(self.graph_replays) != len(other.graph_replays):
            out.append(f"graph replays: {len(self.graph_replays)} vs {len(other.graph_replays)}")
        for i, (g, h) in enumerate(zip(self.graph_replays, other.graph_replays)):
            if g != h:
                out.append(f"graph replay {i} (size {g[0]}, {g[1]} tokens) read other buffers: size {h[0]}, "
                           f"{h[1]} tokens" + (", other padding rows" if g[:4] == h[:4] else ""))
        for name in ("steps", "executed_steps", "truncated", "preemptions"):
            if getattr(self, name) != getattr(other, name):
                out.append(f"{name}: {getattr(self, name)} vs {getattr(other, name)}")
        return out

    def assert_same(self, other: "DecodeResult") -> None:
        diffs = self.differences(other)
        if diffs:
            raise AssertionError("runs differ:\n  " + "\n  ".join(diffs[:20]))


def _canonical(value):
    """Comparable form: arrays become (dtype, shape, bytes) so floats compare bit for bit."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, TokenLogprobs):
        return ("tl", value.token_ids, np.asarray(value.logprobs, dtype=np.float64).tobytes(), value.rank)
    if isinstance(value, float):
        return ("f", np.float64(value).tobytes())
    return value


# ---- the scheduler stand-in ----------------------------------------------------------------------


class _Tracked:
    """Scheduler-side state of one request."""

    def __init__(self, user: Request, fd_request) -> None:
        self.user = user
        self.fd = fd_request
        self.output = RequestOutput(user.request_id)
        self.slot = -1
        self.blocks: list = []
        self.need_prefill = len(user.prompt_token_ids)  # tokens to prefill: the prompt (+ outputs after preemption)
        self.prefilled = 0  # of those, scheduled so far
        self.processed = 0  # positions written to the KV cache after the last executed step
        self.waiting_block = False  # block step: stopped by update_inputs_v1, waiting for a block
        self.preempted = False  # PREEMPTED task sent; not running until rescheduled and prefilled again
        self.done = False


class _Scheduler:
    def __init__(self, mod, config: DriverConfig, fd_config) -> None:
        self.mod = mod
        self.config = config
        self.block_size = config.block_size
        self.blocks_per_seq = (
            config.max_model_len + config.block_size - 1
        ) // config.block_size + config.enc_dec_block_num
        self.free_blocks = list(range(_num_blocks(config)))
        self.slots: list = [None] * config.max_num_seqs
        self.waiting: list = []
        self.tracked: dict = {}
        self.running: list = []  # admission order (FD's ``running``): preemption victims come from its end
        self.to_reschedule: set = set()  # request ids preempted, waiting for their sync row
        self.preemptions = 0
        #: FD 2.5: the sync row's token (config.py:67); None: 2.4's first negative row / batch reach
        self.preempted_token = getattr(mod.config, "PREEMPTED_TOKEN_ID", None)

    # -- blocks --
    def _grow(self, t: _Tracked, needed: int) -> bool:
        """Give ``t`` blocks until it has ``needed``; False (and no change) when the pool is short."""
        needed = min(needed, self.blocks_per_seq)
        missing = needed - len(t.blocks)
        if missing <= 0:
            return True
        if missing > len(self.free_blocks):
            return False
        t.blocks.extend(self.free_blocks[:missing])
        del self.free_blocks[:missing]
        return True

    def _release(self, t: _Tracked) -> None:
        self._free(t)
        if t.slot >= 0 and self.slots[t.slot] is t:
            self.slots[t.slot] = None
        if t in self.running:
            self.running.remove(t)
        if t in self.waiting:  # finished while preempted (its last token arrived after the preemption)
            self.waiting.remove(t)
        self.to_reschedule.discard(t.user.request_id)

    def _free(self, t: _Tracked) -> None:
        self.free_blocks = sorted(self.free_blocks + t.blocks)
        t.blocks = []

    # -- preemption (FD 2.4 ``_trigger_preempt`` / ``reschedule_preempt_task``) --
    def _make_room(self, t: _Tracked, attempt: Callable, tasks: list) -> bool:
        """Preempt running requests, last admitted first, until ``attempt()`` succeeds; False when
        ``t`` itself had to go (FD then stops scheduling running requests for this step)."""
        while not attempt():
            victim = self.running[-1]
            self._preempt(victim, tasks)
            if victim is t:
                return False
        return True

    def _preempt(self, v: _Tracked, tasks: list) -> None:
        RequestType = self.mod.request.RequestType
        self.running.remove(v)
        self._free(v)
        v.preempted = True
        v.prefilled = v.processed = 0
        v.waiting_block = False
        v.output.preemptions.append([len(v.output.token_ids), None])
        self.to_reschedule.add(v.user.request_id)
        self.preemptions += 1
        tasks.append(
            self.mod.request.Request(
                v.user.request_id, v.user.prompt_token_ids, v.user.eos_token_ids, v.fd.sampling_params,
                idx=v.slot, task_type=RequestType.PREEMPTED,
            )
        )

    def reschedule(self, t: _Tracked) -> None:
        if t.user.request_id in self.to_reschedule:
            self.to_reschedule.discard(t.user.request_id)
            self.waiting.insert(0, t)
            t.output.preemptions[-1][1] = len(t.output.token_ids)

    def reschedule_beyond(self, batch: int) -> None:
        """A message whose batch does not reach a preempted slot: no more tokens come from it (2.4)."""
        if self.preempted_token is not None:  # 2.5's msg-queue path has no such check
            return
        for rid in sorted(self.to_reschedule):
            if self.tracked[rid].slot > batch - 1:
                self.reschedule(self.tracked[rid])

    # -- tasks --
    def add(self, user: Request) -> None:
        if user.request_id in self.tracked:
            raise ValueError(f"duplicate request id {user.request_id!r}")
        _validate_request(user, self.config)
        self.tracked[user.request_id] = t = _Tracked(user, _fd_request(self.mod, user))
        self.waiting.append(t)

    def real_bsz(self) -> int:
        occupied = [i for i, t in enumerate(self.slots) if t is not None]
        return occupied[-1] + 1 if occupied else 0

    def schedule(self) -> list:
        """This step's tasks, in FastDeploy's order: running requests first, then new ones."""
        tasks = []
        cfg = self.config
        v1 = cfg.use_v1_scheduler
        preempt = cfg.preemption
        for t in list(self.slots):
            if t is None or t.done or t.preempted:
                continue
            if t.prefilled < t.need_prefill:  # next prefill chunk
                if self._schedule_chunk(t):
                    tasks.append(t.fd)
                elif preempt:
                    if not self._make_room(t, lambda: self._schedule_chunk(t), tasks):
                        break
                    tasks.append(t.fd)
                continue
            if not v1:
                continue
            # Decode: the step writes position ``processed``; update_inputs_v1 then checks the
            # block of position ``processed + 1``.
            had = len(t.blocks)
            needed = (t.processed + 1) // self.block_size + 1
            grown = self._grow(t, needed)
            if not grown and preempt:
                if not self._make_room(t, lambda: self._grow(t, needed), tasks):
                    break
                grown = True
            if grown and len(t.blocks) > had:
                tasks.append(self._decode_task(t))
        while self.waiting and not (preempt and self.preemptions_in(tasks)):
            t = self.waiting[0]
            if t.preempted:  # rescheduled: prompt + every token received, in its own slot
                slot = t.slot
                t.need_prefill = len(t.user.prompt_token_ids) + len(t.output.token_ids)
                t.fd.output_token_ids = list(t.output.token_ids)
            else:
                slot = next((i for i, s in enumerate(self.slots) if s is None), None)
                if slot is None:
                    break
            t.slot = slot
            if v1:
                if not self._schedule_chunk(t):
                    if not t.preempted:
                        t.slot = -1
                    break
            else:
                total = len(t.user.prompt_token_ids) + t.user.max_tokens
                if not self._grow(t, (total + self.block_size - 1) // self.block_size):
                    t.slot = -1
                    break
                t.prefilled = len(t.user.prompt_token_ids)
                t.fd.prefill_start_index, t.fd.prefill_end_index = 0, t.prefilled
                t.fd.block_tables = list(t.blocks)
            self.waiting.pop(0)
            self.slots[slot] = t
            self.running.append(t)
            t.preempted = False
            t.output.slot = slot
            t.fd.idx = slot
            tasks.append(t.fd)
        return tasks

    def preemptions_in(self, tasks: list) -> bool:
        PREEMPTED = self.mod.request.RequestType.PREEMPTED
        return any(task.task_type == PREEMPTED for task in tasks)

    def _schedule_chunk(self, t: _Tracked) -> bool:
        total = t.need_prefill
        start = t.prefilled
        end = total if self.config.chunk_size is None else min(total, start + self.config.chunk_size)
        # Blocks for the chunk; the final chunk also covers the first decode position.
        needed = end // self.block_size + 1 if end == total else (end + self.block_size - 1) // self.block_size
        if not self._grow(t, needed):
            return False
        RequestType = self.mod.request.RequestType
        t.fd.task_type = RequestType.PREFILL
        t.fd.idx = t.slot
        t.fd.prefill_start_index, t.fd.prefill_end_index = start, end
        t.fd.block_tables = list(t.blocks)
        t.prefilled = end
        return True

    def _decode_task(self, t: _Tracked):
        RequestType = self.mod.request.RequestType
        task = self.mod.request.Request(
            t.user.request_id,
            t.user.prompt_token_ids,
            t.user.eos_token_ids,
            t.fd.sampling_params,
            idx=t.slot,
            task_type=RequestType.DECODE,
            block_tables=list(t.blocks),
        )
        t.waiting_block = False
        return task

    def after_execute(self, scheduled_prefill: set) -> None:
        """Advance per-request positions for the step just executed."""
        for t in self.slots:
            if t is None or t.done or t.preempted:
                continue
            if t.user.request_id in scheduled_prefill:
                t.processed = t.prefilled
                if t.prefilled < t.need_prefill:
                    continue
                # The final chunk: update_inputs_v1 checks the block of position prompt_len.
                if self.config.use_v1_scheduler and len(t.blocks) * self.block_size <= t.processed:
                    t.waiting_block = True
                continue
            if t.prefilled < t.need_prefill or t.waiting_block:
                continue
            t.processed += 1
            if self.config.use_v1_scheduler and len(t.blocks) * self.block_size <= t.processed:
                t.waiting_block = True

    # -- outputs (the TokenProcessor's part) --
    def accept(self, slot: int, token: int, step: int, logprobs: Optional[TokenLogprobs]) -> None:
        t = self.slots[slot] if slot < len(self.slots) else None
        if t is None or t.done:
            return
        if token < 0:  # the sync row of a preempted slot: reschedule (token_processor.py:730-735)
            if self.preempted_token is None or token == self.preempted_token:  # 2.5 :786-802
                self.reschedule(t)
            return
        out = t.output
        if out.first_token_step is None:
            out.first_token_step = step
        out.token_ids.append(int(token))
        if logprobs is not None and t.user.logprobs is not None:
            out.logprobs.append(logprobs)
        if int(token) in t.user.eos_token_ids:
            out.finished = True
            out.finish_step = step
            out.stop_reason = _stop_reason(t.user, out.token_ids)
            t.done = True
            self._release(t)

    def stalled(self) -> bool:
        """Every running request waits for a KV block and none can be freed: FastDeploy's scheduler
        would preempt; the driver stops with an error instead."""
        active = [t for t in self.slots if t is not None and not t.done]
        return bool(active) and all(t.waiting_block for t in active)

    def unfinished(self) -> bool:
        return bool(self.waiting) or any(not t.done for t in self.tracked.values())


def _stop_reason(user: Request, tokens: list) -> str:
    if len(tokens) >= user.max_tokens:
        return "length"
    body = tokens[:-1]
    for seq in user.stop_seqs or []:
        if len(seq) and len(body) >= len(seq) and body[-len(seq) :] == list(seq):
            return "stop"
    return "eos"


def _num_blocks(config: DriverConfig) -> int:
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks
    per_seq = (config.max_model_len + config.block_size - 1) // config.block_size + config.enc_dec_block_num
    return config.max_num_seqs * per_seq


def _validate_request(user: Request, config: DriverConfig) -> None:
    if not user.prompt_token_ids:
        raise ValueError(f"{user.request_id}: empty prompt")
    if len(user.prompt_token_ids) + user.max_tokens > config.max_model_len:
        raise ValueError(f"{user.request_id}: prompt + max_tokens exceeds max_model_len={config.max_model_len}")
    if len(user.eos_token_ids) != config.eos_tokens_lens:
        raise ValueError(f"{user.request_id}: expected {config.eos_tokens_lens} eos ids")
    if user.stop_seqs:
        if len(user.stop_seqs) > config.max_stop_seqs_num or any(
            len(s) > config.stop_seqs_max_len for s in user.stop_seqs
        ):
            raise ValueError(f"{user.request_id}: stop sequences exceed the configured limits")
    if config.preemption and (len(user.prompt_token_ids) + user.max_tokens) // config.block_size + 1 > _num_blocks(config):
        raise ValueError(f"{user.request_id}: does not fit in num_gpu_blocks={_num_blocks(config)} even alone")
    if (user.logprobs is not None or user.prompt_logprobs is not None) and not config.enable_logprob:
        raise ValueError(f"{user.request_id}: logprobs need DriverConfig(enable_logprob=True)")


def default_seed(request_id: str) -> int:
    """FastDeploy gives every request a random seed up to 922337203685477580
    (``SamplingParams.__post_init__``): here a deterministic one of the same size, so the seed
    write at insert always runs (through Paddle's setitem, which rounds it as FastDeploy does)."""
    return (zlib.crc32(request_id.encode()) * 214748364751) % 922337203685477580


def _fd_request(mod, user: Request):
    params = mod.sampling_params.SamplingParams(
        max_tokens=user.max_tokens,
        min_tokens=user.min_tokens,
        top_p=user.top_p,
        top_k=user.top_k,
        temperature=user.temperature,
        logprobs=user.logprobs,
        prompt_logprobs=user.prompt_logprobs,
        temp_scaled_logprobs=user.temp_scaled_logprobs,
        top_p_normalized_logprobs=user.top_p_normalized_logprobs,
        seed=default_seed(user.request_id) if user.seed is None else user.seed,
        bad_words_token_ids=user.bad_words,
    )
    if user.stop_seqs:
        width = max(len(s) for s in user.stop_seqs)
        params.stop_token_ids = [list(s) + [-1] * (width - len(s)) for s in user.stop_seqs]
        params.stop_seqs_len = [len(s) for s in user.stop_seqs]
    return mod.request.Request(user.request_id, user.prompt_token_ids, user.eos_token_ids, params)


# ---- the run -------------------------------------------------------------------------------------


class _Modules:
    def __init__(self, root: str) -> None:
        if root.split(".")[0] == "fastdeploy":
            raise ValueError("the driver runs the replica, not FastDeploy")
        self.root = root
        self.config = importlib.import_module(root + ".config")
        self.request = importlib.import_module(root + ".engine.request")
        self.sampling_params = importlib.import_module(root + ".engine.sampling_params")
        self.runner = importlib.import_module(root + ".worker.gpu_model_runner")


_QUEUE_IDS = itertools.count(7100)


def _fd_config(mod: _Modules, config: DriverConfig, port: int):
    c = mod.config
    scheduler = c.SchedulerConfig(max_num_seqs=config.max_num_seqs)
    if config.overlap:
        if not hasattr(scheduler, "enable_overlap_schedule"):
            raise ValueError(f"{mod.root} has no overlap schedule (FastDeploy 2.5+)")
        scheduler.enable_overlap_schedule = True
    elif hasattr(scheduler, "enable_overlap_schedule"):
        scheduler.enable_overlap_schedule = False  # develop's default is on (#6668): the config decides
    if config.chunk_size is not None and not config.use_v1_scheduler:
        raise ValueError("chunked prefill is modelled on the V1 scheduler only")
    if config.preemption and (not config.use_v1_scheduler or config.save_output_v1):
        raise ValueError("preemption is modelled on the V1 scheduler with the msg-queue output path only")
    if config.engine_lag and (config.engine_lag < 0 or config.save_output_v1):
        raise ValueError("engine_lag is a step count >= 0, modelled on the msg-queue output path only")
    model = c.ModelConfig(
        vocab_size=config.vocab_size,
        ori_vocab_size=config.vocab_size,
        max_model_len=config.max_model_len,
        hidden_size=config.hidden_size,
        model_seed=config.model_seed,
        rows_dependent_gemm=config.rows_dependent_gemm,
        moe_experts=config.moe_experts,
        eos_tokens_lens=config.eos_tokens_lens,
        enable_logprob=config.enable_logprob,
        max_logprobs=config.max_logprobs,
        max_stop_seqs_num=config.max_stop_seqs_num,
        stop_seqs_max_len=config.stop_seqs_max_len,
        enable_keep_sampling_mask=config.keep_sampling_mask,
    )
    cache = c.CacheConfig(
        block_size=config.block_size,
        enc_dec_block_num=config.enc_dec_block_num,
        total_block_num=_num_blocks(config),
        enable_chunked_prefill=config.chunk_size is not None,
    )
    parallel = c.ParallelConfig(engine_worker_queue_port=port, msg_queue_id=port)
    graph = c.GraphOptimizationConfig(use_cudagraph=config.cuda_graph)
    if config.cuda_graph:
        if not mod.root.endswith(".fd24"):
            raise ValueError("the CUDA-graph stand-in is modelled on the fd24 replica only")
        graph.init_with_cudagrpah_size(max_capture_size=min(512, config.max_num_seqs))
    return c.FDConfig(model_config=model, scheduler_config=scheduler, cache_config=cache, parallel_config=parallel,
                      graph_opt_config=graph)


@contextlib.contextmanager
def _environment(config: DriverConfig):
    values = {
        "ENABLE_V1_KVCACHE_SCHEDULER": "1" if config.use_v1_scheduler else "0",
        "FD_USE_GET_SAVE_OUTPUT_V1": "1" if config.save_output_v1 else "0",
    }
    names = list(values) + ["INFERENCE_MSG_QUEUE_ID"]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _plain_logprobs(tensors) -> Optional[dict]:
    if tensors is None:
        return None
    ids, values, ranks = (np.asarray(t.numpy()) for t in tensors)
    return {"token_ids": ids, "logprobs": values, "ranks": ranks}


def _plain_payload(rows) -> list:
    out = []
    for row in rows:
        out.append(
            {
                "batch_id": int(row.batch_id),
                "tokens": None if row.tokens is None else np.asarray(row.tokens),
                "logprobs": _plain_logprobs(row.logprobs),
                "prompt_logprobs": _plain_logprobs(row.prompt_logprobs),
                "sampling_mask": None if getattr(row, "sampling_mask", None) is None else np.asarray(row.sampling_mask),
            }
        )
    return out


def _token_logprobs_from_row(lp: dict, want: int) -> TokenLogprobs:
    width = lp["token_ids"].shape[1] if want < 0 else min(want + 1, lp["token_ids"].shape[1])
    return TokenLogprobs(
        lp["token_ids"][0, :width].tolist(), lp["logprobs"][0, :width].tolist(), int(lp["ranks"][0])
    )


class _OutputReader:
    """Reads what the runner sent this step and feeds the scheduler (the engine side)."""

    def __init__(self, runner, sched: _Scheduler, config: DriverConfig, port: int) -> None:
        self.runner = runner
        self.sched = sched
        self.config = config
        self.queue = get_queue(port)
        self.queue.drain()
        self.messages: list = []
        self.payloads: list = []
        self.masks: list = []
        self.sink = get_sink(f"get_save_output_rank0_{port}") if config.save_output_v1 else None
        self.mask_sink = get_sink(f"sampling_mask_output_rank_0_{port}") if config.keep_sampling_mask else None
        self.seen_payloads = 0
        self.backlog: list = []  # (step read, message): the engine takes it ``engine_lag`` steps later

    def read(self, step: int) -> None:
        for message in self.queue.drain():
            self.messages.append(message)
            self.backlog.append((step, message))
        while self.backlog and self.backlog[0][0] <= step - self.config.engine_lag:
            self._accept_message(self.backlog.pop(0)[1], step)
        if self.sink is not None:
            # Wait until the output thread has sent everything queued so far.
            self.sink.wait_for(self.runner.async_output_queue.puts - self.seen_payloads)
            if self.sink.errors:
                raise RuntimeError(f"output thread failed to send: {self.sink.errors[0]!r}")
            taken = self.sink.take()
            self.seen_payloads += len(taken)
            for payload in taken:
                rows = _plain_payload(pickle.loads(payload))
                self.payloads.append(rows)
                self._accept_rows(rows, step)
        if self.mask_sink is not None:
            for payload in self.mask_sink.take():
                self.masks.append({int(k): np.asarray(v) for k, v in pickle.loads(payload).items()})

    def _accept_message(self, message: SavedMessage, step: int) -> None:
        tokens = message.tokens()
        topk = message.topk() if message.kind == "topk" else None
        self.sched.reschedule_beyond(len(tokens))  # token_processor.py:185-193, before the rows
        for slot, token in enumerate(tokens):
            t = self.sched.slots[slot] if slot < len(self.sched.slots) else None
            lp = None
            if topk is not None and t is not None and t.user.logprobs is not None:
                # The op packs at most K = 20 top logprobs, whatever the request asked for.
                want = TOPK_COLUMNS if t.user.logprobs < 0 else min(t.user.logprobs, TOPK_COLUMNS)
                ids, scores, ranks = topk
                lp = TokenLogprobs(ids[slot, : want + 1].tolist(), scores[slot, : want + 1].tolist(), int(ranks[slot]))
            self.sched.accept(slot, int(token), step, lp)

    def _accept_rows(self, rows: list, step: int) -> None:
        for row in rows:
            slot = row["batch_id"]
            t = self.sched.slots[slot] if slot < len(self.sched.slots) else None
            if t is not None and not t.done and row["prompt_logprobs"] is not None:
                t.output.prompt_logprobs = row["prompt_logprobs"]
            lp = None
            if row["logprobs"] is not None and t is not None and t.user.logprobs is not None:
                lp = _token_logprobs_from_row(row["logprobs"], t.user.logprobs)
            if row["tokens"] is not None:
                self.sched.accept(slot, int(row["tokens"].reshape(-1)[0]), step, lp)


def run_decode(
    root: str,
    config: DriverConfig,
    requests: Iterable[Request] = (),
    arrivals: Optional[dict] = None,
    max_steps: int = 256,
    on_step: Optional[Callable] = None,
    modules=None,
) -> DecodeResult:
    """Run decode steps until every request finished (or ``max_steps``). See the module doc.

    ``modules``: another package's runner for the same loop (``real_steps.modules.FastDeployModules``:
    a real FastDeploy tree), with ``config``, ``request``, ``sampling_params`` and
    ``build_runner(config, port)``; ``root`` is then only a label."""
    mod = modules if modules is not None else _Modules(root)
    port = next(_QUEUE_IDS)
    arrivals = {int(k): list(v) for k, v in (arrivals or {}).items()}
    arrivals.setdefault(0, [])
    arrivals[0] = list(requests) + arrivals[0]
    with _environment(config), paddle_device.routed():
        if modules is not None:
            if config.cuda_graph or config.moe_experts:
                raise ValueError("cuda_graph and moe_experts are the replica's (its model and graph stand-in)")
            fd_config, runner = None, modules.build_runner(config, port)
        else:
            fd_config = _fd_config(mod, config, port)
            runner = mod.runner.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)
        try:
            runner.load_model()
            sched = _Scheduler(mod, config, fd_config)
            reader = _OutputReader(runner, sched, config, port)
            if config.warmup:
                if not hasattr(runner, "_dummy_run"):
                    raise ValueError(f"{root} does not model the warm-up run")
                runner._dummy_run(num_tokens=min(8, config.max_model_len // 2), batch_size=1, expected_decode_len=1)
            steps = executed = 0
            truncated = False
            stalled_steps = 0
            runner_bsz = None  # real_bsz of the last insertion (FastDeploy's max_occupied_batch_index)
            while True:
                pending_arrivals = any(step >= steps for step in arrivals)
                if not sched.unfinished() and not pending_arrivals and not reader.backlog:
                    break
                if steps >= max_steps:
                    truncated = True
                    break
                census.begin_step()
                for user in arrivals.pop(steps, []):
                    sched.add(user)
                tasks = sched.schedule()
                real_bsz = sched.real_bsz()
                stalled_steps = stalled_steps + 1 if not tasks and sched.stalled() else 0
                if stalled_steps > 2:
                    raise RuntimeError(
                        "every running request waits for a KV block: num_gpu_blocks is too small "
                        "(FastDeploy would preempt a request: DriverConfig(preemption=True) models that)"
                    )
                if tasks:
                    if hasattr(mod, "to_worker"):  # another process in FastDeploy: the worker gets copies
                        tasks = [mod.to_worker(task) for task in tasks]
                    if config.use_v1_scheduler:
                        runner.insert_tasks_v1(tasks, real_bsz)
                    else:
                        runner.insert_prefill_inputs(tasks, real_bsz)
                    runner_bsz = real_bsz
                if runner_bsz is None:  # nothing inserted yet: the worker loop has no batch
                    idle = True
                else:
                    # develop has no not_need_stop(): its worker loop's hasattr guard runs every step
                    idle = not config.overlap and hasattr(runner, "not_need_stop") and not runner.not_need_stop()
                if not idle:
                    runner.execute_model(tasks or None, runner_bsz)
                    runner.exist_prefill()
                    executed += 1
                    sched.after_execute(
                        {t.request_id for t in tasks if t.task_type == mod.request.RequestType.PREFILL}
                    )
                reader.read(steps)
                if on_step is not None:
                    on_step(steps, runner)
                steps += 1
            return DecodeResult(
                outputs={rid: t.output for rid, t in sched.tracked.items()},
                messages=reader.messages,
                zmq_payloads=reader.payloads,
                sampling_masks=reader.masks,
                steps=steps,
                executed_steps=executed,
                truncated=truncated,
                preemptions=sched.preemptions,
                graph_replays=list(getattr(runner.model, "replays", [])),
            )
        finally:
            close = getattr(runner, "close", None)
            if close is not None:
                close()
            drop_sink(f"get_save_output_rank0_{port}")
            drop_sink(f"sampling_mask_output_rank_0_{port}")
            get_queue(port).drain()
