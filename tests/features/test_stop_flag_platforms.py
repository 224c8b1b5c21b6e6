"""Feature ``stop_flag``: runners on non-CUDA platforms are left exactly as FastDeploy 2.4 has them.

The plugin's ops and buffers are CUDA-only. Where ``current_platform.is_cuda()`` is False (DCU and
Iluvatar runners subclass ``GPUModelRunner``), the runner gets no plugin state - no
``not_need_stop_device``, no pinned buffers - and every patched function passes through to the
2.4 original: the blocking copy inside the update op is still there, ``not_need_stop()`` returns
2.4's tensor.

The replica models only CUDA paths (its sampler and ``pre_process`` raise on other platforms), so
the platform is made non-CUDA where the runner module sees it: ``gpu_model_runner.current_platform``,
the binding the plugin consults.
"""

from __future__ import annotations

import paddle
import pytest

from fd_async_copy_plugin import runtime

pytestmark = pytest.mark.usefixtures("plugin_off")

PLUGIN_KEYS = ("not_need_stop_device", "not_need_stop_gpu", "not_need_stop_pinned", "sampled_token_ids")


class _NotCuda:
    """A platform as FastDeploy's ``current_platform`` reports it on DCU, Iluvatar, XPU, ..."""

    def __init__(self, platform):
        self._platform = platform

    def is_cuda(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _non_cuda_runner_module(sfkit, monkeypatch) -> None:
    runner_module = sfkit.runner_module
    assert runner_module.current_platform.is_cuda()
    monkeypatch.setattr(runner_module, "current_platform", _NotCuda(runner_module.current_platform))


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_non_cuda_runner_decodes_exactly_like_2_4(sfkit, backend, monkeypatch):
    """The plugin's patches are installed but must all pass through."""
    config, requests, arrivals = sfkit.mixed()

    def probe(runner, record, event):
        record.append(type(runner.not_need_stop()))

    base = sfkit.run(config, requests, arrivals=arrivals, probe=probe)
    _non_cuda_runner_module(sfkit, monkeypatch)
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES, probe=probe)
    assert run.states == {"stop_flag": "applied", "sampled_tokens": "applied"}
    run.result.assert_same(base.result)
    assert sfkit.state(run.runner) is None
    assert [k for k in PLUGIN_KEYS if k in run.runner.share_inputs] == []
    assert set(run.probe) == set(base.probe) == {paddle.Tensor}
    # the same host interactions as unpatched 2.4, step by step (the 2.4 ops ran)
    assert [s.events for s in run.census.steps] == [s.events for s in base.census.steps]
    assert run.census.setup.sites("pinned_alloc") == []


def test_patched_functions_called_directly_pass_through_on_a_non_cuda_runner(sfkit, monkeypatch):
    """The update op, the save op and the runner methods, called on a non-CUDA runner's buffers."""
    config, _, _ = sfkit.mixed()
    _non_cuda_runner_module(sfkit, monkeypatch)
    with sfkit.enabled_runner(config, backend="sim") as runner:
        si = runner.share_inputs
        assert sfkit.state(runner) is None
        assert [k for k in PLUGIN_KEYS if k in si] == []
        n = config.max_num_seqs
        si["stop_flags"][:] = False
        args = (
            si["stop_flags"], si["not_need_stop"], runner.seq_lens_this_time_buffer, si["seq_lens_encoder"],
            si["seq_lens_decoder"], si["step_seq_lens_decoder"], si["prompt_lens"],
            paddle.full([n, 1], 5, dtype="int64"), si["input_ids"], si["block_tables"], si["stop_nums"],
            si["next_tokens"], si["is_block_step"], config.block_size,
        )
        with runtime.collecting() as census:
            sfkit.postproc.update_inputs_v1(*args)
            sfkit.postproc.save_output(paddle.full([n, 1], 5, dtype="int64"), si["not_need_stop"], 0, False)
            flag = runner.not_need_stop()
            runner.reset_share_inputs()
        events = census.setup.events
        assert ("blocking_d2h", "update_inputs_v1.not_need_stop") in events, "2.4's update op did not run"
        assert not [e for e in events if e[0] in ("async_d2h", "event_wait")]
        assert isinstance(flag, paddle.Tensor)
        assert [k for k in PLUGIN_KEYS if k in si] == []
