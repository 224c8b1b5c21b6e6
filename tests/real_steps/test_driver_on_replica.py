"""CI has no FastDeploy tree: the real-steps check (``testing/real_steps/check.py``) runs the same
scenarios, configurations and counts on the replica, and must catch a planted ordering bug."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.patches.fd24 import stop_flag
from fd_async_copy_plugin.testing.real_steps import check
from fd_async_copy_plugin.testing.reference import ROOTS

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24 = check.Target(ROOTS["fd24"], "fd24", real=False)
FD25 = check.Target(ROOTS["fd25"], "fd25", real=False)


@pytest.mark.parametrize("target", [FD24, FD25], ids=["fd24", "fd25"])
def test_every_configuration_is_bit_identical_on_the_replica(target):
    scenarios = check.scenarios(target.line, steps=16)
    rows = [row for scenario in scenarios for row in check.compare(scenario, check.configurations(target.line), target=target)]
    assert rows and all(row.ok for row in rows), [vars(r) for r in rows if not r.ok]
    plugin_rows = [r for r in rows if "applied:" in r.detail]
    not_run = [r for r in rows if r.detail.startswith("not run:")]
    assert len(plugin_rows) + len(not_run) == sum(c.plugin for c in check.configurations(target.line)) * len(scenarios)
    assert all("overlap" in r.configuration for r in not_run)
    # the scenarios end requests every way they can
    assert any("stop" in r.detail.split("finished:")[1] for r in rows), [r.detail for r in rows]


def test_a_read_before_the_wait_fails_the_rows_it_reaches(monkeypatch):
    """A planted plugin bug (the flag and the tokens read from pinned memory without waiting for
    their copy's event): the sim backend makes the save op's read raise."""
    monkeypatch.setattr(stop_flag.StopFlagState, "host_tokens", lambda self, reader: self.tokens)

    def sync(self, reader):
        if self.flag_pending:
            self.ops.set_stop(self.legacy, bool(self.pinned[0]))
            self.flag_pending = False

    monkeypatch.setattr(stop_flag.StopFlagState, "sync", sync)
    scenario = check.scenarios("fd24", steps=8)[1]
    rows = {r.configuration: r for r in check.compare(scenario, check.configurations("fd24")[:3], target=FD24)}
    assert rows["unpatched"].ok
    for name in ("default (all)", "backport"):
        assert not rows[name].ok and "PendingCopyError" in rows[name].detail, rows[name].detail


def test_a_stand_down_is_not_a_pass():
    """A configuration whose feature did not apply compares FastDeploy's own path: the row fails."""
    config = check.Configuration("backport, overlap required", True, check.BACKPORT_FEATURES, must_apply=("overlap",))
    rows = check.compare(check.scenarios("fd24", steps=8)[1], [config], target=FD24)
    assert not rows[0].ok and "not applied: overlap=" in rows[0].detail


def test_exact_falling_back_to_the_wait_before_the_prepare_is_not_a_pass(monkeypatch):
    """``exact`` compared after its runner fell back (``prepare``'s wait) would check the fallback
    only: the row fails and names the fallback."""
    from fd_async_copy_plugin.patches.fd24 import overlap

    config = next(c for c in check.configurations("fd24") if c.name == "all,overlap exact")
    scenario = check.scenarios("fd24", steps=8)[0]
    assert check.compare(scenario, [config], target=FD24)[0].ok
    monkeypatch.setattr(overlap, "restore_check", lambda runner, glue: "planted: the self-check failed")
    row = check.compare(scenario, [config], target=FD24)[0]
    assert not row.ok and "no runner waited at the forward's launch" in row.detail and "planted" in row.detail, row.detail


def test_sync_check_counts_on_the_replica():
    by = {(r["configuration"], r["logprobs"]): r["waits_per_step"] for r in check.counts(FD24)}
    assert by == {("unpatched", None): 7, ("unpatched", 2): 10, ("default (all)", None): 1, ("default (all)", 2): 1}
