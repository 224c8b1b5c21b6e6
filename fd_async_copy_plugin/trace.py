"""Step trace: Chrome trace-event JSON of decode steps (opens in Perfetto and chrome://tracing).

``FD_ASYNC_COPY_TRACE=FILE`` in an FD worker, or ``fd-async-copy bench --trace FILE`` on the
replica. Per decode step (``execute_model``, the sync check's step boundary) on one track:

- the step as a span, and inside it the host phases as spans: ``prepare`` (``_prepare_inputs``),
  ``forward launch`` (a call into the runner's model), ``logits`` (``compute_logits``),
  ``sampler`` (a call into the runner's sampler), ``post-process`` (``post_process``), ``save``
  (FD's save functions);
- each host wait as a span (category ``wait``) named by its site, with what waited - the waits
  the sync check sees (``sync_check.py``: on a GPU its wrappers of Paddle's host reads, on CPU
  Paddle the replica's device tracking);
- copies, pinned allocations and event records as instant events (the sync census's records and
  the copy backend's ``record``).

Phases are found with a per-thread ``sys.setprofile`` hook while a step is traced: it slows the
traced steps down (a diagnostic, never on unless asked); the trace stops after
``FD_ASYNC_COPY_TRACE_STEPS`` steps (default 20, at most ``MAX_TRACE_STEPS``: about 10 KB per
step is held in memory until the file is written) following the sync check's warm-up, and the file
is written then (and at exit, if fewer steps ran). ``validate()`` checks a file against the
trace-event format and that the spans of each track nest.

The trace writes regular files only: ``path_problem()`` refuses a path that is a symbolic link, a
directory, a FIFO, a socket or a device node, or whose directory is missing or not writable - before
any work (``bench --trace``, ``FD_ASYNC_COPY_TRACE``, ``doctor``) and again right before the file
is written; the file is written to a temporary file beside it, then renamed onto it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
import threading
import time
from typing import Optional

from . import observers, sync_check
from .sync_check import site_label

log = logging.getLogger("fd_async_copy")

ENV_TRACE = "FD_ASYNC_COPY_TRACE"
ENV_TRACE_STEPS = "FD_ASYNC_COPY_TRACE_STEPS"
DEFAULT_TRACE_STEPS = 20
#: about 10 KB of events per traced step stay in memory until the file is written: 1000 steps ~ 10 MB
MAX_TRACE_STEPS = 1000
_DIGITS = re.compile(r"[0-9]+", re.ASCII)  # "٣", "1_0", "+3" and " 3" are typos, not counts


class TraceConfigError(ValueError):
    """A bad ``FD_ASYNC_COPY_TRACE``/``FD_ASYNC_COPY_TRACE_STEPS`` or ``--trace`` path: one line,
    naming the setting, its value and what is allowed."""


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def path_problem(path: str) -> Optional[str]:
    """Why the trace cannot be written to ``path`` ("" never; None: it can). Only a regular file is
    ever replaced: a symbolic link (its target would not be written), a directory, a FIFO, a socket
    or a device node at ``path`` is refused, as is a missing or unwritable directory."""
    if not path:
        return "no path given"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot inspect it ({exc.strerror or exc})"
    if st is not None:
        kind = next((name for test, name in _KINDS if test(st.st_mode)), None)
        if kind is None and not stat.S_ISREG(st.st_mode):
            kind = "not a regular file"
        if kind is not None:
            return f"it is {kind}; the trace replaces regular files only: give the path of a new or regular file"
        if not os.access(path, os.W_OK):
            return "the file exists and is not writable"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"its directory {directory} does not exist"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"its directory {directory} is not writable"
    return None


def parse_trace_steps(raw: Optional[str], source: str = ENV_TRACE_STEPS) -> int:
    """An integer from 1 to ``MAX_TRACE_STEPS`` in ASCII digits; unset or empty: the default."""
    if raw is None or raw.strip() == "":
        return DEFAULT_TRACE_STEPS
    value = raw.strip()
    if not _DIGITS.fullmatch(value) or not 1 <= int(value) <= MAX_TRACE_STEPS:
        raise TraceConfigError(f"{source}={raw!r} is not valid; allowed values: an integer from 1 to "
                               f"{MAX_TRACE_STEPS} (default {DEFAULT_TRACE_STEPS})")
    return int(value)


def settings_from_env(environ=None, pid: Optional[int] = None) -> Optional[tuple[str, int]]:
    """``(path, steps)`` of ``FD_ASYNC_COPY_TRACE``/``_STEPS`` (``{pid}`` in the path replaced), None
    when no trace is asked for; raises ``TraceConfigError`` with every problem on one line."""
    environ = os.environ if environ is None else environ
    raw_path = environ.get(ENV_TRACE)
    if not raw_path:
        return None
    problems = []
    try:
        steps = parse_trace_steps(environ.get(ENV_TRACE_STEPS))
    except TraceConfigError as exc:
        problems.append(str(exc))
    path = raw_path.replace("{pid}", str(os.getpid() if pid is None else pid))
    problem = path_problem(path)
    if problem:
        problems.append(f"{ENV_TRACE}={raw_path!r}: {problem}")
    if problems:
        raise TraceConfigError("; ".join(problems) + " (no trace is written)")
    return path, steps

#: FD functions whose calls are the save phase (2.4 and 2.5 names)
SAVE_FUNCTIONS = frozenset({"save_output_normal", "save_output_specualate", "_save_model_output",
                            "save_output", "save_output_topk", "_build_stream_transfer_data"})
#: census kinds shown as instant events (waits are spans, from the sync check)
INSTANT_KINDS = frozenset({"async_d2h", "async_h2d", "pinned_alloc", "pinned_free", "op_on_pinned"})


class Trace:
    """Trace events of one process (``pid``), one track (``tid``) per name given to ``track``."""

    def __init__(self, process_name: str = "fd-async-copy") -> None:
        self.pid = os.getpid()
        self.events: list[dict] = [{"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0,
                                    "args": {"name": process_name}}]
        self._t0 = time.perf_counter()
        self._tracks: dict[str, int] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        """Microseconds since the trace started."""
        return (time.perf_counter() - self._t0) * 1e6

    def track(self, name: str) -> int:
        with self._lock:
            if name not in self._tracks:
                tid = self._tracks[name] = len(self._tracks) + 1
                self.events.append({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": name}})
                self.events.append({"name": "thread_sort_index", "ph": "M", "pid": self.pid, "tid": tid,
                                    "args": {"sort_index": tid}})
            return self._tracks[name]

    def span(self, tid: int, name: str, cat: str, ts: float, end: float, args: Optional[dict] = None) -> None:
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.pid, "tid": tid, "ts": round(ts, 3),
                 "dur": round(max(0.0, end - ts), 3)}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    def instant(self, tid: int, name: str, cat: str, args: Optional[dict] = None) -> None:
        event = {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.pid, "tid": tid, "ts": round(self.now(), 3)}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    def to_json(self) -> dict:
        with self._lock:
            return {"traceEvents": list(self.events), "displayTimeUnit": "ms",
                    "otherData": {"producer": "fd-async-copy-plugin step trace"}}

    def write(self, path: str) -> None:
        """Write the trace to ``path`` through a temporary file beside it; raises ``OSError`` (and
        leaves nothing behind) when ``path`` is not a regular file or cannot be written."""
        problem = path_problem(path)
        if problem:
            raise OSError(f"{path}: {problem}")
        data = self.to_json()
        directory, name = os.path.split(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            problem = path_problem(path)  # something appeared there while the steps ran
            if problem:
                raise OSError(f"{path}: {problem}")
            try:  # mkstemp makes it 0600: keep a replaced file's mode, else rw-r--r--
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                mode = 0o644
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class StepTracer:
    """Traces the decode steps run on one thread at a time onto ``trace``'s current track."""

    def __init__(self, trace: Trace, track: str = "decode steps", steps: Optional[int] = None, skip: int = 0) -> None:
        self.trace = trace
        self.tid = trace.track(track)
        self.steps_left = steps  # None: every step
        self.skip = skip
        self.steps = 0
        self._local = threading.local()

    def use_track(self, name: str) -> None:
        self.tid = self.trace.track(name)

    @property
    def done(self) -> bool:
        return self.steps_left is not None and self.steps_left <= 0

    def _tracing(self) -> bool:
        return getattr(self._local, "step", None) is not None

    # -- the step boundary ---------------------------------------------------------------------
    def step_begin(self, runner=None) -> None:
        if self.skip > 0 or self.done or self._tracing():
            return
        local = self._local
        local.step = (self.trace.now(), self.steps)
        local.open = []  # (frame, name, ts)
        local.model = getattr(runner, "model", None)
        local.sampler = getattr(runner, "sampler", None)
        local.wait = None
        local.previous_profile = sys.getprofile()
        sys.setprofile(self._profile)

    def step_end(self, runner=None) -> None:
        if not self._tracing():
            if self.skip > 0:
                self.skip -= 1
            return
        local = self._local
        sys.setprofile(local.previous_profile)
        self.wait_end()
        now = self.trace.now()
        for _, name, ts in reversed(local.open):  # an exception unwound them: close at the step's end
            self.trace.span(self.tid, name, "phase", ts, now)
        start, index = local.step
        self.trace.span(self.tid, f"decode step {index}", "step", start, now)
        local.step = None
        self.steps += 1
        if self.steps_left is not None:
            self.steps_left -= 1

    # -- phases --------------------------------------------------------------------------------
    def _phase(self, frame) -> Optional[str]:
        name = frame.f_code.co_name
        if name == "_prepare_inputs":
            return "prepare"
        if name == "post_process":
            return "post-process"
        if name in SAVE_FUNCTIONS:
            return "save"
        local = self._local
        this = frame.f_locals.get("self") if name in ("__call__", "forward", "forward_cuda", "compute_logits") else None
        if this is None:
            return None
        if this is local.model:
            return "logits" if name == "compute_logits" else "forward launch"
        if this is local.sampler:
            return "sampler"
        return None

    def _profile(self, frame, event, arg) -> None:
        if event == "call":
            local = self._local
            if any(name != "post-process" for _, name, _ in local.open):
                return  # phases nest only in post-process (its save)
            phase = self._phase(frame)
            if phase is not None and not (local.open and phase == "post-process"):
                self.wait_end()
                local.open.append((frame, phase, self.trace.now()))
        elif event == "return":
            local = self._local
            if local.open and local.open[-1][0] is frame:
                self.wait_end()
                _, name, ts = local.open.pop()
                self.trace.span(self.tid, name, "phase", ts, self.trace.now())

    # -- waits and instants (from the sync check and the census) --------------------------------
    def wait_begin(self, mechanism: str, where: str, what: str) -> None:
        if self._tracing():
            label = site_label({"where": where, "mechanism": mechanism, "what": what})
            self.wait_end()  # a source that does not say when its wait ended: it ended by now
            self._local.wait = (self.trace.now(), label, where, what)

    def wait_end(self) -> None:
        """Close the open wait span (also at every phase boundary and the step's end, so that
        spans nest)."""
        if self._tracing() and self._local.wait is not None:
            ts, label, where, what = self._local.wait
            self._local.wait = None
            name = f"wait {label}" if label else "wait"
            self.trace.span(self.tid, name, "wait", ts, self.trace.now(), {"site": where, "what": what})

    def instant(self, name: str, args: dict) -> None:
        if self._tracing():
            self.trace.instant(self.tid, name, "copy", args)


# ---- process state: FD_ASYNC_COPY_TRACE --------------------------------------------------------

_tracer: Optional[StepTracer] = None


def tracer() -> Optional[StepTracer]:
    return _tracer


def activate(t: Optional[StepTracer]) -> Optional[StepTracer]:
    """Make ``t`` the tracer the step boundary and the wait sources feed (None: none)."""
    global _tracer
    previous, _tracer = _tracer, t
    if previous is not None:
        observers.unsubscribe(previous)
    if t is not None:
        observers.subscribe(t, observers.TRACE)  # the step boundary and the wait sources feed it
    return previous


def census_class():
    """A sync census that shows copies as instant events of the active tracer (and keeps nothing
    when ``keep`` is False: a worker's census is never read)."""
    from .runtime.census import SyncCensus

    class TracingCensus(SyncCensus):
        def __init__(self, keep: bool = True) -> None:
            super().__init__()
            self.keep = keep

        def record(self, kind: str, site: str) -> None:
            t = _tracer
            if t is not None and kind in INSTANT_KINDS:
                t.instant(f"{kind} {site}", {"kind": kind, "site": site})
            if self.keep:
                super().record(kind, site)

    return TracingCensus


def wrap_event_record() -> tuple:
    """The copy backend's events - ``record`` and a copy set's own (``RuntimeBackend._issue``) - as
    instant events; returns what ``unwrap`` needs."""
    from .runtime.backend import CopyBackend
    from .runtime.cuda import RuntimeBackend

    original, issue = CopyBackend.__dict__["record"], RuntimeBackend.__dict__["_issue"]

    def record(self, label):
        event = original(self, label)
        t = _tracer
        if t is not None:
            t.instant(f"event record {label}", {"label": label})
        return event

    def _issue(self, dsts, names, sources, label, grow=True):
        event = issue(self, dsts, names, sources, label, grow)
        t = _tracer
        if t is not None and event is not None:  # (None: nothing issued, ``fill`` chooses a slot)
            t.instant(f"event record {label}", {"label": label})
        return event

    CopyBackend.record, RuntimeBackend._issue = record, _issue
    return CopyBackend, original, RuntimeBackend, issue


def unwrap(saved: tuple) -> None:
    owner, original, *more = saved
    owner.record = original
    if more:
        more[0]._issue = more[1]


def install_from_env(environ=None, root: str = "fastdeploy") -> Optional[StepTracer]:
    """``FD_ASYNC_COPY_TRACE=FILE``: trace ``FD_ASYNC_COPY_TRACE_STEPS`` decode steps after the sync
    check's warm-up and write FILE (``{pid}`` in FILE is replaced by the process id: one file per
    worker). Arms the sync check first (``count`` mode if it is off: the trace shows its waits); a
    bad trace value is logged and the check is armed as its own variables say. Never raises."""
    try:
        settings = settings_from_env(environ)
    except TraceConfigError as exc:
        log.error("fd_async_copy: %s", exc)
        sync_check.install_from_env(root, environ)
        return None
    if settings is None:
        sync_check.install_from_env(root, environ)
        return None
    path, steps = settings
    c = sync_check.install_from_env(root, environ, count_if_off=True)
    if c is None:
        return None
    try:
        from . import runtime

        trace = Trace(f"FastDeploy worker {os.getpid()}")
        t = WritingTracer(trace, path, steps=steps, skip=c.settings.warmup)
        activate(t)
        cls = census_class()
        runtime.census._ACTIVE = cls(keep=False)  # process-wide, as the census is; records nothing
        wrap_event_record()
    except Exception as exc:  # never stop the server for a diagnostic
        log.error("fd_async_copy trace: cannot install (%s: %s); the check is off", type(exc).__name__, exc)
        activate(None)
        sync_check.stop()
        return None
    atexit.register(t.flush)
    log.info("fd_async_copy: tracing %d decode steps after %d warm-up steps to %s", steps, c.settings.warmup, path)
    return t


class WritingTracer(StepTracer):
    """Writes the file when its steps are done (and at exit)."""

    def __init__(self, trace: Trace, path: str, **kwargs) -> None:
        super().__init__(trace, track=f"decode steps (thread of the runner)", **kwargs)
        self.path = path
        self.written = False

    def step_end(self, runner=None) -> None:
        super().step_end(runner)
        if self.done and not self.written:
            self.flush()

    def flush(self) -> None:
        if self.written or self.steps == 0:
            return
        try:
            self.trace.write(self.path)
            self.written = True
            log.info("fd_async_copy: wrote the step trace of %d decode steps to %s (open it in "
                     "https://ui.perfetto.dev)", self.steps, self.path)
        except OSError as exc:
            log.error("fd_async_copy: cannot write the step trace to %s: %s", self.path, exc)
            self.written = True


# ---- validation -------------------------------------------------------------------------------

PHASES = frozenset({"B", "E", "X", "i", "I", "M", "C"})


def validate(data) -> list[str]:
    """Problems of ``data`` (a loaded JSON file) as trace-event JSON; [] when it is valid: an object
    with ``traceEvents`` (or a bare list), every event with ``name``, a known ``ph``, integer
    ``pid``/``tid``, a number ``ts`` >= 0 (not for metadata), ``dur`` >= 0 on ``X``, scope on
    instants, B/E pairs matched, and on each track every span either inside the one it starts in
    or after its end (spans nest)."""
    problems: list[str] = []
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        return ["no traceEvents list"]
    spans: dict[tuple, list] = {}
    begun: dict[tuple, list] = {}
    for i, e in enumerate(events):
        where = f"event {i} ({e.get('name') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: no name")
        if ph not in PHASES:
            problems.append(f"{where}: unknown ph {ph!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            problems.append(f"{where}: pid and tid must be integers")
        if ph == "M":
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or ts < 0:
            problems.append(f"{where}: ts must be a number >= 0")
            continue
        key = (e.get("pid"), e.get("tid"))
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"{where}: X event needs dur >= 0")
                continue
            spans.setdefault(key, []).append((ts, ts + dur, e["name"]))
        elif ph == "B":
            begun.setdefault(key, []).append((ts, e["name"]))
        elif ph == "E":
            if not begun.get(key):
                problems.append(f"{where}: E without B on track {key}")
            else:
                start, name = begun[key].pop()
                spans.setdefault(key, []).append((start, ts, name))
        elif ph in ("i", "I") and e.get("s", "t") not in ("t", "p", "g"):
            problems.append(f"{where}: instant scope must be t, p or g")
    for key, open_ in begun.items():
        for _, name in open_:
            problems.append(f"track {key}: B event {name!r} never ended")
    for key, items in spans.items():
        stack: list[tuple] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1]:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-3:
                problems.append(f"track {key}: span {name!r} [{start}, {end}] overlaps {stack[-1][2]!r} "
                                f"[{stack[-1][0]}, {stack[-1][1]}] without nesting")
                continue
            stack.append((start, end, name))
    return problems
