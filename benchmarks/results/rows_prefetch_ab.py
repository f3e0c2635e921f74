"""Calls of 5 rows or more with and without the rows' prefetch (Thresholds::rows_prefetch: the next tile,
512 B into L1 and 4 KB into L2 in each stream),
one K x N layer, hot (the same layer every call), interleaved with the dot-product peak, order rotated.

    python benchmarks/results/rows_prefetch_ab.py w4a8|w4a16 M,M,... [KxN] [REPS]

Each variant is the machine's plan with only ``rows_prefetch`` changed (the outputs are
checked bit-identical); the share is 2 M N K / time over the peak (vpdpbusd for W4A8, vdpbf16ps for W4A16).
"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import peak_probe  # noqa: E402
from rotating_rounds import rotated_medians  # noqa: E402
from awq_inductor import AWQLinear  # noqa: E402
from awq_inductor.kernels import native, tuning_cache  # noqa: E402


def main(argv):
    scheme, ms = argv[0], [int(m) for m in argv[1].split(",")]
    K, N = map(int, (argv[2] if len(argv) > 2 else "4096x11008").split("x"))
    reps, G = int(argv[3]) if len(argv) > 3 else 30, 128
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
    layer = AWQLinear.from_canonical(q, z, s, group_size=G, act_quant="int8" if scheme == "w4a8" else None)
    weights = [getattr(layer, w.name) for w in layer.op.scheme.weights]
    kern = native.get_kernel(layer.op.name, torch.bfloat16)
    plan = tuning_cache.plan_for(layer.op, kern.isa, torch.bfloat16, K, N, G)
    print(f"{scheme} {K}x{N} G{G}, 2 threads, plan {plan}")
    variants = {f"rows_prefetch={v}": dataclasses.replace(plan, rows_prefetch=v) for v in (0, 1)}
    peak, peak_ops = peak_probe.peak_calls(2, "int8" if scheme == "w4a8" else "bf16", iters=1 << 18)
    for M in ms:
        x = torch.randn(M, K, dtype=torch.bfloat16)
        fns = {k: (lambda p: lambda: kern(x, *weights, None, G, N, plan=p))(p) for k, p in variants.items()}
        outs = [f() for f in fns.values()]
        assert all(torch.equal(o, outs[0]) for o in outs)
        fns["peak"] = peak
        med = rotated_medians(fns, reps)
        rate = peak_ops / med["peak"]
        cells = "  ".join(f"{k} {med[k] * 1e3:.3f} ms ({2 * M * K * N / med[k] / rate:.0%})" for k in variants)
        print(f"M={M}: {cells}  off/on {med['rows_prefetch=0'] / med['rows_prefetch=1']:.2f}  peak {rate / 1e12:.3f} T/s")


if __name__ == "__main__":
    main(sys.argv[1:])
