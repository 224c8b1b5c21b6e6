"""Device-value tracking on CPU Paddle: every host wait a decode step makes, whoever causes it.

Test and bench infrastructure only (it lives next to the FastDeploy replica, and nothing in the
plugin's runtime imports it): an FD worker never loads this module.

On CPU Paddle every tensor is a CPU tensor. Inside ``tracking()``:

- **Marks.** A tensor is "on the device" when it carries the replica's device mark
  (``placement.as_device``: FastDeploy's ``share_inputs`` buffers, model and sampler outputs) or
  when it was made by an op FastDeploy's GPU build would run on the device: a Paddle op or
  Tensor method with a marked input (every ``paddle._C_ops`` callable, the ``paddle`` /
  ``paddle.tensor`` / ``paddle.nn.functional`` functions and every ``paddle.Tensor`` method and
  operator dunder are wrapped: ``numel()``, reductions, comparisons, ``astype``, slicing,
  ``paddle.concat``, in-place ops, arithmetic ...), or a creation op (``paddle.full``,
  ``paddle.to_tensor``, ``paddle.empty`` ...) with no host ``place``: on a GPU build those
  allocate on the GPU.
- **Host reads.** ``int()``, ``float()``, ``bool()``/truth tests, ``__index__``, ``.item()``,
  ``.numpy()``, ``.tolist()``, ``np.asarray``, ``str()``, ``.cpu()``, ``.pin_memory()``, a
  ``copy_`` into host memory that is not a pinned buffer of the copy backend, or a ``setitem``
  of a device value into a host tensor, applied to a marked tensor: each is a **blocking D2H**
  (a stream-ordered copy the host waits for), recorded with its call site (``file:line
  function``) - FastDeploy replica, patch, runtime or Paddle glue alike. Metadata (``shape``,
  ``dtype``, ``place``, ``len()``, ``data_ptr()``) is not a read.
- **Implicit H2D.** A pageable host tensor passed into an op that runs on the device (an op with
  a marked input, or a replica stand-in for a Paddle op, ``phi_op``) goes through Paddle's place
  transform (``TransDataPlace``: the stream is synchronized, then a blocking copy): a host wait.
  This is how FastDeploy 2.4's CPU ``infer_seed`` makes ``top_p_sampling`` drain the stream.
- **Event waits and synchronizes** through the copy backend (FastDeploy 2.5's events in the
  replica, the plugin's events) count too: every ``wait`` call, and every device/stream sync.
- **Pinned buffers** written by the backend's asynchronous copy are not marked: the copy itself
  is not a read (the simulator's snapshot of the source, ``glue.snapshot``, runs untracked as the
  DMA it models; the rest of ``copy_d2h``, the copy by address included, is tracked), and reading
  the buffer is judged by the simulator.
- **Device code.** The replica's stand-ins for FastDeploy's compiled ops and its model read
  tensors with ``.numpy()`` to compute on the CPU; they run under ``device_code()`` (nothing is
  recorded, nothing is checked). The host side of such an op (``token_num.copy_to(CPUPlace)``
  in ``get_padding_offset``, the flag copy in ``update_inputs_v1``) runs under ``host_code()``.

Each wait is **long** when device work that is still running in FastDeploy's GPU build - the
forward or the sampler, launched since the host last waited (``heavy()``) - must finish first,
else **short** (the GPU is already idle; the cost is a copy round trip). An event wait is long only
when the event covers such work launched in the current step: waiting on the previous step's event
after this step's forward was launched (the overlap schedule) leaves the GPU busy.

Records go to the active sync census as kind ``host_wait`` (``encode_host_wait``) and to
``Tracker.waits``. Wrapping costs Python overhead on every Paddle call while a tracker is
active; nothing is wrapped outside ``tracking()``, and everything is restored on exit.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import paddle

from fd_async_copy_plugin import sync_check  # absolute: one sync check per process, also for a copied replica
from ...runtime import census
from ...runtime.backend import CopyBackend
from ...runtime.cuda import RuntimeBackend
from ...runtime.glue import PaddleGlue
from fd_async_copy_plugin.registry.patch import Junction

MARK = "_fd_reference_on_device"


def encode_host_wait(mechanism: str, long: bool, where: str, what: str) -> str:
    """The census site of a ``host_wait``: ``long|short``, mechanism, ``file:line function``, what."""
    return f"{'long' if long else 'short'}|{mechanism}|{where}|{what}"


def decode_host_wait(site: str) -> dict:
    length, mechanism, where, what = site.split("|", 3)
    return {"long": length == "long", "mechanism": mechanism, "where": where, "what": what}


#: Tensor methods that read the tensor's values on the host (shared with the shipped sync check).
HOST_READS = sync_check.HOST_READS

#: Creation ops: on a GPU build the result lives on the device unless a host ``place`` is given.
CREATION = frozenset({
    "full", "zeros", "ones", "empty", "to_tensor", "arange", "linspace", "eye", "rand", "randn",
    "randint", "uniform", "normal", "assign", "tensor", "logspace",
})
#: Tensor attributes never wrapped: object protocol, metadata, the tracker's own needs.
_NOT_WRAPPED = frozenset({
    "__init__", "__new__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__",
    "__class__", "__dict__", "__del__", "__hash__", "__init_subclass__", "__subclasshook__",
    "__sizeof__", "__dir__", "__len__", "data_ptr", "_is_initialized", "is_dense", "is_dist",
    "is_sparse", "is_selected_rows", "dim", "ndimension", "element_size", "is_contiguous",
    "_place_str", "value", "get_tensor", "_share_underline_tensor_to", "_is_shared_underline_tensor_with",
    "is_same_shape", "_numel", "is_floating_point", "is_complex", "is_integer", "__weakref__",
    "__module__", "__doc__", "__subclasscheck__", "__instancecheck__", "_md5sum",
    "_tensor_use_gpudnn", "_use_gpudnn", "register_hook", "_register_grad_hook",
    "__cuda_array_interface__", "__dlpack__", "__dlpack_device__",
})
#: Modules whose public functions are wrapped (where ``paddle.X`` functions are defined).
_FUNCTION_MODULES = ("paddle.tensor", "paddle.base.dygraph.generated_tensor_methods_patch", "paddle.nn.functional")

_HERE = os.path.abspath(__file__)
_PLACEMENT = os.path.join(os.path.dirname(_HERE), "placement.py")
#: the stand-ins of step_syncs' share_inputs watch dispatch to Paddle's Tensor methods: a read that
#: passes through one belongs to its caller (its handlers' own reads are in ``patches/step_syncs.py``)
_WATCH = importlib.util.find_spec("fd_async_copy_plugin.patches._tensor_watch")
_PADDLE_DEVICE = os.path.join(os.path.dirname(_HERE), "paddle_device.py")  # the routed CUDA event
_SKIPPED_FILES = {_HERE, _PLACEMENT, _PADDLE_DEVICE, os.path.abspath(functools.__file__), os.path.abspath(contextlib.__file__)}
#: the plugin's junctions (one replacement per patched attribute) dispatch to the links: a read that
#: passes through one belongs to its caller too
_JUNCTIONS = importlib.util.find_spec("fd_async_copy_plugin.registry.patch")
if _JUNCTIONS is not None and _JUNCTIONS.origin:
    _SKIPPED_FILES.add(os.path.abspath(_JUNCTIONS.origin))
if _WATCH is not None and _WATCH.origin:
    _SKIPPED_FILES.add(os.path.abspath(_WATCH.origin))
sync_check.SKIPPED_FILES.update(_SKIPPED_FILES)  # the sync check's GPU source names the same sites

@dataclass(frozen=True)
class HostWait:
    """One blocking point: what, where, and whether it waits for running device work."""

    step: int
    mechanism: str  # "d2h", "h2d", "event", "sync"
    long: bool
    file: str
    line: int
    function: str
    what: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


class _Local(threading.local):
    depth = 0  # >0 while inside a wrapped call (only the outermost call is judged)
    device = 0  # >0 inside device_code()


_local = _Local()
_ACTIVE: Optional["Tracker"] = None


def is_marked(t) -> bool:
    return isinstance(t, paddle.Tensor) and getattr(t, MARK, False) is True


def on_device_for_host_code(t) -> bool:
    """The sync check's ``is_device`` on the replica: a marked tensor, read by host code (the
    replica's stand-ins for compiled ops and the model compute on the CPU: not host reads)."""
    return _local.device == 0 and is_marked(t)


def _mark(t) -> None:
    setattr(t, MARK, True)


def _tensors(value, out: list, depth: int = 0) -> list:
    if isinstance(value, paddle.Tensor):
        out.append(value)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            _tensors(v, out, depth + 1)
    return out


class DevicePlace(paddle.CPUPlace):
    """``t.place`` of a marked tensor while tracking: Paddle takes it as the CPU place it is on
    CPU Paddle, and the tracker knows that a tensor created there lives on the device (as
    ``paddle.to_tensor(..., place=share_inputs["stop_flags"].place)`` does in a GPU worker)."""


def _is_host_place(place) -> bool:
    if place is None or isinstance(place, DevicePlace):
        return False
    if isinstance(place, str):
        return place.lower().startswith(("cpu", "pinned", "gpu_pinned"))
    if isinstance(place, (paddle.CPUPlace, paddle.CUDAPinnedPlace)):
        return True
    try:
        return bool(place.is_cpu_place() or place.is_cuda_pinned_place())
    except AttributeError:
        return False


def _site(skip: int = 2, backend_is_mechanism: bool = False) -> tuple[str, int, str]:
    """The first frame outside the tracker, the replica's placement helpers, Paddle and numpy
    (and, for event waits and synchronizes, the copy backend: its caller is the site)."""
    return sync_check.site_of(sys._getframe(skip), _SKIPPED_FILES, skip_runtime=backend_is_mechanism)


class Tracker:
    """The state of one ``tracking()`` block."""

    def __init__(self, recording: bool = True) -> None:
        self.recording = recording
        self.waits: list[HostWait] = []
        self._lock = threading.Lock()
        self._heavy = 0  # heavy device work launched so far
        self._heavy_done = 0  # heavy work the host has waited for
        self._event_heavy: dict[int, tuple[object, int]] = {}
        self._step = None  # the census step of the last heavy launch
        self._step_heavy_start = 0  # heavy work launched before the current step

    # -- device work --------------------------------------------------------------------------
    def heavy(self, label: str) -> None:
        active = census.active()
        step = active.steps[-1].index if active is not None and active.steps else None
        with self._lock:
            if step != self._step:
                self._step, self._step_heavy_start = step, self._heavy
            self._heavy += 1

    def _stream_wait(self) -> bool:
        with self._lock:
            long = self._heavy > self._heavy_done
            self._heavy_done = self._heavy
            return long

    # -- records ------------------------------------------------------------------------------
    def record(self, mechanism: str, what: str, long: bool, skip: int = 3) -> Optional[HostWait]:
        if not self.recording:
            return None  # marks only: the shipped sync check's own wrappers count
        file, line, function = _site(skip, backend_is_mechanism=mechanism in ("event", "sync"))
        active = census.active()
        step = active.steps[-1].index if active is not None and active.steps else -1
        wait = HostWait(step, mechanism, long, file, line, function, what)
        with self._lock:
            self.waits.append(wait)
        census.record("host_wait", encode_host_wait(mechanism, long, wait.where, what))
        sync_check.observe(mechanism, wait.where, what)  # the runtime sync check, when armed
        return wait

    def d2h(self, what: str) -> None:
        self.record("d2h", what, self._stream_wait(), skip=4)

    def h2d(self, what: str) -> None:
        self.record("h2d", what, self._stream_wait(), skip=4)

    # -- events (through the copy backend) -----------------------------------------------------
    def event_recorded(self, event) -> None:
        with self._lock:
            self._event_heavy[id(event)] = (event, self._heavy)

    def event_waited(self, event, reason: str) -> None:
        with self._lock:
            entry = self._event_heavy.get(id(event))
            heavy = entry[1] if entry is not None and entry[0] is event else self._heavy
            # long: the event covers device work not waited for yet that this step launched (an
            # event of an earlier step - the overlap schedule's - lets this step's forward run on)
            long = heavy > self._heavy_done and heavy > self._step_heavy_start
            self._heavy_done = max(self._heavy_done, heavy)
        self.record("event", f"event wait {reason}", long, skip=4)

    def synchronized(self, what: str) -> None:
        self.record("sync", what, self._stream_wait(), skip=4)


def active() -> Optional[Tracker]:
    return _ACTIVE


def heavy(label: str) -> None:
    """Device work that runs long on a GPU (the forward, the sampler) was launched."""
    tracker = _ACTIVE
    if tracker is not None and _local.device == 0:
        tracker.heavy(label)


@contextlib.contextmanager
def device_code() -> Iterator[None]:
    """Code that stands for device code (a compiled op's kernels, the model): untracked."""
    _local.device += 1
    try:
        yield
    finally:
        _local.device -= 1


@contextlib.contextmanager
def host_code() -> Iterator[None]:
    """The host side of a stand-in op (inside ``device_code``): tracked again."""
    saved_device, saved_depth = _local.device, _local.depth
    _local.device = _local.depth = 0
    try:
        yield
    finally:
        _local.device, _local.depth = saved_device, saved_depth


def device_op(fn):
    """Decorator for a replica stand-in of a compiled FastDeploy op: its body is device code."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        if _ACTIVE is None:
            return fn(*args, **kwargs)
        with device_code():
            return fn(*args, **kwargs)

    return op


def phi_op(name: str, **inputs) -> None:
    """A replica stand-in for a Paddle (PHI) op is called with ``inputs`` (by argument name):
    Paddle's data transform moves a pageable host input of a device op to the device,
    synchronizing the stream first. Recorded at the site that called the op."""
    tracker = _ACTIVE
    if tracker is None or _local.device:
        return
    if not any(is_marked(t) for t in _tensors(list(inputs.values()), [])):
        return  # a host op
    for arg, value in inputs.items():
        if any(not is_marked(t) and not _is_pinned(t) for t in _tensors(value, [])):
            tracker.record("h2d", f"{name}({arg}=pageable host tensor)", tracker._stream_wait(), skip=4)
            return


def _is_pinned(t) -> bool:
    from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend

    try:
        return replica_backend.current().is_pinned(t)
    except Exception:  # no backend configured
        return False


# ---- the wrappers -----------------------------------------------------------------------------


def _judge_op(tracker: Tracker, name: str, args, kwargs, result, creation: bool):
    inputs = _tensors(list(args), [])
    inputs = _tensors(list(kwargs.values()), inputs)
    marked = [t for t in inputs if is_marked(t)]
    if marked:
        for t in inputs:
            if not is_marked(t) and not _is_pinned(t) and t is not result:
                tracker.record("h2d", f"{name}: pageable host input", tracker._stream_wait(), skip=4)
                break
    on_device = bool(marked)
    if creation and not marked:
        place = kwargs.get("place", kwargs.get("device"))
        if name == "to_tensor" and place is None and len(args) > 2:
            place = args[2]
        on_device = not _is_host_place(place) and not kwargs.get("pin_memory", False)
    if on_device:
        for t in _tensors(result, []):
            if not _is_pinned(t):
                _mark(t)
    return result


def _wrap_function(name: str, fn, creation: bool):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tracker = _ACTIVE
        if tracker is None or _local.device or _local.depth:
            return fn(*args, **kwargs)
        _local.depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            _local.depth -= 1
        return _judge_op(tracker, name, args, kwargs, result, creation)

    wrapper.__fd_tracking_original__ = fn
    return wrapper


def _unmarked_copy(t):
    out = _ORIGINAL_CLONE(t)
    setattr(out, MARK, False)
    return out


def _wrap_method(name: str, fn):
    read = name in HOST_READS

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        tracker = _ACTIVE
        if tracker is None or _local.device or _local.depth:
            return fn(self, *args, **kwargs)
        if name == "copy_":
            return _copy_(tracker, fn, self, args, kwargs)
        if name == "__setitem__":
            return _setitem(tracker, fn, self, args)
        if read and is_marked(self):
            if name == "_copy_to" and not _is_host_place(args[0] if args else kwargs.get("place")):
                pass
            else:
                tracker.d2h(f".{name}()" if not name.startswith("__") else f"{name.strip('_')}()")
                _local.depth += 1
                try:
                    result = fn(self, *args, **kwargs)
                finally:
                    _local.depth -= 1
                    sync_check.wait_done()  # the step trace's wait span ends
                if isinstance(result, paddle.Tensor) and (result is self or is_marked(result)):
                    result = _unmarked_copy(result) if result is self else result
                    setattr(result, MARK, False)
                return result
        _local.depth += 1
        try:
            result = fn(self, *args, **kwargs)
        finally:
            _local.depth -= 1
        if name in ("cuda",):
            if isinstance(result, paddle.Tensor):
                _mark(result)
            return result
        if read:
            return result
        return _judge_op(tracker, name, (self,) + args, kwargs, result, False)

    wrapper.__fd_tracking_original__ = fn
    return wrapper


def _copy_(tracker: Tracker, fn, dst, args, kwargs):
    src = args[0] if args else kwargs.get("src")
    if isinstance(src, paddle.Tensor):
        if is_marked(src) and not is_marked(dst) and not _is_pinned(dst):
            tracker.d2h("copy_ into pageable host memory")
        elif not is_marked(src) and is_marked(dst) and _is_pinned(src):
            pass  # pinned -> device: an async H2D
    _local.depth += 1
    try:
        return fn(dst, *args, **kwargs)
    finally:
        _local.depth -= 1
        sync_check.wait_done()


def _setitem(tracker: Tracker, fn, self, args):
    key, value = args[0], args[1]
    values = _tensors(value, [])
    keys = _tensors(key, [])
    if is_marked(self):
        if any(not is_marked(v) and not _is_pinned(v) for v in values):
            tracker.h2d("setitem: pageable host value")
    elif any(is_marked(v) for v in values + keys):
        tracker.d2h("setitem of a device value into host memory")
    _local.depth += 1
    try:
        return fn(self, *args)
    finally:
        _local.depth -= 1


_ORIGINAL_CLONE = paddle.Tensor.clone


def _backend_wrappers() -> list[tuple[object, str, object]]:
    """(owner, name, replacement) for the copy backend: events, syncs, and the async copy."""
    original_record = CopyBackend.record
    original_wait = CopyBackend.wait
    original_device_sync = CopyBackend.device_synchronize
    original_stream_sync = CopyBackend.stream_synchronize
    original_snapshot = PaddleGlue.snapshot
    original_issue, original_h2d = RuntimeBackend._issue, RuntimeBackend._copy_h2d

    def noting(method):  # the backend's events, each noted with the device work it covers
        def noted(self, *args, **kwargs):
            event = method(self, *args, **kwargs)
            tracker = _ACTIVE
            if tracker is not None and event is not None:  # (None: ``_issue`` issued nothing)
                tracker.event_recorded(event)
            return event
        return noted

    record = noting(original_record)
    issue = noting(original_issue)  # a copy set's own event
    copy_h2d = noting(original_h2d)  # an H2D copy's own event

    def wait(self, event, reason):
        tracker = _ACTIVE
        if tracker is not None and not _local.device:
            tracker.event_waited(event, reason)
        try:
            return original_wait(self, event, reason)
        finally:
            sync_check.wait_done()

    def device_synchronize(self, reason):
        tracker = _ACTIVE
        if tracker is not None and not _local.device:
            tracker.synchronized(f"device synchronize {reason}")
        try:
            return original_device_sync(self, reason)
        finally:
            sync_check.wait_done()

    def stream_synchronize(self, reason):
        tracker = _ACTIVE
        if tracker is not None and not _local.device:
            tracker.synchronized(f"stream synchronize {reason}")
        try:
            return original_stream_sync(self, reason)
        finally:
            sync_check.wait_done()

    def snapshot(self, t):
        # The modelled DMA: the simulator (and ``host`` for a non-contiguous source) snapshots the
        # source instead of copying by address; that is the copy, not a host read. The rest of
        # ``copy_d2h`` - the ``cuda`` backend's copy by address included - is tracked.
        with device_code():
            return original_snapshot(self, t)

    return [
        (CopyBackend, "record", record),
        (RuntimeBackend, "_issue", issue),
        (RuntimeBackend, "_copy_h2d", copy_h2d),
        (CopyBackend, "wait", wait),
        (CopyBackend, "device_synchronize", device_synchronize),
        (CopyBackend, "stream_synchronize", stream_synchronize),
        (PaddleGlue, "snapshot", snapshot),
    ]


def _tensor_method_names() -> list[str]:
    names = []
    for name in dir(paddle.Tensor):
        if name in _NOT_WRAPPED:
            continue
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in (
            "_copy_to", "_to", "_getitem_dygraph", "_setitem_dygraph", "_getitem_static"
        ):
            continue
        try:
            raw = inspect.getattr_static(paddle.Tensor, name)
        except AttributeError:
            continue
        if isinstance(raw, (property, staticmethod, classmethod)) or inspect.isdatadescriptor(raw):
            continue
        if not callable(raw) or isinstance(raw, type):
            continue
        names.append(name)
    return names


def _function_targets() -> list[tuple[object, str, object]]:
    """(module, name, function) for every public op function reachable as paddle.X,
    paddle.tensor.X, paddle.nn.functional.X, and every ``paddle._C_ops`` callable."""
    targets = []
    for module in (paddle, paddle.tensor, paddle.nn.functional):
        for name in dir(module):
            if name.startswith("_"):
                continue
            obj = getattr(module, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            if not (getattr(obj, "__module__", None) or "").startswith(_FUNCTION_MODULES) and not (
                    module is paddle and name in CREATION):
                # a creation op another package replaced (PaddleFormers, a FastDeploy dependency, swaps
                # ``paddle.to_tensor`` for its own wrapper) still allocates on the device
                continue
            targets.append((module, name, obj))
    for name in dir(paddle._C_ops):
        if name.startswith("_"):
            continue
        obj = getattr(paddle._C_ops, name, None)
        if callable(obj) and not isinstance(obj, type) and not inspect.ismodule(obj):
            targets.append((paddle._C_ops, name, obj))
    return targets


@contextlib.contextmanager
def tracking(recording: bool = True) -> Iterator[Tracker]:
    """Track device values for the duration of the block (one tracker at a time).

    ``recording=False``: marks only - tensors are marked as on the device as usual, but nothing
    is recorded; the shipped sync check's GPU source (``sync_check.install_gpu_source`` with
    ``is_device=is_marked``) counts the waits, as it does on a GPU."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("device tracking is already active")
    saved: list[tuple[object, str, object, bool]] = []
    beneath: list[tuple[Junction, object]] = []

    def patch(owner, name, replacement):
        had = name in vars(owner) if isinstance(owner, type) else True
        saved.append((owner, name, getattr(owner, name) if not isinstance(owner, type) else vars(owner).get(name), had))
        setattr(owner, name, replacement)

    def patch_method(owner, name, make):
        """Where the plugin's junction holds the attribute, the tracking wrapper goes beneath its
        links (tracking stands for the device, which the links reach last): a read a link serves on
        the host is never judged a device read."""
        junction = Junction.at(owner, name)
        if junction is None:
            patch(owner, name, make(getattr(owner, name)))
        else:
            beneath.append((junction, junction.bottom))
            junction.set_bottom(make(junction.bottom))

    tracker = Tracker(recording)
    try:
        wrapped: dict[int, object] = {}
        for module, name, fn in _function_targets():
            replacement = wrapped.get(id(fn))
            if replacement is None:
                replacement = wrapped[id(fn)] = _wrap_function(name, fn, name in CREATION)
            patch(module, name, replacement)
        for name in _tensor_method_names():
            patch_method(paddle.Tensor, name, functools.partial(_wrap_method, name))
        for owner, name, replacement in _backend_wrappers():
            patch(owner, name, replacement)
        original_place = inspect.getattr_static(paddle.Tensor, "place")

        def place(self):
            return DevicePlace() if is_marked(self) else original_place.__get__(self, type(self))

        patch(paddle.Tensor, "place", property(place))
        _ACTIVE = tracker
        if recording:
            sync_check.external_source(True)  # the tracker reports the waits: the GPU source stands aside
        try:
            yield tracker
        finally:
            if recording:
                sync_check.external_source(False)
    finally:
        _ACTIVE = None
        for junction, bottom in reversed(beneath):
            junction.set_bottom(bottom)
        for owner, name, original, had in reversed(saved):
            # the plugin enabled during tracking wrapped a tracking wrapper: it gets Paddle's back
            junction = Junction.at(owner, name)
            if junction is not None:  # made during tracking: its original is the tracking wrapper
                if junction.bottom is junction.original:
                    junction.set_bottom(original)
                junction.original = original
                continue
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
