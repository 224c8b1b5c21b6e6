"""Host cost of ``step_syncs``' watch on FastDeploy's ``share_inputs`` per decode step (CPU Paddle,
our FD 2.4 replica).

The watch is scoped to the FastDeploy calls that need it (``patches/_tensor_watch.py``): for the
duration of an insert or ``_prepare_inputs``, ``runner.share_inputs`` is a ``ScopedInputs`` view
that hands out a ``StandIn`` for a watched tensor; Paddle's tensor class is not patched. This
prints, side by side in one run:

- per replica decode step (plugin enabled, the default features): the watched calls (scopes), the
  item accesses through the view, the stand-in calls (``__setitem__``, ``__getitem__``, ``numpy``);
- ns per operation with the watch and without it (a plain dict access, Paddle's own method; a
  scope's set-up and end against nothing);
- the product: us of host time per decode step the watch adds inside its scopes, and outside
  them (Paddle's ``Tensor`` methods with step_syncs applied against without: the same objects).

The replica's step makes more tensor calls than FD's (its stand-in ops are Python), so the product
is an upper bound for FD's own calls. Run: ``python benchmarks/tensor_watch_overhead.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import paddle

METHODS = ("__setitem__", "__getitem__", "numpy")


def per_step(steps: int, fd_root: str | None = None, batch: int = 16) -> tuple[dict, int]:
    """Scopes, view accesses and stand-in calls per executed decode step, and every call of Paddle's
    tensor methods in the process (each of which the class-wide patch of these methods dispatched).
    ``fd_root``: FastDeploy's own code there steps (its real-steps environment), else the replica."""
    import contextlib
    import sys

    from fd_async_copy_plugin.runtime import collecting
    from fd_async_copy_plugin.testing.harness import Variant, device_for, plugin_state
    from fd_async_copy_plugin.testing.reference import ROOTS
    from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

    counts: collections.Counter = collections.Counter()
    requests = [Request(f"w{i}", [(7 * i + j) % 200 + 3 for j in range(4 + i % 9)], max_tokens=steps,
                        eos_token_ids=[-1]) for i in range(batch)]
    config = DriverConfig(max_num_seqs=batch, vocab_size=256, max_model_len=steps + 32, chunk_size=16)
    if fd_root:
        from fd_async_copy_plugin.testing.real_steps import check
        from fd_async_copy_plugin.testing.real_steps.environment import prepare

        with contextlib.redirect_stdout(sys.stderr):
            prepare(fd_root)
        target = check.real_target()
        root, modules = target.root, target.modules()
        variant = Variant("default", root, True, None)
    else:
        root, modules = ROOTS["fd24"], None
        variant = Variant("p", root, True, ("logprobs", "stop_flag", "sampled_tokens", "step_syncs"))
    counted = [*_COUNTED, *((paddle.Tensor, name) for name in METHODS)]
    saved = {(cls, name): vars(cls)[name] for cls, name in counted}
    for cls, name in counted:  # Paddle's first: the plugin (applied below) finds them as they are
        setattr(cls, name, _counting(vars(cls)[name], name, counts, "Tensor" if cls is paddle.Tensor else None))
    try:
        with contextlib.redirect_stdout(sys.stderr), device_for("host"), plugin_state(variant, "host"), \
                collecting():
            result = run_decode(root, config, requests, max_steps=steps + 8, modules=modules)
    finally:
        for cls, name in counted:
            setattr(cls, name, saved[cls, name])
    assert counts["watching.__init__"] > 0 and counts["StandIn.__setitem__"] > 0, counts  # the watch ran
    return {name: n / result.executed_steps for name, n in counts.items()}, result.executed_steps


def _counted_members():
    from fd_async_copy_plugin.patches._tensor_watch import ScopedInputs, StandIn, watching

    return ((watching, "__init__"), (ScopedInputs, "__getitem__"),
            *((StandIn, name) for name in METHODS))


_COUNTED = ()


def _counting(method, name, counts, owner=None):
    label = f"{owner or method.__qualname__.split('.')[0]}.{name}"

    def counted(*args, **kwargs):
        counts[label] += 1
        return method(*args, **kwargs)

    return counted


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - start) / repeat)
    return min(times) * 1e9


def ns_per_op(repeat: int) -> dict:
    """ns per operation: (without the watch, with it)."""
    import fd_async_copy_plugin
    from fd_async_copy_plugin.patches._tensor_watch import Watched, watching
    from fd_async_copy_plugin.testing.reference import ROOTS

    class Runner:
        pass

    class Passing(Watched):  # the handlers' own work is the shadow's, not the watch's
        pass

    keys = ("seq_lens_encoder", "is_block_step", "step_seq_lens_decoder", "bad_tokens_len", "block_tables")
    runner = Runner()
    runner.share_inputs = {k: paddle.to_tensor(np.zeros(16, dtype="int64")) for k in (*keys, "other")}
    runner.seq_lens_this_time_buffer = paddle.to_tensor(np.zeros(16, dtype="int32"))
    si = runner.share_inputs
    t = si["seq_lens_encoder"]
    handlers = [Passing(si[k]) for k in keys] + [Passing(runner.seq_lens_this_time_buffer)]
    out = {}

    def enter_exit():
        with watching(handlers, runner=runner):
            pass

    out["scope (enter + exit)"] = (0.0, _best(enter_exit, repeat))
    with watching(handlers, runner=runner):
        view = runner.share_inputs
        stand_in = view["seq_lens_encoder"]
        out["view access, watched key"] = (_best(lambda: si["seq_lens_encoder"], repeat),
                                          _best(lambda: view["seq_lens_encoder"], repeat))
        out["view access, other key"] = (_best(lambda: si["other"], repeat), _best(lambda: view["other"], repeat))
        out["stand-in __setitem__"] = (_best(lambda: t.__setitem__(3, 5), repeat),
                                       _best(lambda: stand_in.__setitem__(3, 5), repeat))
        out["stand-in __getitem__"] = (_best(lambda: t[3], repeat), _best(lambda: stand_in[3], repeat))
        out["stand-in numpy"] = (_best(lambda: t.numpy(), repeat), _best(lambda: stand_in.numpy(), repeat))

    # outside the scopes: Paddle's own methods with step_syncs applied and without it
    calls = {"__setitem__": lambda: t.__setitem__(3, 5), "__getitem__": lambda: t[3], "numpy": lambda: t.numpy()}
    fd_async_copy_plugin.disable()
    own = {name: vars(paddle.Tensor)[name] for name in METHODS}
    plain = {name: _best(fn, repeat) for name, fn in calls.items()}
    fd_async_copy_plugin.enable(features=("stop_flag", "step_syncs"), backend="host", root=ROOTS["fd24"])
    __import__(f"{ROOTS['fd24']}.worker.gpu_model_runner")
    __import__(f"{ROOTS['fd24']}.model_executor.pre_and_post_process")
    try:
        assert fd_async_copy_plugin.status()["features"]["step_syncs"]["state"] == "applied"
        assert {name: vars(paddle.Tensor)[name] for name in METHODS} == own  # Paddle's own objects
        applied = {name: _best(fn, repeat) for name, fn in calls.items()}
    finally:
        fd_async_copy_plugin.disable()
    for name in METHODS:
        out[f"Tensor.{name}, outside"] = (plain[name], applied[name])
    return out


#: which per-step count multiplies which timing row
_ROWS = (
    ("scope (enter + exit)", "watching.__init__"),
    ("view access, watched key", None),  # counted with the other key: one count of all accesses
    ("view access, other key", "ScopedInputs.__getitem__"),
    ("stand-in __setitem__", "StandIn.__setitem__"),
    ("stand-in __getitem__", "StandIn.__getitem__"),
    ("stand-in numpy", "StandIn.numpy"),
)


#: ns the class-wide patch of these methods (the watch before it was scoped to share_inputs) added to
#: every call in the process, outside its scopes: measured 2026-12-02 at 61ac2d2 on this kind of
#: machine (the previous record in benchmarks/results/tensor_watch_overhead.txt)
CLASS_WIDE_NS = {"__setitem__": 645, "__getitem__": 702, "numpy": 469}


def main(argv=None) -> int:
    global _COUNTED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="decode steps of the run (default 24)")
    parser.add_argument("--batch", type=int, default=16, help="requests, all inserted at once (default 16)")
    parser.add_argument("--fd-root", help="step FastDeploy's own code in this tree (real-steps environment) "
                                          "instead of the replica")
    parser.add_argument("--repeat", type=int, default=20000, help="calls per timing loop (default 20000)")
    args = parser.parse_args(argv)
    _COUNTED = _counted_members()
    counts, steps = per_step(args.steps, args.fd_root, args.batch)
    timing = ns_per_op(args.repeat)
    where = f"FastDeploy at {args.fd_root}" if args.fd_root else "replica FD 2.4"
    print(f"step_syncs share_inputs watch: {where}, B={args.batch}, {steps} decode steps, CPU Paddle "
          f"{paddle.__version__}")
    print(f"{'operation':<26} {'per step':>8} {'plain ns':>9} {'watched ns':>11} {'added ns':>9} {'us/step':>8}")
    inside = 0.0
    for row, count in _ROWS:
        plain, watched = timing[row]
        n = counts.get(count, 0.0) if count else 0.0
        added = max(0.0, watched - plain) * n / 1000
        inside += added
        shown = f"{n:>8.1f}" if count else f"{'-':>8}"
        print(f"{row:<26} {shown} {plain:>9.0f} {watched:>11.0f} {watched - plain:>9.0f} {added:>8.1f}")
    outside = class_wide = 0.0
    for name in METHODS:
        plain, applied = timing[f"Tensor.{name}, outside"]
        n = counts.get(f"Tensor.{name}", 0.0)
        class_wide += CLASS_WIDE_NS[name] * n / 1000
        print(f"{'Tensor.' + name + ', outside':<26} {n:>8.1f} {plain:>9.0f} {applied:>11.0f} {applied - plain:>9.0f} "
              f"{0.0:>8.1f}")
    print(f"added host time per decode step inside watched calls: {inside:.1f} us (view and stand-in "
          "dispatch; the handlers' own shadow work is not the watch's)")
    print(f"added host time per decode step outside watched calls: {outside:.1f} us (Paddle's own Tensor "
          "methods: step_syncs patches none)")
    print(f"the class-wide patch instead: the Tensor calls above x its recorded ns per call "
          f"({', '.join(f'{k} {v}' for k, v in CLASS_WIDE_NS.items())}) = {class_wide:.1f} us per decode step, "
          "on every thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
