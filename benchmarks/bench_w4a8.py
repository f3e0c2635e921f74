"""W4A8 (awq::int4_mm_a8, act_quant="int8") vs our W4A16 (awq::int4_mm) vs dense bf16, one linear.

    python benchmarks/bench_w4a8.py                 # K=4096 N=11008 G=128, bf16, 2 threads
    python benchmarks/bench_w4a8.py --m 1 32 --reps 5
    python benchmarks/bench_w4a8.py --smoke         # tiny shape, seconds

Eager op calls (the same native kernels the Inductor template inlines). Methods are interleaved
round-robin inside every repetition (noisy shared machine), medians in ms, and the ratios
W4A16/W4A8 and dense/W4A8 (> 1: W4A8 faster) are reported. ISA: config.force_isa or the CPU's best.
Where the CPU has AVX512-BF16/VNNI, the dot-product peak (``peak_probe``: vdpbf16ps for W4A16,
vpdpbusd for W4A8) is timed as two more methods in the same reps, and each op's share of its peak
(2 M N K operations / time) is printed: the yardstick of the compute-bound rows (M >= 16).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import peak_probe  # noqa: E402  (benchmarks/ is sys.path[0])
from awq_inductor import AWQLinear
from awq_inductor.kernels import isa as isa_mod


def make_layer(K, N, G, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
    return q, z, s


def peak_methods(threads: int) -> dict:
    """kind -> (one pass of the dot-product peak probe, its operations), or {} without AVX512-BF16/VNNI."""
    try:
        return {kind: peak_probe.peak_calls(threads, kind, iters=1 << 18) for kind in peak_probe.KINDS}
    except ValueError as e:
        print(f"no peak column: {e}")
        return {}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--K", type=int, default=4096)
    ap.add_argument("--N", type=int, default=11008)
    ap.add_argument("--G", type=int, default=128)
    ap.add_argument("--m", type=int, nargs="*", default=[1, 32, 128, 512, 2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=0, help="0: adaptive (>= 5 reps, ~1 s per M)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.smoke:
        a.K, a.N, a.G, a.m = 256, 320, 128, [1, 32]
    torch.set_num_threads(a.threads)
    q, z, s = make_layer(a.K, a.N, a.G)
    w16 = AWQLinear.from_canonical(q, z, s, group_size=a.G)
    w8 = AWQLinear.from_canonical(q, z, s, group_size=a.G, act_quant="int8")
    dense = w16.dequantize().to(torch.bfloat16)
    methods = {
        "w4a8": lambda x: w8(x),
        "w4a16": lambda x: w16(x),
        "dense_bf16": lambda x: torch.nn.functional.linear(x, dense),
    }
    peaks = peak_methods(a.threads)
    methods.update({f"peak_{k}": call for k, (call, _) in peaks.items()})
    print(f"isa={isa_mod.select()} threads={a.threads} K={a.K} N={a.N} G={a.G} bf16, median ms")
    print(f"{'M':>5} {'w4a8':>9} {'w4a16':>9} {'dense':>9} {'w4a16/w4a8':>11} {'dense/w4a8':>11}"
          f"{'  w4a16 of bf16 peak  w4a8 of int8 peak' if peaks else ''}")
    rows = []
    for M in a.m:
        x = torch.randn(M, a.K, dtype=torch.bfloat16)
        with torch.no_grad():
            for f in methods.values():  # warm-up (builds kernels once)
                f(x)
            times = {k: [] for k in methods}
            reps = a.reps
            if reps == 0:
                t0 = time.perf_counter()
                for f in methods.values():
                    f(x)
                one = time.perf_counter() - t0
                reps = int(max(5, min(50, 1.5 / max(one, 1e-6))))
            for _ in range(reps):
                for k, f in methods.items():  # interleaved
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = dict(M=M, reps=reps, **{f"{k}_ms": round(v, 4) for k, v in med.items()},
                   w4a16_over_w4a8=round(med["w4a16"] / med["w4a8"], 3),
                   dense_over_w4a8=round(med["dense_bf16"] / med["w4a8"], 3))
        shares = ""
        if peaks:  # operations per ms of the op over those of the peak pass of the same reps
            ops = 2 * M * a.N * a.K
            for op, kind in (("w4a16", "bf16"), ("w4a8", "int8")):
                row[f"{op}_peak_share"] = (ops / med[op]) / (peaks[kind][1] / med[f"peak_{kind}"])  # unrounded: a smoke shape is ~0.1%
            row["peak_TFLOPs"] = {k: round(ops_k / med[f"peak_{k}"] / 1e9, 3) for k, (_, ops_k) in peaks.items()}
            shares = f"{row['w4a16_peak_share']:21.0%} {row['w4a8_peak_share']:18.0%}"
        rows.append(row)
        print(f"{M:5d} {med['w4a8']:9.3f} {med['w4a16']:9.3f} {med['dense_bf16']:9.3f} "
              f"{row['w4a16_over_w4a8']:11.2f} {row['dense_over_w4a8']:11.2f}{shares}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(K=a.K, N=a.N, G=a.G, threads=a.threads, isa=isa_mod.select(), rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
