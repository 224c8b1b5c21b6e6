"""Shared fixtures of the feature specification tests (real CPU Paddle, the reference replica).

Each helper's fixtures live in their own clearly named block below; add new blocks rather than
editing another block.
"""

from __future__ import annotations

# ==== logprobs / sync_scope / planted-bug fixtures ===============================================
# Used by test_logprobs*.py, test_sync_scope*.py and test_planted_logprob_bugs.py.

import importlib
from dataclasses import dataclass
from typing import Any, Optional

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DecodeResult, DriverConfig, Request, run_decode

FD24 = ROOTS["fd24"]
FD25 = ROOTS["fd25"]
#: The 2.5 runner; fd25 tests skip until it is importable.
FD25_RUNNER = FD25 + ".worker.gpu_model_runner"
#: Reader names the logprob consumers pass to the copy backend (census ``host_read`` sites).
LOGPROB_CONSUMER_SITES = (
    "save_output_topk",
    "slice_rows",
    "tolists",
    "pickle",
    "prompt_logprobs",
    "ksm_renormalize",
    "_build_stream_transfer_data",
)


def require_fd25_runner():
    """Skip the calling test until the 2.5 replica's runner exists (it is being written)."""
    return pytest.importorskip(FD25_RUNNER, reason="the fd25 replica's gpu_model_runner is not importable yet")


def logprobs_ring() -> Optional[runtime.PinnedRing]:
    """The ``logprobs`` feature's pinned ring (None before the first gather or when not applied)."""
    applied = fd_async_copy_plugin._get_manager().applied.get("logprobs")
    if applied is None:
        return None
    return applied.ctx.state.rings.get("decode")  # None before the first decode gather


@dataclass
class LogprobRun:
    """One decode run of the replica, with what the tests inspect afterwards."""

    result: DecodeResult
    census: runtime.SyncCensus
    #: feature name -> state, read after the run (before the plugin was disabled)
    states: dict
    ring: Optional[runtime.PinnedRing]
    backend: str


def run_replica(
    root: str,
    config: DriverConfig,
    requests,
    *,
    features=None,
    backend: str = "host",
    arrivals=None,
    max_steps: int = 64,
    on_step=None,
) -> LogprobRun:
    """Run the replica at ``root`` unpatched (``features=None``) or with the plugin's ``features``.

    The plugin is disabled before and always afterwards. Unpatched runs use a fresh ``backend`` as
    the current copy backend (the replica's own pinned buffers go through it), then restore it.
    """
    fd_async_copy_plugin.disable()
    previous = None
    try:
        if features is None:
            previous = replica_backend.use(runtime.make_backend(backend))
        else:
            fd_async_copy_plugin.enable(features=list(features), backend=backend, root=root)
        with runtime.collecting() as census:
            result = run_decode(root, config, requests, arrivals=arrivals, max_steps=max_steps, on_step=on_step)
        states = {}
        if features is not None:
            states = {n: s["state"] for n, s in fd_async_copy_plugin.status()["features"].items()}
        return LogprobRun(result, census, states, logprobs_ring() if features is not None else None, backend)
    finally:
        fd_async_copy_plugin.disable()
        if features is None:
            replica_backend.use(previous)


_BASELINES: dict[Any, LogprobRun] = {}


@pytest.fixture(scope="session")
def unpatched_run():
    """``unpatched_run(key, root, config, requests, arrivals=None, max_steps=64, backend="host")``:
    the unpatched replica's run, computed once per ``(key, backend)`` for the session (the
    reference outputs)."""

    def get(key, root, config, requests, arrivals=None, max_steps=64, backend="host") -> LogprobRun:
        if (key, backend) not in _BASELINES:
            _BASELINES[(key, backend)] = run_replica(root, config, requests, arrivals=arrivals,
                                                     max_steps=max_steps, backend=backend)
        return _BASELINES[(key, backend)]

    return get


def replica_module(root: str, relative: str):
    return importlib.import_module(f"{root}.{relative}")


def logprob_requests(batch: int, logprobs: Optional[int], steps: int, vocab: int, *, prompt_len: int = 4,
                     first: int = 0, **kw) -> list:
    """``batch`` requests that never sample their eos (each runs ``steps`` tokens)."""
    return [
        Request(
            f"r{first + i}",
            [(7 * (first + i) + 3 * j) % (vocab - 3) + 3 for j in range(prompt_len + (i % 3))],
            max_tokens=steps,
            eos_token_ids=[vocab + 1],
            logprobs=logprobs,
            **kw,
        )
        for i in range(batch)
    ]


def fd25_check_problem(feature: str) -> Optional[str]:
    """Why the plugin's compatibility check of ``feature`` rejects the fd25 replica (None: it
    accepts it). Imports the fd25 replica; call from tests, not at collection."""
    from fd_async_copy_plugin.patches import logprobs as logprobs_patch
    from fd_async_copy_plugin.patches import sync_scope as sync_scope_patch
    from fd_async_copy_plugin.registry.patch import IncompatibleError

    try:
        if feature == "logprobs":
            sampler = replica_module(FD25, "model_executor.layers.sample.sampler").Sampler
            logprobs_patch.check_gather_logprobs(sampler.gather_logprobs, None)
        elif feature == "sync_scope":
            runner = importlib.import_module(FD25_RUNNER).GPUModelRunner
            sync_scope_patch.check_prompt_logprobs(runner._get_prompt_logprobs_list, None)
        else:
            raise ValueError(feature)
    except IncompatibleError as exc:
        return str(exc)
    return None


@pytest.fixture
def fd25_logprobs():
    """For tests of the ``logprobs`` behaviour on 2.5 (overlap schedule, ring bound): skips until
    the fd25 runner is importable; the plugin is disabled afterwards."""
    require_fd25_runner()
    yield
    fd_async_copy_plugin.disable()


class LogprobKit:
    """What the logprobs / sync_scope / planted-bug tests share, handed out by the ``lpkit``
    fixture (test modules do not import conftest)."""

    fd25_check_problem = staticmethod(fd25_check_problem)

    FD24 = FD24
    FD25 = FD25
    FD25_RUNNER = FD25_RUNNER
    LOGPROB_CONSUMER_SITES = LOGPROB_CONSUMER_SITES
    LogprobRun = LogprobRun
    run_replica = staticmethod(run_replica)
    logprobs_ring = staticmethod(logprobs_ring)
    require_fd25_runner = staticmethod(require_fd25_runner)
    replica_module = staticmethod(replica_module)
    logprob_requests = staticmethod(logprob_requests)


@pytest.fixture(scope="session")
def lpkit() -> LogprobKit:
    return LogprobKit()
# ==== end of logprobs / sync_scope / planted-bug fixtures ========================================


# ==== stop_flag / sampled_tokens fixtures ========================================================
# Used by test_stop_flag*.py, test_sampled_tokens*.py and test_planted_stop_flag_bugs.py, through
# the ``sfkit`` fixture and the shared ``plugin_off`` (every name here starts with ``sf``/``SF``).

# Self-contained: the imports below repeat what this block uses from the top of the file.
import contextlib as _sf_contextlib  # noqa: E402
import importlib  # noqa: E402,F811
from dataclasses import dataclass  # noqa: E402,F811
from typing import Any  # noqa: E402,F811

import numpy as _sf_np  # noqa: E402
import pytest  # noqa: E402,F811

import fd_async_copy_plugin  # noqa: E402,F811
from fd_async_copy_plugin import runtime  # noqa: E402,F811
from fd_async_copy_plugin.testing.reference import ROOTS  # noqa: E402,F811
from fd_async_copy_plugin.testing.reference.driver import DecodeResult, DriverConfig, Request, run_decode  # noqa: E402,F811
from fd_async_copy_plugin.patches.runner import part

SF_FEATURES = ("stop_flag", "sampled_tokens")
SF_EOS_NEVER = 9999  # an eos id outside every test vocabulary: requests run to max_tokens


class SFRunnerSnapshot:
    """A runner as it was while the plugin was enabled: ``disable()`` hands live runners back to
    FastDeploy (removing the plugin's keys and state), so tests that inspect a run afterwards read
    this snapshot of ``share_inputs`` and the plugin's state; anything else goes to the runner."""

    def __init__(self, runner) -> None:
        self._runner = runner
        self.share_inputs = dict(runner.share_inputs)
        self.stop_part = part(runner, "stop")

    def __getattr__(self, name):
        return getattr(self._runner, name)


@dataclass
class SFRun:
    """One decode run of the fd24 replica and what the stop-flag tests inspect afterwards."""

    result: DecodeResult
    census: runtime.SyncCensus
    #: feature -> state, read before the plugin was disabled ({} for unpatched runs)
    states: dict
    backend: str
    #: the runner of the run (captured at construction), still holding its share_inputs
    runner: Any = None
    #: whatever the run's probe recorded (see ``SFKit.run``'s ``probe``)
    probe: list = None
    #: feature -> reason given by ``status()``
    reasons: dict = None


class SFKit:
    """What the stop_flag / sampled_tokens tests share (handed out by the ``sfkit`` fixture)."""

    FD24 = ROOTS["fd24"]
    FEATURES = SF_FEATURES
    snapshot = staticmethod(SFRunnerSnapshot)
    EOS_NEVER = SF_EOS_NEVER

    def __init__(self) -> None:
        self._baselines: dict = {}

    # -- modules ---------------------------------------------------------------------------------
    def module(self, relative: str):
        return importlib.import_module(f"{self.FD24}.{relative}")

    @property
    def runner_module(self):
        return self.module("worker.gpu_model_runner")

    @property
    def postproc(self):
        return self.module("model_executor.pre_and_post_process")

    @property
    def ops_gpu(self):
        return self.module("model_executor.ops.gpu")

    @property
    def stop_flag_patches(self):
        return importlib.import_module("fd_async_copy_plugin.patches.fd24.stop_flag")

    # -- runs ------------------------------------------------------------------------------------
    def run(self, config: DriverConfig, requests, *, features=None, backend: str = "host", arrivals=None,
            max_steps: int = 96, on_step=None, probe=None, strict: bool = False) -> SFRun:
        """Decode on the fd24 replica, unpatched (``features=None``) or with the plugin.

        ``probe(runner, record, event)`` is called right after each insertion (event "insert")
        and after each ``execute_model`` (event "execute"); it appends what it wants to ``record``.
        It runs through a subclass of the runner installed after ``enable()`` and removed before
        ``disable()``, so the plugin's patches on ``GPUModelRunner`` are untouched.
        """
        fd_async_copy_plugin.disable()
        previous = None
        record: list = []
        captured: list = []
        module = self.runner_module
        base_class = module.GPUModelRunner
        try:
            if features is None:
                previous = replica_backend.use(runtime.make_backend(backend))
            else:
                fd_async_copy_plugin.enable(features=list(features), backend=backend, root=self.FD24, strict=strict)
            module.GPUModelRunner = _sf_runner_subclass(base_class, captured, record, probe)
            with runtime.collecting() as census:
                result = run_decode(self.FD24, config, requests, arrivals=arrivals, max_steps=max_steps,
                                    on_step=on_step)
            reported = fd_async_copy_plugin.status()["features"] if features is not None else {}
            return SFRun(result, census, {n: s["state"] for n, s in reported.items()}, backend,
                         SFRunnerSnapshot(captured[0]) if captured else None, record,
                         {n: s["reason"] for n, s in reported.items()})
        finally:
            module.GPUModelRunner = base_class
            fd_async_copy_plugin.disable()
            if features is None:
                replica_backend.use(previous)

    @_sf_contextlib.contextmanager
    def enabled_runner(self, config: DriverConfig, *, features=SF_FEATURES, backend: str = "host", strict: bool = False):
        """A runner constructed by the driver (no requests) with the plugin still enabled while
        the block runs; disabled afterwards."""
        fd_async_copy_plugin.disable()
        try:
            fd_async_copy_plugin.enable(features=list(features), backend=backend, root=self.FD24, strict=strict)
            yield self.build_runners([config])[0]
        finally:
            fd_async_copy_plugin.disable()

    def build_runners(self, configs) -> list:
        """One runner per config, constructed by the driver (no requests) with the plugin as it is
        now, and kept alive: the returned list holds them. The runner class is replaced by a
        recording subclass only while they are built."""
        built: list = []
        module = self.runner_module
        base_class = module.GPUModelRunner
        module.GPUModelRunner = _sf_runner_subclass(base_class, built, [], None)
        try:
            for config in configs:
                run_decode(self.FD24, config, [])
        finally:
            module.GPUModelRunner = base_class
        return built

    def baseline(self, key, config: DriverConfig, requests, arrivals=None, max_steps: int = 96) -> SFRun:
        """The unpatched replica's run on the host backend, computed once per ``key``."""
        if key not in self._baselines:
            self._baselines[key] = self.run(config, requests, arrivals=arrivals, max_steps=max_steps)
        return self._baselines[key]

    # -- reading state the 2.4 way ---------------------------------------------------------------
    @staticmethod
    def legacy_reads(share_inputs) -> tuple:
        """``share_inputs["not_need_stop"]`` read as FastDeploy 2.4 code does: ``[0]``, ``bool()``,
        ``.numpy()``."""
        flag = share_inputs["not_need_stop"]
        return bool(flag[0]), bool(flag), bool(flag.numpy()[0])

    @staticmethod
    def state(runner):
        """The plugin's ``StopFlagState`` of ``runner`` (None when it made none)."""
        return vars(runner)["stop_part"] if "stop_part" in vars(runner) else part(runner, "stop")

    @staticmethod
    def raw(t) -> _sf_np.ndarray:
        """The memory of a host (CPU or pinned) tensor without a Paddle op or a census record."""
        from fd_async_copy_plugin.runtime.backend import host_view

        return _sf_np.array(host_view(t), copy=True)

    # -- scenarios -------------------------------------------------------------------------------
    @staticmethod
    def request(rid: str, prompt_len: int, max_tokens: int, eos, seed: int = 0, **kw) -> Request:
        prompt = [(11 * seed + 5 * j + 3) % 200 + 3 for j in range(prompt_len)]
        return Request(rid, prompt, max_tokens=max_tokens, eos_token_ids=list(eos), **kw)

    def mixed(self, **config_overrides):
        """(config, requests, arrivals) covering eos, a stop sequence, max_tokens=1, chunked
        prefill, block steps (a KV pool too small for everyone), a request inserted mid-run and
        one inserted after every request finished (idle steps in between)."""
        eos, stop_seq, num_gpu_blocks = _sf_mixed_tuning(self)
        cfg = dict(_SF_MIXED_CONFIG, num_gpu_blocks=num_gpu_blocks)
        cfg.update(config_overrides)
        return (DriverConfig(**cfg), *_sf_mixed_requests(self, eos, stop_seq))


_SF_MIXED_CONFIG = dict(max_num_seqs=8, vocab_size=256, max_model_len=48, block_size=4, chunk_size=4)


def _sf_mixed_requests(kit: SFKit, eos, stop_seq):
    r = kit.request
    requests = [
        r("eos", 5, 20, eos, seed=0),
        r("len", 9, 10, eos, seed=1),
        r("one", 13, 1, eos, seed=2),
        r("stop", 7, 20, eos, seed=3, stop_seqs=[stop_seq] if stop_seq else None),
        r("long", 3, 15, eos, seed=4),
    ]
    arrivals = {3: [r("mid", 6, 8, eos, seed=7)], 40: [r("late", 4, 3, eos, seed=8)]}
    return requests, arrivals


_SF_MIXED_TUNING: dict = {}


def _sf_mixed_tuning(kit: SFKit):
    """(eos ids, stop sequence, num_gpu_blocks) for ``SFKit.mixed``, derived once from probe runs
    of the unpatched replica, so the scenario keeps its coverage if the tiny model changes: eos is
    a token request "eos" samples early, the stop sequence two tokens request "stop" samples before
    any eos, and the KV pool the smallest that makes requests wait for blocks without stalling."""
    if "value" in _SF_MIXED_TUNING:
        return _SF_MIXED_TUNING["value"]
    never = [SF_EOS_NEVER]
    requests, arrivals = _sf_mixed_requests(kit, never, None)
    probe = kit.run(DriverConfig(**_SF_MIXED_CONFIG), requests, arrivals=arrivals)
    out = {rid: o.token_ids[:-1] for rid, o in probe.result.outputs.items()}
    for candidate in out["eos"][3:12]:
        stop_tokens = out["stop"]
        cut = stop_tokens.index(candidate) if candidate in stop_tokens else len(stop_tokens)
        if cut >= 6 and candidate not in out["len"] and candidate not in out["long"]:
            eos, stop_seq = [candidate], list(stop_tokens[3:5])
            break
    else:
        raise AssertionError(f"no eos candidate covers the mixed scenario; probe outputs: {out}")
    requests, arrivals = _sf_mixed_requests(kit, eos, stop_seq)
    for num_gpu_blocks in range(8, 40):
        block_steps = []
        try:
            run = kit.run(DriverConfig(**_SF_MIXED_CONFIG, num_gpu_blocks=num_gpu_blocks), requests,
                          arrivals=arrivals, on_step=lambda step, runner: block_steps.append(
                              bool(runner.share_inputs["is_block_step"].numpy().any())))
        except RuntimeError:  # every running request waits for a block: the driver stalls
            continue
        finished = all(o.finished for o in run.result.outputs.values())
        if any(block_steps) and finished and not run.result.truncated:
            _SF_MIXED_TUNING["value"] = (eos, stop_seq, num_gpu_blocks)
            return _SF_MIXED_TUNING["value"]
    raise AssertionError("no KV pool size gives the mixed scenario a block step without stalling")


def _sf_runner_subclass(base, captured: list, record: list, probe):
    class ProbedRunner(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            captured.append(self)

        def insert_tasks_v1(self, *args, **kwargs):
            out = super().insert_tasks_v1(*args, **kwargs)
            if probe is not None:
                probe(self, record, "insert")
            return out

        def insert_prefill_inputs(self, *args, **kwargs):
            out = super().insert_prefill_inputs(*args, **kwargs)
            if probe is not None:
                probe(self, record, "insert")
            return out

        def execute_model(self, *args, **kwargs):
            out = super().execute_model(*args, **kwargs)
            if probe is not None:
                probe(self, record, "execute")
            return out

    return ProbedRunner


@pytest.fixture(scope="session")
def sfkit() -> SFKit:
    return SFKit()
# ==== end of stop_flag / sampled_tokens fixtures =================================================


# ==== engine helpers ==============================================================================
# Features declare their patches up front (class attribute ``patches``): a planted bug replaces the
# builder of one declared patch, for one test.


@pytest.fixture
def replace_build(monkeypatch):
    """``replace_build(feature_cls, attr, make)``: ``feature_cls``'s patch of the target attribute
    ``attr`` (e.g. ``"save_output_topk"``) builds with ``make(attr)(original, ctx)`` in this test."""
    import dataclasses

    def replace(feature_cls, attr: str, make) -> None:
        patches = tuple(
            dataclasses.replace(p, build=make(p.target.attr)) if p.target.attr == attr else p
            for p in feature_cls.patches
        )
        assert patches != feature_cls.patches, f"{feature_cls.__name__} declares no patch of {attr}"
        monkeypatch.setattr(feature_cls, "patches", patches)

    return replace


# ==== end of engine helpers ======================================================================


@pytest.fixture
def logprob_inputs():
    """``make(seed, rows=3, vocab=64)``: seeded log-softmax logprobs ``[rows, vocab]`` and sampled
    ids ``[rows, 1]`` for ``gather_logprobs``."""
    return _random_logprob_inputs


def _random_logprob_inputs(seed: int, rows: int = 3, vocab: int = 64):
    import numpy as np
    import paddle

    rng = np.random.default_rng(seed)
    logprobs = paddle.nn.functional.log_softmax(paddle.to_tensor(rng.standard_normal((rows, vocab)).astype("float32")), -1)
    return logprobs, paddle.to_tensor(rng.integers(0, vocab, size=(rows, 1)), dtype="int64")
