#!/usr/bin/env python3
"""H200 measurement: does a GEMM's result for the real rows change when padded rows are added?

Why: the ``overlap`` feature (like FastDeploy 2.5's overlap schedule, #6259) prepares step N+1
before step N's token count is known, with an upper bound of it: on a step right after a request
finished (or block-stepped), the forward runs on M + d packed rows, d of them padding, where
FastDeploy 2.4 runs M. The real rows are bit-identical to FD 2.4's only if every GEMM of the model
gives the same bits for row i whatever M is - cuBLAS picks its kernel (tiles, split-K) by shape, so
that is a property to measure, not to assume. This script measures it with PyTorch's cuBLAS/cuBLASLt
GEMMs (Paddle's matmul also calls cuBLASLt, but Paddle itself is not on the machine: the numbers are
a proxy for FastDeploy's dense bf16 layers, not a measurement inside FastDeploy).

For decode-step row counts M = 1..MAX_M and paddings d, for layer shapes of a 7-8B and a 1.5B
model, in bf16 (FastDeploy's serving dtype): ``(X[:M+d] @ W)[:M]`` against ``X[:M] @ W``, byte for
byte, for ``torch.matmul`` (x @ W, Paddle's layout) and ``F.linear`` (x @ W^T). A repeat of the
same call is checked too (cuBLAS is deterministic for a fixed shape on one GPU).

    python3 benchmarks/padded_gemm_check.py [--max-m 256] [--output FILE]

It prints one line per shape and op: the share of (M, d) pairs whose real rows differ, the first
such M per d, and the largest difference. RESULT: MEASURED (the share is the finding; the
README quotes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: (name, K, N): the dense layers of one decoder layer; 7-8B (hidden 4096, GQA 8 kv heads, MLP
#: 14336) and 1.5B (hidden 1536, 2 kv heads, MLP 8960)
SHAPES = (
    ("8B qkv", 4096, 6144),
    ("8B o_proj", 4096, 4096),
    ("8B gate_up", 4096, 28672),
    ("8B down", 14336, 4096),
    ("1.5B qkv", 1536, 2048),
    ("1.5B gate_up", 1536, 17920),
    ("1.5B down", 8960, 1536),
    ("8B lm_head", 4096, 128256),
)
PADS = (1, 2, 4, 8)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-m", type=int, default=256)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("padded_gemm_check: needs PyTorch with CUDA (the GPU machine has it)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("padded_gemm_check: no CUDA device", file=sys.stderr)
        return 2

    lines = [
        f"padded_gemm_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"BLAS {getattr(torch.backends.cuda, 'preferred_blas_library', lambda: '?')()}, bf16, "
        f"M = 1..{args.max_m}, d = {PADS}",
        f"{'shape':14s} {'op':7s} {'pairs differing':>16s}  first M differing per d{'':18s} max |diff|  repeat",
    ]
    gen = torch.Generator(device="cuda").manual_seed(2024)
    total = differing = 0
    for name, k, n in SHAPES:
        x = torch.randn(args.max_m + max(PADS), k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
        wt = w.t().contiguous()
        for op_name, op in (("matmul", lambda a: torch.matmul(a, w)), ("linear", lambda a: F.linear(a, wt))):
            first: dict = {}
            count = pairs = 0
            worst = 0.0
            repeat_ok = True
            for m in range(1, args.max_m + 1):
                real = op(x[:m])
                repeat_ok &= bool(torch.equal(real, op(x[:m])))
                for d in PADS:
                    padded = op(x[: m + d])[:m]
                    pairs += 1
                    if not torch.equal(real, padded):
                        count += 1
                        first.setdefault(d, m)
                        worst = max(worst, float((real.float() - padded.float()).abs().max()))
            total += pairs
            differing += count
            firsts = ", ".join(f"d={d}: {first.get(d, '-')}" for d in PADS)
            lines.append(f"{name:14s} {op_name:7s} {count:6d}/{pairs:<6d} {100 * count / pairs:5.1f}%  {firsts:40s} "
                         f"{worst:9.3g}  {'same' if repeat_ok else 'DIFFERS'}")
    lines.append(f"overall: {differing}/{total} (M, d) pairs ({100 * differing / max(1, total):.1f}%) give the real rows "
                 "different bits when d padded rows are added")
    lines.append("RESULT: MEASURED (a share above 0 means the overlap schedule's padded token count can change real "
                 "rows' bits on a step after a request finished, as FastDeploy 2.5's overlap schedule can)")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
