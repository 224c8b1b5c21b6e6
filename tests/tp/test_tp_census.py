"""``bench``'s TP=2 census per rank (``tp.census_per_rank``): rank 0's row is the single-rank run's
(the same workload, variant and backend), and every rank of the plugin's run waits once per step on
its event with the step's copies asynchronous - rank 1 as rank 0, though it sends nothing."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.harness import CENSUS_VARIANTS, census_row, logprob_workload, run_variant
from fd_async_copy_plugin.testing.reference import tp as tpm

pytestmark = pytest.mark.usefixtures("plugin_off")


def test_census_per_rank_rank0_is_the_single_rank_census():
    config, requests = logprob_workload(6, 5, 256, 10)
    rows = tpm.census_per_rank(config, requests, tp=2, max_steps=18)
    assert set(rows) == {f"{name} r{rank}" for name in tpm.CENSUS_TP_VARIANTS for rank in (0, 1)}
    for name in tpm.CENSUS_TP_VARIANTS:
        single = census_row(run_variant(CENSUS_VARIANTS[name], config, requests, backend="sim", max_steps=18))
        mine = {k: v for k, v in rows[f"{name} r0"].items() if k not in ("fallbacks", "host_waits")}
        assert mine == {k: single[k] for k in mine}, name
    for name in ("fd24-plugin", "fd24-overlap"):
        for rank in (0, 1):
            row = rows[f"{name} r{rank}"]
            assert row["event_wait"] == 1.0 and row["blocking_d2h"] == 0 and row["async_d2h"] >= 5, (name, rank, row)
