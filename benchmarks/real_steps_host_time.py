#!/usr/bin/env python3
"""The plugin's own host time per decode step on FastDeploy's own code, beside FastDeploy's own
Python time per step, in the same run (issue 38).

FastDeploy's ``GPUModelRunner`` steps on CPU Paddle (``fd_async_copy_plugin/testing/real_steps``:
our ports of its compiled ops, the tiny model). Per configuration (unpatched, default features,
``all,overlap`` on 2.4), with and without logprobs, at each batch size:

- **plain**: wall time per loop iteration (the driver's step: schedule, insert, ``execute_model``,
  outputs) from the second iteration to the end of the run (the runner's construction, the plugin's
  enabling and the first, prefill step excluded; the garbage collector off in the window, in both
  kinds of run: a collection's pause would land in whichever frame runs), nothing instrumented; configurations alternate
  over ``--rounds``, median of rounds.
- **attributed** (a separate run, the same window under ``cProfile``): each function's own time goes to its owner
  by file - ``plugin`` (``fd_async_copy_plugin/`` outside ``testing/``), ``fastdeploy`` (the
  tree's ``fastdeploy/``), ``stand-ins`` (``fd_async_copy_plugin/testing/``: our op ports, the
  tiny model, the driver - what a GPU or the engine does in a server); a function of anyone else
  (Paddle's Python, numpy, builtins, the standard library) is charged to its callers in proportion
  to the time each caller spent in it, up the call graph: so "plugin" is time in plugin-owned
  frames with the Paddle calls they make, and "fastdeploy" FastDeploy's own Python with its Paddle
  calls (the stand-ins' own time excluded). Plugin code is the plugin's where FastDeploy (or the
  plugin) calls it, the stand-ins' where a stand-in does: the replica's op ports, FastDeploy 2.5's
  pinned copies and events (``real_steps/pinned.py``, ``reference/paddle_device.py``) and the sync
  census go through the plugin's copy backend and census modules, which on a GPU would be
  FastDeploy's own CUDA calls or nothing at all. Per executed step; the ratio plugin / fastdeploy of the
  same run is the figure (the profiler's per-call overhead inflates both; the plain figures are
  exact). Under each plugin row, where its time goes: its largest functions (``--top``). Each row
  also counts the calls of the plugin's own Python functions per step (the profiler's count:
  deterministic where the times are not).
- **sampled** (``--sampler``; a third run per row, in a child process): the same loop, the same
  window, under a sampling profiler, py-spy, which reads the child's stacks from outside
  (``py-spy record --nonblocking -r 1000 -f speedscope``, ``--sample-rate``) and adds nothing to
  what the loop runs. The child (this script again, the row's parameters, a hidden child mode)
  runs the loop ``--sample-runs`` times (default 12) as the plain run does and marks each window's
  start and end with a ~15 ms busy spin in ``_sampled_window_begins`` / ``_sampled_window_ends``;
  py-spy's samples are in order, so only the samples between a begin marker and the next end
  marker count (the markers' own excluded; a window whose end marker no sample caught is
  dropped). Each sample goes to the innermost frame of its stack whose file has an owner, by the
  rule above (the bench itself is the stand-ins'; unowned frames - Paddle, numpy - go to the
  nearest owned caller; plugin code the stand-ins call is theirs); a stack without an owned frame
  is "other". py-spy leaves out samples of a thread that is not running (its default), as
  ``--cpu-clock`` leaves out time off the CPU. Under each row: ``sampled: plugin N, fastdeploy N,
  stand-ins N, other N samples | plugin/fastdeploy X% (95% interval A-B%)``; the interval is the
  Wilson score interval of p = plugin / (plugin + fastdeploy) mapped to the ratio p / (1 - p): the
  counting error of that many samples taken as independent, not the variation between runs;
  with ``--top``, the plugin's largest frames by samples (each sample's innermost plugin frame:
  a function with the Paddle calls it makes, not its plugin callees). Where py-spy is missing or
  cannot read the child the line says ``sampled: - (why)`` and the bench goes on. Non-blocking,
  py-spy reads a stack while it changes: about 1-2% of the samples are torn (cut short, empty, or
  a frame of another moment); they count where their frames point, mostly as "other" (the few
  plugin samples of an unpatched row are such).
- **beside unpatched**: under each plugin row, its host Python - plugin and FastDeploy together -
  over the unpatched row's for the same work (same batch and logprobs: the same requests and
  tokens; per run, as overlap's run has one step more), per instrument: ``host Python for the
  same work (plugin + fastdeploy) over unpatched: profiled X, sampled Y (95% interval A-B)``. The
  plugin moves work between owners: a watched write of FastDeploy's (``share_inputs[k][i] = v``)
  runs in the plugin's frame, a host read it answers from its shadow leaves FastDeploy's. This
  figure is what the host gains or loses for that work, wherever the time lands; it does not
  replace the plugin / fastdeploy ratio.

Why two instruments: cProfile's hook runs at every call and return, and its cost is charged to
the function called. The plugin's work per step is many cheap Python calls (~300) and builtin
calls; FastDeploy's, fewer calls into Paddle that each cost more. So the profiled times inflate the
plugin's share far more than FastDeploy's: on FastDeploy 2.4 (B=128, default features, no
logprobs, ``--steps 32 --cpu-clock``) the profiled ratio plugin / fastdeploy read 72% in two runs,
the sampled one 22% and 32% (about a third). A sampler costs the sampled process nothing per call;
its error is the count's (the interval; at ~1 ms per sample, a few hundred samples of the plugin
and FastDeploy per row) and the sampling's period. The profiled rows keep what only a profiler
gives: exact call counts, times per function.

py-spy: ``pip install py-spy`` (or ``--py-spy PATH``; by default ``py-spy`` on PATH or beside this
Python). It starts the child itself and reads its memory, which needs ptrace permission on it:
as the same user, with ``/proc/sys/kernel/yama/ptrace_scope`` at most 1 (a child of py-spy's is
allowed at 1); in a container, often ``--cap-add SYS_PTRACE`` too. ``--sample-out DIR`` keeps
each row's speedscope file (https://www.speedscope.app shows it).

    python benchmarks/real_steps_host_time.py --fd-root /path/to/FastDeploy [--batches 8,128]
        [--steps 32] [--rounds 3] [--vocab 1024] [--top 6] [--json FILE]
        [--sampler [--py-spy PATH] [--sample-runs 12] [--sample-rate 1000] [--sample-out DIR]]
    python benchmarks/real_steps_host_time.py --replica fd24     # the replica (CI smoke)

The result is a measurement (RESULT: MEASURED), not a pass/fail check.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import math
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def attribute(stats: pstats.Stats, fd_dir, plugin_dir, testing_dir) -> dict:
    """Own time per owner; unowned functions' own time charged to callers by their time in it."""
    raw = stats.stats  # func -> (cc, nc, tt, ct, callers{func: (cc, nc, tt, ct)})
    owner = Owners(fd_dir, plugin_dir, testing_dir)  # (the bench's own frames: nobody's, charged to callers)
    owners = {f: owner(f[0]) if f[0] != "~" else None for f in raw}
    memo: dict = {}

    def shares(f, seen=()):
        owner = owners.get(f)
        if owner in ("fastdeploy", "stand-ins"):
            return {owner: 1.0}
        if f in memo:
            return memo[f]
        if f in seen:
            return {}
        callers = raw.get(f, (0, 0, 0, 0, {}))[4]
        by_ct = sum(v[3] for v in callers.values())
        total = by_ct or sum(v[2] for v in callers.values())
        if owner == "plugin" and total <= 0:
            return {"plugin": 1.0}
        out: dict = {}
        if total > 0:
            for caller, v in callers.items():
                weight = (v[3] if by_ct else v[2]) / total
                for who, share in shares(caller, seen + (f,)).items():
                    if owner == "plugin" and who == "fastdeploy":
                        who = "plugin"  # FastDeploy calling into the plugin (a junction, a patched name)
                    out[who] = out.get(who, 0.0) + weight * share
        memo[f] = out
        return out

    totals: dict = {"plugin": 0.0, "fastdeploy": 0.0, "stand-ins": 0.0, "unattributed": 0.0}
    where: dict = {}
    # calls of the plugin's own Python functions (builtins excluded), shared among callers as the
    # time is (a plugin function a stand-in calls is the stand-ins'): deterministic where time is not
    totals["_plugin_calls"] = 0.0
    for f, (cc, nc, tt, ct, callers) in raw.items():
        s = shares(f)
        if owners[f] == "plugin":
            totals["_plugin_calls"] += nc * s.get("plugin", 0.0)
        charged = 0.0
        for owner, share in s.items():
            totals[owner] += tt * share
            charged += share
        totals["unattributed"] += tt * max(0.0, 1.0 - charged)
        if s.get("plugin"):
            where[f] = tt * s["plugin"]
    totals["_plugin_functions"] = where
    return totals


def top_plugin_functions(where: dict, plugin_dir: str, steps: int, n: int) -> list[str]:
    """The plugin's time by function (own time, and unowned callees' share) per step, largest first."""
    rows = sorted(where.items(), key=lambda kv: -kv[1])[:n]
    out = []
    for (filename, line, name), seconds in rows:
        out.append(f"{seconds / steps * 1e6:8.1f} us  {display_name(filename, plugin_dir)}:{line} {name}")
    return out


def display_name(filename: str, plugin_dir: str) -> str:
    """A frame's file as the rows show it: the plugin's relative to the package's folder, others' base name."""
    if filename.startswith(plugin_dir):
        return os.path.relpath(filename, os.path.dirname(plugin_dir.rstrip(os.sep)))
    return os.path.basename(filename) if filename != "~" else ""


def workload(batch: int, steps: int, vocab: int, logprobs: bool):
    from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

    config = DriverConfig(max_num_seqs=batch, vocab_size=vocab, max_model_len=steps + 16, block_size=16,
                          enable_logprob=logprobs)
    requests = [Request(f"b{i}", [(7 * i + j) % (vocab - 3) + 3 for j in range(8)], max_tokens=steps,
                        eos_token_ids=[vocab + 1], logprobs=5 if logprobs else None) for i in range(batch)]
    return config, requests


def configurations(line: str, count: str = "exact"):
    from fd_async_copy_plugin.testing.harness import OVERLAP_FEATURES
    from fd_async_copy_plugin.testing.real_steps.check import Configuration

    out = [Configuration("unpatched", False), Configuration("default", True, None)]
    if line == "fd24":
        out.append(Configuration("all,overlap", True, OVERLAP_FEATURES, (("FD_ASYNC_COPY_OVERLAP_COUNT", count),)))
    return out


class StepWindow:
    """Starts at the driver's second ``census.begin_step()`` (the first step prefills) and ends when
    the run returns: the steady loop only, without building the runner or enabling the plugin."""

    def __init__(self, profiler, marks: bool = False) -> None:
        self.profiler = profiler
        self.marks = marks  # the sampled child: mark the window's ends for the sampler
        self.begins = 0
        self.started = None

    @contextlib.contextmanager
    def installed(self):
        from fd_async_copy_plugin.runtime import census

        original = census.begin_step

        def begin_step(*args, **kwargs):
            self.begins += 1
            if self.begins == 2:
                if self.marks:
                    _sampled_window_begins()
                self.started = time.perf_counter()
                if self.profiler is not None:
                    self.profiler.enable()
            return original(*args, **kwargs)

        census.begin_step = begin_step
        gc.collect()
        gc.disable()  # a collection's pause lands in whichever frame runs: noise in every column
        try:
            yield self
        finally:
            if self.profiler is not None:
                self.profiler.disable()
            self.ended = time.perf_counter()
            if self.marks and self.started is not None:
                _sampled_window_ends()
            census.begin_step = original
            gc.enable()

    @property
    def steps(self) -> int:
        return max(1, self.begins - 1)

    @property
    def seconds(self) -> float:
        return (self.ended - self.started) if self.started is not None else 0.0


# --- the sampler (``--sampler``): py-spy on a child that steps the same loop -------------------------

#: how long each marker spins: ~15 samples at 1000 Hz
MARK_SECONDS = 0.015
BEGIN_MARK, END_MARK = "_sampled_window_begins", "_sampled_window_ends"


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _sampled_window_begins(seconds: float = MARK_SECONDS) -> None:
    """A marker the sampler sees: the step window starts when this returns."""
    _spin(seconds)


def _sampled_window_ends(seconds: float = MARK_SECONDS) -> None:
    """A marker the sampler sees: the step window ended before this was called."""
    _spin(seconds)


class Owners:
    """Who owns a file, for both instruments (the profile's and py-spy's file names, as the code
    objects name them: absolute, or relative to the working folder): ``fd_dir`` FastDeploy (on the
    replica ``testing/reference/<line>/``, checked first), ``fd_async_copy_plugin/testing/`` the
    stand-ins, the rest of ``fd_async_copy_plugin/`` the plugin; ``bench_file`` (the sampler's: the
    child's loop runs in it) the stand-ins too. Prefixes first, then path fragments (a copy of the
    package elsewhere, a path through a link)."""

    def __init__(self, fd_dir: str | None, plugin_dir: str, testing_dir: str, bench_file: str | None = None,
                 cwd: str | None = None) -> None:
        self.fd_dir, self.plugin_dir, self.testing_dir = fd_dir, plugin_dir, testing_dir
        self.bench_file = os.path.abspath(bench_file) if bench_file else None
        self.cwd = cwd or os.getcwd()
        self.fd_fragment = None
        if fd_dir:
            parts = fd_dir.replace(os.sep, "/").rstrip("/").split("/")
            if "fd_async_copy_plugin" in parts:  # the replica: fd_async_copy_plugin/testing/reference/<line>/
                parts = parts[parts.index("fd_async_copy_plugin"):]
            else:  # a tree: <tree>/fastdeploy/
                parts = parts[-2:]
            self.fd_fragment = "/" + "/".join(parts) + "/"
        self.memo: dict = {}

    def __call__(self, filename: str) -> str | None:
        if filename not in self.memo:
            self.memo[filename] = self._owner(filename)
        return self.memo[filename]

    def _owner(self, filename: str) -> str | None:
        if not filename or filename.startswith("<"):  # <frozen ...>, <string>
            return None
        path = os.path.normpath(filename if os.path.isabs(filename) else os.path.join(self.cwd, filename))
        slashed = "/" + path.replace(os.sep, "/").lstrip("/")
        if self.bench_file and (path == self.bench_file or slashed.endswith(
                "/benchmarks/" + os.path.basename(self.bench_file))):
            return "stand-ins"
        if self.fd_dir and (path.startswith(self.fd_dir) or self.fd_fragment in slashed):
            return "fastdeploy"
        if path.startswith(self.testing_dir) or "/fd_async_copy_plugin/testing/" in slashed:
            return "stand-ins"
        if path.startswith(self.plugin_dir) or "/fd_async_copy_plugin/" in slashed:
            return "plugin"
        return None


def sample_owner(stack: list, owner) -> tuple[str, int | None]:
    """Who a sample (``stack``: frames outermost first, each ``(file, name)``) is charged to, and the
    index of the frame charged: the innermost owned frame; a plugin frame the stand-ins called (with
    only plugin or unowned frames between) is the stand-ins', as in the profiled attribution (the
    replica's op ports, FD 2.5's pinned copies, the census go through the plugin's modules). No owned
    frame: ``("other", None)``."""
    for i in range(len(stack) - 1, -1, -1):
        who = owner(stack[i][0])
        if who is None:
            continue
        if who == "plugin":
            for j in range(i - 1, -1, -1):
                outer = owner(stack[j][0])
                if outer in ("fastdeploy", "stand-ins"):
                    return ("stand-ins" if outer == "stand-ins" else "plugin"), i
        return who, i
    return "other", None


def windowed_samples(speedscope: dict) -> tuple[list[list], int]:
    """The samples between a begin marker and the next end marker (the markers' own excluded), each
    a stack of ``(file, name)`` outermost first, from py-spy's speedscope file (its samples are in
    order, one profile per thread: the thread with the markers counts); and the number of windows.
    A window without its end (the sampler missed it) is dropped, not run on into the next run's setup."""
    frames = [(f.get("file") or "", f.get("name") or "") for f in speedscope["shared"]["frames"]]
    out: list = []
    windows = 0
    for profile in speedscope.get("profiles", []):
        pending = None  # samples of an open window
        for sample in profile.get("samples", []):
            names = {frames[i][1] for i in sample}
            if BEGIN_MARK in names:
                pending = []
            elif END_MARK in names:
                if pending is not None:
                    out.extend(pending)
                    windows += 1
                pending = None
            elif pending is not None:
                pending.append([frames[i] for i in sample])
    return out, windows


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k`` of ``n`` (95% at z 1.96)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def _odds(p: float) -> float:
    return p / (1 - p) if p < 1 else float("inf")


def sampled_figures(speedscope: dict, owner, top: int = 0, shown=None) -> dict:
    """Samples per owner in the step windows, the ratio plugin / fastdeploy and its 95% interval (the
    Wilson interval of p = plugin / (plugin + fastdeploy), mapped to p / (1 - p)); with ``top``, the
    plugin's largest innermost frames (``shown``: a file's display name)."""
    samples, windows = windowed_samples(speedscope)
    counts = {"plugin": 0, "fastdeploy": 0, "stand-ins": 0, "other": 0}
    frames: dict = {}
    for stack in samples:
        who, at = sample_owner(stack, owner)
        counts[who] += 1
        if who == "plugin":
            frames[stack[at]] = frames.get(stack[at], 0) + 1
    out: dict = dict(counts, windows=windows)
    pair = counts["plugin"] + counts["fastdeploy"]
    if counts["fastdeploy"]:
        low, high = wilson(counts["plugin"], pair)
        out["plugin_over_fastdeploy"] = counts["plugin"] / counts["fastdeploy"]
        out["interval95"] = [_odds(low), _odds(high)]
    else:
        out["plugin_over_fastdeploy"] = out["interval95"] = None
    if top:
        out["plugin_top"] = [f"{n:6d} samples  {(shown or (lambda f: f))(f)} {name}"
                             for (f, name), n in sorted(frames.items(), key=lambda kv: -kv[1])[:top]]
    return out


def beside_unpatched(row: dict, unpatched: dict, z: float = 1.96) -> dict:
    """A plugin row's host Python - its plugin and FastDeploy time together - over the unpatched
    row's for the same work (same batch and logprobs setting: the same requests and tokens; per run,
    not per step: overlap's run has one step more, its last save), per instrument: what the plugin
    changes in the host's work, whichever owner the time lands in. Sampled: samples per window, with
    a 95% interval taking both counts as Poisson (on the log of the ratio)."""
    mine, base = row["profiled_us_per_step"], unpatched["profiled_us_per_step"]
    below = (base["plugin"] + base["fastdeploy"]) * unpatched["steps"]
    out: dict = {"profiled": (mine["plugin"] + mine["fastdeploy"]) * row["steps"] / below if below else None,
                 "sampled": None, "interval95": None}
    s, u = row.get("sampled") or {}, unpatched.get("sampled") or {}
    if "plugin" in s and "plugin" in u:
        a, b = s["plugin"] + s["fastdeploy"], u["plugin"] + u["fastdeploy"]
        if a and b:
            ratio = (a / s["windows"]) / (b / u["windows"])
            spread = math.exp(z * (1 / a + 1 / b) ** 0.5)
            out.update(sampled=ratio, interval95=[ratio / spread, ratio * spread])
    return out


def beside_line(figures: dict) -> str:
    profiled = "-" if figures["profiled"] is None else f"{figures['profiled']:.2f}x"
    sampled = "-" if figures["sampled"] is None else (
        f"{figures['sampled']:.2f}x (95% interval {figures['interval95'][0]:.2f}-{figures['interval95'][1]:.2f}x)")
    return (f"host Python for the same work (plugin + fastdeploy) over unpatched: profiled {profiled}, "
            f"sampled {sampled}")


def sampled_line(figures: dict) -> str:
    if "error" in figures:
        return f"sampled: - ({figures['error']})"
    ratio, interval = figures["plugin_over_fastdeploy"], figures["interval95"]
    if ratio is None:
        shown = "-"
    else:
        high = "inf" if interval[1] == float("inf") else f"{100 * interval[1]:.1f}"
        shown = f"{100 * ratio:.1f}% (95% interval {100 * interval[0]:.1f}-{high}%)"
    return (f"sampled: plugin {figures['plugin']}, fastdeploy {figures['fastdeploy']}, stand-ins "
            f"{figures['stand-ins']}, other {figures['other']} samples | plugin/fastdeploy {shown}")


def find_py_spy(given: str | None) -> str | None:
    """``--py-spy`` as given (a path, or a name on PATH); else ``py-spy`` on PATH or beside this Python."""
    if given:
        return shutil.which(given) or (given if os.path.isfile(given) and os.access(given, os.X_OK) else None)
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def sample_row(args, py_spy: str | None, batch: int, logprobs: bool, configuration: str, owner,
               shown=None) -> dict:
    """Runs the row's steady loop ``--sample-runs`` times in a child of this script under ``py-spy
    record``; the figures, or ``{"error": why}`` (never raises for the sampler's sake)."""
    if py_spy is None:
        return {"error": "py-spy not found: pip install py-spy, or --py-spy PATH"}
    where = ["--fd-root", args.fd_root] if args.fd_root else ["--replica", args.replica]
    child = [sys.executable, os.path.abspath(__file__), *where, "--batches", str(batch), "--steps", str(args.steps),
             "--vocab", str(args.vocab), "--overlap-count", args.overlap_count, "--sample-runs", str(args.sample_runs),
             "--sampled-child", f"{int(logprobs)}/{configuration}"]
    with tempfile.TemporaryDirectory(prefix="real-steps-sampled-") as folder:
        out = os.path.join(folder, "profile.json")
        command = [py_spy, "record", "--nonblocking", "-r", str(args.sample_rate), "-f", "speedscope", "-o", out,
                   "--", *child]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=args.sample_timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"py-spy timed out after {args.sample_timeout} s"}
        except OSError as e:
            return {"error": f"py-spy did not start: {e}"}
        if done.returncode != 0 or not os.path.exists(out):
            lines = [line.strip() for line in (done.stdout or "").splitlines() if line.strip()]
            errors = [line for line in lines if "rror" in line or "ermission" in line] or lines[-1:]
            why = errors[-1] if errors else ""
            return {"error": f"py-spy exited {done.returncode}{': ' + why[:200] if why else ''}"}
        if getattr(args, "sample_out", None):
            os.makedirs(args.sample_out, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9]+", "-", f"B{batch}-{'logprobs' if logprobs else 'no-logprobs'}-{configuration}")
            shutil.copyfile(out, os.path.join(args.sample_out, name + ".speedscope.json"))
        try:
            with open(out) as f:
                speedscope = json.load(f)
            figures = sampled_figures(speedscope, owner, args.top, shown)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            return {"error": f"unreadable speedscope file: {e!r}"}
    if not figures["windows"]:
        return {"error": f"no step window in the samples (of {args.sample_runs} runs)"}
    figures.update(runs=args.sample_runs, rate_hz=args.sample_rate)
    return figures


def sampled_child(args, target) -> int:
    """The child the sampler watches: the row's steady loop ``--sample-runs`` times, each window marked."""
    logprobs, name = args.sampled_child.split("/", 1)
    config, requests = workload(int(args.batches), args.steps, args.vocab, logprobs == "1")
    (c,) = [c for c in configurations(target.line, args.overlap_count) if c.name == name]
    for _ in range(args.sample_runs):
        one_run(target, c, config, requests, profile=False, marks=True)
    return 0


def one_run(target, c, config, requests, profile: bool, marks: bool = False):
    """One run as a server runs: the plugin enabled (or not) on the ``host`` backend, no sync census
    collecting and no device tracking (``harness.run_variant`` collects a census: test cost).
    ``marks``: the window's ends are marked for the sampler (the sampled child)."""
    from fd_async_copy_plugin.testing.harness import device_for, plugin_state
    from fd_async_copy_plugin.testing.real_steps.check import _variant
    from fd_async_copy_plugin.testing.reference.driver import run_decode

    window = StepWindow((cProfile.Profile(*PROFILE_TIMER)) if profile else None, marks=marks)
    variant = _variant(c, target.root)
    with contextlib.redirect_stdout(sys.stderr), device_for("host"), plugin_state(variant, "host"), window.installed():
        result = run_decode(variant.root, config, requests, max_steps=4 * len(requests) + 200, modules=target.modules())
    return result, window


#: the profiler's clock: wall time (default), or the thread's CPU time (``--cpu-clock``)
PROFILE_TIMER: tuple = ()


def main(argv=None) -> int:
    global PROFILE_TIMER
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd-root", help="folder holding fastdeploy/")
    where.add_argument("--replica", choices=("fd24", "fd25"), help="the replica instead (smoke)")
    parser.add_argument("--batches", default="8,128")
    parser.add_argument("--steps", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=6, help="the plugin's largest functions per row (default 6; 0: none)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--overlap-count", choices=("exact", "prepare", "bound", "launch"), default="exact",
                        help="FD_ASYNC_COPY_OVERLAP_COUNT of the all,overlap row on FD 2.4 (default exact; launch: "
                             "its old name)")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="profile on the thread's CPU clock: on a shared machine, time the process spent "
                             "descheduled is not charged to the function it was in (the profile costs more)")
    parser.add_argument("--sampler", action="store_true",
                        help="also sample each row's loop with py-spy in a child process (a second instrument, "
                             "without the profiler's per-call cost)")
    parser.add_argument("--py-spy", metavar="PATH", help="the py-spy to run (default: py-spy on PATH or beside "
                                                          "this Python)")
    parser.add_argument("--sample-runs", type=int, default=12, help="runs of the loop per sampled row (default 12)")
    parser.add_argument("--sample-rate", type=int, default=1000, help="samples per second (default 1000)")
    parser.add_argument("--sample-out", metavar="DIR", help="keep each sampled row's speedscope file in DIR")
    parser.add_argument("--sample-timeout", type=int, default=900, help=argparse.SUPPRESS)
    parser.add_argument("--sampled-child", metavar="LOGPROBS/CONFIGURATION", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    PROFILE_TIMER = (time.thread_time,) if args.cpu_clock else ()

    from fd_async_copy_plugin.testing.real_steps import check

    if args.fd_root:
        with contextlib.redirect_stdout(sys.stderr):
            from fd_async_copy_plugin.testing.real_steps.environment import prepare

            prepared = prepare(args.fd_root)
        target = check.real_target()
        fd_dir = os.path.dirname(prepared.fastdeploy_file) + os.sep
    else:
        from fd_async_copy_plugin.testing.reference import ROOTS

        target = check.Target(ROOTS[args.replica], args.replica, real=False)
        fd_dir = None
    import fd_async_copy_plugin

    plugin_dir = os.path.dirname(os.path.abspath(fd_async_copy_plugin.__file__)) + os.sep
    testing_dir = os.path.join(plugin_dir, "testing") + os.sep
    if fd_dir is None:  # the replica stands for FastDeploy: its files are "fastdeploy", not stand-ins
        fd_dir = os.path.join(testing_dir, "reference", target.line) + os.sep
    if args.sampled_child:
        return sampled_child(args, target)
    sample_owners = Owners(fd_dir, plugin_dir, testing_dir, os.path.abspath(__file__))
    py_spy = find_py_spy(args.py_spy) if args.sampler else None

    def shown(filename):  # (a plugin frame found by a path fragment only: its whole name)
        return display_name(filename, plugin_dir) if filename.startswith(plugin_dir) else filename

    results = []
    print(f"real-steps host time: {'FastDeploy ' + target.line + ' at ' + fd_dir if args.fd_root else 'replica ' + target.line}; "
          f"backend host, {args.steps} tokens per request, vocab {args.vocab}, logprobs k=5 where on")
    for batch in [int(b) for b in args.batches.split(",")]:
        for logprobs in (False, True):
            config, requests = workload(batch, args.steps, args.vocab, logprobs)
            configs = configurations(target.line, args.overlap_count)
            plain: dict = {c.name: [] for c in configs}
            unpatched = None  # the row the plugin rows are set beside (configurations() lists it first)
            for _ in range(args.rounds):
                for c in configs:
                    run, window = one_run(target, c, config, requests, profile=False)
                    plain[c.name].append(window.seconds / window.steps)
            for c in configs:
                run, window = one_run(target, c, config, requests, profile=True)
                steps = window.steps
                totals = attribute(pstats.Stats(window.profiler), fd_dir, plugin_dir, testing_dir)
                where = totals.pop("_plugin_functions")
                calls = totals.pop("_plugin_calls") / steps
                per_step = {k: v / steps * 1e6 for k, v in totals.items()}
                row = {
                    "batch": batch, "logprobs": logprobs, "configuration": c.name,
                    "plain_us_per_step": statistics.median(plain[c.name]) * 1e6,
                    "profiled_us_per_step": {k: round(v, 1) for k, v in per_step.items()},
                    "plugin_over_fastdeploy": per_step["plugin"] / per_step["fastdeploy"] if per_step["fastdeploy"] else None,
                    "plugin_python_calls_per_step": round(calls, 1),
                    "steps": steps,
                }
                results.append(row)
                ratio = row["plugin_over_fastdeploy"]
                print(f"  B={batch:<4d} {'logprobs' if logprobs else 'no logprobs':11s} {c.name:12s} "
                      f"plain {row['plain_us_per_step']:9.0f} us/step | profiled per step: plugin "
                      f"{per_step['plugin']:8.0f} us, fastdeploy {per_step['fastdeploy']:8.0f} us, stand-ins "
                      f"{per_step['stand-ins']:8.0f} us, other {per_step['unattributed']:6.0f} us | plugin/fastdeploy "
                      f"{'-' if ratio is None else f'{100 * ratio:.1f}%'} | plugin Python calls {calls:.1f}")
                if c.plugin and args.top:
                    row["plugin_top"] = top_plugin_functions(where, plugin_dir, steps, args.top)
                    for line in row["plugin_top"]:
                        print(f"      {line}")
                if args.sampler:
                    sampled = sample_row(args, py_spy, batch, logprobs, c.name, sample_owners, shown)
                    row["sampled"] = {k: v for k, v in sampled.items() if k != "plugin_top" or c.plugin}
                    print(f"    {sampled_line(sampled)}")
                    if c.plugin and args.top:
                        for line in sampled.get("plugin_top", []):
                            print(f"      {line}")
                if not c.plugin:
                    unpatched = row
                elif unpatched is not None:
                    row["beside_unpatched"] = beside_unpatched(row, unpatched)
                    print(f"    {beside_line(row['beside_unpatched'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print("RESULT: MEASURED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
