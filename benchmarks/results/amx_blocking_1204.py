"""Our W4A16 op on a forced AMX plan vs F.linear on the dequantized bf16 weight, in one process,
interleaved (alternating order per rep), medians in ms. The harness of amx_blocking_1204.md; the flush
(cold-cache) variant of the same comparison is amx_large_m_flush.py.

    python benchmarks/results/amx_blocking_1204.py 4096x4096,11008x4096 128,512
    python benchmarks/results/amx_blocking_1204.py 4096x4096 4,16 --copies 6    # + round robin over copies
    python benchmarks/results/amx_blocking_1204.py 4096x4096 1,4,8 --amx-min-m 9  # M <= 8: bf16 decode kernel

``--variants name=value,...`` times the op once per variant with the environment variable AWQ_MC set
to value before each call: only a scratch build whose driver reads it changes with it (the M-block
experiment: in int4_mm_driver, ``Mc`` from ``amx_block_rows(..., getenv("AWQ_MC") ? atoi(...) :
kAmxMcMax)`` and ``m_outer`` true when it is set; "0" = unset).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_linear import make_layer  # noqa: E402
from awq_inductor import AWQLinear, config  # noqa: E402
from awq_inductor.kernels.plan import NEVER  # noqa: E402


def timed(fns, reps):
    for f in fns.values():
        f()
        f()
    ts = {k: [] for k in fns}
    for r in range(reps):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}


def with_env(fn, value):
    def run():
        os.environ["AWQ_MC"] = value
        return fn()
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shapes", help="KxN,...")
    p.add_argument("m", help="M,...")
    p.add_argument("--amx-min-m", type=int, default=0, help="from 9: M <= 8 runs the bf16 decode kernel")
    p.add_argument("--copies", type=int, default=1, help="also time round robin over this many weight copies")
    p.add_argument("--variants", default="", help="name=AWQ_MC value,... (scratch builds only, see above)")
    p.add_argument("--min-reps", type=int, default=6)
    a = p.parse_args()
    torch.set_num_threads(2)
    config.kernel_plan = dict(amx_min_m=a.amx_min_m, panel_min_m=NEVER,
                              bf16_f32_min_m=9 if a.amx_min_m >= 9 else NEVER)
    for K, N in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
        q, z, s = make_layer(K, N, 128)
        lins = [AWQLinear.from_canonical(q, z, s, group_size=128) for _ in range(a.copies)]
        w = lins[0].dequantize().to(torch.bfloat16)
        for M in (int(v) for v in a.m.split(",")):
            x = torch.randn(M, K, dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            err = ((lins[0](x).float() - ref).abs().max() / ref.abs().max()).item()
            ours = lambda: lins[0](x)  # noqa: E731
            fns = {k: with_env(ours, v) for k, v in (kv.split("=") for kv in a.variants.split(",") if kv)}
            fns = fns or {"ours": ours}
            if a.copies > 1:
                fns["round_robin"] = lambda: [lin(x) for lin in lins]
            fns["dense"] = lambda: F.linear(x, w)
            med = timed(fns, max(a.min_reps, int(3000 / M)))
            if "round_robin" in med:
                med["round_robin"] /= a.copies
            fl = 2 * M * N * K
            print(f"K={K} N={N} M={M}: " + "  ".join(
                f"{k} {v:.3f} ms ({fl / v / 1e9:.2f} TF/s, /dense {v / med['dense']:.3f})" for k, v in med.items())
                + f"  relerr {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
