"""In-process stand-in for the SysV message queue between the GPU worker and FastDeploy's engine.

FastDeploy's ``save_output`` / ``save_output_topk`` ops pack one message per decode step and
``msgsnd`` it to the queue keyed by ``ftok("/dev/shm", INFERENCE_MSG_QUEUE_ID)``; the engine's
TokenProcessor reads it with ``get_output`` / ``get_output_topk``. The replica's save ops put the
same packed layout (fastdeploy-surface.md section 4) into a ``MessageQueue`` found by that id.

Layouts (``MAX_BSZ = 512``, ``K = 20``):

- token message (``save_output``): ``mtext`` int32 ``[MAX_BSZ + 2]``:
  ``mtext[0] = +msg_id`` while ``not_need_stop`` else ``-msg_id``, ``mtext[1] = bsz``,
  ``mtext[2 + i]`` = token of row i (2.5: ``-9`` for a preempted row).
- top-k message (``save_output_topk``): ``mtext`` int32 ``[MAX_BSZ * (K + 1) + 2]`` with
  ``mtext[2 + i*(K+1) + j]`` = column j of row i (column 0 is the sampled token taken from ``x``,
  columns ``1 <= j < K'`` the top-k ids, the rest -1), ``mtext_f`` float32 ``[MAX_BSZ * (K + 1)]``
  the matching scores (0.0 padding), ``mtext_ranks`` int32 ``[MAX_BSZ]``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np

MAX_BSZ = 512
K = 20


class MessageOverflowError(RuntimeError):
    """A batch larger than ``MAX_BSZ``: the real op overruns its static message buffer."""


@dataclass
class SavedMessage:
    """One ``msgsnd``: ``kind`` is ``"tokens"`` or ``"topk"``."""

    kind: str
    mtext: np.ndarray
    mtext_f: np.ndarray | None = None
    mtext_ranks: np.ndarray | None = None

    @property
    def not_need_stop(self) -> bool:
        return int(self.mtext[0]) > 0

    @property
    def bsz(self) -> int:
        return int(self.mtext[1])

    def tokens(self) -> np.ndarray:
        """The sampled token of each row (column 0 for top-k messages)."""
        if self.kind == "tokens":
            return self.mtext[2 : 2 + self.bsz].copy()
        return self.mtext[2 : 2 + self.bsz * (K + 1)].reshape(self.bsz, K + 1)[:, 0].copy()

    def topk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids [bsz, K+1], scores [bsz, K+1], ranks [bsz])`` of a top-k message."""
        if self.kind != "topk":
            raise ValueError("not a top-k message")
        n = self.bsz
        ids = self.mtext[2 : 2 + n * (K + 1)].reshape(n, K + 1).copy()
        scores = self.mtext_f[: n * (K + 1)].reshape(n, K + 1).copy()
        return ids, scores, self.mtext_ranks[:n].copy()

    def same_as(self, other: "SavedMessage") -> bool:
        def eq(a, b):
            if a is None or b is None:
                return a is b
            return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

        return (
            self.kind == other.kind
            and eq(self.mtext, other.mtext)
            and eq(self.mtext_f, other.mtext_f)
            and eq(self.mtext_ranks, other.mtext_ranks)
        )


def message_id() -> int:
    """``INFERENCE_MSG_ID`` (default 1), validated like the real ops."""
    value = int(os.environ.get("INFERENCE_MSG_ID", "1"))
    if value == 2:
        raise RuntimeError(" INFERENCE_MSG_ID cannot be 2, please use other number.")
    if value < 0:
        raise RuntimeError(" INFERENCE_MSG_ID cannot be negative, please use other number.")
    return value


def queue_id() -> int:
    """``INFERENCE_MSG_QUEUE_ID`` (default 1), set by the runner to the engine worker queue port."""
    return int(os.environ.get("INFERENCE_MSG_QUEUE_ID", "1"))


@dataclass
class MessageQueue:
    """FIFO of ``SavedMessage``; ``drain()`` is the engine side's ``get_output`` loop."""

    qid: int
    messages: list[SavedMessage] = field(default_factory=list)

    def send(self, message: SavedMessage) -> None:
        with _LOCK:
            self.messages.append(message)

    def drain(self) -> list[SavedMessage]:
        with _LOCK:
            out, self.messages = self.messages, []
        return out


_LOCK = threading.Lock()
_QUEUES: dict[int, MessageQueue] = {}


def get_queue(qid: int | None = None) -> MessageQueue:
    """The queue for ``qid`` (``msgget(ftok(...), IPC_CREAT)``: created on first use)."""
    qid = queue_id() if qid is None else qid
    with _LOCK:
        q = _QUEUES.get(qid)
        if q is None:
            q = _QUEUES[qid] = MessageQueue(qid)
        return q


def pack_tokens(tokens: np.ndarray, not_need_stop: bool, preempted: np.ndarray | None = None) -> SavedMessage:
    tokens = np.asarray(tokens).reshape(-1)
    bsz = tokens.shape[0]
    if bsz > MAX_BSZ:
        raise MessageOverflowError(f"save_output with bsz={bsz} > MAX_BSZ={MAX_BSZ}")
    msg_id = message_id()
    mtext = np.zeros([MAX_BSZ + 2], dtype=np.int32)
    mtext[0] = msg_id if not_need_stop else -msg_id
    mtext[1] = bsz
    mtext[2 : 2 + bsz] = tokens.astype(np.int32)
    if preempted is not None:
        rows = np.flatnonzero(np.asarray(preempted).reshape(-1)[:bsz] == 1)
        mtext[2 + rows] = -9
    return SavedMessage("tokens", mtext)


def pack_topk(
    tokens: np.ndarray,
    logprob_token_ids: np.ndarray,
    logprob_scores: np.ndarray,
    ranks: np.ndarray,
    not_need_stop: bool,
    preempted: np.ndarray | None = None,
) -> SavedMessage:
    tokens = np.asarray(tokens).reshape(-1)
    bsz = tokens.shape[0]
    if bsz > MAX_BSZ:
        raise MessageOverflowError(f"save_output_topk with bsz={bsz} > MAX_BSZ={MAX_BSZ}")
    ids = np.asarray(logprob_token_ids).reshape(bsz, -1)
    scores = np.asarray(logprob_scores, dtype=np.float32).reshape(bsz, -1)
    width = ids.shape[1]  # max_num_logprobs + 1 in FastDeploy's naming inside the op
    msg_id = message_id()
    mtext = np.zeros([MAX_BSZ * (K + 1) + 2], dtype=np.int32)
    mtext_f = np.zeros([MAX_BSZ * (K + 1)], dtype=np.float32)
    mtext_ranks = np.zeros([MAX_BSZ], dtype=np.int32)
    mtext[0] = msg_id if not_need_stop else -msg_id
    mtext[1] = bsz
    body = np.full([bsz, K + 1], -1, dtype=np.int32)
    body_f = np.zeros([bsz, K + 1], dtype=np.float32)
    body[:, 0] = tokens.astype(np.int32)
    body_f[:, 0] = scores[:, 0]
    cols = min(width, K + 1)
    if cols > 1:
        body[:, 1:cols] = ids[:, 1:cols].astype(np.int32)
        body_f[:, 1:cols] = scores[:, 1:cols]
    if preempted is not None:
        body[np.asarray(preempted).reshape(-1)[:bsz] == 1, :] = -9
    mtext[2 : 2 + bsz * (K + 1)] = body.reshape(-1)
    mtext_f[: bsz * (K + 1)] = body_f.reshape(-1)
    mtext_ranks[:bsz] = np.asarray(ranks).reshape(-1)[:bsz].astype(np.int32)
    return SavedMessage("topk", mtext, mtext_f, mtext_ranks)
