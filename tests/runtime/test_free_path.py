"""Issue 25 item 2: freeing the plugin's pinned buffers runs no Python inside Paddle's free routine.

The buffers are Paddle tensors over memory the plugin owns; the last reference to one goes inside
Paddle's free routine, under a Paddle lock. Python code there (a ``__del__``) can drop the GIL, and
a thread allocating a buffer at that moment takes the GIL and waits on Paddle's lock: the process
hangs for good. The memory is now released later, by plugin code (``runtime.backend.release_freed``).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from fd_async_copy_plugin.runtime import HostBackend, SimulatedBackend
from fd_async_copy_plugin.runtime.backend import pending_release, release_freed

BACKENDS = {"host": HostBackend, "sim": SimulatedBackend}

#: Two threads: one allocates pinned buffers (as building a runner does), the other drops them (as
#: disable() does). A tiny GIL switch interval makes a GIL hand-off inside the free path near
#: certain; before the fix this hung within a second on both backends.
CHURN = textwrap.dedent(
    """
    import faulthandler, queue, sys, threading, time
    faulthandler.dump_traceback_later({watchdog}, exit=True)  # a hang fails fast, with the stacks
    sys.setswitchinterval(1e-6)
    from fd_async_copy_plugin.runtime import make_backend
    from fd_async_copy_plugin.runtime.backend import pending_release, release_freed
    backend = make_backend("{backend}")
    buffers = queue.Queue()
    stop = time.monotonic() + {seconds}
    def allocate():
        while time.monotonic() < stop:
            buffers.put(backend.new_pinned([64], "int64", "churn"))
        buffers.put(None)
    def free():
        while (t := buffers.get()) is not None:
            backend.free_pinned(t, "churn")
            del t
    threads = [threading.Thread(target=allocate), threading.Thread(target=free)]
    for t in threads: t.start()
    for t in threads: t.join()
    release_freed()
    print("counts", backend.rt.allocations, backend.rt.frees, pending_release())
    """
)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_freeing_on_one_thread_while_another_allocates_never_hangs(backend):
    code = CHURN.format(watchdog=40, backend=backend, seconds=2)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:  # pragma: no cover - the in-process watchdog fires first
        pytest.fail("the free/allocate churn hung (the watchdog did not fire either)")
    assert done.returncode == 0, "the free/allocate churn hung or failed:\n" + done.stderr[-4000:]
    counts = [line for line in done.stdout.splitlines() if line.startswith("counts")]
    _, allocations, frees, pending = counts[0].split()
    # every pinned allocation was freed, once, and counted
    assert int(allocations) > 100 and int(allocations) == int(frees) and int(pending) == 0, counts


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_last_reference_going_runs_no_python(backend):
    """What runs where the tensor dies: no Python function at all (so nothing can drop the GIL)."""
    be = BACKENDS[backend]()
    release_freed()
    live = be.rt.allocations - be.rt.frees  # (``sim``: the process's one fake runtime counts every backend's)
    t = be.new_pinned([8], "int64", "b")
    be.free_pinned(t, "b")
    release_freed()
    frees = be.rt.frees
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        del t
    finally:
        sys.setprofile(None)
    assert calls == [], calls
    assert pending_release() >= 1 and be.rt.frees == frees  # deferred, not lost
    assert release_freed() >= 1
    assert be.rt.frees == frees + 1 and be.rt.allocations - be.rt.frees == live


def test_memory_is_released_at_the_next_allocation_and_at_exit():
    be = HostBackend()
    t = be.new_pinned([8], "int64", "a")
    del t
    gc.collect()
    assert be.rt.frees == 0
    be.new_pinned([8], "int64", "b")  # the next allocation releases what went before
    assert be.rt.frees == 1
    code = textwrap.dedent(
        """
        import atexit
        from fd_async_copy_plugin.runtime import HostBackend
        be = HostBackend()
        atexit.register(lambda: print("frees at exit", be.rt.frees))  # LIFO: runs after the plugin's
        t = be.new_pinned([8], "int64", "a")
        del t
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "frees at exit 1" in done.stdout, done.stdout + done.stderr
