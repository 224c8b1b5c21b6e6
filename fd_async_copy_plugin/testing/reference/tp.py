"""Tensor parallelism in the replica: one thread per rank, FastDeploy's worker loop per rank.

Under ``--tensor-parallel-size N`` FastDeploy runs one worker process per rank, each with its own
``GPUModelRunner``; the ranks must take the same decision every step or one waits in a barrier while
another waits in the forward's all-reduce (a hang; FD #7172 fixed one of this class upstream).
``run_decode_tp`` plays that with one thread per rank, each with its own runner and its own copy
backend (a ``RankSim``: the simulator, with the rank's device speed), and checks per step that every
rank took the same decisions. docs/tensor-parallel.md lists the rules and their FD sources.

The worker loop per rank (``_rank_loop``), written from FD's ``event_loop_normal``:

- FD 2.4 ``worker/worker_process.py:420-551``; FD 2.5 ``worker/worker_process.py:467-642``:
  rank 0 alone asks the task queue (2.4 ``num_tasks() > 0`` :448-456; 2.5 ``exist_tasks()`` :494-502)
  and raises ``exist_task_signal``; every rank meets at ``_tp_barrier_wait()`` (2.4 :458-460,
  2.5 :505), which is ``paddle.distributed.barrier(tp_group)`` on CUDA (2.4 :304-308, 2.5 :322-326);
- every rank that sees the signal reads the tasks (``EngineWorkerQueue.get_tasks``: each client
  reads the same list; the last one gets ``read_finish`` and clears the signal, 2.4
  ``inter_communicator/engine_worker_queue.py:501-518``) and inserts them
  (``gpu_worker.preprocess_new_task`` -> ``insert_tasks_v1`` / ``insert_prefill_inputs``, 2.4
  ``worker/gpu_worker.py:204-212``, 2.5 :216-224; 2.5's ``get_tasks`` at :563-570);
- ``if not not_need_stop(): barrier; sleep; continue`` (2.4 :540-545; 2.5 :613-620, where the
  overlap schedule skips the branch but ``not_need_stop()`` is still called first), else
  ``execute_model`` and ``exist_prefill`` (2.4 :550-551; 2.5 :637-642);
- only rank 0 sends output: ``save_output``/``save_output_topk`` are called on every rank and return
  at once for ``rank_id > 0`` (2.4 ``custom_ops/gpu_ops/save_with_output_msg.cc:109``,
  ``save_output_msg_with_topk.cc:43``); the ZMQ payload is built only where ``save_each_rank or
  mp_rank == 0`` (2.4 ``model_executor/pre_and_post_process.py:396``). The replica's ops and
  ``post_process`` follow these rules already.

The ranks' one communicator is ``Collective``: the barriers and the all-reduce of the tiny model's
forward (``tiny_model.all_reduce``) are calls on it, in order, as on NCCL. A call where the ranks
are not at the same collective (one at the idle barrier, another in the forward's all-reduce), or
an all-reduce whose inputs differ in shape or token ids, fails every rank at once
(``CollectiveMismatch``); a rank waiting longer than ``timeout`` fails with ``RankHang`` and every
rank's stack (a hang made a failure).

The engine (scheduler and TokenProcessor, ``driver._Scheduler``/``_OutputReader``) runs on the
calling thread in lockstep with the loop (it schedules, releases one loop iteration of every rank,
then reads rank 0's output), so runs compare bit for bit with the single-rank driver's.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from ...runtime.backend import _mark_done
from ...runtime.simulated import SimulatedBackend
from . import copy_backend as replica_backend
from . import paddle_device, tiny_model
from .placement import device_array, write_back
from .driver import (
    DecodeResult,
    DriverConfig,
    _environment,
    _fd_config,
    _Modules,
    _OutputReader,
    _QUEUE_IDS,
    _Scheduler,
)
from .message_queue import get_queue
from .zmq_sink import drop_sink

EXIST, EMPTY = 1, 0  # ExistTaskStatus (2.4 inter_communicator/ipc_signal_const.py:46-49)


class CollectiveMismatch(AssertionError):
    """The ranks reached different collectives, or an all-reduce with different inputs."""


class RankHang(AssertionError):
    """A rank waited at a collective longer than the run's timeout (a hang on a GPU)."""


def _all_stacks(threads: dict) -> str:
    frames = sys._current_frames()
    out = []
    for rank, thread in sorted(threads.items()):
        frame = frames.get(thread.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (not running)\n"
        out.append(f"--- rank {rank} ({thread.name}) ---\n{stack}")
    return "\n".join(out)


class Collective:
    """The ranks' communicator: every call is one collective all ranks must make, in the same order."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size, self.timeout = size, timeout
        self._cond = threading.Condition()
        self._arrived: dict = {}
        self._generation = 0
        self.error: Optional[BaseException] = None
        self.threads: dict = {}  # rank -> thread, for the stacks of a hang
        self.calls = 0
        self.kinds: collections.Counter = collections.Counter()  # collectives made, by kind

    def abort(self, error: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()

    def call(self, rank: int, kind: str, payload=None) -> dict:
        """One collective; returns every rank's payload. Payloads must be equal (an all-reduce of one
        shape), except for a ``reduce`` (a reduction of the ranks' values)."""
        with self._cond:
            if self.error is not None:
                raise self.error
            generation = self._generation
            self._arrived[rank] = (kind, payload)
            if len(self._arrived) == self.size:
                arrived, self._arrived = self._arrived, {}
                kinds = {r: k for r, (k, _) in sorted(arrived.items())}
                payloads = {r: p for r, (_, p) in sorted(arrived.items())}
                differ = len({repr(p) for p in payloads.values()}) > 1 and not kind.startswith("reduce")
                if len(set(kinds.values())) > 1 or differ:
                    what = ", ".join(f"rank {r}: {kinds[r]} {payloads[r]!r}" for r in kinds)
                    self.error = CollectiveMismatch(
                        f"collective #{self.calls}: the ranks are not at the same collective ({what}); "
                        "on GPUs this hangs or reduces garbage")
                    self._cond.notify_all()
                    raise self.error
                self.calls += 1
                self.kinds[kind] += 1
                self._last = payloads  # read by every waiting rank before the next one can complete
                self._generation += 1
                self._cond.notify_all()
                return payloads
            done = self._cond.wait_for(lambda: self._generation != generation or self.error is not None,
                                       self.timeout)
            if self.error is not None:
                raise self.error
            if done:
                return self._last
            if not done:
                waiting = {r: k for r, (k, _) in sorted(self._arrived.items())}
                self.error = RankHang(
                    f"rank {rank} waited {self.timeout:g} s at {kind!r}; ranks at a collective: {waiting}, "
                    f"the others never came:\n{_all_stacks(self.threads)}")
                self._cond.notify_all()
                raise self.error

    def barrier(self, rank: int, site: str) -> None:
        """``paddle.distributed.barrier(tp_group)`` (``_tp_barrier_wait``)."""
        self.call(rank, "barrier", site)


class _TPGroup:
    """A rank's ``parallel_config.tp_group`` (FD 2.4 ``config.py:629-640``): collectives on it are the
    run's ``Collective`` (``routed_all_reduce``)."""

    def __repr__(self) -> str:
        return "<replica tp_group>"


TP_GROUP = _TPGroup()
_REDUCTIONS = {"SUM": np.sum, "MAX": np.max, "MIN": np.min, "PROD": np.prod}


def _all_reduce(tensor, op=None, group=None, sync_op=True, **kwargs):
    """``paddle.distributed.all_reduce`` on the replica's ``TP_GROUP`` from a rank thread: the ranks'
    values reduced through the run's collective, written back in place."""
    import paddle

    collective = getattr(tiny_model._tp, "collective", None)
    if collective is None or group is not TP_GROUP:
        return _all_reduce.__wrapped__(tensor, op=op, group=group, sync_op=sync_op, **kwargs)
    ops = paddle.distributed.ReduceOp
    name = "SUM" if op is None else next(n for n in _REDUCTIONS if op == getattr(ops, n))
    values = collective(f"reduce_{name.lower()}", device_array(tensor).tolist())
    reduced = _REDUCTIONS[name](np.stack([np.asarray(v) for _, v in sorted(values.items())]), axis=0)
    write_back(tensor, reduced.astype(device_array(tensor).dtype))
    return None


@contextlib.contextmanager
def routed_all_reduce():
    """``paddle.distributed.all_reduce`` routed to the rank's collective for the run (the plugin's own
    collectives, e.g. overlap's agreement at runner construction, meet the other ranks there)."""
    import paddle

    real = paddle.distributed.all_reduce
    _all_reduce.__wrapped__ = real
    paddle.distributed.all_reduce = _all_reduce
    try:
        yield
    finally:
        paddle.distributed.all_reduce = real


class TaskQueue:
    """``EngineWorkerQueue`` of one data-parallel group: each client reads the same list; the list is
    cleared once every client read it (2.4 ``engine_worker_queue.py:476-530``)."""

    def __init__(self, clients: int) -> None:
        self._lock = threading.Lock()
        self.clients = clients
        self.tasks: list = []
        self.read_flag = [1] * clients

    def put_tasks(self, tasks) -> None:
        with self._lock:
            if sum(self.read_flag) < self.clients:
                raise RuntimeError("put_tasks before every rank read the last batch (the engine is in lockstep)")
            self.tasks[:] = []
            self.read_flag = [0] * self.clients
            self.tasks.append(tasks)

    def num_tasks(self) -> int:
        with self._lock:
            return len(self.tasks)

    def get_tasks(self, client: int):
        with self._lock:
            tasks = copy.deepcopy(self.tasks)  # each worker process unpickles its own copy
            self.read_flag[client] = 1
            finished = sum(self.read_flag) == self.clients
            if finished:
                self.tasks[:] = []
            return tasks, finished


class RankSim(SimulatedBackend):
    """The simulator for one rank's device. ``speed`` (1 = fastest): an event's copies complete on
    the device ``speed - 1`` steps' worth of records after it (``query`` says so and lands them,
    as the GPU would have); ``late``: copies complete only when the host waits, and a wait takes
    ``late_s`` seconds (this rank's copies land late). Waits always land what they cover."""

    def __init__(self, rank: int, speed: int = 1, late: bool = False, late_s: float = 0.002) -> None:
        super().__init__()
        self.rank, self.speed, self.late, self.late_s = rank, int(speed), late, late_s
        self.records = 0  # ``record`` calls on this rank's device so far
        self._recorded: dict[int, int] = {}  # event handle -> ``records`` when ``record`` made it
        self.queries = {"complete": 0, "in flight": 0}

    def _event(self, stream: int, device: int) -> int:
        handle = super()._event(stream, device)  # (a pooled handle, taken right before it is recorded)
        self._recorded.pop(handle, None)  # a copy set's event: as if recorded now
        return handle

    def _record_native(self, label):
        self.records += 1
        event = super()._record_native(label)
        for handle in event.native:
            self._recorded[handle] = self.records
        return event

    def query(self, event) -> bool:
        if event.done:
            return True
        recorded = max((self._recorded.get(h, self.records) for h in event.native), default=self.records)
        done = not self.late and self.records - recorded >= self.speed - 1
        self.queries["complete" if done else "in flight"] += 1
        if done:  # the device finished them: the data is there, no host wait made
            for handle in event.native:
                self.rt.event_synchronize(handle)
            with self._lock:
                _mark_done(event)
        return done

    def wait(self, event, reason: str) -> None:
        if self.late and not event.done:
            time.sleep(self.late_s)
        super().wait(event, reason)


class RankBackends(SimulatedBackend):
    """The copy backend the plugin and the replica get in a TP run: each call goes to the calling
    rank thread's own ``RankSim`` (one process per rank in FastDeploy: one backend each). Outside a
    rank thread (``enable()``, ``disable()`` on the test's thread) it is ``main``, which holds no
    rank's buffers. A ``SimulatedBackend`` by type (code that asks the type of its backend sees the
    simulator's methods), every method and attribute forwarded."""

    name = "sim"

    def __init__(self, ranks: list) -> None:  # (no backend state of its own)
        self.ranks = ranks
        self.main = SimulatedBackend()
        self._local = threading.local()

    @contextlib.contextmanager
    def rank(self, rank: int):
        self._local.backend = self.ranks[rank]
        try:
            yield
        finally:
            self._local.backend = None

    def current(self):
        return getattr(self._local, "backend", None) or self.main

    def __getattr__(self, name):
        return getattr(self.current(), name)


def _forward(name):
    def method(self, *args, **kwargs):
        backend = getattr(self._local, "backend", None)
        if backend is None and args:  # the test's thread (disable() finishing a rank's pending save)
            backend = next((b for b in self.ranks if b.is_pinned(args[0])), None)
        return getattr(backend or self.main, name)(*args, **kwargs)

    method.__name__ = name
    return method


for _name in {n for klass in SimulatedBackend.__mro__ for n, v in vars(klass).items() if callable(v)}:
    if not _name.startswith("__") and _name not in vars(RankBackends):
        setattr(RankBackends, _name, _forward(_name))


class RankCensus:
    """The active census of a TP run (``census.collecting(RankCensus(...))``): each record goes to the
    census of the rank whose thread makes it; other threads (rank 0's output thread) count for rank 0,
    the only rank that sends output."""

    def __init__(self, backends: RankBackends, censuses: dict) -> None:
        self.backends, self.censuses = backends, censuses

    def _own(self):
        backend = getattr(self.backends._local, "backend", None)
        rank = self.backends.ranks.index(backend) if backend is not None else 0
        return self.censuses[rank]

    def begin_step(self):
        return self._own().begin_step()

    def record(self, kind: str, site: str) -> None:
        self._own().record(kind, site)


class _RankLocal(dict):
    """A dict of per-process plugin state (the ``logprobs`` feature's rings by kind) made one per
    rank (the rank whose backend is current): in FastDeploy each rank is a process with its own."""

    def __init__(self, backends: RankBackends) -> None:
        super().__init__()
        self.backends = backends
        self._by_rank: dict = {}

    def _own(self) -> dict:
        return self._by_rank.setdefault(id(self.backends.current()), {})

    def get(self, key, default=None):
        return self._own().get(key, default)

    def __getitem__(self, key):
        return self._own()[key]

    def __setitem__(self, key, value) -> None:
        self._own()[key] = value

    def __contains__(self, key) -> bool:
        return key in self._own()

    def __len__(self) -> int:
        return len(self._own())

    def __iter__(self):
        return iter(self._own())

    def values(self):
        return self._own().values()

    def items(self):
        return self._own().items()


def _per_rank_process_state(backends: RankBackends) -> None:
    """The plugin's per-process state that a rank would own in its process, made per rank."""
    import fd_async_copy_plugin

    manager = fd_async_copy_plugin._manager
    applied = manager.applied.get("logprobs") if manager is not None and manager.enabled else None
    copier = getattr(getattr(applied, "ctx", None), "state", None)
    if copier is not None and hasattr(copier, "rings") and not isinstance(copier.rings, _RankLocal):
        copier.rings = _RankLocal(backends)


@dataclass
class RankStep:
    """What one rank decided in one loop iteration."""

    inserted: tuple = ()  # (request_id, task_type) of the tasks it inserted
    not_need_stop: Optional[bool] = None  # its answer (None: not asked)
    executed: bool = False
    exist_prefill: Optional[bool] = None


@dataclass
class TPResult:
    result: DecodeResult  # rank 0's outputs, as the engine received them
    ranks: dict = field(default_factory=dict)  # rank -> [RankStep per iteration]
    backends: list = field(default_factory=list)  # the RankSims
    collectives: int = 0  # collectives made (barriers + all-reduces)
    collective_kinds: dict = field(default_factory=dict)  # by kind
    censuses: dict = field(default_factory=dict)  # rank -> SyncCensus (``census=True``)
    runners: list = field(default_factory=list)  # each rank's runner (closed), for the plugin's parts

    def asymmetries(self) -> list:
        """Iterations where some rank decided otherwise than rank 0 (empty: every rank alike)."""
        out = []
        base = self.ranks[0]
        for rank, steps in sorted(self.ranks.items()):
            if len(steps) != len(base):
                out.append(f"rank {rank} ran {len(steps)} iterations, rank 0 {len(base)}")
            for i, (a, b) in enumerate(zip(base, steps)):
                if a != b:
                    out.append(f"iteration {i}: rank 0 {a} vs rank {rank} {b}")
        return out


class _Lockstep:
    """The engine releases one loop iteration of every rank and waits for all of them."""

    def __init__(self, size: int, timeout: float) -> None:
        self.start = threading.Barrier(size + 1, timeout=timeout)
        self.end = threading.Barrier(size + 1, timeout=timeout)
        self.stop = False


def _rank_loop(rank, tp, make_runner, ready, modern, config, collective, queue, signal, lockstep, steps, backends,
               errors, census_of):
    """The rank's worker: its runner built (every rank at once: a plugin may meet the others in a
    collective there), then FastDeploy's ``event_loop_normal`` (module doc), one iteration per release."""
    from ...runtime import census

    counting = bool(census_of)
    try:
        with backends.rank(rank), tiny_model.tensor_parallel(lambda kind, payload: collective.call(rank, kind, payload)):
            runner = make_runner(rank)
            ready.wait()
            max_occupied_batch_index = None
            while True:
                lockstep.start.wait()
                if lockstep.stop or collective.error is not None:
                    return
                record = RankStep()
                if counting:
                    census.begin_step()  # this rank's census (RankCensus)
                try:
                    if rank == 0 and queue.num_tasks() > 0:
                        signal[0] = EXIST
                    if tp > 1:
                        collective.barrier(rank, "exist_task_signal")
                    if signal[0] == EXIST:
                        tasks, read_finish = queue.get_tasks(rank)
                        if read_finish:
                            signal[0] = EMPTY
                        req_dicts = []
                        for req_dict, bsz in tasks:
                            max_occupied_batch_index = int(bsz)
                            req_dicts.extend(req_dict)
                        if req_dicts or not modern:
                            if config.use_v1_scheduler:
                                runner.insert_tasks_v1(req_dicts, max_occupied_batch_index)
                            else:
                                runner.insert_prefill_inputs(req_dicts, max_occupied_batch_index)
                        record.inserted = tuple((t.request_id, str(t.task_type)) for t in req_dicts)
                    if modern and config.overlap:
                        # FD 2.5 evaluates not_need_stop() here and discards it (:613-616): an
                        # unsynchronised read of the pinned flag (the simulator would flag it)
                        idle = max_occupied_batch_index is None
                    elif max_occupied_batch_index is not None:
                        record.not_need_stop = bool(runner.not_need_stop())
                        idle = not record.not_need_stop
                    else:
                        idle = True  # nothing inserted yet (the runner's flag is False then too)
                    if idle:
                        if tp > 1:
                            collective.barrier(rank, "idle (not_need_stop() is False)")
                    else:
                        runner.execute_model(None, max_occupied_batch_index)
                        record.exist_prefill = bool(runner.exist_prefill())
                        record.executed = True
                finally:
                    steps.append(record)
                lockstep.end.wait()
    except threading.BrokenBarrierError:
        return
    except BaseException as exc:  # noqa: BLE001 - reported by the engine with the rank's name
        errors[rank] = exc
        collective.abort(exc if isinstance(exc, AssertionError) else RuntimeError(f"rank {rank} failed: {exc!r}"))
        for barrier in (ready, lockstep.start, lockstep.end):
            barrier.abort()


def run_decode_tp(
    root: str,
    config: DriverConfig,
    tp: int,
    requests: Iterable = (),
    arrivals: Optional[dict] = None,
    max_steps: int = 256,
    speeds: Optional[list] = None,
    late_rank: Optional[int] = None,
    timeout: float = 20.0,
    census: bool = False,
) -> TPResult:
    """Run ``tp`` ranks of the replica at ``root`` (with whatever patches are applied to it) until
    every request finished. ``speeds``: per rank, the ``RankSim`` speed (1 = fastest); ``late_rank``:
    that rank's copies land only when waited, late. The plugin, when enabled, must have been enabled
    with this run's backend (``tp_backends``/``enable_tp``); an unpatched run hands it to the replica."""
    from ...runtime import census as census_module

    mod = _Modules(root)  # (imports the replica: a plugin enabled on it applies now)
    modern = hasattr(mod.config, "PREEMPTED_TOKEN_ID")  # FD 2.5's loop (exist_tasks, the overlap branch)
    backends = _current_backends()
    if backends is None or len(backends.ranks) != tp:
        raise ValueError(f"run_decode_tp needs tp_backends({tp}) in effect (with the plugin: enable_tp)")
    _per_rank_process_state(backends)
    for rank, sim in enumerate(backends.ranks):
        sim.speed = (speeds or [1] * tp)[rank]
        sim.late = rank == late_rank
    port = next(_QUEUE_IDS)
    arrivals = {int(k): list(v) for k, v in (arrivals or {}).items()}
    arrivals.setdefault(0, [])
    arrivals[0] = list(requests) + arrivals[0]
    collective = Collective(tp, timeout)
    queue, signal = TaskQueue(tp), [EMPTY]
    barrier_timeout = 1.5 * timeout + 1.0  # after the collective's own timeout: its report wins
    lockstep = _Lockstep(tp, barrier_timeout)
    steps: dict = {rank: [] for rank in range(tp)}
    errors: dict = {}
    censuses = {rank: census_module.SyncCensus() for rank in range(tp)} if census else {}
    counting = census_module.collecting(RankCensus(backends, censuses)) if census else contextlib.nullcontext()
    with _environment(config), paddle_device.routed(), routed_all_reduce(), counting:
        runners = [None] * tp
        ready = threading.Barrier(tp + 1, timeout=barrier_timeout)

        def make_runner(rank):
            fd_config = _fd_config(mod, config, port)
            fd_config.parallel_config.tensor_parallel_size = tp
            fd_config.parallel_config.tensor_parallel_rank = rank
            fd_config.parallel_config.tp_group = TP_GROUP
            runner = mod.runner.GPUModelRunner(fd_config, device="gpu", device_id=rank, rank=rank, local_rank=rank)
            runners[rank] = runner
            runner.load_model()
            return runner

        try:
            threads = {
                rank: threading.Thread(
                    target=_rank_loop, name=f"tp-rank{rank}", daemon=True,
                    args=(rank, tp, make_runner, ready, modern, config, collective, queue, signal, lockstep,
                          steps[rank], backends, errors, censuses))
                for rank in range(tp)
            }
            collective.threads = threads
            for thread in threads.values():
                thread.start()
            n = executed = 0
            truncated = False
            sched = reader = None
            try:
                ready.wait()  # every rank built its runner
                sched = _Scheduler(mod, config, runners[0].fd_config)
                reader = _OutputReader(runners[0], sched, config, port)
                while True:
                    if not sched.unfinished() and not any(s >= n for s in arrivals) and not reader.backlog:
                        break
                    if n >= max_steps:
                        truncated = True
                        break
                    for user in arrivals.pop(n, []):
                        sched.add(user)
                    tasks = sched.schedule()
                    if tasks:
                        queue.put_tasks((tasks, sched.real_bsz()))
                    try:
                        lockstep.start.wait()
                        lockstep.end.wait()
                    except threading.BrokenBarrierError:
                        break
                    if collective.error is not None or errors:
                        break
                    if steps[0] and steps[0][-1].executed:
                        executed += 1
                        sched.after_execute(
                            {t.request_id for t in tasks if t.task_type == mod.request.RequestType.PREFILL})
                    reader.read(n)
                    n += 1
            except threading.BrokenBarrierError:
                pass  # a rank failed while building its runner (reported below)
            finally:
                lockstep.stop = True
                with contextlib.suppress(threading.BrokenBarrierError):
                    lockstep.start.wait(timeout=1.0)
                for thread in threads.values():
                    thread.join(timeout=timeout)
            if errors:
                rank, exc = sorted(errors.items())[0]
                if isinstance(exc, AssertionError):
                    raise exc
                raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
            if collective.error is not None:
                raise collective.error
            if lockstep.start.broken or lockstep.end.broken:
                raise RankHang(f"a rank did not finish its loop iteration within {timeout:g} s:\n"
                               f"{_all_stacks(threads)}")
            result = DecodeResult(
                outputs={rid: t.output for rid, t in sched.tracked.items()},
                messages=reader.messages, zmq_payloads=reader.payloads, sampling_masks=reader.masks,
                steps=n, executed_steps=executed, truncated=truncated, preemptions=sched.preemptions)
            return TPResult(result, steps, list(backends.ranks), collective.calls, dict(collective.kinds), censuses,
                            list(runners))
        finally:
            for rank, runner in enumerate(runners):
                close = getattr(runner, "close", None) if runner is not None else None
                if close is not None:
                    with backends.rank(rank):
                        close()
            for rank in range(tp):
                drop_sink(f"get_save_output_rank{rank}_{port}")
            drop_sink(f"sampling_mask_output_rank_0_{port}")
            get_queue(port).drain()


def _current_backends() -> Optional[RankBackends]:
    current = replica_backend.current()
    return current if isinstance(current, RankBackends) else None


@contextlib.contextmanager
def tp_backends(tp: int):
    """A ``RankBackends`` of ``tp`` fresh ``RankSim``s handed to the replica (an unpatched run)."""
    backends = RankBackends([RankSim(rank) for rank in range(tp)])
    previous = replica_backend.use(backends)
    try:
        yield backends
    finally:
        replica_backend.use(previous)


@contextlib.contextmanager
def enable_tp(tp: int, features, root: str, **kwargs):
    """The plugin enabled on ``root`` with ``features`` and a ``RankBackends`` of ``tp`` ranks as its
    backend (``sim`` per rank); disabled afterwards. Yields ``status()``."""
    import fd_async_copy_plugin
    from ..backends import sim_made_by

    backends = RankBackends([RankSim(rank) for rank in range(tp)])
    with sim_made_by(lambda: backends):
        status = fd_async_copy_plugin.enable(features=features, backend="sim", root=root, **kwargs)
    try:
        yield status
    finally:
        fd_async_copy_plugin.disable()


#: the variants of ``census_per_rank``: name -> (replica, the plugin's features or None: unpatched)
CENSUS_TP_VARIANTS = {"fd24-unpatched": ("fd24", None), "fd24-plugin": ("fd24", "all"),
                      "fd24-overlap": ("fd24", "all,overlap")}


def census_per_rank(config: DriverConfig, requests, tp: int = 2, max_steps: int = 256) -> dict:
    """``bench``'s TP rows: per variant and rank, the census row (``harness.census_row``) of a TP run
    (``sim`` per rank), named ``<variant> r<rank>``."""
    from types import SimpleNamespace

    from ..harness import census_row
    from . import ROOTS

    rows = {}
    for name, (replica, features) in CENSUS_TP_VARIANTS.items():
        root = ROOTS[replica]
        plugin = enable_tp(tp, features.split(","), root) if features else tp_backends(tp)
        with plugin:
            run = run_decode_tp(root, config, tp, requests, max_steps=max_steps, census=True)
        if run.asymmetries():
            raise AssertionError(f"{name}: the ranks decided otherwise: {run.asymmetries()[:3]}")
        for rank, counted in sorted(run.censuses.items()):
            rows[f"{name} r{rank}"] = census_row(SimpleNamespace(census=counted, final_status=None))
    return rows
