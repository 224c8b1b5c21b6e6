#!/usr/bin/env python3
"""GPU measurement: can a MoE layer's padding rows change the real rows' bits?

Why: under FD 2.4's CUDA-graph decode a step replays the graph captured for the size above its
token count M, so rows M..captured hold padding. FD 2.4 leaves stale contents there; the overlap
schedule's opt-in ``launch`` count (docs/overlap-token-count.md) leaves token id 2 there (the
bound's fill). Attention ignores padding rows and a dense GEMM at a fixed row count gives the real
rows the same bits whatever the padding holds (``padded_gemm_check.txt``). A MoE layer is
different: the router sends padding rows to experts like real rows, so the padding's contents
change how many rows each expert gets. Whether that reaches a real row's bits depends on how the
expert GEMMs are chosen:
- a grouped GEMM that reads the per-expert row offsets on the device (CUTLASS grouped GEMM, as
  FD's MoE kernels and ``torch._grouped_mm`` are) picks its kernel by the total row count, which a
  captured graph fixes; each row's dot products run in one order whatever the other groups hold;
- an implementation that picks a kernel per expert by that expert's row count (one GEMM per
  expert, sized on the host) can give a real row other bits when the padding moves rows between
  experts (as ``padded_gemm_check`` shows for dense GEMMs of another M).

This script measures both with PyTorch on the GPU (no Paddle, no FD kernels: a proxy for FD's MoE,
not a measurement inside FD). For MoE shapes of ERNIE-4.5-21B-A3B and Qwen3-30B-A3B in bf16, for
captured sizes C and real counts M < C, it runs the layer on ``[X_real; padding]`` twice, padding
once random (stale contents) and once token 2's embedding, and compares rows 0..M-1 byte for byte:
the grouped GEMM eagerly and replayed from one captured CUDA graph, and one GEMM per expert.

    python3 benchmarks/moe_padding_rows_check.py [--output FILE] [--quick]

RESULT: MEASURED (the shares are the finding).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

#: (name, hidden, experts, top-k, expert intermediate size)
MODELS = (("ERNIE-4.5-21B-A3B", 2560, 64, 6, 1536), ("Qwen3-30B-A3B", 2048, 128, 8, 768))
#: FD 2.4's captured decode sizes up to 128 (config.py: 1, 2, 4, 8, then by 8 to 128)
CAPTURED = (2, 4, 8, 16, 24, 32, 64, 128)


class MoE:
    """Top-k routed experts (gate in fp32, SwiGLU experts in bf16), rows combined in top-k order."""

    def __init__(self, torch, hidden, experts, top_k, inter, gen) -> None:
        self.t, self.e, self.k, self.inter = torch, experts, top_k, inter
        dev, bf = "cuda", torch.bfloat16
        self.gate = torch.randn(hidden, experts, device=dev, generator=gen) * hidden**-0.5
        # [E, N, K] stored, used as [E, K, N] with stride(-2) == 1: the layout grouped GEMMs want
        self.w1 = (torch.randn(experts, 2 * inter, hidden, device=dev, generator=gen) * hidden**-0.5).to(bf)
        self.w2 = (torch.randn(experts, hidden, inter, device=dev, generator=gen) * inter**-0.5).to(bf)
        self.w1 = self.w1.transpose(-2, -1)
        self.w2 = self.w2.transpose(-2, -1)
        self.arange = torch.arange(experts, device=dev)
        self.grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm

    def _route(self, x):
        t = self.t
        weights, idx = t.topk(t.softmax(x.float() @ self.gate, dim=-1), self.k, dim=-1)
        flat = idx.reshape(-1)
        order = t.argsort(flat, stable=True)
        counts = (flat.unsqueeze(1) == self.arange).sum(0)  # no host sync: capturable
        return weights, order, counts

    def _combine(self, y, order, weights, rows):
        unperm = self.t.empty_like(y)
        unperm[order] = y
        return (unperm.view(rows, self.k, -1).float() * weights.unsqueeze(-1)).sum(1).to(self.t.bfloat16)

    def _swiglu(self, h):
        return self.t.nn.functional.silu(h[:, : self.inter]) * h[:, self.inter :]

    def grouped(self, x):
        weights, order, counts = self._route(x)
        offs = self.t.cumsum(counts, 0).to(self.t.int32)
        xs = x[order // self.k]
        y = self.grouped_mm(self._swiglu(self.grouped_mm(xs, self.w1, offs=offs)), self.w2, offs=offs)
        return self._combine(y, order, weights, x.shape[0])

    def per_expert(self, x):
        weights, order, counts = self._route(x)
        xs, start = x[order // self.k], 0
        y = self.t.empty_like(xs)
        for e, n in enumerate(counts.tolist()):  # sized on the host, one GEMM per expert
            if n:
                part = xs[start : start + n]
                y[start : start + n] = self._swiglu(part @ self.w1[e]) @ self.w2[e]
                start += n
        return self._combine(y, order, weights, x.shape[0])


def measure(torch, quick: bool) -> list:
    gen = torch.Generator(device="cuda").manual_seed(2024)
    lines = [f"moe_padding_rows_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}, bfloat16; captured sizes {CAPTURED}; padding: random (stale) vs "
             "token 2's embedding",
             f"{'model':20s} {'expert GEMMs':34s} {'(C, M) pairs differing':>24s}  max |diff|  repeat same"]
    totals = {}
    for name, hidden, experts, top_k, inter in MODELS[:1] if quick else MODELS:
        moe = MoE(torch, hidden, experts, top_k, inter, gen)
        emb2 = torch.randn(1, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        stats = {key: [0, 0, 0.0, True] for key in ("grouped, eager", "grouped, one CUDA graph per C",
                                                    "one GEMM per expert, eager")}
        for cap in CAPTURED[:4] if quick else CAPTURED:
            static = torch.zeros(cap, hidden, device="cuda", dtype=torch.bfloat16)
            moe.grouped(static)  # warm-up before capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = moe.grouped(static)

            def replay(x):
                static.copy_(x)
                graph.replay()
                return static_out.clone()

            runs = {"grouped, eager": moe.grouped, "grouped, one CUDA graph per C": replay,
                    "one GEMM per expert, eager": moe.per_expert}
            for m in range(1, cap):
                real = torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)
                stale = torch.cat([real, torch.randn(cap - m, hidden, device="cuda", generator=gen).to(real.dtype)])
                token2 = torch.cat([real, emb2.expand(cap - m, hidden)])
                for key, run in runs.items():
                    a = run(stale)[:m]
                    b = run(token2)[:m]
                    s = stats[key]
                    s[0] += 1
                    if not torch.equal(a, b):
                        s[1] += 1
                        s[2] = max(s[2], float((a.float() - b.float()).abs().max()))
                    s[3] &= bool(torch.equal(a, run(stale)[:m]))
        for key, (pairs, differing, worst, same) in stats.items():
            lines.append(f"{name:20s} {key:34s} {differing:9d}/{pairs:<6d} {100 * differing / pairs:5.1f}%  "
                         f"{worst:10.3g}  {'same' if same else 'DIFFERS'}")
            tot = totals.setdefault(key, [0, 0])
            tot[0] += pairs
            tot[1] += differing
    for key, (pairs, differing) in totals.items():
        lines.append(f"overall, {key}: {differing}/{pairs} pairs ({100 * differing / max(1, pairs):.1f}%) give real "
                     "rows other bits when only the padding rows' contents change")
    lines.append("RESULT: MEASURED (0 for the grouped GEMM means padding contents cannot reach real rows through a "
                 "device-offset grouped GEMM; a share above 0 for one GEMM per expert means they can where kernels "
                 "are chosen per expert)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, captured sizes up to 16")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device for PyTorch")
        if getattr(torch.nn.functional, "grouped_mm", None) is None and not hasattr(torch, "_grouped_mm"):
            raise RuntimeError(f"torch {torch.__version__} has no grouped GEMM (torch._grouped_mm)")
    except (ImportError, RuntimeError) as exc:
        print(f"moe_padding_rows_check: cannot run: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    text = "\n".join(measure(torch, args.quick) + [f"({time.perf_counter() - start:.1f} s)"])
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
