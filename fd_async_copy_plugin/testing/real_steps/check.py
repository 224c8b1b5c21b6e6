"""Real FastDeploy decode steps on CPU: bit-identity per scenario and configuration, and the sync
check's counts on FastDeploy's own code.

Runs in one process per FastDeploy tree (``environment.prepare`` changes the process for good):

    python -m fd_async_copy_plugin.testing.real_steps [--fd-root TREE] [--json] [--quick]

For each scenario (``scenarios(line)``) the driver (``reference/driver.py``: scheduler, worker
loop, TokenProcessor) steps FastDeploy's own ``GPUModelRunner`` (``runner.build_runner``):

- **reference**: FastDeploy unpatched on the ``host`` backend - every copy synchronous;
- then each configuration of ``configurations(line)`` (unpatched included) on the ``sim`` backend,
  the race-detecting simulator (a copy lands only when its event is waited for: a host read before
  that raises, a buffer reused while its copy is in flight is detected); each is compared with the
  reference on every saved token, logprob, prompt logprob and saved message, bit for bit. An
  unpatched FastDeploy that differs from its own synchronous run has a race of its own
  (FastDeploy 2.5's copies), told apart from the plugin's by that row.

A plugin configuration counts only when its features applied (``status()``) and its copies ran
asynchronously (``async_d2h`` > 0 in the census): a stand-down to FastDeploy's path is a failure,
not a pass.

``counts(line)``: ``FD_ASYNC_COPY_SYNC_CHECK=count`` (the shipped sync check, fed by device
tracking) over the waits of real steps, unpatched and with the default features, without and with
logprobs.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

from ..harness import BACKPORT_FEATURES, OVERLAP_FEATURES, Variant, census_row, preemption_workload, run_variant
from ..reference.driver import DriverConfig, Request

#: FastDeploy 2.4 features of ``all`` (the default) and the opt-in overlap schedule
ALL = None
#: the overlap configurations' ``FD_ASYNC_COPY_OVERLAP_COUNT`` values (``launch``: the old name of ``exact``)
OVERLAP_COUNTS = ("exact", "prepare", "bound", "launch")


@dataclass(frozen=True)
class Configuration:
    name: str
    plugin: bool
    features: tuple | None = None
    env: tuple = ()
    #: the unpatched reference's engine lag: the plugin's overlap schedule hands outputs over one step later
    base_engine_lag: int = 0
    #: FastDeploy 2.5+'s own overlap schedule (both the reference and this run)
    fd_overlap: bool = False
    #: features that must be ``applied`` for the row to count
    must_apply: tuple = ()


def configurations(line: str) -> list[Configuration]:
    if line == "fd24":
        return [
            Configuration("unpatched", False),
            Configuration("default (all)", True, ALL, must_apply=("logprobs", "stop_flag", "sampled_tokens", "step_syncs")),
            Configuration("backport", True, BACKPORT_FEATURES, must_apply=BACKPORT_FEATURES),
            *(Configuration(f"all,overlap {count}", True, OVERLAP_FEATURES, (("FD_ASYNC_COPY_OVERLAP_COUNT", count),),
                            base_engine_lag=1, must_apply=OVERLAP_FEATURES) for count in OVERLAP_COUNTS),
        ]
    must = ("logprobs", "step_syncs") if line == "fd25" else ("logprobs",)
    return [
        Configuration("unpatched", False),
        Configuration("default (all)", True, ALL, must_apply=must),
        Configuration("unpatched, FD overlap schedule", False, fd_overlap=True),
        Configuration("default (all), FD overlap schedule", True, ALL, fd_overlap=True, must_apply=must),
    ]


@dataclass(frozen=True)
class RealScenario:
    name: str
    config: DriverConfig
    requests: tuple
    arrivals: dict | None = None
    #: {configuration name: why it is not run on this scenario} (its feature keeps FD's path here by design)
    not_with: dict | None = None


EOS = [40]


def _req(i, n_prompt, max_tokens, **kw):
    prompt = [(11 * i + 5 * j) % 120 + 3 for j in range(n_prompt)]
    return Request(f"req{i}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, **kw)


def _mixed(steps: int):
    """The save-ops workload: logprob widths, stop sequences, seeded and greedy rows, arrivals."""
    mixed = (
        _req(0, 5, steps, logprobs=0, top_p=0.0),
        _req(1, 9, steps // 2, logprobs=5, top_p=0.8),
        _req(2, 20, 1, logprobs=5),
        _req(3, 13, steps, logprobs=20, stop_seqs=[[126, 2], [58, 17]], top_p=0.8),
        _req(4, 3, steps - 5, top_p=0.0, stop_seqs=[[41, 30]]),
        _req(5, 30, steps // 3, logprobs=5, top_p=0.8),
        _req(6, 7, steps, logprobs=20, top_p=0.8),
    )
    later = {3: (_req(7, 11, steps // 2, logprobs=5, top_p=0.8),), 9: (_req(8, 4, 3, logprobs=0),)}
    return mixed, later


def scenarios(line: str, steps: int = 24) -> list[RealScenario]:
    """Workloads for real steps. Greedy rows (``top_p`` 0) and seeded ones (``top_p`` 0.8, each with
    its request's seed); eos 40 is in the tiny model's vocabulary, so requests end on eos at
    different steps (staggered), on ``max_tokens`` or on a stop sequence."""
    base = dict(max_num_seqs=8, vocab_size=128, max_model_len=96, block_size=16, enable_logprob=True)
    mixed, later = _mixed(steps)
    zmq = (
        _req(10, 17, steps // 2, logprobs=-1, prompt_logprobs=5, top_p=0.8),
        _req(11, 25, steps // 2, logprobs=3, prompt_logprobs=-1),
        _req(12, 6, steps, logprobs=20, top_p=0.8),
        _req(13, 9, steps, logprobs=0, prompt_logprobs=0),
    )
    plain = tuple(_req(20 + i, 4 + i, steps // 2 + i, top_p=0.8 if i % 2 else 0.0) for i in range(6))
    return [
        RealScenario("save ops: logprobs k 0/5/20, eos, max_tokens, stop sequences, chunked prefill, arrivals",
                     DriverConfig(**base, chunk_size=8), mixed, later),
        RealScenario("ZMQ output thread (FD_USE_GET_SAVE_OUTPUT_V1): logprobs k -1/3/20/0, prompt logprobs 5/-1/0",
                     DriverConfig(**base, save_output_v1=True, chunk_size=8), zmq,
                     not_with={name: "overlap keeps FastDeploy's schedule on the ZMQ output path (patches/fd24/overlap.py)"
                               for name in (f"all,overlap {count}" for count in OVERLAP_COUNTS)}),
        RealScenario("block steps: the save-ops workload (24 tokens) with 8 KV blocks of 16 tokens",
                     DriverConfig(**base, chunk_size=8, num_gpu_blocks=8), *_mixed(24)),
        RealScenario("preemption mid-flight (12 KV blocks, 9 requests; harness.preemption_workload)",
                     *preemption_workload()),
        RealScenario("no logprobs: eos, max_tokens, seeded and greedy rows",
                     DriverConfig(max_num_seqs=8, vocab_size=128, max_model_len=96, block_size=16), plain),
    ]


@dataclass
class Row:
    scenario: str
    configuration: str
    ok: bool
    detail: str
    steps: int = 0
    seconds: float = 0.0


def _modules_line():
    from .environment import _PREPARED

    return _PREPARED


def _modules():
    from .modules import FastDeployModules

    return FastDeployModules()


def _variant(c: Configuration, root: str) -> Variant:
    return Variant(c.name, root, c.plugin, c.features, overlap=c.fd_overlap, env=c.env)


@dataclass(frozen=True)
class Target:
    """What the driver steps: a real FastDeploy (``root`` "fastdeploy", FastDeploy's modules) or, in
    CI, a replica root (``modules`` None: the driver's own)."""

    root: str = "fastdeploy"
    line: str = "fd24"
    real: bool = True

    def modules(self):
        return _modules() if self.real else ReplicaModules(self.root)


class ReplicaModules:
    """The driver's own view of a replica root, plus what FastDeploy's engine-worker boundary does:
    the worker gets copies of the scheduled tasks (``FastDeployModules.to_worker``), so one driver
    loop means the same on the replica and on FastDeploy."""

    def __init__(self, root: str) -> None:
        from ..reference import driver

        self._driver = driver
        self._mod = driver._Modules(root)
        self.root, self.config, self.request = root, self._mod.config, self._mod.request
        self.sampling_params, self.runner = self._mod.sampling_params, self._mod.runner

    @staticmethod
    def to_worker(task):
        return copy.deepcopy(task)

    def build_runner(self, config, port):
        fd_config = self._driver._fd_config(self._mod, config, port)
        return self.runner.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)


def real_target() -> Target:
    prepared = _modules_line()
    if prepared is None:
        raise RuntimeError("environment.prepare() has not run: no FastDeploy to step")
    return Target("fastdeploy", prepared.line, True)


def _path_ran(c: Configuration, run, copies_expected: bool) -> str:
    """'' when the plugin's path ran in ``run``; else why not. ``copies_expected``: the plugin's
    features copy asynchronously in this run (FD 2.4's copies; logprobs on every line)."""
    if not c.plugin:
        return ""
    features = (run.status or {}).get("features", {})
    not_applied = [n for n in c.must_apply if features.get(n, {}).get("state") != "applied"]
    if not_applied:
        return "not applied: " + ", ".join(f"{n}={features.get(n, {}).get('state')} ({features.get(n, {}).get('reason')})"
                                           for n in not_applied)
    if copies_expected and census_row(run, skip=0)["async_d2h"] <= 0:
        return "the plugin's copies did not run (0 non-blocking D2H copies)"
    final = (run.final_status or {}).get("features", {})
    for name in c.must_apply:  # a feature that reports its runners: one of them applied, and served
        runners = (final.get(name) or {}).get("runners")
        if runners is None:
            continue
        serving = [r for r in runners if r.get("state") == "applied"
                   and ("served" not in r or sum((r.get("served") or {}).values()) > 0)]
        if not serving:
            return f"{name}: no runner applied and served at the end of the run ({runners})"
    if dict(c.env).get("FD_ASYNC_COPY_OVERLAP_COUNT") in ("exact", "launch"):  # its wait at the forward's launch ran
        launch = [r.get("launch") or {} for r in (final.get("overlap") or {}).get("runners") or ()]
        if not any(not l.get("fallback") and l.get("steps trimmed", 0) + l.get("steps at the bound", 0) > 0
                   for l in launch):
            return f"overlap exact: no runner waited at the forward's launch ({launch})"
    return ""


def _applied(run) -> str:
    features = (run.status or {}).get("features", {})
    return ",".join(n for n, f in features.items() if f.get("state") == "applied") or "none"


def compare(scenario: RealScenario, configs, max_steps: int = 300, target: Target | None = None) -> list[Row]:
    target = target or real_target()
    rows = []
    references = {}
    for c in configs:
        if scenario.not_with and c.name in scenario.not_with:
            rows.append(Row(scenario.name, c.name, True, f"not run: {scenario.not_with[c.name]}"))
            continue
        # the engine's lag models the msg-queue path (the TokenProcessor's read); ZMQ payloads carry no lag
        lag = 0 if scenario.config.save_output_v1 else c.base_engine_lag
        key = (lag, c.fd_overlap)
        started = time.perf_counter()
        try:
            if key not in references:
                ref_config = dataclasses.replace(scenario.config, engine_lag=lag, overlap=c.fd_overlap)
                references[key] = run_variant(Variant("reference", target.root, False), ref_config, scenario.requests,
                                              backend="host", max_steps=max_steps, arrivals=scenario.arrivals,
                                              modules=target.modules())
            reference = references[key]
            run = run_variant(_variant(c, target.root), dataclasses.replace(scenario.config, overlap=c.fd_overlap),
                              scenario.requests, backend="sim", max_steps=max_steps, arrivals=scenario.arrivals,
                              modules=target.modules())
        except Exception as exc:  # a failed run is a row, not a crash of the check
            rows.append(Row(scenario.name, c.name, False, f"ERROR {type(exc).__name__}: {exc}".splitlines()[0][:300],
                            seconds=round(time.perf_counter() - started, 1)))
            continue
        diffs = reference.result.differences(run.result)
        if c.base_engine_lag:  # the overlap schedule's flush steps send nothing (harness.Scenario)
            diffs = [d for d in diffs if not d.startswith("executed_steps")]
        why = _path_ran(c, run, target.line == "fd24" or scenario.config.enable_logprob)
        problems = list(diffs[:6]) + ([why] if why else [])
        if reference.result.truncated:
            problems.append("the reference run hit max_steps")
        finished = sum(o.finished for o in run.result.outputs.values())
        reasons = sorted({o.stop_reason for o in run.result.outputs.values() if o.stop_reason})
        detail = "; ".join(problems) if problems else (
            f"bit-identical: {len(run.result.outputs)} requests ({finished} finished: {', '.join(reasons)}), "
            f"{len(run.result.messages)} saved messages, {run.result.steps} steps"
            + (f", {run.result.preemptions} preemptions" if run.result.preemptions else "")
            + (f"; applied: {_applied(run)}" if c.plugin else ""))
        rows.append(Row(scenario.name, c.name, not problems, detail, run.result.steps,
                        round(time.perf_counter() - started, 1)))
    return rows


# --- the sync check's counts ---------------------------------------------------------------------

COUNT_CONFIG = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64)


def _count_requests(logprobs):
    return [Request(f"r{i}", [3 + i, 4, 5 + i], max_tokens=8, eos_token_ids=[100], logprobs=logprobs) for i in range(3)]


def counts(target: Target | None = None, warmup: int = 2) -> list[dict]:
    """Waits per counted step (``status()["sync_check"]``), unpatched and default, without and with
    logprobs (k=2), with the label of each site."""
    from ... import sync_check

    target = target or real_target()
    sync_check.install_step_hook(target.root)
    out = []
    for plugin in (False, True):
        for logprobs in (None, 2):
            config = dataclasses.replace(COUNT_CONFIG, enable_logprob=logprobs is not None)
            sync_check.start(sync_check.Settings("count", warmup, ()))
            entry = {"configuration": "default (all)" if plugin else "unpatched", "logprobs": logprobs}
            try:
                run = run_variant(Variant("count", target.root, plugin), config, _count_requests(logprobs),
                                  backend="sim", max_steps=40, track=True, modules=target.modules())
                report = sync_check.status()
            except Exception as exc:  # a row that says why, not a crash of the check
                out.append({**entry, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                            "waits_per_step": None, "steps_counted": 0, "sites": [], "features": {}})
                continue
            finally:
                sync_check.stop()
            out.append({
                **entry,
                "waits_per_step": report.get("waits_per_step"),
                "steps_counted": report.get("steps_counted"),
                "sites": [(s["label"], s["site"], s["per_step"]) for s in report.get("sites", [])],
                "features": {n: f["state"] for n, f in ((run.status or {}).get("features") or {}).items()},
            })
    return out


def format_counts(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        labels = {}
        for label, _site, per_step in r["sites"]:
            labels[label or "?"] = labels.get(label or "?", 0) + per_step
        shown = ", ".join(f"{k} {v:g}" for k, v in labels.items())
        lp = "no logprobs" if r["logprobs"] is None else f"logprobs k={r['logprobs']}"
        if r.get("error"):
            lines.append(f"  {r['configuration']:14s} {lp:14s} ERROR {r['error']}")
            continue
        lines.append(f"  {r['configuration']:14s} {lp:14s} {r['waits_per_step']} waits/step "
                     f"({r['steps_counted']} steps counted): {shown}")
    return lines
