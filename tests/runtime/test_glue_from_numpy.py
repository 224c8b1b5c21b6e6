"""``PaddleGlue.from_numpy`` makes what ``paddle.to_tensor(array, place=CPUPlace())`` makes (issue 24:
the consumers' owned tensors through the constructor, without ``to_tensor``'s argument handling):
the same dtype, shape, values, place and ``stop_gradient``, and a copy - never the array's memory,
which the caller may reuse."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime.backend import _NP_DTYPES
from fd_async_copy_plugin.runtime.glue import PaddleGlue


@pytest.mark.parametrize("dtype", sorted(_NP_DTYPES))
@pytest.mark.parametrize("shape", [(), (1,), (0, 3), (4, 3), (128, 21)])
def test_from_numpy_makes_what_to_tensor_makes(dtype, shape):
    array = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
    expected = paddle.to_tensor(array, place=paddle.CPUPlace())
    got = PaddleGlue().from_numpy(array)
    assert (got.dtype, list(got.shape), str(got.place), got.stop_gradient) == (
        expected.dtype, list(expected.shape), str(expected.place), expected.stop_gradient)
    assert got.numpy().dtype == expected.numpy().dtype and np.array_equal(got.numpy(), expected.numpy())
    if array.size:
        assert got.data_ptr() != array.ctypes.data  # a copy: the array may be written again
        array.reshape(-1)[0] = 2
        assert np.array_equal(got.numpy(), expected.numpy())
