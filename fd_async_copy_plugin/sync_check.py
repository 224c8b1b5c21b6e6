"""Runtime sync check: what each decode step of *this* FastDeploy worker makes the host wait for.

``FD_ASYNC_COPY_SYNC_CHECK=off|count|warn|raise`` (default ``off``: nothing is installed, nothing
costs anything). Works with the plugin enabled or not (``FD_ASYNC_COPY=0`` measures unpatched FD).

- **Step boundary**: ``step_begin(runner)`` / ``step_end(runner)``, called around the runner's
  ``execute_model`` (today by the one wrapper ``install_step_hook`` puts on the runner class).
  A step is one turn of the worker loop on the thread that runs ``execute_model``: its waits from
  the end of the previous ``execute_model`` (the loop's own checks, inserts) to the end of this
  one. Waits on other threads are never counted (FD's output and ZMQ threads are not the step):
  the scope is per thread.
- **Warm-up**: the first ``FD_ASYNC_COPY_SYNC_CHECK_WARMUP`` steps (default 20) are not counted.
- **Sources of waits** (each reports ``observe(mechanism, where, what)``):
  on a GPU build, ``install_gpu_source()`` wraps Paddle's host reads of a tensor placed on the GPU
  (``HOST_READS``: ``numpy``, ``item``, ``tolist``, ``__bool__``/``__int__``/``__float__``,
  ``cpu`` ...), a ``copy_`` from the GPU into pageable host memory, ``paddle.device.synchronize``
  and the copy backend's event waits and synchronizes (the plugin's own, and FD 2.5's through the
  replica). On CPU Paddle the replica's device-value tracking
  (``testing/reference/device_tracking.py``), which knows which CPU tensors stand for device
  tensors, reports into the same function.
- **Modes**: ``count``: per-step figures in ``status()["sync_check"]`` and ``doctor --json``, one
  log line every ``FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY`` counted steps (default 100); ``warn``: also
  logs each new site once; ``raise``: raises ``SyncCheckError`` at a wait whose site is not on the
  allow-list ``FD_ASYNC_COPY_SYNC_CHECK_ALLOW`` (comma list of substrings of the site, its label or
  what waited; for tests).

A site is ``file:line function`` of the first frame outside Paddle, numpy and this module
(``site_of``), the label the name fd24-step-syncs.md gives the blocking point (``site_label``:
S1, S2, S3/S7, T, S5, S6, L1-3, I1, ``save event`` ...).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from . import observers

log = logging.getLogger("fd_async_copy")

ENV_MODE = "FD_ASYNC_COPY_SYNC_CHECK"
ENV_WARMUP = "FD_ASYNC_COPY_SYNC_CHECK_WARMUP"
ENV_ALLOW = "FD_ASYNC_COPY_SYNC_CHECK_ALLOW"
ENV_LOG_EVERY = "FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY"
ENV_VARS = (ENV_MODE, ENV_WARMUP, ENV_ALLOW, ENV_LOG_EVERY)
MODES = ("off", "count", "warn", "raise")

#: Tensor methods that read the tensor's values on the host (device tracking uses the same list).
HOST_READS = frozenset({
    "numpy", "item", "tolist", "__int__", "__float__", "__bool__", "__nonzero__", "__index__",
    "__complex__", "__array__", "__format__", "__str__", "__repr__", "__reduce__", "__reduce_ex__",
    "cpu", "pin_memory", "_copy_to", "__deepcopy__",
})
#: What the GPU source wraps: host reads a serving step can make (printing is left out).
_GPU_SOURCE_READS = ("numpy", "item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu", "__array__")

#: fd24-step-syncs.md's names for the blocking points, by the function the site is in
#: (feature-only points in lower case).
SITE_LABELS = {
    "get_padding_offset": "S1",
    "_prepare_inputs": "S2",
    "exist_prefill": "S3/S7",
    "top_k_top_p_sampling": "T",
    "_host_flag_from_kernel": "S5",
    "save_output": "S6",
    "save_output_topk": "S6",
    "_build_stream_transfer_data": "S6",
    "gather_logprobs": "L1-3",
    "insert_tasks_v1": "I1",
    "_get_prompt_logprobs_list": "prompt lp",
    "_device_synchronize": "prompt lp",
    "keep_sampling_mask": "ksm",
    "_renormalize_logprobs": "ksm",
}
_EVENT_LABELS = {"_prepare_inputs": "token_num", "_postprocess": "token_num", "_save_model_output": "save event",
                 "_resolve_current_launch_token_num": "token_num", "execute_model_normal": "save event"}
#: develop's overlap step waits on both events in one function (gpu_model_runner.py:2129, :2138): by event
_DEVELOP_EVENTS = {"post_process_event": "save event", "token_num_event": "token_num"}


def site_label(wait: dict) -> str:
    """The doc's name for a host wait (``""``: not a documented blocking point); ``wait`` has
    ``where`` (``file:line function``) and ``mechanism`` (``d2h``, ``h2d``, ``event``, ``sync``),
    and may have ``what`` (a compiled op's wait, ``OP_WAITS``, is named by the op)."""
    label = _site_label(wait)
    if not label and _OP_MARK in wait.get("what", ""):
        label = OP_LABELS.get(wait["what"].split(" ", 1)[0], "")
    return label


def _site_label(wait: dict) -> str:
    where = wait["where"]
    function = where.rsplit(" ", 1)[-1]
    if wait["mechanism"] == "event":
        if where.startswith(("patches/fd25/flag_race.py", "patches/fd25/methods.py")):
            return "insert"  # 2.5 overlap: the wait an insert's synchronous H2D makes on a GPU anyway
        if where.startswith(("patches/step_syncs.py", "patches/fd2")):  # stop_flag, overlap, the lines
            # overlap: the previous step's, waited after this step's forward (bound) or, for its
            # snapshot, before this step is prepared (step_syncs, the exact count)
            return "save event"
        if where.startswith("patches/logprobs.py"):
            return "lp event"
        if function == "execute_model_overlap":
            return next((v for k, v in _DEVELOP_EVENTS.items() if k in wait.get("what", "")), "")
        return _EVENT_LABELS.get(function, "")
    return SITE_LABELS.get(function, "")


#: FastDeploy's compiled ops that wait for the device inside their C++ (a Python wrapper cannot see
#: it), by profile: op -> (mechanism, what waits, FD source reference, index of the argument that
#: must be on the device for the copy to wait, or None: always). Read from the FD 2.4 tree
#: (gongshaotian/FastDeploy r3_fix_int32_bug_2.4, custom_ops/gpu_ops); ``*.copy_to(CPUPlace, false)``
#: of a GPU tensor is a copy the host waits for (of a host tensor, e.g. the plugin's host token
#: count or pinned ids, it is not).
OP_WAITS = {
    "fastdeploy-2.4": {
        "get_padding_offset": ("d2h", "token_num to the host", "get_padding_offset.cu:80", 1),
        "update_inputs": ("d2h", "not_need_stop back to the host", "update_inputs.cu:106", None),
        "update_inputs_v1": ("d2h", "not_need_stop back to the host", "update_inputs_v1.cu:164", None),
        "save_output": ("d2h", "sampled ids to the host", "save_with_output_msg.cc:112-121", 0),
        "save_output_topk": ("d2h", "ids, logprobs and ranks to the host", "save_output_msg_with_topk.cc:46-49", 0),
    },
    # r3_fix_int32_bug_2.5 and develop: get_padding_offset.cu and update_inputs(_v1).cu copy nothing
    # to the host any more (#5440/#6170, #6176); the save ops still copy a device ``x`` (2.5 hands
    # them its pinned sampled ids: no wait then)
    "fastdeploy-2.5": {
        "save_output": ("d2h", "sampled ids to the host", "save_with_output_msg.cc:115-119", 0),
        "save_output_topk": ("d2h", "ids, logprobs and ranks to the host", "save_output_msg_with_topk.cc:48-52", 0),
    },
}
OP_WAITS["fastdeploy-2.6+"] = OP_WAITS["fastdeploy-2.5"]  # develop: the same two files, unchanged
#: labels of op waits (fd24-step-syncs.md), by op
OP_LABELS = {"get_padding_offset": "S1", "update_inputs": "S5", "update_inputs_v1": "S5", "save_output": "S6",
             "save_output_topk": "S6"}
#: the FD modules whose imported op names are wrapped (where a decode step calls them)
OP_MODULES = ("model_executor.pre_and_post_process",)
_OP_MARK = " (op: "


# ---- site naming (shared with device tracking) ----------------------------------------------

_HERE = os.path.abspath(__file__)
_PLUGIN_DIR = os.path.dirname(_HERE) + os.sep
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(_PLUGIN_DIR))
_TESTING_DIR = os.path.join(_PLUGIN_DIR, "testing") + os.sep
_RUNTIME_DIR = os.path.join(_PLUGIN_DIR, "runtime") + os.sep


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("paddle", "numpy"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(module.__file__))
    return tuple(dirs)


#: files that are never a site (dispatch layers: device tracking, the replica's placement helpers)
SKIPPED_FILES: set = set()


def site_of(frame, skipped_files=frozenset(), skip_runtime: bool = False) -> tuple[str, int, str]:
    """``(file, line, function)`` of the first frame from ``frame`` outwards that is not in
    Paddle, numpy, ``skipped_files`` or this module (nor the copy backend, ``skip_runtime``: for an
    event wait or synchronize its caller is the site). Files are named relative to the testing
    scaffolding (``reference/...``), the plugin (``runtime/...``) or the checkout (``patches/...``)."""
    skipped_dirs = _library_dirs() + ((_RUNTIME_DIR,) if skip_runtime else ())
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename != _HERE and filename not in skipped_files and filename not in SKIPPED_FILES \
                and not filename.startswith(skipped_dirs):
            if filename.startswith(_TESTING_DIR):
                rel = os.path.relpath(filename, _TESTING_DIR)
            elif filename.startswith(_PLUGIN_DIR):
                rel = os.path.relpath(filename, _PLUGIN_DIR)
            elif filename.startswith(_PACKAGE_ROOT):
                rel = os.path.relpath(filename, _PACKAGE_ROOT)
            else:
                rel = _fd_relative(filename)
            return rel, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return "<unknown>", 0, "<unknown>"


def _fd_relative(filename: str) -> str:
    """A FastDeploy file as ``fastdeploy/...`` (an installed FD or a source tree)."""
    marker = os.sep + "fastdeploy" + os.sep
    index = filename.rfind(marker)
    return filename[index + 1:] if index >= 0 else filename


# ---- settings ---------------------------------------------------------------------------------


_ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)


class SyncCheckConfigError(ValueError):
    """An ``FD_ASYNC_COPY_SYNC_CHECK*`` variable has a bad value (the check then stays off)."""


class SyncCheckError(RuntimeError):
    """``raise`` mode: a decode step waited at a site that is not on the allow-list."""


@dataclass(frozen=True)
class Settings:
    mode: str = "off"
    warmup: int = 20
    allow: tuple[str, ...] = ()
    log_every: int = 100

    @classmethod
    def from_env(cls, environ=None) -> "Settings":
        environ = os.environ if environ is None else environ
        problems = []
        mode = (environ.get(ENV_MODE) or "off").strip().lower()
        if mode in ("0", "false", "no", ""):
            mode = "off"
        if mode not in MODES:
            problems.append(f"{ENV_MODE}={environ.get(ENV_MODE)!r}: expected one of {', '.join(MODES)}")
        numbers = {}
        for name, default in ((ENV_WARMUP, cls.warmup), (ENV_LOG_EVERY, cls.log_every)):
            raw = environ.get(name)
            try:  # ASCII digits only, as the ring setting: int() also takes "٣", "1_0", "+3", " 3"
                if raw not in (None, "") and not _ASCII_DIGITS.fullmatch(raw.strip()):
                    raise ValueError
                numbers[name] = default if raw in (None, "") else int(raw.strip())
                if numbers[name] < (0 if name == ENV_WARMUP else 1):
                    raise ValueError
            except ValueError:
                low = 0 if name == ENV_WARMUP else 1
                problems.append(f"{name}={raw!r}: expected an integer >= {low}")
        if problems:
            raise SyncCheckConfigError("; ".join(problems) + " (the sync check stays off)")
        allow = tuple(s.strip() for s in (environ.get(ENV_ALLOW) or "").split(",") if s.strip())
        return cls(mode, numbers[ENV_WARMUP], allow, numbers[ENV_LOG_EVERY])


# ---- the checker ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    mechanism: str
    where: str
    what: str

    @property
    def label(self) -> str:
        return site_label({"where": self.where, "mechanism": self.mechanism, "what": self.what})

    def describe(self) -> str:
        label = self.label
        return f"{label + ' ' if label else ''}{self.mechanism} at {self.where} ({self.what})"


_MAX_WAITS_PER_STEP = 4096


class _Local(threading.local):
    #: the waits of the step this thread runs, from the end of its previous ``execute_model`` to
    #: the end of this one; None on a thread that never ran a step (not counted)
    waits: Optional[list] = None
    depth = 0  # >0 inside a wrapped host read (only the outermost one counts)


class Checker:
    """Counts host waits per decode step, by site, for the steps run on each thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._local = _Local()
        self._lock = threading.Lock()
        self.steps_seen = 0
        self.steps_counted = 0
        self.waits_histogram: collections.Counter = collections.Counter()  # waits per step -> steps
        self.site_counts: collections.Counter = collections.Counter()  # Wait -> count over counted steps
        self.outside_steps = 0  # waits reported on a thread with no step open (not counted)
        self._warned: set = set()
        self.last_step: list[Wait] = []
        #: called with the waits of every counted step (the Prometheus export)
        self.step_listeners: list[Callable] = []
        self.metrics = "not exported"

    @property
    def armed(self) -> bool:
        return self.steps_seen >= self.settings.warmup

    # -- the step boundary ----------------------------------------------------------------------
    def step_begin(self, runner=None) -> None:
        if self._local.waits is None:
            self._local.waits = []  # the thread's first step (else: the worker loop's waits since the last)

    def step_end(self, runner=None) -> None:
        # the worker loop's own waits on this thread before the next execute_model (FD 2.4's
        # exist_prefill, an insert's block-step reads) belong to the next step, as in the census
        waits, self._local.waits = self._local.waits, []
        if waits is None:
            return
        with self._lock:
            armed = self.armed
            self.steps_seen += 1
            if not armed:
                return
            self.steps_counted += 1
            self.waits_histogram[len(waits)] += 1
            self.site_counts.update(waits)
            self.last_step = list(waits)
            counted = self.steps_counted
        for listener in list(self.step_listeners):
            try:
                listener(waits)
            except Exception as exc:  # an exporter must never stop a step
                log.warning("fd_async_copy sync check: %r failed (%s: %s); removed", listener, type(exc).__name__, exc)
                self.step_listeners.remove(listener)
        every = self.settings.log_every
        if counted % every == 0:
            log.info("fd_async_copy sync check: %s", self.summary_line())

    # -- waits --------------------------------------------------------------------------------
    def in_step(self) -> bool:
        return self._local.waits is not None

    def wait_begin(self, mechanism: str, where: str, what: str) -> None:  # an observer (observers.py)
        self.observe(mechanism, where, what)

    def wait_end(self) -> None:
        pass

    def observe(self, mechanism: str, where: str, what: str) -> None:
        waits = self._local.waits
        if waits is None:
            with self._lock:
                self.outside_steps += 1
            return
        wait = Wait(mechanism, where, what)
        if len(waits) >= _MAX_WAITS_PER_STEP:  # a thread that stopped running steps: stop growing
            del waits[: len(waits) // 2]
        waits.append(wait)
        if not self.armed:
            return
        mode = self.settings.mode
        if mode == "warn" and wait not in self._warned:
            self._warned.add(wait)
            log.warning("fd_async_copy sync check: decode step %d waits: %s", self.steps_seen, wait.describe())
        elif mode == "raise" and not self.allowed(wait):
            raise SyncCheckError(
                f"decode step {self.steps_seen} waits at a site not on the allow-list ({ENV_ALLOW}="
                f"{','.join(self.settings.allow)!r}): {wait.describe()}"
            )

    def allowed(self, wait: Wait) -> bool:
        text = f"{wait.where} {wait.label} {wait.what}"
        return any(entry in text for entry in self.settings.allow)

    # -- reports ------------------------------------------------------------------------------
    def report(self) -> dict:
        with self._lock:
            n = self.steps_counted
            typical = self.waits_histogram.most_common(1)[0][0] if n else None
            sites = [
                {"site": w.where, "label": w.label, "mechanism": w.mechanism, "what": w.what, "per_step": c / n}
                for w, c in self.site_counts.most_common()
            ] if n else []
            return {
                "mode": self.settings.mode,
                "warmup": self.settings.warmup,
                "steps_seen": self.steps_seen,
                "steps_counted": n,
                "waits_per_step": typical,
                "mean_waits_per_step": (sum(k * v for k, v in self.waits_histogram.items()) / n) if n else None,
                "histogram": {str(k): v for k, v in sorted(self.waits_histogram.items())},
                "sites": sites,
                "waits_outside_steps": self.outside_steps,
                "metrics": self.metrics,
            }

    def summary_line(self) -> str:
        r = self.report()
        if not r["steps_counted"]:
            return f"no decode step counted yet ({r['steps_seen']} seen, warm-up {r['warmup']})"
        waits = r["waits_per_step"]
        sites = ", ".join(f"{s['label'] or s['mechanism']} at {s['site']}" for s in r["sites"][:8])
        return (f"decode step: {waits} host wait{'s' if waits != 1 else ''} (typical of {r['steps_counted']} "
                f"steps, mean {r['mean_waits_per_step']:.2f}) - {sites or 'none'}")


# ---- process state ----------------------------------------------------------------------------

_checker: Optional[Checker] = None
_config_error: Optional[str] = None
_external = 0  # >0 while device tracking (the replica) reports waits instead of the GPU source
_state_lock = threading.Lock()


def checker() -> Optional[Checker]:
    return _checker


def step_begin(runner=None) -> None:
    """Call when the runner starts a decode step: every observer hears it (``observers.py``)."""
    observers.step_begin(runner)


def step_end(runner=None) -> None:
    """Call when the runner's decode step is over (``execute_model`` returned or raised)."""
    observers.step_end(runner)


def observe(mechanism: str, where: str, what: str) -> None:
    """A source saw the host wait (``mechanism``: d2h, h2d, event, sync) at ``where``, before
    waiting; ``wait_done()`` after it (the step trace's span)."""
    observers.wait_begin(mechanism, where, what)


def wait_done() -> None:
    observers.wait_end()


def external_source(active: bool) -> None:
    """Device tracking reports waits (on CPU Paddle): the GPU source's wrappers stand aside."""
    global _external
    with _state_lock:
        _external += 1 if active else -1


def start(settings: Settings) -> Optional[Checker]:
    """Arm the check with ``settings`` (``off``: stop it); returns the checker."""
    global _checker, _config_error
    with _state_lock:
        if _checker is not None:
            observers.unsubscribe(_checker)
        _checker = Checker(settings) if settings.mode != "off" else None
        _config_error = None
        if _checker is not None:
            observers.subscribe(_checker, observers.CHECK)
    return _checker


def stop() -> None:
    start(Settings())
    uninstall_gpu_source()


def status() -> dict:
    """``status()["sync_check"]``: the mode and the figures (``{"mode": "off"}`` when off)."""
    c = _checker
    if c is None:
        out: dict = {"mode": "off"}
        if _config_error:
            out["config_error"] = _config_error
        return out
    return c.report()


def install_from_env(root: str = "fastdeploy", environ=None, count_if_off: bool = False) -> Optional[Checker]:
    """The plugin's entry point calls this first: with ``FD_ASYNC_COPY_SYNC_CHECK`` not ``off``
    (or ``count_if_off``: the step trace's ``install_from_env`` asks for the waits), arm the check,
    wrap Paddle's host reads (a GPU build) and hook the runner's step. Never raises:
    a bad value is logged (and shown by ``status()``) and the check stays off."""
    global _config_error
    try:
        settings = Settings.from_env(environ)
    except SyncCheckConfigError as exc:
        _config_error = str(exc)
        log.error("fd_async_copy: %s", exc)
        return None
    if count_if_off and settings.mode == "off":
        settings = Settings("count", settings.warmup, settings.allow, settings.log_every)  # the trace's waits
    if settings.mode == "off" or _checker is not None:
        return _checker
    c = start(settings)
    try:
        install_gpu_source()
        install_step_hook(root)
        from .metrics import export

        c.metrics = export(c)
    except Exception as exc:  # never stop the server for a diagnostic
        log.error("fd_async_copy sync check: cannot install (%s: %s); the check is off", type(exc).__name__, exc)
        stop()
        return None
    log.info("fd_async_copy sync check: %s, warm-up %d steps, figures in status()['sync_check']",
             settings.mode, settings.warmup)
    return c


# ---- the step boundary: one wrapper on the runner's execute_model ------------------------------

_RUNNER_MODULE = "{root}.worker.gpu_model_runner"
_hooked: dict = {}  # runner module -> the junction on its execute_model
_op_hooked: dict[str, tuple[object, str, object]] = {}


def wrap_execute_model(original):
    """``execute_model`` with ``step_begin``/``step_end`` around it (the one place they are called):
    the ``sync_check`` link of the runner's junction, outermost (``Junction.attach(outermost=True)``)."""

    @functools.wraps(original)
    def execute_model(self, *args, **kwargs):
        step_begin(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            step_end(self)

    return execute_model


def install_step_hook(root: str = "fastdeploy") -> None:
    """Wrap ``GPUModelRunner.execute_model`` of ``root`` now, or when FD imports the module.

    It is a link of the plugin's one junction on that method, outermost (a diagnostic: no row in
    the features' order): ``overlap``'s part runs inside the step, whichever of the two comes first."""
    name = _RUNNER_MODULE.format(root=root)

    def hook(module) -> None:
        from .registry.patch import Junction

        cls = getattr(module, "GPUModelRunner", None)
        if cls is None or name in _hooked:
            return
        if getattr(cls, "execute_model", None) is None:
            log.warning("fd_async_copy sync check: %s.GPUModelRunner has no execute_model; no step boundary", name)
            return
        junction = Junction.on(cls, "execute_model")
        junction.attach("sync_check", wrap_execute_model, outermost=True)
        _hooked[name] = junction

    from .registry.imports import WATCHER

    module = sys.modules.get(name)
    if module is not None and getattr(module, "GPUModelRunner", None) is not None:
        hook(module)
    else:
        WATCHER.when_ready(name, lambda: hook(sys.modules[name]))
    _install_op_hooks(root, WATCHER)


def _install_op_hooks(root: str, watcher) -> None:
    """Wrap the compiled ops of ``OP_WAITS`` for this FD's profile where a decode step calls them."""
    from .profile import detect_profile

    table = OP_WAITS.get(detect_profile(root).profile)
    if not table:
        return
    for short in OP_MODULES:
        name = f"{root}.{short}"

        def hook(name=name, short=short) -> None:
            module = sys.modules[name]
            for op, (mechanism, what, source, arg) in table.items():
                if module.__dict__.get(op) is not None and name + "." + op not in _op_hooked:
                    # a link of the plugin's junction there (innermost: FD's op itself), never a
                    # setattr over it: the plugin would take that for a module reload (issue 41)
                    _op_hooked[name + "." + op] = _link(module, op, f"{short}:{op}", lambda nxt, m=mechanism, w=(
                        f"{op} (op: {what}, {source})"), a=arg: _wrap_op(nxt, m, w, a))

        if name in sys.modules:
            hook()
        else:
            watcher.when_ready(name, hook)


def _one_wait(counted: bool, fn, *args, **kwargs):
    """Call ``fn`` as one host wait: what it calls inside is not counted again (on CPU, the replica's
    stand-in ops read tensors themselves); the wait ends with it when it was ``counted``."""
    _source_local.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _source_local.depth -= 1
        if counted:
            wait_done()


def _wrap_op(fn, mechanism: str, what: str, arg):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        counted = _source_active() and (arg is None or (len(args) > arg and _is_device(args[arg])))
        if counted:
            _report(mechanism, what)
        return _one_wait(counted, fn, *args, **kwargs)  # the op's own copies are this wait

    wrapper.__fd_sync_check_original__ = fn
    return wrapper


def _link(owner, name: str, key: str, build):
    """Put the check's wrapper on ``owner.name`` as the ``sync_check`` link of the plugin's one
    junction there (``registry.patch.Junction``), innermost: armed before or after ``enable()``,
    the plugin's links and the check's never replace each other, ``disable()`` keeps the check's
    and ``stop()`` takes only its own out (the last link out puts the original back)."""
    from .registry.patch import Junction

    junction = Junction.on(owner, name)
    junction.attach("sync_check", build)
    return junction


def uninstall_step_hooks() -> None:
    for key, junction in list(_op_hooked.items()):
        junction.detach("sync_check")
        del _op_hooked[key]
    for name, junction in list(_hooked.items()):
        junction.detach("sync_check")
        del _hooked[name]


# ---- the GPU source: Paddle's host reads of GPU tensors, synchronizes, event waits --------------

_gpu_saved: list[tuple[object, str, object]] = []
_source_local = _Local()


def _source_active() -> bool:
    """A wrapper of the GPU source counts: an armed checker, a step open on this thread, not
    inside another counted call, and no device tracking reporting instead."""
    c = _checker
    return c is not None and not _external and c.in_step() and _source_local.depth == 0


def _on_device(t) -> bool:
    try:
        place = t.place
        return bool(place.is_gpu_place())
    except Exception:
        return False


_is_device: Callable = _on_device  # the GPU source's predicate (install_gpu_source sets it)


def _pinned(t) -> bool:
    try:
        return bool(t.place.is_cuda_pinned_place())
    except Exception:
        return False


def _report(mechanism: str, what: str, skip_runtime: bool = False) -> None:
    file, line, function = site_of(sys._getframe(2), skip_runtime=skip_runtime)
    observe(mechanism, f"{file}:{line} {function}", what)


def install_gpu_source(is_device: Callable = _on_device) -> None:
    """Wrap Paddle's host reads and synchronizes, and the copy backend's waits. Each wrapper is a
    pass-through outside a step of an armed checker, and while device tracking reports instead."""
    if _gpu_saved:
        return
    import paddle

    from .runtime.backend import CopyBackend

    global _is_device
    _is_device = is_device
    active = _source_active

    def read_wrapper(name, fn):
        what = f".{name}()" if not name.startswith("__") else f"{name.strip('_')}()"

        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            counted = active() and is_device(self)
            if counted:
                _report("d2h", what)
            return _one_wait(counted, fn, self, *args, **kwargs)

        return wrapper

    def copy_wrapper(fn):
        @functools.wraps(fn)
        def copy_(self, src, *args, **kwargs):
            blocking = args[0] if args else kwargs.get("blocking", True)
            counted = active() and blocking and isinstance(src, paddle.Tensor) and is_device(src) and not is_device(self)
            if counted:
                _report("d2h", "copy_ into host memory")
            try:
                return fn(self, src, *args, **kwargs)
            finally:
                if counted:
                    wait_done()

        return copy_

    def sync_wrapper(fn, what, skip_runtime=False):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            counted = active()
            if counted:
                reason = args[-1] if skip_runtime and args and isinstance(args[-1], str) else ""
                _report("event" if "event" in what else "sync", f"{what} {reason}".strip(), skip_runtime)
            return _one_wait(counted, fn, *args, **kwargs)

        return wrapper

    def patch(owner, name, replacement):  # the plugin's own class: no feature patches it
        _gpu_saved.append((owner, name, owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, replacement)

    # Paddle's methods and functions: links of the plugin's junctions (its features may hold them)
    for name in _GPU_SOURCE_READS:
        if getattr(paddle.Tensor, name, None) is not None:
            _gpu_saved.append(_link(paddle.Tensor, name, f"paddle:Tensor.{name}",
                                    lambda nxt, name=name: read_wrapper(name, nxt)))
    _gpu_saved.append(_link(paddle.Tensor, "copy_", "paddle:Tensor.copy_", copy_wrapper))
    _gpu_saved.append(_link(paddle.device, "synchronize", "paddle.device:synchronize",
                            lambda nxt: sync_wrapper(nxt, "paddle.device.synchronize")))
    if getattr(paddle.tensor, "top_p_sampling", None) is not None:
        _gpu_saved.append(_link(paddle.tensor, "top_p_sampling", "paddle.tensor:top_p_sampling",
                                lambda nxt: wrap_pageable_input("top_p_sampling", nxt)))
    for name, what in (("wait", "event wait"), ("device_synchronize", "device synchronize"),
                       ("stream_synchronize", "stream synchronize")):
        patch(CopyBackend, name, sync_wrapper(getattr(CopyBackend, name), what, skip_runtime=True))


def wrap_pageable_input(name: str, fn):
    """``fn``, a Paddle op, counted when called with a GPU tensor and a pageable host tensor:
    Paddle's data transform synchronizes the stream and copies the host one (FD 2.4's host
    ``topp_seed`` for ``paddle.tensor.top_p_sampling``: T)."""
    import paddle

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, paddle.Tensor)]
        counted = _source_active() and any(_is_device(t) for t in tensors) and any(
            not _is_device(t) and not _pinned(t) for t in tensors)
        if counted:
            _report("h2d", f"{name}: pageable host input")
        return _one_wait(counted, fn, *args, **kwargs)

    return wrapper


def uninstall_gpu_source() -> None:
    global _is_device
    _is_device = _on_device
    while _gpu_saved:
        saved = _gpu_saved.pop()
        if not isinstance(saved, tuple):  # a junction link
            saved.detach("sync_check")
            continue
        owner, name, original = saved
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
