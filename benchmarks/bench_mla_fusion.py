"""MLA: is fusing DeepSeek-V3's q_a_proj (7168 -> 1536) with kv_a_proj_with_mqa (7168 -> 576), the two
projections of the attention input, into one int4 linear (N = 2112) faster? Eager AWQLinear calls,
bf16 activations, G = 128, random weights; separate (two calls) and fused (one call, two slices)
interleaved round-robin, medians.

    python benchmarks/bench_mla_fusion.py --m 1 256 --reps 50
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from awq_inductor import testing
from awq_inductor.nn import AWQLinear


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--q-lora", type=int, default=1536)
    p.add_argument("--kv-a", type=int, default=576, help="kv_lora_rank + qk_rope_head_dim")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--m", type=int, nargs="*", default=[1, 256])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    H, G = a.hidden, a.group_size
    parts = [testing.quantize_weight(torch.randn(n, H, generator=g) * 0.05, G) for n in (a.q_lora, a.kv_a)]
    q_a, kv_a = (AWQLinear.from_canonical(*c, group_size=G) for c in parts)
    fused = AWQLinear.from_canonical(*(torch.cat([c[i] for c in parts]) for i in range(3)), group_size=G)
    res = {}
    with torch.no_grad():
        for M in a.m:
            x = torch.randn(M, H, generator=g).bfloat16()
            torch.testing.assert_close(fused(x)[:, :a.q_lora], q_a(x), atol=0.05, rtol=0.02)  # (bf16 rounding by plan)
            runs = {"separate": lambda: (q_a(x), kv_a(x)),
                    "fused": lambda: (lambda y: (y[:, :a.q_lora], y[:, a.q_lora:]))(fused(x))}
            for f in runs.values():  # first calls: kernel build, per-machine plan
                for _ in range(3):
                    f()
            ts = {k: [] for k in runs}
            for _ in range(a.reps):
                for k, f in runs.items():
                    t0 = time.perf_counter()
                    f()
                    ts[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v[3:]) * 1e3 for k, v in ts.items()}
            res[M] = med
            print(f"M={M:<4} separate {med['separate']:.3f} ms   fused {med['fused']:.3f} ms   "
                  f"fused/separate {med['fused'] / med['separate']:.2f}", flush=True)
    return res


if __name__ == "__main__":
    main()
