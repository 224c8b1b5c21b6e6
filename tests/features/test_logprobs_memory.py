"""Pinned memory stays bounded: prompt logprobs never inflate the decode ring, and nothing larger
than the cap is pinned (such a step is copied the 2.4 way, with identical results)."""

from __future__ import annotations

from fd_async_copy_plugin.testing.harness import Variant, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

from fd_async_copy_plugin.patches import logprobs as logprobs_patch

ROOT = ROOTS["fd24"]
CONFIG = DriverConfig(max_num_seqs=4, vocab_size=512, max_model_len=96, enable_logprob=True, chunk_size=32,
                      save_output_v1=True)
REQUESTS = (
    Request("long-prompt", [(7 * j) % 500 + 3 for j in range(60)], max_tokens=6, eos_token_ids=[2],
            logprobs=5, prompt_logprobs=-1),
    Request("short", [5, 6, 7], max_tokens=6, eos_token_ids=[2], logprobs=5),
)


def run(plugin: bool, backend: str = "sim"):
    return run_variant(Variant("x", ROOT, plugin, ("logprobs",) if plugin else None), CONFIG, REQUESTS, backend=backend)


def rings_spy():
    """A LogprobsCopier.copy that remembers the rings it used (they are gone after disable())."""
    seen = {}
    real = logprobs_patch.LogprobsCopier.copy

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        seen.update(self.rings)
        return out

    return seen, spy


def test_prompt_logprobs_do_not_grow_the_decode_ring(monkeypatch):
    seen, spy = rings_spy()
    monkeypatch.setattr(logprobs_patch.LogprobsCopier, "copy", spy)
    base, patched = run(False), run(True)
    base.result.assert_same(patched.result)
    decode = seen["decode"]
    # rows: max_num_seqs; columns: the default 20 top logprobs + the token
    assert all(slot.capacity["logprobs"] == 4 * 21 for slot in decode.slots)
    assert decode.grow_events == 0
    assert max(slot.capacity["logprobs"] for slot in seen["prompt"].slots) >= 32 * 513  # vocab-wide prompt rows


def test_steps_beyond_the_pinned_cap_are_copied_blocking_with_identical_outputs(monkeypatch):
    cap = 2048
    monkeypatch.setattr(logprobs_patch, "MAX_PINNED_BYTES", cap)  # vocab-wide prompt rows exceed it
    seen, spy = rings_spy()
    monkeypatch.setattr(logprobs_patch.LogprobsCopier, "copy", spy)
    base, patched = run(False), run(True)
    base.result.assert_same(patched.result)
    blocking = [site for step in patched.census.steps for kind, site in step.events
                if kind == "blocking_d2h" and site.startswith("gather_logprobs.")]
    assert blocking, "the over-cap prompt chunks should have been copied blocking"
    item_bytes = {"logprob_token_ids": 8, "logprobs": 4, "selected_token_ranks": 8}
    for ring in seen.values():
        for slot in ring.slots:
            for field, elements in slot.capacity.items():
                assert elements * item_bytes[field] <= cap, (ring.name, field, elements)
