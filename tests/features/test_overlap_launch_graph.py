"""``FD_ASYNC_COPY_OVERLAP_COUNT=exact`` (the default; ``launch`` is its old name) and ``prepare``
under FD 2.4's CUDA-graph decode, in the replica's graph
mode (``DriverConfig(cuda_graph=True)``, ``reference/cuda_graph.py``): a decode-only step's forward
runs on the first C rows of the static buffers ``share_inputs["ids_remove_padding"]`` and
``batch_id_per_token``, C being the captured size above the token count M. FD 2.4 copies M rows into
them each step, so rows M..C hold what they held. With ``moe_experts`` the replica's model routes
every row, padding rows included, to an expert by token id, and an expert's bits depend on its row
count: the padding rows' contents reach real rows' bits, as they may through a MoE layer.

``exact`` prepares the step sized by the bound B, so FD's copy writes B rows (the bound's fill past
M). At the launch it puts rows M..B back as they were before that copy and leaves the buffers M rows
long (``OverlapState.keep_padding``/``launch_wait``): every replay then reads FD 2.4's padding rows.
``DecodeResult.graph_replays`` records, per replay, the size, the count, the buffers' shapes and
their first C rows; ``run_exact`` compares them with unpatched FD 2.4's (docs/overlap-token-count.md,
"A wait at the forward's launch"). The restore's Paddle calls pass a self-check first; where
they fail it, ``exact`` waits at the prepare as ``prepare`` does, and the replays are FD 2.4's too."""

from __future__ import annotations

import dataclasses

import paddle
import pytest

from fd_async_copy_plugin.patches.fd24 import overlap as overlap_patch
from fd_async_copy_plugin.testing.harness import Variant, run_variant

from test_overlap import EXACT, FD24, OVERLAP, _req, _run_plugin, config, run_exact
from test_overlap_launch_wait import one_wait_at_the_launch

pytestmark = pytest.mark.usefixtures("plugin_off")

#: graph mode with the MoE stand-in (and the rows-dependent dense layer, keyed by the captured size)
GRAPH = dict(cuda_graph=True, moe_experts=3, rows_dependent_gemm=True)


def staggered():
    """Eleven requests, one finishing a step (``max_tokens`` 4..14): decode-only steps of 11 down to
    1 tokens, so finishes cross the captured sizes 8, 4, 2 and 1; logprobs on every other one."""
    requests = [_req(i, 3 + i % 5, 4 + i, logprobs=5 if i % 2 else None) for i in range(11)]
    return config(max_num_seqs=16, chunk_size=None, enable_logprob=True), requests, {}


SCENARIOS = {"staggered finishes across captured sizes, logprobs": staggered, **EXACT}
STAGGERED = "staggered finishes across captured sizes, logprobs"


@pytest.fixture
def count(monkeypatch):
    def set_mode(mode: str) -> None:
        monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", mode)

    return set_mode


def run_graph(name, backend="sim", **model):
    cfg, requests, arrivals = SCENARIOS[name]()
    return run_exact(dataclasses.replace(cfg, **{**GRAPH, **model}), requests, arrivals, backend, max_steps=400)


def graph_diffs(name, replays=None, **model) -> list:
    """The differences from unpatched FD 2.4 (its engine one step behind), graph replays left out
    (``replays``: gets FD 2.4's and the plugin's replays, pairwise)."""
    cfg, requests, arrivals = SCENARIOS[name]()
    cfg = dataclasses.replace(cfg, **{**GRAPH, **model})
    base = run_variant(Variant("fd24-unpatched", FD24, False), dataclasses.replace(cfg, engine_lag=1), requests,
                       backend="sim", arrivals=arrivals, max_steps=400).result
    plugin, _, _ = _run_plugin(cfg, requests, arrivals, "sim", OVERLAP, 400)
    if replays is not None:
        replays.extend(zip(base.graph_replays, plugin.graph_replays))
    return [d for d in base.differences(plugin) if not d.startswith(("executed_steps", "graph replay"))]


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("mode", ["exact", "prepare", "launch"])
def test_graph_mode_with_moe_is_fastdeploy_24_bit_for_bit_padding_rows_included(mode, name, backend, count):
    count(mode)
    result, served = run_graph(name, backend)
    assert result.graph_replays and served["count mode: " + {"launch": "exact"}.get(mode, mode)], served
    if mode != "prepare" and name != "all ending together":  # a step after a finish ran on fewer rows than B
        assert served["launch: padding restored"] == served["launch: steps trimmed"] > 0, served
        assert served["launch fallback: "], served  # no fallback: the self-check passed


def test_the_replica_graph_reads_stale_padding_rows_at_captured_sizes(count):
    """The graph mode is what the check above needs: unpatched FD 2.4 replays at captured sizes
    above the count, with padding rows that are neither the bound's fill (id 2) nor empty."""
    cfg, requests, _ = staggered()
    result = run_variant(Variant("fd24-unpatched", FD24, False), dataclasses.replace(cfg, **GRAPH), requests,
                         backend="sim", max_steps=100).result
    sizes = [(size, real) for size, real, *_ in result.graph_replays]
    assert {(16, 9), (8, 5), (4, 3)} <= set(sizes), sizes
    padded = [r for r in result.graph_replays if r[0] > r[1]]
    import numpy as np

    assert any(set(np.frombuffer(ids, dtype=np.int64)[real:]) - {2} for size, real, _, _, ids, _ in padded)


def test_without_the_restore_exact_is_not_fastdeploy_24_under_the_graph(count, monkeypatch):
    """The check can fail: without the restore the replays read the bound's fill (and buffers B
    rows long) where FD 2.4's hold stale rows, and through the MoE layer real rows' bits move."""
    count("exact")
    monkeypatch.setattr(overlap_patch.OverlapState, "keep_padding", lambda self, *args: None)
    with pytest.raises(AssertionError, match="logprobs differ"):
        run_graph(STAGGERED)
    assert graph_diffs(STAGGERED, moe_experts=0) == []  # dense layers only: the padding rows do not matter


def test_bound_moves_bits_where_a_finish_crosses_a_captured_size(count):
    """``bound`` replays the graph of the bound's size: on a finish from 9 to 8 tokens that is 16,
    where FD 2.4 replays 8, and the dense rows-dependent layer moves bits. Where no finish takes
    the count below the bound's captured size, it replays FD 2.4's sizes and keeps the bits."""
    count("bound")
    replays = []
    assert "logprobs differ" in " ".join(graph_diffs(STAGGERED, replays, moe_experts=0))
    assert any(ours[0] != fd24[0] for fd24, ours in replays), replays
    SCENARIOS["within one size"] = lambda: (
        config(max_num_seqs=16, chunk_size=None, enable_logprob=True),
        [_req(i, 3 + i % 5, 6 + min(i, 8), logprobs=5 if i % 2 else None) for i in range(16)], {})
    try:
        replays = []
        assert graph_diffs("within one size", replays, moe_experts=0) == []
    finally:
        del SCENARIOS["within one size"]
    assert all(ours[0] == fd24[0] for fd24, ours in replays), replays  # the sizes: FD 2.4's
    assert any(ours[1] > fd24[1] for fd24, ours in replays), replays  # padded: a bound above the count


def test_the_restore_makes_no_host_wait(count):
    """Graph mode, finishes in the window: still one wait per step, on the last step's event at
    the launch; the restore's copies are device work."""
    count("exact")
    requests = [_req(i, 4 + i, 8 + 2 * i, logprobs=5, top_p=0.9, seed=i) for i in range(8)]
    cfg = config(max_num_seqs=8, chunk_size=None, enable_logprob=True, block_size=64, **GRAPH)  # no insert
    run, runner = one_wait_at_the_launch(cfg, requests, slice(3, 24))
    assert runner["launch"]["padding restored"] >= 5 and run.result.graph_replays, runner


class _CopyingAsStrided:
    """Paddle, but ``as_strided`` returns a copy: reads past the shape work, writes through it are lost."""

    def __getattr__(self, name):
        return getattr(paddle, name)

    @staticmethod
    def as_strided(x, shape, stride, offset=0):
        return paddle.as_strided(x, shape, stride, offset).clone()


class _NoAsStrided:
    """A Paddle without ``as_strided``."""

    def __getattr__(self, name):
        if name == "as_strided":
            raise AttributeError("module 'paddle' has no attribute 'as_strided'")
        return getattr(paddle, name)


@pytest.mark.parametrize("broken, seen", [(_CopyingAsStrided, "[0, 1, 2, 3, 4, 5]"), (_NoAsStrided, "AttributeError")])
def test_a_restore_failing_its_self_check_falls_back_to_the_wait_at_the_prepare(broken, seen, count, monkeypatch):
    """The restore's ``paddle.as_strided`` (the plugin's, not the replica's) planted broken: the
    runner's one-time self-check sees it, ``exact`` waits at ``_prepare_inputs`` (no step sized by
    the bound), ``status()`` says why, and every output, message and replay is FD 2.4's."""
    count("exact")
    monkeypatch.setattr(overlap_patch, "paddle", broken())
    result, served = run_graph(STAGGERED)
    assert not served["syncs: S1 upper bound (tail filled)"] and not served["launch: steps trimmed"], served
    (why,) = [k for k in served if k.startswith("launch fallback: ")]
    assert why.startswith("launch fallback: the padding rows' restore failed its self-check") and seen in why, why
    assert served["count mode: exact"] and result.graph_replays and served["overlap steps"] > 0, served


def test_without_the_self_check_a_copying_as_strided_moves_bits(count, monkeypatch):
    """The check above can fail: with the self-check passing anyway, the copying ``as_strided``
    loses the restore's writes and the replays read the bound's fill through the MoE layer."""
    count("exact")
    monkeypatch.setattr(overlap_patch, "paddle", _CopyingAsStrided())
    monkeypatch.setattr(overlap_patch, "restore_check", lambda *args: "")
    with pytest.raises(AssertionError, match="logprobs differ"):
        run_graph(STAGGERED)


def test_the_self_check_on_a_shape_setter_that_moves_nothing():
    """``_set_dims`` (``glue.set_shape``) that leaves the shape as it was fails the check too; the
    real calls pass it."""
    from types import SimpleNamespace

    from fd_async_copy_plugin.runtime.glue import paddle_glue

    runner = SimpleNamespace(share_inputs={"ids_remove_padding": paddle.zeros([8], dtype="int64")})
    assert overlap_patch.restore_check(runner, paddle_glue()) == ""
    why = overlap_patch.restore_check(runner, SimpleNamespace(set_shape=lambda t, shape: None))
    assert why == "the padding rows' restore failed its self-check (([6], [0, 1, 2, 3, 0, 1]))", why
