"""Run a callback once a module is fully imported - also when it is half-initialised right now.

FastDeploy's plugin hook fires in the middle of imports (fastdeploy-surface.md §1.3, platform-facts
"Import order is not fixed"): in the GPU worker before ``gpu_model_runner`` and the sampler are
imported at all, and in FD's own tests while ``gpu_model_runner`` is half-initialised (its class not
yet defined). Patching must end in the same state either way, so features wait for their modules:

- already fully imported: the callback runs now;
- not imported yet: a ``sys.meta_path`` finder wraps the module's loader and runs the callback
  right after the module finished executing;
- half-initialised (in ``sys.modules`` with ``__spec__._initializing`` set): the callback runs on
  the first import of anything after the module finished (the same finder polls on every import;
  ``status()`` does not: it reads state only).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable

Callback = Callable[[], None]


class _LoaderProxy(importlib.abc.Loader):
    def __init__(self, loader, name: str, watcher: "ImportWatcher") -> None:
        self._loader, self._name, self._watcher = loader, name, watcher

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # Runs while importlib still marks the module as initialising; the callbacks need the
        # module's attributes only, which are all defined now.
        self._watcher._executed_names.add(self._name)
        self._watcher._fire(self._name)

    def __getattr__(self, item):
        return getattr(self._loader, item)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """One instance per process (``WATCHER``); installed in ``sys.meta_path`` on first use."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._lock, self._in_find = threading.RLock(), threading.local()
        # Modules whose body finished executing; importlib still flags them as initialising
        # until the loader returns, which is when our callbacks run.
        self._executed_names: set[str] = set()

    # -- public --------------------------------------------------------------------------------
    def is_ready(self, name: str) -> bool:
        """True when ``name`` is imported and its module body has finished executing (importlib no
        longer marks it as initialising, or the body ran under our loader)."""
        module = sys.modules.get(name)
        initialising = getattr(getattr(module, "__spec__", None), "_initializing", False)
        return module is not None and (name in self._executed_names or not initialising)

    def when_ready(self, name: str, callback: Callback) -> None:
        """Run ``callback`` once ``name`` is fully imported (now, if it is)."""
        if self.is_ready(name):
            callback()
            return
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def cancel(self, callback: Callback) -> None:
        with self._lock:
            kept = {n: [c for c in waiting if c is not callback] for n, waiting in self._callbacks.items()}
            self._callbacks = {n: waiting for n, waiting in kept.items() if waiting}
            self._uninstall_if_idle()

    def poll(self) -> None:
        """Fire callbacks of modules that finished initialising since they were registered."""
        with self._lock:
            ready = [name for name in self._callbacks if self.is_ready(name)]
        for name in ready:
            self._fire(name)

    # -- importlib protocol --------------------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        if getattr(self._in_find, "active", False):
            return None
        self.poll()
        with self._lock:
            if fullname not in self._callbacks:
                return None
        self._in_find.active = True
        try:  # the spec the other finders give, in their order
            finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
            spec = next(filter(None, (f.find_spec(fullname, path, target) for f in finders)), None)
        finally:
            self._in_find.active = False
        if spec is not None and hasattr(spec.loader, "exec_module"):  # (else a legacy loader: not watched)
            spec.loader = _LoaderProxy(spec.loader, fullname, self)
        return spec

    # -- internals -----------------------------------------------------------------------------
    def _fire(self, name: str) -> None:
        with self._lock:
            callbacks = self._callbacks.pop(name, [])
            self._uninstall_if_idle()
        for callback in callbacks:
            callback()

    def _uninstall_if_idle(self) -> None:
        if not self._callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)


WATCHER = ImportWatcher()
