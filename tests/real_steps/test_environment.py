"""What makes a FastDeploy tree step on CPU, tested without one: device tracking of a creation op
another package replaced, the pinned-memory routing for FastDeploy's files, the CLI's input checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime.simulated import SimulatedBackend
from fd_async_copy_plugin.testing.real_steps import pinned
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference import device_tracking


def test_tracking_marks_a_creation_op_another_package_replaced(monkeypatch):
    """PaddleFormers (imported by FastDeploy) swaps ``paddle.to_tensor`` for its own wrapper; a
    tensor it makes still lands on the device (the plugin's device copy of ``infer_seed`` is one)."""
    original = paddle.to_tensor

    def enhance_to_tensor(*args, **kwargs):
        return original(*args, **kwargs)

    enhance_to_tensor.__module__ = "paddleformers.utils.paddle_patch"
    monkeypatch.setattr(paddle, "to_tensor", enhance_to_tensor)
    with device_tracking.tracking(recording=True):
        on_device = paddle.to_tensor(np.arange(3))
        on_host = paddle.to_tensor(np.arange(3), place=paddle.CPUPlace())
    assert device_tracking.is_marked(on_device) and not device_tracking.is_marked(on_host)


@pytest.fixture
def fake_fastdeploy(tmp_path):
    package = tmp_path / "fastdeploy"
    package.mkdir()
    (package / "batch.py").write_text(textwrap.dedent("""
        import paddle

        def make():
            return paddle.full([2], 5, dtype="int64").pin_memory()

        def copy_into(dst, src):
            dst.copy_(src, False)
    """))
    sys.path.insert(0, str(tmp_path))
    pinned.install(str(package))
    try:
        import fastdeploy.batch as batch

        yield batch
    finally:
        pinned.uninstall()
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "fastdeploy" or n.startswith("fastdeploy.")]:
            del sys.modules[name]


def test_fastdeploys_pinned_buffers_and_copies_go_through_the_backend(fake_fastdeploy):
    sim = SimulatedBackend()
    previous = replica_backend.use(sim)
    try:
        buf = fake_fastdeploy.make()
        assert sim.is_pinned(buf) and buf.numpy().tolist() == [5, 5]
        fake_fastdeploy.copy_into(buf, paddle.to_tensor(np.array([7, 8], dtype=np.int64)))
        assert buf.numpy().tolist() != [7, 8]  # in flight: FastDeploy's own read would see poison
        sim.wait(sim.record("event"), "test")
        assert buf.numpy().tolist() == [7, 8]
        # other callers keep Paddle's methods: a blocking copy_ lands at once
        other = paddle.zeros([2], dtype="int64")
        other.copy_(paddle.to_tensor(np.array([1, 2], dtype=np.int64)), False)
        assert other.numpy().tolist() == [1, 2] and not sim.is_pinned(other)
    finally:
        replica_backend.use(previous)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_real_steps_refuses_a_folder_without_fastdeploy(tmp_path):
    done = _cli("selftest", "--real-steps", "--fd-root", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"selftest --real-steps: --fd-root {str(tmp_path)!r} holds no fastdeploy/ folder"]


def test_real_steps_says_in_one_line_when_no_fastdeploy_can_step(tmp_path):
    (tmp_path / "fastdeploy").mkdir()  # a folder named fastdeploy that is no FastDeploy
    done = _cli("selftest", "--real-steps", "--fd-root", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip().startswith("real-steps: cannot step this FastDeploy:") and "Traceback" not in done.stdout
    assert len(done.stdout.strip().splitlines()) == 1


def test_the_runners_output_thread_is_ended_at_the_end_of_a_run():
    """FastDeploy's ``_async_output_busy_loop`` catches ``Exception`` and loops for ever, holding its
    runner; ``runner.close`` (called by the driver) ends it."""
    import queue
    import threading
    import types

    from fd_async_copy_plugin.testing.real_steps.runner import _end_output_thread

    sent = []
    runner = types.SimpleNamespace(async_output_queue=queue.Queue())

    def busy_loop():  # the shape of FastDeploy's loop
        while True:
            try:
                import pickle

                sent.append(pickle.dumps(runner.async_output_queue.get()))
            except Exception:
                pass

    runner.async_output_copy_thread = threading.Thread(target=busy_loop, daemon=True)
    runner.async_output_copy_thread.start()
    runner.async_output_queue.put([1, 2])
    _end_output_thread(runner)
    assert not runner.async_output_copy_thread.is_alive() and len(sent) == 1
