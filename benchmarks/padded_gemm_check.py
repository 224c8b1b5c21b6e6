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
same call is checked too (cuBLAS is deterministic for a fixed shape on one GPU), and so is what
CUDA-graph decode relies on: at a fixed M (a captured batch size), rows past the real ones holding
different values (padding) leave the real rows' bits alone - FastDeploy 2.4 replays its decode
graph at the captured size above the token count, so the overlap schedule's upper bound changes
the GEMMs only when it falls into another captured size than the real count.

    python3 benchmarks/padded_gemm_check.py [--framework torch|paddle] [--max-m 256] [--output FILE]

``--framework paddle`` runs the same measurement with ``paddle.matmul`` on a Paddle GPU build - the
check an FD user can make on their own GPU and Paddle (not run by the project: no Paddle GPU build
on its machines; its CPU path is smoke-tested with ``--device cpu``, which measures the CPU GEMM).

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


class _Torch:
    name = "torch"

    def __init__(self, device: str, dtype: str) -> None:
        import torch
        import torch.nn.functional as F

        if device == "gpu" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device for PyTorch")
        self.torch, self.F = torch, F
        self.device = "cuda" if device == "gpu" else "cpu"
        self.gen = torch.Generator(device=self.device).manual_seed(2024)
        self.dtype = getattr(torch, dtype)

    def describe(self) -> str:
        t = self.torch
        where = t.cuda.get_device_name() if self.device == "cuda" else "CPU"
        return f"{where}, torch {t.__version__}, CUDA {t.version.cuda}"

    def randn(self, rows, cols, scale=1.0):
        return self.torch.randn(rows, cols, device=self.device, dtype=self.dtype, generator=self.gen) * scale

    def ops(self, w):
        wt = w.t().contiguous()
        return (("matmul", lambda a: self.torch.matmul(a, w)), ("linear", lambda a: self.F.linear(a, wt)))

    def equal(self, a, b) -> bool:
        return bool(self.torch.equal(a, b))

    def concat(self, a, b):
        return self.torch.cat([a, b])

    def max_diff(self, a, b) -> float:
        return float((a.float() - b.float()).abs().max())


class _Paddle:
    name = "paddle"

    def __init__(self, device: str, dtype: str) -> None:
        import paddle

        if device == "gpu" and not paddle.device.is_compiled_with_cuda():
            raise RuntimeError("this Paddle is not a GPU build")
        paddle.set_device(device)
        paddle.seed(2024)
        self.paddle = paddle
        self.dtype = dtype

    def describe(self) -> str:
        p = self.paddle
        where = p.device.cuda.get_device_name() if p.get_device().startswith("gpu") else "CPU"
        return f"{where}, paddle {p.__version__}, CUDA {p.version.cuda()}"

    def randn(self, rows, cols, scale=1.0):
        return (self.paddle.randn([rows, cols], dtype="float32") * scale).astype(self.dtype)

    def ops(self, w):
        # Paddle's Linear keeps the weight [in, out] and calls matmul(x, w); transpose_y is F.linear's layout
        wt = w.t().contiguous()
        return (("matmul", lambda a: self.paddle.matmul(a, w)),
                ("linear", lambda a: self.paddle.matmul(a, wt, transpose_y=True)))

    def equal(self, a, b) -> bool:
        import numpy as np

        return np.array_equal(a.astype("float32").numpy(), b.astype("float32").numpy())

    def max_diff(self, a, b) -> float:
        return float((a.astype("float32") - b.astype("float32")).abs().max())

    def concat(self, a, b):
        return self.paddle.concat([a, b])


def measure(fw, shapes, max_m: int, pads=PADS, dtype="bfloat16") -> list:
    """Lines of the report: per shape and op, the (M, d) pairs whose real rows change bits."""
    lines = [
        f"padded_gemm_check: {fw.describe()}, {dtype}, M = 1..{max_m}, d = {tuple(pads)}",
        f"{'shape':14s} {'op':7s} {'pairs differing':>16s}  first M differing per d{'':18s} max |diff|  "
        "fixed M (repeat; padding rewritten)",
    ]
    total = differing = 0
    for name, k, n in shapes:
        x = fw.randn(max_m + max(pads), k)
        w = fw.randn(k, n, scale=k**-0.5)
        for op_name, op in fw.ops(w):
            first: dict = {}
            count = pairs = 0
            worst = 0.0
            repeat_ok = True
            for m in range(1, max_m + 1):
                real = op(x[:m])
                repeat_ok &= fw.equal(real, op(x[:m]))
                for d in pads:
                    padded = op(x[: m + d])[:m]
                    pairs += 1
                    if not fw.equal(real, padded):
                        count += 1
                        first.setdefault(d, m)
                        worst = max(worst, fw.max_diff(real, padded))
            pad_changes = 0  # fixed M, the last d rows rewritten: the real rows must not move
            for m in range(2, max_m + 1):
                base = op(x[:m])
                for d in pads:
                    if d < m:
                        other = fw.concat(x[: m - d], fw.randn(d, k))
                        pad_changes += not fw.equal(base[: m - d], op(other)[: m - d])
            repeat_ok &= pad_changes == 0
            total += pairs
            differing += count
            firsts = ", ".join(f"d={d}: {first.get(d, '-')}" for d in pads)
            lines.append(f"{name:14s} {op_name:7s} {count:6d}/{pairs:<6d} {100 * count / pairs:5.1f}%  {firsts:40s} "
                         f"{worst:9.3g}  {'same' if repeat_ok else 'DIFFERS'}")
    lines.append(f"overall: {differing}/{total} (M, d) pairs ({100 * differing / max(1, total):.1f}%) give the real rows "
                 "different bits when d padded rows are added")
    lines.append("RESULT: MEASURED (a share above 0 means the overlap schedule's padded token count can change real "
                 "rows' bits on a step after a request finished, as FastDeploy 2.5's overlap schedule can)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="bfloat16 (FastDeploy's serving dtype); CPU Paddle has float32 matmul only")
    parser.add_argument("--max-m", type=int, default=256)
    parser.add_argument("--shapes", choices=("models", "tiny"), default="models",
                        help="tiny: two small shapes, for a smoke test of the script")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    try:
        fw = (_Torch if args.framework == "torch" else _Paddle)(args.device, args.dtype)
    except (ImportError, RuntimeError) as exc:
        print(f"padded_gemm_check: cannot run with {args.framework} on {args.device}: {exc}", file=sys.stderr)
        return 2
    shapes = SHAPES if args.shapes == "models" else (("tiny a", 64, 32), ("tiny b", 128, 16))
    text = "\n".join(measure(fw, shapes, args.max_m, dtype=args.dtype))
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
