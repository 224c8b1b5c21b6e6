#!/usr/bin/env python3
"""Where the overlap's wait before the prepare exposes host time: one decode step's host time split
into phases, on FastDeploy 2.4's own step (issue 40, first part: measure).

With ``FD_ASYNC_COPY_FEATURES=all,overlap`` and ``FD_ASYNC_COPY_OVERLAP_COUNT=prepare`` (the exact
count waited for before the prepare: ``exact``'s fallback; the results recorded before the renaming
call it ``exact``), ``step_syncs`` waits for step N's snapshot at the start of ``_prepare_inputs``
(``patches/fd24/step_syncs.py`` ``step_count``: ``shadow.refresh("overlap.exact count")``). On a GPU,
everything the host does from the end of that wait until the forward of step N+1 is launched runs
while the GPU is idle: that is the wait's exposed host time (``exact`` moves that wait to the
forward's launch). Everything before the wait (the worker loop, step N's
sampler and post-process launches, step N-1's save) runs in the shadow of step N's GPU work.

Each phase is the exclusive wall time (``time.perf_counter``) of a FastDeploy (or plugin) callable
wrapped for the run, nested calls subtracted; per executed step, median over the steps of the run
(the prefill step excluded, the garbage collector off):

- ``worker``: ``insert_tasks_v1`` (FastDeploy's; zero on a step without new tasks);
- ``driver``: the stand-in engine (the driver's schedule and output read): not FastDeploy's code;
- ``wait``: ``step_syncs``' snapshot refresh (the one wait per step; on CPU it has nothing to wait for);
- ``prepare`` parts that do not depend on step N's exact token count: ``recover_decode_task`` (a
  device op: stream-ordered after step N, launchable before the host wait), ``SamplingMetadata``;
- ``prepare`` lines that are mixed: ``_prepare_inputs``' own lines and the plugin's wrapper
  (logprobs request list, ``bad_tokens_len`` max, the four ``copy_`` of the padding-removed inputs,
  the shadow's host replay of the count);
- ``prepare`` parts that depend on the count: ``pre_process`` (``get_padding_offset``: the packed
  batch's size) and ``initialize_forward_meta`` (shapes, CUDA-graph choice, attention metadata);
- ``pre-forward``: ``execute_model`` from the end of ``_prepare_inputs`` to the forward's call;
- ``forward``: the tiny stand-in model (on a GPU: the kernel launches of a real model);
- ``sampler``, ``post_process`` (update op; the save ops are captured, not run), ``save`` (the
  overlap flush: step N-1's save ops, run right after step N's forward is launched),
  ``execute_model`` lines after the forward.

CPU-measured: FastDeploy's Paddle calls (and our ports of its compiled ops) compute on the CPU here,
where a GPU would only launch them and run them asynchronously; so each phase is an upper bound of
its host time on a GPU, and the split (which phase is how large relative to the others) is the
finding, not the absolute microseconds.

    python benchmarks/overlap_exact_phases.py --fd-root /path/to/FastDeploy-2.4 [--batches 8,64,128]
        [--steps 32] [--vocab 1024] [--logprobs] [--json FILE]
    python benchmarks/overlap_exact_phases.py            # the replica fd24 (CI smoke)

``--json`` writes the split in the form ``benchmarks/step_model.py --host-split`` reads.
The result is a measurement (RESULT: MEASURED), not a pass/fail check; the run fails (exit 1) if
the overlap's path did not run (no overlap step served; with ``prepare``, no exact-count wait taken
at the prepare). ``--count exact`` (or ``launch``, its old name) and ``bound`` run for comparison.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import importlib
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

#: phase label -> (class, what it is). The classes: where the phase runs relative to exact's wait.
PHASES = {
    "worker: insert_tasks_v1": ("worker", "FastDeploy's insert (before the wait)"),
    "driver: schedule, output read": ("stand-in", "the driver's engine stand-in"),
    "wait: step_syncs snapshot refresh": ("wait", "the wait for step N's snapshot (prepare)"),
    "prepare: recover_decode_task": ("independent", "device op, stream-ordered after step N"),
    "prepare: SamplingMetadata": ("independent", "tensor references; bad-words slice by a max known at insert"),
    "prepare: FD's own lines": ("mixed", "logprobs request list, bad_tokens_len read and max, 5 input copies"),
    "prepare: plugin's wrapper": ("mixed", "step_syncs' _prepare_inputs wrapper: shadow load, seed, bad_len mirror"),
    "prepare: pre_process (get_padding_offset)": ("dependent", "sizes the packed batch by N's count"),
    "prepare: step_syncs count replay": ("dependent", "the plugin's host replay of N's count (needs N's snapshot)"),
    "prepare: initialize_forward_meta": ("dependent", "shapes, CUDA-graph choice, attention metadata"),
    "pre-forward: execute_model lines": ("dependent", "sampler.pre_process etc., before the forward's call"),
    "forward (stand-in model)": ("forward", "on a GPU: the model's kernel launches"),
    "sampler": ("post", "FastDeploy's Sampler"),
    "post_process (save captured)": ("post", "update op; the save ops are captured"),
    "save: overlap flush (step N-1)": ("save", "the pending save ops, after the forward's launch"),
    "execute_model: lines after the forward": ("post", "execute_model's own lines after the forward"),
}
#: exposed under exact: from the end of the wait to the forward's call
EXPOSED = ("independent", "mixed", "dependent")


class PhaseClock:
    """Exclusive wall time per label of wrapped callables (nested wrapped calls subtracted), per step."""

    def __init__(self) -> None:
        self.stack: list = []
        self.now: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.steps: list = []  # per executed step: {label: seconds}, plus "_wall"
        self.step_started = None
        self.marks: dict = {}
        self.wait_reasons: collections.Counter = collections.Counter()
        self.main = threading.main_thread()
        self.trace_lines = False
        self.lines: collections.Counter = collections.Counter()

    def wrap(self, label, fn, mark_start: str | None = None, mark_end: str | None = None):
        """``label``: a phase's name, or None for an op port: its time goes to "ops|<the phase calling it>"."""
        clock = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if threading.current_thread() is not clock.main:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            if mark_start:
                clock.marks[mark_start] = t0
            name = label if label is not None else "ops|" + (clock.stack[-1][0] if clock.stack else
                                                              "driver: schedule, output read")
            clock.stack.append([name, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                if mark_end and "forward" not in clock.marks:  # the last one before the forward's call
                    clock.marks[mark_end] = t1
                dt = t1 - t0
                child = clock.stack.pop()[1]
                clock.now[name] += dt - child
                clock.calls[name] += 1
                if label is None:
                    clock.now["opcalls|" + name[4:]] += 1
                if clock.stack:
                    clock.stack[-1][1] += dt
        return timed

    def begin_step(self) -> None:
        t = time.perf_counter()
        if self.step_started is not None and self.now.get("_executed"):
            row = dict(self.now)
            wall = t - self.step_started
            row["driver: schedule, output read"] = wall - sum(
                v for k, v in row.items() if not k.startswith(("_", "opcalls|")))
            row["_wall"] = wall
            row["pre-forward: execute_model lines"] = max(0.0, self.marks.get("forward", 0) - self.marks.get("prep_end", 0))
            row["execute_model: lines after the forward"] = (row.get("_execute_model", 0.0)
                                                              - row["pre-forward: execute_model lines"])
            waited = "wait_end" in self.marks and "forward" in self.marks
            row["_exposed"] = max(0.0, self.marks["forward"] - self.marks["wait_end"]) if waited else 0.0
            self.steps.append(row)
        self.now = collections.Counter()
        self.marks = {}
        self.step_started = t


def _line_traced(fn, clock):
    """``fn`` run under a line tracer of FastDeploy's ``_prepare_inputs`` code only (``--lines``): the
    wall time from each line to the next, nested calls included, into ``clock.lines``."""
    inner = fn
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    code = inner.__code__

    def traced(*args, **kwargs):
        state = {"line": None, "t": 0.0}

        def local(frame, event, arg):
            if event in ("line", "return"):
                t = time.perf_counter()
                if state["line"] is not None:
                    clock.lines[(code.co_filename, state["line"])] += t - state["t"]
                state["line"], state["t"] = frame.f_lineno, t
            return local

        def global_trace(frame, event, arg):
            return local if frame.f_code is code else None

        sys.settrace(global_trace)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.settrace(None)

    return traced


@contextlib.contextmanager
def installed(clock: PhaseClock, runner_module, modules=(), skip_first: int = 1):
    """Wrap the phases' callables (whatever is installed now: FastDeploy's, or the plugin's patches of
    them) for the run; everything restored after."""
    from fd_async_copy_plugin.runtime import census

    restore: list = []

    def swap(owner, name, label, **marks):
        if not hasattr(owner, name):
            return False
        had = name in vars(owner)
        old = getattr(owner, name) if not isinstance(owner, type) else vars(owner).get(name, getattr(owner, name))
        new = clock.wrap(label, old, **marks)
        setattr(owner, name, new)
        restore.append((owner, name, old, had))
        return True

    # our ports of FastDeploy's compiled ops (what a GPU runs; on a GPU the host only launches them):
    # timed apart, under the phase that calls them. Where the plugin patched a name, the timer goes
    # beneath the plugin's links (its junction's ``set_bottom``, the hook test instrumentation uses),
    # so the plugin's Python stays in the calling phase.
    try:
        from fd_async_copy_plugin.registry.patch import JUNCTION_MARK
    except ImportError:  # the registry moved (issue 37): time whole names, plugin links included
        JUNCTION_MARK = None
    timed_ports: dict = {}
    restore_bottoms: list = []

    def junction_of(obj):
        return getattr(obj, JUNCTION_MARK, None) if JUNCTION_MARK else None

    def is_port(fn) -> bool:
        own = getattr(fn, "__module__", "") or ""
        return callable(fn) and not isinstance(fn, type) and own.startswith("fd_async_copy_plugin.testing")

    def under_links(obj, label) -> bool:
        """Time what the plugin's links of ``obj`` call last (FastDeploy's original); False if unpatched."""
        junction = junction_of(obj)
        if junction is None:
            return False
        bottom = junction.bottom
        junction.set_bottom(clock.wrap(label, bottom))
        restore_bottoms.append((junction, bottom))
        return True

    for module in modules:
        for name, obj in list(vars(module).items()):
            junction = junction_of(obj)
            port = junction.bottom if junction is not None else obj
            if not is_port(port) or id(port) in timed_ports:
                continue
            timed_ports[id(port)] = True
            if junction is not None:
                under_links(obj, None)
            else:
                setattr(module, name, clock.wrap(None, port))
                restore.append((module, name, obj, True))

    cls = runner_module.GPUModelRunner
    found_inner = under_links(vars(cls).get("_prepare_inputs"), "prepare: FD's own lines")
    if clock.trace_lines and found_inner:  # --lines: FastDeploy's _prepare_inputs line by line (a tracer: slower)
        junction = junction_of(vars(cls).get("_prepare_inputs"))
        timed = junction.bottom
        junction.set_bottom(functools.wraps(timed)(_line_traced(timed, clock)))
    swap(cls, "insert_tasks_v1", "worker: insert_tasks_v1")
    swap(cls, "_prepare_inputs", "prepare: plugin's wrapper" if found_inner else "prepare: FD's own lines",
         mark_end="prep_end")
    swap(cls, "initialize_forward_meta", "prepare: initialize_forward_meta")
    swap(runner_module, "recover_decode_task", "prepare: recover_decode_task")
    swap(runner_module, "pre_process", "prepare: pre_process (get_padding_offset)")
    swap(runner_module, "SamplingMetadata", "prepare: SamplingMetadata")
    swap(runner_module, "post_process", "post_process (save captured)")
    swap(cls, "execute_model", "_execute_model")
    found = {"wait": False, "count replay": False, "save": False}
    try:  # the plugin's parts (read-only use: their methods wrapped for the run)
        from fd_async_copy_plugin.patches.fd24 import overlap
        from fd_async_copy_plugin.patches.fd24 import step_syncs

        old_refresh = step_syncs.StepShadow.refresh

        def refresh(self, reader, *args, **kwargs):
            clock.wait_reasons[reader] += 1
            try:
                return old_refresh(self, reader, *args, **kwargs)
            finally:
                if reader == "overlap.exact count":  # prepare's wait (not a refresh after an insert, say)
                    clock.marks["wait_end"] = time.perf_counter()
                    clock.now["_exact_wait"] += 1

        step_syncs.StepShadow.refresh = functools.wraps(old_refresh)(refresh)
        restore.append((step_syncs.StepShadow, "refresh", old_refresh, True))
        found["wait"] = swap(step_syncs.StepShadow, "refresh", "wait: step_syncs snapshot refresh")
        found["count replay"] = swap(step_syncs.StepShadow, "recover_and_count", "prepare: step_syncs count replay")
        found["save"] = swap(overlap.OverlapState, "flush", "save: overlap flush (step N-1)")
    except (ImportError, AttributeError) as exc:  # the plugin's modules moved (issue 37): say so, measure the rest
        print(f"note: the plugin's wait/save could not be wrapped ({type(exc).__name__}: {exc})", file=sys.stderr)
    original_begin = census.begin_step
    seen = {"n": 0}

    def begin_step(*args, **kwargs):
        seen["n"] += 1
        if seen["n"] > skip_first:
            clock.begin_step()
        return original_begin(*args, **kwargs)

    census.begin_step = begin_step
    model_classes: dict = {}
    sampler_classes: dict = {}

    old_execute = cls.execute_model

    def execute_model(self, *args, **kwargs):  # the model's and sampler's classes, once known
        for attr, label, seen_classes, mark in (("model", "forward (stand-in model)", model_classes, "forward"),
                                                ("sampler", "sampler", sampler_classes, None)):
            kind = type(getattr(self, attr, None))
            if getattr(self, attr, None) is not None and kind not in seen_classes:
                seen_classes[kind] = vars(kind).get("__call__")
                call = kind.__call__
                kind.__call__ = clock.wrap(label, call, mark_start=mark)
        clock.now["_executed"] += 1
        return old_execute(self, *args, **kwargs)

    cls.execute_model = functools.wraps(old_execute)(execute_model)
    gc.collect()
    gc.disable()
    try:
        yield found
    finally:
        clock.begin_step()  # closes the last step
        gc.enable()
        cls.execute_model = old_execute
        census.begin_step = original_begin
        for kinds in (model_classes, sampler_classes):
            for kind, own in kinds.items():
                if own is None:
                    delattr(kind, "__call__")
                else:
                    kind.__call__ = own
        for junction, bottom in reversed(restore_bottoms):
            junction.set_bottom(bottom)
        for owner, name, old, had in reversed(restore):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)


def summarize(clock: PhaseClock) -> dict:
    """Per phase: the median per step of its own Python (``host_us``: FastDeploy's and the plugin's,
    with their Paddle calls) and of the op ports it calls (``op_us``, ``op_calls``: what a GPU runs)."""
    rows = [r for r in clock.steps if r.get("_executed")]

    def med(key, scale=1e6):
        values = [r.get(key, 0.0) * scale for r in rows]
        return round(statistics.median(values), 1) if values else 0.0

    out = {"steps": len(rows), "steps_waited": sum(1 for r in rows if r.get("_exact_wait")), "phases": {}}
    for label, (kind, what) in PHASES.items():
        out["phases"][label] = {"class": kind, "what": what, "host_us": med(label), "op_us": med("ops|" + label),
                                "op_calls": med("opcalls|" + label, 1)}
    by_class: dict = collections.defaultdict(float)
    ops_by_class: dict = collections.defaultdict(float)
    for v in out["phases"].values():
        by_class[v["class"]] += v["host_us"]
        ops_by_class[v["class"]] += v["op_us"]
    out["by_class_host_us"] = {k: round(v, 1) for k, v in by_class.items()}
    out["by_class_op_us"] = {k: round(v, 1) for k, v in ops_by_class.items()}
    out["step_wall_us"] = med("_wall")
    out["exposed_wall_us"] = med("_exposed")  # wait end -> forward call, everything included
    exposed = sum(by_class.get(k, 0.0) for k in EXPOSED)
    lo = by_class.get("independent", 0.0)
    hi = lo + by_class.get("mixed", 0.0)
    out["exposed_host_us"] = round(exposed, 1)
    out["exposed_op_us"] = round(sum(ops_by_class.get(k, 0.0) for k in EXPOSED), 1)
    out["exposed_op_calls"] = round(sum(v["op_calls"] for v in out["phases"].values() if v["class"] in EXPOSED), 1)
    out["movable_before_wait_host_us"] = [round(lo, 1), round(hi, 1)]
    out["movable_share"] = [round(lo / exposed, 3) if exposed else 0.0, round(hi / exposed, 3) if exposed else 0.0]
    return out


def _commit() -> str:
    """The plugin checkout's commit (results name their commit), or "unknown"."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _paddle_version() -> str:
    import paddle

    return getattr(paddle, "__version__", "?")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd-root", help="folder holding FastDeploy 2.4's fastdeploy/ (default: the replica fd24)")
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--steps", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--logprobs", action="store_true", help="requests ask for top-5 logprobs")
    parser.add_argument("--count", choices=("prepare", "exact", "bound", "launch"), default="prepare",
                        help="FD_ASYNC_COPY_OVERLAP_COUNT (default prepare: the wait before the prepare; exact (launch: "
                             "its old name): the wait at the forward's launch; bound: no wait before the forward)")
    parser.add_argument("--lines", action="store_true",
                        help="also FastDeploy's _prepare_inputs line by line (a line tracer: slower, the shares count)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import real_steps_host_time as rsh
    from fd_async_copy_plugin.testing.harness import OVERLAP_FEATURES
    from fd_async_copy_plugin.testing.real_steps import check

    if args.fd_root:
        with contextlib.redirect_stdout(sys.stderr):
            from fd_async_copy_plugin.testing.real_steps.environment import prepare

            prepare(args.fd_root)
        target = check.real_target()
        if target.line != "fd24":
            print(f"error: {args.fd_root} is FastDeploy {target.line}; the overlap backport runs on 2.4 only",
                  file=sys.stderr)
            return 2
        where = f"FastDeploy {target.line} at {args.fd_root}"
    else:
        from fd_async_copy_plugin.testing.reference import ROOTS

        target = check.Target(ROOTS["fd24"], "fd24", real=False)
        where = "replica fd24"
    runner_module = importlib.import_module(target.root + ".worker.gpu_model_runner")
    postproc_module = importlib.import_module(target.root + ".model_executor.pre_and_post_process")
    c = check.Configuration(f"all,overlap {args.count}", True, OVERLAP_FEATURES,
                            (("FD_ASYNC_COPY_OVERLAP_COUNT", args.count),))
    print(f"overlap exact phases: {where}; features all,overlap, FD_ASYNC_COPY_OVERLAP_COUNT={args.count}, backend host, "
          f"{args.steps} tokens per request, vocab {args.vocab}, logprobs {'k=5' if args.logprobs else 'off'}")
    print("CPU-measured: Paddle calls compute here where a GPU launches them; per phase: exclusive wall time, "
          "median us per executed step (prefill step excluded)")
    results = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": _commit(),
               "machine": f"CPU ({os.cpu_count()} cores), Paddle {_paddle_version()}", "source": where,
               "count": args.count, "logprobs": args.logprobs, "batches": {}}
    ok = True
    for batch in [int(b) for b in args.batches.split(",")]:
        config, requests = rsh.workload(batch, args.steps, args.vocab, args.logprobs)
        clock = PhaseClock()
        clock.trace_lines = args.lines
        # the real configuration's environment is set by plugin_state; the clock wraps what it installed
        from fd_async_copy_plugin.testing.harness import device_for, plugin_state
        from fd_async_copy_plugin.testing.real_steps.check import _variant
        from fd_async_copy_plugin.testing.reference.driver import run_decode

        variant = _variant(c, target.root)
        with contextlib.redirect_stdout(sys.stderr), device_for("host"), plugin_state(variant, "host"):
            with installed(clock, runner_module, (runner_module, postproc_module)) as found:
                run_decode(variant.root, config, requests, max_steps=4 * len(requests) + 200,
                           modules=target.modules())
            import fd_async_copy_plugin

            overlap_report = fd_async_copy_plugin.status().get("features", {}).get("overlap", {})
        summary = summarize(clock)
        summary["exact_waits"] = clock.wait_reasons.get("overlap.exact count", 0)
        summary["wait_reasons"] = dict(clock.wait_reasons)
        served = clock.calls.get("save: overlap flush (step N-1)", 0)
        summary["overlap_flushes"] = served
        summary["plugin_parts_wrapped"] = found
        # the overlap's path ran (its flushes), and prepare waited at _prepare_inputs on every step / the others not
        ran = served > 0 and ((summary["steps_waited"] == summary["steps"]) if args.count == "prepare"
                              else summary["steps_waited"] < summary["steps"])
        summary["exact_path_ran"] = ran
        ok = ok and ran
        results["batches"][str(batch)] = summary
        note = "" if ran else f"  <-- the overlap ({args.count}) path did NOT run"
        print(f"\nB={batch}: {summary['steps']} steps, step wall {summary['step_wall_us']:.0f} us; waits at the prepare "
              f"{summary['exact_waits']} (steps that waited: {summary['steps_waited']}/{summary['steps']}), "
              f"overlap flushes {served}{note}")
        print(f"  {'host us':>9s} {'op us':>9s} {'ops':>5s}  class        phase   (host: FD's/plugin's Python and "
              f"Paddle calls; op: our ports of FD's compiled ops, what a GPU runs)")
        for label, v in summary["phases"].items():
            print(f"  {v['host_us']:9.1f} {v['op_us']:9.1f} {v['op_calls']:5.0f}  [{v['class']:11s}] {label}")
        lo, hi = summary["movable_before_wait_host_us"]
        exposed = summary["exposed_host_us"]
        print(f"  exposed under prepare (wait end -> forward call): host {exposed:.1f} us + op ports "
              f"{summary['exposed_op_us']:.1f} us in {summary['exposed_op_calls']:.0f} op calls (wall, measured: "
              f"{summary['exposed_wall_us']:.1f} us)")
        print(f"  of the exposed host time, could move before the wait: {lo:.1f}-{hi:.1f} us = "
              f"{100 * summary['movable_share'][0]:.0f}%-{100 * summary['movable_share'][1]:.0f}%; count-dependent: "
              f"{summary['by_class_host_us'].get('dependent', 0.0):.1f} us")
        if clock.lines:
            import linecache

            total = sum(clock.lines.values())
            print(f"  --lines: _prepare_inputs by line (us per step under the tracer, nested calls included; "
                  f"lines over 2% of {total / max(1, summary['steps']) * 1e6:.0f} us)")
            summary["lines"] = {}
            for (filename, line), seconds in sorted(clock.lines.items(), key=lambda kv: kv[0][1]):
                us = seconds / max(1, summary["steps"]) * 1e6
                summary["lines"][line] = round(us, 1)
                if seconds >= 0.02 * total:
                    print(f"    {us:8.1f} us  :{line} {linecache.getline(filename, line).strip()[:80]}")
        if overlap_report:
            results["batches"][str(batch)]["overlap_status"] = {k: overlap_report.get(k) for k in ("state", "runners")
                                                                if k in overlap_report}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    print("RESULT: MEASURED" if ok else "RESULT: FAILED (the overlap's path did not run)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
