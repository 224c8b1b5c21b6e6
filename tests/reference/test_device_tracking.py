"""Device-value tracking (``reference/device_tracking.py``) on real CPU Paddle: marks, propagation
through every category of op, host reads, implicit H2D, sites, long/short, and a clean exit."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference import device_tracking as dt
from fd_async_copy_plugin.testing.reference.placement import as_device
from fd_async_copy_plugin.runtime import collecting


def dev(values, dtype="int64"):
    return as_device(paddle.to_tensor(values, dtype=dtype, place=paddle.CPUPlace()))


def host(values, dtype="int64"):
    return paddle.to_tensor(values, dtype=dtype, place=paddle.CPUPlace())


def line() -> int:
    return sys._getframe(1).f_lineno


@pytest.fixture
def tr():
    with collecting(), dt.tracking() as tracker:
        yield tracker


# -- propagation: every category the issue names, then one read of the result -----------------

PROPAGATING = {
    "numel": lambda t: t.numel(),
    "sum": lambda t: t.sum(),
    "paddle.sum": lambda t: paddle.sum(t),
    "max": lambda t: paddle.max(t),
    "any": lambda t: (t > 0).any(),
    "greater_than": lambda t: t > 1,
    "equal": lambda t: t == 2,
    "paddle.greater_equal": lambda t: paddle.greater_equal(t, paddle.full_like(t, 1)),
    "astype": lambda t: t.astype("float32"),
    "cast": lambda t: paddle.cast(t, "int32"),
    "index": lambda t: t[0],
    "slice": lambda t: t[1:],
    "reshape": lambda t: t.reshape([-1, 1]),
    "concat": lambda t: paddle.concat([t, t]),
    "where": lambda t: paddle.where(t > 1, t, t * 0),
    "add": lambda t: t + 1,
    "radd": lambda t: 1 + t,
    "mod": lambda t: t % 2,
    "mul": lambda t: t * t,
    "neg": lambda t: -t,
    "clone": lambda t: t.clone(),
    "topk": lambda t: paddle.topk(t.astype("float32"), 1)[1],
    "take_along_axis": lambda t: paddle.take_along_axis(t, paddle.zeros_like(t), axis=0),
    "in-place add_": lambda t: t.add_(paddle.ones_like(t)),
    "in-place clip_": lambda t: t.astype("float32").clip_(min=0.0),
    "to_tensor of a device tensor": lambda t: paddle.to_tensor(t),
    "assign": lambda t: paddle.assign(t),
}


@pytest.mark.parametrize("op", PROPAGATING)
def test_the_mark_propagates_and_a_read_of_the_result_is_a_blocking_d2h(tr, op):
    t = dev([1, 2, 3])
    out = PROPAGATING[op](t)
    assert dt.is_marked(out), op
    assert tr.waits == []  # an op is not a read
    out.numpy()
    assert [w.mechanism for w in tr.waits] == ["d2h"]


def test_int_of_numel_is_a_blocking_d2h_at_its_line(tr):
    t = dev([[1, 2], [3, 4]])
    here = line() + 1
    n = int(t.numel())
    assert n == 4
    (wait,) = tr.waits
    assert (wait.mechanism, wait.file, wait.line, wait.function) == (
        "d2h", "tests/reference/test_device_tracking.py", here, "test_int_of_numel_is_a_blocking_d2h_at_its_line"
    )


READS = {
    "int": int,
    "float": float,
    "bool": bool,
    "truth test": lambda t: 1 if t else 0,
    "index": lambda t: [10, 20, 30][t],
    "item": lambda t: t.item(),
    "numpy": lambda t: t.numpy(),
    "tolist": lambda t: t.tolist(),
    "np.asarray": np.asarray,
    "str": str,
    "cpu": lambda t: t.cpu(),
    "copy_ into host": lambda t: host([0]).copy_(t, True),
    "setitem into host": lambda t: host([0, 0]).__setitem__(0, t),
}


@pytest.mark.parametrize("read", READS)
def test_every_host_read_of_a_device_scalar_is_one_blocking_d2h(tr, read):
    t = dev([1])[0]
    READS[read](t)
    assert [w.mechanism for w in tr.waits] == ["d2h"], read


def test_cpu_returns_an_unmarked_copy(tr):
    t = dev([1, 2])
    h = t.cpu()
    assert h is not t and not dt.is_marked(h) and dt.is_marked(t)
    h.numpy()
    int(h[0])
    assert len(tr.waits) == 1


def test_metadata_is_not_a_read(tr):
    t = dev([[1, 2], [3, 4]])
    assert (list(t.shape), t.dtype, len(t), t.ndim) == ([2, 2], paddle.int64, 2, 2)
    t.place, t.data_ptr(), t.is_contiguous()
    assert tr.waits == []


def test_host_values_are_never_recorded(tr):
    h = paddle.to_tensor([1, 2, 3], place=paddle.CPUPlace())
    assert not dt.is_marked(h + 1)
    int(h[0]), h.numpy(), bool(h.sum() > 0), h.cpu()
    assert tr.waits == []


def test_creation_ops_place_on_the_device_unless_a_host_place_is_given(tr):
    assert dt.is_marked(paddle.full([2], 1))
    assert dt.is_marked(paddle.to_tensor([1, 2]))
    assert dt.is_marked(paddle.zeros([2]))
    assert not dt.is_marked(paddle.to_tensor([1], place=paddle.CPUPlace()))
    assert not dt.is_marked(paddle.full([2], 1, device="cpu"))
    assert not dt.is_marked(paddle.empty([2], device=paddle.CPUPlace()))
    # the place of a device tensor names the device (FastDeploy's ``place=stop_flags.place``)
    assert dt.is_marked(paddle.to_tensor([False], place=dev([1]).place))
    # a GPU allocation read back: the pattern of ``paddle.full(...).cpu()`` on reset
    paddle.full([1], False, dtype="bool").cpu()
    assert [w.mechanism for w in tr.waits] == ["d2h"]


def test_a_pageable_host_tensor_into_a_device_op_is_a_synchronous_h2d(tr):
    t = dev([1, 2])
    out = paddle.where(t > 1, t, host([7, 7]))
    assert dt.is_marked(out)
    assert [(w.mechanism, w.what) for w in tr.waits] == [("h2d", "where: pageable host input")]


def test_setitem_of_a_host_tensor_into_a_device_tensor_is_a_synchronous_h2d(tr):
    t = dev([1, 2])
    t[0] = 5  # a Python or numpy value: an H2D copy with no stream wait
    t[0:1] = np.array([5])
    assert tr.waits == []
    t[0:1] = host([6])
    assert [w.mechanism for w in tr.waits] == ["h2d"]


def top_p_sampling(x, topp_seed):
    """A stand-in for a Paddle op: declares its inputs to the tracker."""
    dt.phi_op("top_p_sampling", x=x, topp_seed=topp_seed)


def test_phi_op_stand_in_records_the_transform_of_a_pageable_input_at_the_caller(tr):
    here = line() + 1
    top_p_sampling(dev([0.5], "float32"), topp_seed=host([1]))
    (wait,) = tr.waits
    assert (wait.mechanism, wait.line, wait.what) == ("h2d", here, "top_p_sampling(topp_seed=pageable host tensor)")
    top_p_sampling(dev([0.5], "float32"), topp_seed=dev([1]))  # the seed on the device (#6765)
    top_p_sampling(host([0.5], "float32"), topp_seed=host([1]))  # a host op
    assert len(tr.waits) == 1


def test_device_code_is_untracked_and_host_code_inside_it_is_tracked(tr):
    t = dev([1, 2])
    with dt.device_code():
        t.numpy()
        int(t[0])
        with dt.host_code():
            t.cpu()
    assert [w.mechanism for w in tr.waits] == ["d2h"]


def test_a_wait_after_heavy_device_work_is_long_and_the_next_one_short(tr):
    t = dev([1, 2])
    t.numpy()
    dt.heavy("forward")
    t.numpy()
    t.numpy()
    assert [w.long for w in tr.waits] == [False, True, False]


def test_async_copy_into_a_pinned_buffer_and_its_read_are_not_host_waits(tr):
    backend = runtime.make_backend("sim")
    previous = replica_backend.use(backend)
    try:
        t = dev([1, 2])
        buf = backend.new_pinned([2], "int64", "buf")
        backend.copy_d2h(buf, t, "copy")
        assert not dt.is_marked(buf) and tr.waits == []
        event = backend.record("e")
        backend.wait(event, "reader")
        assert backend.read(buf, "reader").tolist() == [1, 2]
        assert [w.mechanism for w in tr.waits] == ["event"]
    finally:
        replica_backend.use(previous)


def test_everything_is_restored_on_exit():
    before_methods = {name: inspect.getattr_static(paddle.Tensor, name, None) for name in dir(paddle.Tensor)}
    before_functions = (paddle.where, paddle.full, paddle.nn.functional.softmax, paddle._C_ops.where)
    with collecting(), dt.tracking():
        assert paddle.where is not before_functions[0]
        assert paddle.Tensor.__add__ is not before_methods["__add__"]
    after_methods = {name: inspect.getattr_static(paddle.Tensor, name, None) for name in dir(paddle.Tensor)}
    assert after_methods == before_methods
    assert (paddle.where, paddle.full, paddle.nn.functional.softmax, paddle._C_ops.where) == before_functions
    assert dt.active() is None


def test_one_tracker_at_a_time():
    with dt.tracking():
        with pytest.raises(RuntimeError, match="already active"):
            with dt.tracking():
                pass
