"""Side-by-side runs of the reference FastDeploy: unpatched 2.4, native 2.5, and the plugin.

Shared by ``fd-async-copy selftest``, ``fd-async-copy bench`` and the tests: one place that knows
how to build a workload, run a variant with a sync census, and report the census per decode step.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field

from .. import disable, enable, status as plugin_status
from .reference import ROOTS
from .reference.driver import DecodeResult, DriverConfig, Request, run_decode
from .. import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from ..runtime import SyncCensus, census as census_module, collecting
from .reference.device_tracking import decode_host_wait

#: Census sites on the paths the plugin patches (gather_logprobs, update op, save ops, ZMQ
#: payload, prompt logprobs). Other host syncs of FastDeploy 2.4 (get_padding_offset, bad_tokens_len,
#: exist_prefill: fastdeploy-surface.md §2.5 S1-S3/S7) are outside this plugin's scope and are
#: reported separately.
PATCHED_PATHS = (
    "Sampler.gather_logprobs",
    "gather_logprobs",
    "update_inputs",
    "save_output",
    "_build_stream_transfer_data",
    "_get_prompt_logprobs_list",
    "prompt_logprobs",
    "slice_rows",
    "not_need_stop",
    "sampled_token_ids",
    "post_process",
    "_postprocess.sampled_token_ids",
    "_postprocess.not_need_stop",
    "_save_model_output",
    "paddle.device.synchronize",  # FD 2.5's prompt-logprobs sync (the only device-wide one per step)
    "overlap.",  # the overlap feature's wait for the previous step's event (its save)
    "insert_tasks_v1.post_process_event",  # flag_race's wait (FD 2.5 overlap): it covers the flag's copy
    "execute_model_normal.post_process_event",  # develop waits for the save's event in execute_model_*
    "execute_model_overlap.post_process_event",
)


def on_patched_path(site: str) -> bool:
    return site.startswith(PATCHED_PATHS)


@dataclass(frozen=True)
class Variant:
    name: str
    root: str
    plugin: bool
    features: tuple[str, ...] | None = None
    #: FastDeploy 2.5's ``enable_overlap_schedule`` (forces ``DriverConfig.overlap``)
    overlap: bool = False
    #: environment variables set while the plugin is enabled (e.g. FD_ASYNC_COPY_OVERLAP_COUNT)
    env: tuple[tuple[str, str], ...] = ()


#: FastDeploy 2.4 with the backport only (#6176 + #6362), without step_syncs
BACKPORT_FEATURES = ("logprobs", "stop_flag", "sampled_tokens")

VARIANTS = {
    "fd24-unpatched": Variant("fd24-unpatched", ROOTS["fd24"], False),
    "fd25-native": Variant("fd25-native", ROOTS["fd25"], False),
    "fd24-backport": Variant("fd24-backport", ROOTS["fd24"], True, BACKPORT_FEATURES),
    "fd24-plugin": Variant("fd24-plugin", ROOTS["fd24"], True),
    "fd25-plugin": Variant("fd25-plugin", ROOTS["fd25"], True),
}
#: FastDeploy 2.4 with the opt-in overlap schedule and what it needs
OVERLAP_FEATURES = ("logprobs", "stop_flag", "sampled_tokens", "step_syncs", "overlap")
#: The whole-step census (``host_waits``) also covers the overlap schedules: the plugin's on 2.4
#: (exact count, the default, and FD 2.5's upper bound) and 2.5's own, without and with the plugin.
CENSUS_VARIANTS = {
    **VARIANTS,
    "fd24-overlap": Variant("fd24-overlap", ROOTS["fd24"], True, OVERLAP_FEATURES),
    "fd24-overlap-bound": Variant("fd24-overlap-bound", ROOTS["fd24"], True, OVERLAP_FEATURES,
                                  env=(("FD_ASYNC_COPY_OVERLAP_COUNT", "bound"),)),
    "fd25-native-overlap": Variant("fd25-native-overlap", ROOTS["fd25"], False, overlap=True),
    "fd25-plugin-overlap": Variant("fd25-plugin-overlap", ROOTS["fd25"], True, overlap=True),
    # FastDeploy develop (2.6-dev): overlap on is its default (#6668); the plugin's plan applies
    # logprobs and sync_scope there, every other feature is native (the census is develop's own)
    "fddev-native": Variant("fddev-native", ROOTS["fddev"], False),
    "fddev-native-overlap": Variant("fddev-native-overlap", ROOTS["fddev"], False, overlap=True),
    "fddev-plugin": Variant("fddev-plugin", ROOTS["fddev"], True),
    "fddev-plugin-overlap": Variant("fddev-plugin-overlap", ROOTS["fddev"], True, overlap=True),
}
CENSUS_ORDER = ("fd24-unpatched", "fd24-backport", "fd24-plugin", "fd24-overlap", "fd24-overlap-bound", "fd25-native",
                "fd25-native-overlap", "fd25-plugin", "fd25-plugin-overlap", "fddev-native", "fddev-native-overlap",
                "fddev-plugin", "fddev-plugin-overlap")


@contextlib.contextmanager
def device_for(backend: str):
    """The replica's "device" tensors live where the backend expects them: the GPU for ``cuda``,
    the CPU for ``host`` and ``sim`` (also on a GPU machine, where Paddle defaults to the GPU)."""
    import paddle

    previous = paddle.get_device()
    paddle.set_device("gpu" if backend == "cuda" else "cpu")
    try:
        yield
    finally:
        paddle.set_device(previous)


@contextlib.contextmanager
def stream_per_step(root: str, streams: int, tolerant: bool = False):
    """Inside: every ``execute_model`` of ``root``'s runner moves FastDeploy's current stream on
    backend ``sim`` to the next of ``streams`` streams (the fake CUDA runtime's ``use_stream``; FD 2.5
    may change it under a stream guard); stream 0 again afterwards. Yields ``.rt``, the fake runtime,
    ``.backends``, the ``sim`` backends the runner ran on, in order, and ``.steps``, the steps run on
    each. ``tolerant``: a race between FastDeploy's own copies is noted, not raised: in the backend's
    ``framework_races`` (labels) and in ``.races``, one list of ``(step, label)`` per backend."""
    import importlib
    import types

    from ..runtime.simulated import fake_runtime

    rt = fake_runtime()
    cls = importlib.import_module(f"{root}.worker.gpu_model_runner").GPUModelRunner
    had, execute = "execute_model" in vars(cls), cls.execute_model
    steps, seen = [0], types.SimpleNamespace(rt=rt, backends=[], steps=[], races=[])

    def execute_model(self, *args, **kwargs):
        backend = replica_backend.current()
        if getattr(backend, "rt", None) is not rt:
            return execute(self, *args, **kwargs)
        if not any(b is backend for b in seen.backends):
            seen.backends.append(backend)
            seen.steps.append(0)
            seen.races.append([])
            if tolerant:
                backend.framework_races = []
        i = next(i for i, b in enumerate(seen.backends) if b is backend)
        seen.steps[i] += 1
        steps[0] += 1
        rt.use_stream(steps[0] % streams)
        noted = len(backend.framework_races or ())
        try:
            return execute(self, *args, **kwargs)
        finally:
            seen.races[i] += [(seen.steps[i], label) for label in (backend.framework_races or ())[noted:]]

    cls.execute_model = execute_model
    try:
        yield seen
    finally:
        rt.use_stream(0)
        if had:
            cls.execute_model = execute
        else:
            del cls.execute_model


@contextlib.contextmanager
def plugin_state(variant: Variant, backend: str):
    """Enable the plugin for ``variant`` (or make sure it is off); always disabled afterwards."""
    disable()
    status = None
    previous = None
    saved_env = {name: os.environ.get(name) for name, _ in variant.env}
    os.environ.update(dict(variant.env))
    try:
        if variant.plugin:
            status = enable(features=variant.features, backend=backend, root=variant.root)
        else:
            # Unpatched FastDeploy's own copies (2.5's pinned buffers and events) run on the same backend.
            previous = replica_backend.use(runtime.make_backend(backend))
        yield status
    finally:
        disable()
        if not variant.plugin:
            replica_backend.use(previous)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class VariantRun:
    variant: Variant
    result: DecodeResult
    census: SyncCensus
    step_seconds: list[float] = field(default_factory=list)
    status: dict | None = None
    #: ``status()`` at the end of the run (before the plugin was disabled): the runners' counters
    final_status: dict | None = None


def run_variant(variant: Variant, config: DriverConfig, requests, *, backend: str = "host",
                max_steps: int = 256, arrivals=None, track: bool = False, census: SyncCensus | None = None,
                modules=None) -> VariantRun:
    """Run ``variant``; ``track`` adds device-value tracking (``host_wait`` census records: every
    blocking point of each step, see ``reference/device_tracking.py``; slower, tests/bench only);
    ``track="marks"``: tensors are marked, nothing recorded (the shipped sync check's GPU source
    counts, with ``is_device=device_tracking.is_marked``); ``census``: the census to collect into (the step trace's, which also emits instant events);
    ``modules``: ``run_decode``'s (a real FastDeploy tree: ``real_steps.modules.FastDeployModules``)."""
    times: list[float] = []
    last = [time.perf_counter()]

    runners = []  # the runner, held until its counters were read (status() lists live runners)

    def on_step(step, runner):
        if not runners:
            runners.append(runner)
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    if variant.overlap and not config.overlap:
        config = dataclasses.replace(config, overlap=True)
    tracking = contextlib.nullcontext()
    if track:
        from .reference.device_tracking import tracking
        tracking = tracking(recording=track != "marks")
    with device_for(backend), plugin_state(variant, backend) as status, collecting(census) as census, tracking:
        last[0] = time.perf_counter()
        result = run_decode(variant.root, config, requests, arrivals=arrivals, max_steps=max_steps, on_step=on_step,
                            modules=modules)
        final = plugin_status() if variant.plugin else None
        runners.clear()
    return VariantRun(variant, result, census, times, status, final)


def fallbacks_by_cause(status: dict | None) -> dict[str, dict[str, int]]:
    """Per feature, the runners' fallbacks (FastDeploy's own path taken, by cause) summed over the
    live runners of ``status()``; features without any are left out."""
    out: dict[str, dict[str, int]] = {}
    for name, entry in ((status or {}).get("features") or {}).items():
        counts: collections.Counter = collections.Counter()
        for runner in (entry or {}).get("runners") or ():
            counts.update(runner.get("fallbacks") or {})
        if counts:
            out[name] = dict(sorted(counts.items()))
    return out


def count_waits(status: dict | None) -> dict | None:
    """The ``overlap`` feature's decode steps, summed over its runners (``count_waits``: the host
    waited for the last step's event before the step's forward, not, or it had landed before), and
    ``waited_fraction``: of the steps with a step in flight, the share that waited (``exact``: all,
    ``bound``: none). None where overlap did not run."""
    runners = [r for r in (((status or {}).get("features") or {}).get("overlap") or {}).get("runners") or ()
               if "count_waits" in r]
    if not runners:
        return None
    counts = collections.Counter()
    for runner in runners:
        counts.update(runner["count_waits"])
    prepared = counts["waited for the count"] + counts["not waited"]
    return {"token_count": runners[0]["token_count"], "count_waits": dict(counts),
            "waited_fraction": counts["waited for the count"] / prepared if prepared else None}


#: Census kinds after which host data of the step is known to be complete.
WAIT_KINDS = frozenset({"blocking_d2h", "device_sync", "stream_sync", "event_wait"})


def first_read_after_wait(step, sites=None) -> bool | None:
    """True when the first host read of the census ``step`` comes after at least one wait.

    ``sites`` restricts both to the sites it accepts. None when the step had no such host read.
    """
    waited = False
    for kind, site in step.events:
        if sites is not None and not sites(site):
            continue
        if kind in WAIT_KINDS:
            waited = True
        elif kind == "host_read":
            return waited
    return None


def census_row(run: VariantRun, skip: int = 2) -> dict:
    """Per-step means over steps after ``skip`` warm-up steps, split by patched path or not."""
    steps = run.census.steps[skip:] or run.census.steps
    n = max(1, len(steps))
    row: dict = {"steps": len(steps)}
    for kind in census_module.KINDS:
        on = sum(1 for s in steps for k, site in s.events if k == kind and on_patched_path(site))
        off = sum(1 for s in steps for k, site in s.events if k == kind and not on_patched_path(site))
        row[kind] = on / n
        row[f"{kind}_elsewhere"] = off / n
    row["first_read_after_wait"] = all(first_read_after_wait(s, on_patched_path) in (True, None) for s in steps)
    row["fallbacks"] = fallbacks_by_cause(getattr(run, "final_status", None))
    waits = count_waits(getattr(run, "final_status", None))
    if waits is not None:
        row["overlap_count_waits"] = waits
    row["pinned_alloc_after_warmup"] = sum(s.count("pinned_alloc") + s.count("pinned_free") for s in steps)
    if any(k == "host_wait" for s in run.census.steps for k, _ in s.events):
        row["host_waits"] = host_waits(run.census.steps, skip)
    return row


# fd24-step-syncs.md's names for the blocking points live with the shipped sync check.
from ..sync_check import SITE_LABELS, site_label  # noqa: E402,F401


def step_labels(run, skip: int = 1) -> list[list[str]]:
    """Per executed step of a tracked ``run`` after ``skip``, with a host wait: each wait's label
    (``site_label``: fd24-step-syncs.md's names), ``*`` when long."""
    out = []
    for step in run.census.steps[skip:]:
        waits = [decode_host_wait(site) for kind, site in step.events if kind == "host_wait"]
        if waits:
            out.append([site_label(w) + ("*" if w["long"] else "") for w in waits])
    return out


def host_waits(steps, skip: int = 2) -> dict:
    """Blocking points per decode step, from the ``host_wait`` census records (device tracking).

    ``total``/``long``/``short`` describe the typical (most common) step after ``skip`` warm-up
    steps: its number of waits, and how many wait for running device work (the forward or the
    sampler). ``mean`` is the mean over those steps. ``sites`` lists every distinct blocking point
    with its mean count per step.
    """
    steps = steps[skip:] or steps
    per_step = [[decode_host_wait(site) for k, site in s.events if k == "host_wait"] for s in steps]
    if not per_step:
        return {"total": 0, "long": 0, "short": 0, "mean": 0.0, "steps": 0, "sites": []}
    signature = collections.Counter(
        (len(waits), sum(w["long"] for w in waits)) for waits in per_step
    ).most_common(1)[0][0]
    counts: collections.Counter = collections.Counter()
    first_seen: dict = {}
    for waits in per_step:
        for w in waits:
            key = (w["where"], w["mechanism"], w["long"], w["what"])
            counts[key] += 1
            first_seen.setdefault(key, len(first_seen))
    n = len(per_step)
    sites = [
        {
            "site": where,
            "mechanism": mechanism,
            "long": long,
            "what": what,
            "label": site_label({"where": where, "mechanism": mechanism, "what": what}),
            "per_step": counts[key] / n,
        }
        for key in sorted(counts, key=first_seen.get)
        for where, mechanism, long, what in [key]
    ]
    return {
        "total": signature[0],
        "long": signature[1],
        "short": signature[0] - signature[1],
        "mean": sum(len(w) for w in per_step) / n,
        "steps": n,
        "sites": sites,
    }


def plugin_host_reads(census: SyncCensus) -> list[dict]:
    """Tracked host reads of device values and implicit H2Ds (not event waits) whose site is
    outside the FastDeploy replica - in the plugin's patches, runtime, ops or glue - over set-up and
    every step. The plugin's contract on its patched paths: none."""
    out = []
    for step in (census.setup, *census.steps):
        for kind, site in step.events:
            if kind != "host_wait":
                continue
            wait = decode_host_wait(site)
            if wait["mechanism"] in ("d2h", "h2d") and not wait["where"].startswith("reference/"):
                out.append({**wait, "step": step.index})
    return out


def format_host_waits(rows: dict[str, dict], width: int = 100) -> str:
    """One block per variant: the typical step's waits, then each site (within ``width`` columns)."""
    lines = [f"{'host waits per decode step (device tracking)':46s}{'total':>7s}{'long':>6s}{'short':>7s}{'mean':>7s}"]
    for name, row in rows.items():
        hw = row.get("host_waits")
        if hw is None:
            continue
        lines.append(f"{name:46s}{hw['total']:7d}{hw['long']:6d}{hw['short']:7d}{hw['mean']:7.2f}")
        for site in hw["sites"]:
            tag = f"{site['label'] or '-':>10s} {'long ' if site['long'] else 'short'} {site['mechanism']:5s}"
            where = site["site"].removeprefix("reference/")  # the replica's files: fd24/..., fd25/...
            room = width - len(tag) - 9
            if len(where) > room:
                where = "..." + where[-(room - 3):]
            lines.append(f"  {tag} {where:{room}s}{site['per_step']:5.2f}")
    return "\n".join(line[:width] for line in lines)


CENSUS_COLUMNS = (
    ("blocking_d2h", "blk D2H"),
    ("device_sync", "dev syn"),
    ("stream_sync", "str syn"),
    ("event_wait", "ev wait"),
    ("pinned_alloc", "pin alc"),
    ("pinned_free", "pin fre"),
    ("op_on_pinned", "op pin"),
    ("async_d2h", "async"),
)


def format_census(rows: dict[str, dict]) -> str:
    """A table (within 100 columns): one row per variant, per-step means on the patched paths."""
    header = f"{'per step, patched':20s}" + "".join(f"{label:>8s}" for _, label in CENSUS_COLUMNS)
    header += f"{'rd>wait':>8s}{'other':>6s}"
    lines = [header]
    for name, row in rows.items():
        cells = "".join(f"{row[key]:8.2f}" for key, _ in CENSUS_COLUMNS)
        lines.append(
            f"{name:20s}{cells}{'yes' if row['first_read_after_wait'] else 'NO':>8s}{row['blocking_d2h_elsewhere']:6.2f}"
        )
    lines.append("rd>wait: the first host read of copied data comes after a wait. other: blocking D2H")
    lines.append("outside the patched paths (the whole-step census below counts every host wait).")
    return "\n".join(lines)


def summarize_times(seconds: list[float]) -> dict:
    if not seconds:
        return {"median_ms": float("nan"), "p90_ms": float("nan"), "n": 0}
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p90_ms": p90 * 1e3, "n": len(ordered)}


def logprob_workload(batch: int, top_k: int, vocab: int, steps: int, *, save_output_v1: bool = False):
    """``batch`` requests decoding with ``top_k`` logprobs, all admitted at step 0."""
    config = DriverConfig(
        max_num_seqs=batch,
        vocab_size=vocab,
        enable_logprob=True,
        max_logprobs=max(20, top_k),
        max_model_len=max(64, steps + 16),
        save_output_v1=save_output_v1,
    )
    requests = [
        Request(
            f"bench-{i}",
            [(7 * i + j) % (vocab - 3) + 3 for j in range(4)],
            max_tokens=steps,
            eos_token_ids=[vocab + 1],  # never sampled: every request runs the full length
            logprobs=top_k,
        )
        for i in range(batch)
    ]
    return config, requests


def preemption_workload(**config):
    """FD 2.4 preemption mid-flight (``DriverConfig(preemption=True)``): 12 KV blocks of 16 tokens
    for 9 requests of up to 128 tokens, greedy and seeded top-p, logprobs, chunked prefill and
    arrivals. Requests are preempted while decoding and more than once; with ``num_gpu_blocks=10``
    one also right after admission; with ``engine_lag=1`` (the engine one step behind, as under the
    overlap schedule) victims' tokens are in flight when they are preempted, and one whose eos is
    in flight finishes without being rescheduled."""
    eos = [2]

    def req(i, n_prompt, max_tokens, **kw):
        return Request(f"pre{i}", [(17 * i + 5 * j) % 200 + 3 for j in range(n_prompt)],
                       max_tokens=max_tokens, eos_token_ids=eos, **kw)

    requests = (req(0, 5, 40, top_p=0.7, seed=5), req(1, 9, 30), req(2, 20, 6), req(3, 13, 40, logprobs=5),
                req(4, 3, 35, logprobs=0), req(5, 30, 14))
    arrivals = {3: (req(7, 11, 20),), 9: (req(8, 4, 2),), 12: (req(9, 2, 10, logprobs=20),)}
    settings = dict(max_num_seqs=8, vocab_size=1024, max_model_len=128, enable_logprob=True, chunk_size=8,
                    num_gpu_blocks=12, preemption=True)
    settings.update(config)
    return DriverConfig(**settings), requests, arrivals


@dataclass(frozen=True)
class Scenario:
    name: str
    replica: str  # "fd24" or "fd25"
    config: DriverConfig
    requests: tuple
    arrivals: dict | None = None
    #: the plugin's features (None: the default, ``all``)
    features: tuple | None = None
    #: the unpatched run's engine lag: 1 for the overlap schedule, whose outputs reach the engine
    #: one step later (``DriverConfig.engine_lag``); every message and output is then identical
    base_engine_lag: int = 0
    #: environment variables while the plugin is enabled (``Variant.env``, e.g. the overlap count)
    env: tuple = ()

    def differences(self, base: DecodeResult, plugin: DecodeResult) -> list:
        """``base.differences(plugin)``; under the overlap schedule without the executed-step count
        (its flush steps when the batch drains send nothing) but with every message checked."""
        diffs = base.differences(plugin)
        if self.base_engine_lag:
            diffs = [d for d in diffs if not d.startswith("executed_steps")]
            if plugin.executed_steps < base.executed_steps:
                diffs.append(f"executed_steps: {base.executed_steps} vs {plugin.executed_steps} (fewer with the plugin)")
        return diffs


#: ``selftest --steps`` accepts 1 to this many decode steps per run (each value sizes its scenarios)
MAX_SELFTEST_STEPS = 512


def _kv_blocks(requests, block_size: int = 16) -> int:
    return sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) for r in requests)


def selftest_scenarios(steps: int = 48) -> list[Scenario]:
    """Mixed workloads covering the patched paths: every logprob width, eos, stop sequences,
    max_tokens=1, chunked prefill, prompt logprobs, block steps, mid-run arrivals, both output
    paths (save ops and the ZMQ thread), FastDeploy 2.5's overlap schedule, preemption mid-flight,
    and the opt-in ``overlap`` feature (against FD 2.4 with its engine one step behind).

    Sized by ``steps`` (1 to ``MAX_SELFTEST_STEPS``): the model length fits the longest request,
    and the block-step workload never stalls with every request waiting for a KV block."""
    if not 1 <= int(steps) <= MAX_SELFTEST_STEPS:
        raise ValueError(f"steps={steps}: expected 1 to {MAX_SELFTEST_STEPS}")
    eos = [2]

    def req(i, n_prompt, max_tokens, **kw):
        prompt = [(11 * i + 5 * j) % 1000 + 3 for j in range(n_prompt)]
        return Request(f"req{i}", prompt, max_tokens=max_tokens, eos_token_ids=eos, **kw)

    preemption, preempting, preempting_later = preemption_workload()
    mixed = (
        req(0, 5, steps, logprobs=0),
        req(1, 9, steps // 2, logprobs=1),
        req(2, 20, 1, logprobs=5),
        req(3, 13, steps, logprobs=20, stop_seqs=[[17, 23]]),
        req(4, 3, steps - 5),
        req(5, 30, steps // 3, logprobs=5),
        req(6, 7, steps, logprobs=20),
    )
    later = {3: (req(7, 11, steps // 2, logprobs=5),), 9: (req(8, 4, 3, logprobs=1),)}
    model_len = max(128, -(-(steps + 40) // 16) * 16)  # the longest prompt (30) and its tokens, in blocks
    base = dict(max_num_seqs=8, vocab_size=1024, max_model_len=model_len, enable_logprob=True, chunk_size=8)
    # 14 KV blocks: requests wait for blocks (block steps), and up to 59 steps one always finishes
    # (checked for every value). Beyond, a deadlock-free count: each request holding all but one of
    # its blocks still leaves one free
    everyone = mixed + tuple(r for rs in later.values() for r in rs)
    blocks = 14 if steps <= 59 else _kv_blocks(everyone) - len(everyone) + 1
    zmq = (
        req(10, 17, steps // 2, logprobs=-1, prompt_logprobs=5),
        req(11, 25, steps // 2, logprobs=3, prompt_logprobs=-1),
        req(12, 6, steps, logprobs=20),
    )
    return [
        Scenario("fd24 save ops: logprobs 0/1/5/20, chunked prefill, arrivals, block steps", "fd24",
                 DriverConfig(**base, num_gpu_blocks=blocks), mixed, later),
        Scenario("fd24 ZMQ output thread: logprobs -1, prompt logprobs", "fd24",
                 DriverConfig(**base, save_output_v1=True), zmq),
        Scenario("fd24 no logprobs, legacy scheduler", "fd24",
                 DriverConfig(max_num_seqs=8, vocab_size=1024, max_model_len=model_len, use_v1_scheduler=False),
                 tuple(req(20 + i, 4 + i, steps // 2 + i) for i in range(5))),
        Scenario("fd25 overlap schedule, ZMQ, prompt logprobs", "fd25",
                 DriverConfig(**base, save_output_v1=True, overlap=True), zmq),
        Scenario("fd24 preemption mid-flight", "fd24", preemption, preempting, preempting_later),
        Scenario("fd24 opt-in overlap vs FD 2.4 with the engine one step behind: preemption mid-flight", "fd24",
                 preemption, preempting, preempting_later, features=OVERLAP_FEATURES, base_engine_lag=1),
    ]


def _unpatched_run(scenario: Scenario, backend: str, max_steps: int) -> VariantRun:
    off = Variant(f"{scenario.replica}-unpatched", ROOTS[scenario.replica], False)
    base_config = dataclasses.replace(scenario.config, engine_lag=scenario.base_engine_lag)
    return run_variant(off, base_config, scenario.requests, backend=backend, max_steps=max_steps,
                       arrivals=scenario.arrivals)


def _plugin_run(scenario: Scenario, backend: str, max_steps: int) -> VariantRun:
    on = Variant(f"{scenario.replica}-plugin", ROOTS[scenario.replica], True, scenario.features, env=scenario.env)
    return run_variant(on, scenario.config, scenario.requests, backend=backend, max_steps=max_steps,
                       arrivals=scenario.arrivals)


def run_scenario(scenario: Scenario, backend: str, max_steps: int = 400) -> tuple[VariantRun, VariantRun]:
    return _unpatched_run(scenario, backend, max_steps), _plugin_run(scenario, backend, max_steps)


#: backends whose copies are asynchronous with no device behind them: a run there is also compared
#: with the synchronous reference (unpatched FastDeploy on ``host``: every copy lands when issued)
RACY_BACKENDS = ("sim",)


@dataclass
class Judgement:
    """One scenario on one backend. ``differences``: the plugin's run against what it must equal
    (the synchronous reference on a racy backend, else unpatched FastDeploy on the same backend).
    ``fastdeploy_race``: unpatched FastDeploy on the racy backend differs from (or fails where) the
    synchronous reference while the plugin matches it - FastDeploy's own race, not the plugin's."""

    base: VariantRun | None
    plugin: VariantRun
    differences: list
    reference: VariantRun | None = None
    fastdeploy_race: list = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return bool((self.reference or self.base).result.truncated)


def judge_scenario(scenario: Scenario, backend: str, max_steps: int = 400) -> Judgement:
    """Run ``scenario`` unpatched and with the plugin on ``backend`` and judge the plugin's run. On
    a racy backend (``sim``) both runs are compared with the synchronous reference: a plugin that
    equals it is right even where unpatched FastDeploy's own race (FD 2.5's overlap schedule losing
    a prompt chunk's logprobs, or a step) makes the unpatched run differ or fail."""
    if backend not in RACY_BACKENDS:
        base, plugin = run_scenario(scenario, backend, max_steps)
        return Judgement(base, plugin, scenario.differences(base.result, plugin.result))
    reference = _unpatched_run(scenario, "host", max_steps)
    plugin = _plugin_run(scenario, backend, max_steps)
    differences = scenario.differences(reference.result, plugin.result)
    try:
        base = _unpatched_run(scenario, backend, max_steps)
        own = scenario.differences(reference.result, base.result)
    except Exception as exc:  # e.g. a step lost to the race leaves every request waiting for a block
        base, own = None, [f"unpatched FastDeploy failed: {type(exc).__name__}: {exc}"]
    if own and differences:
        differences = differences + [f"(unpatched FastDeploy differs too: {own[0]})"]
    return Judgement(base, plugin, differences, reference, own if not differences else [])
