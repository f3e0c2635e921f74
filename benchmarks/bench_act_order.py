"""Decode cost of the act-order input gather: one AWQLinear at M=1 with vs without ``perm``.

The Llama-7B shapes that take a gathered input in a GPTQ desc_act model (q/k/v and gate/up fuse
only with equal permutations, so real checkpoints keep them apart; every linear pays one gather):
q/k/v/o (K=4096, N=4096), gate/up (K=4096, N=11008), down (K=11008, N=4096). Both modules hold
the same weights; calls are interleaved in one process (A, B, A, B, ...) so machine noise hits both.

    python benchmarks/bench_act_order.py [--threads 1] [--iters 200]

Prints per shape the median (and 10th percentile) time with and without the gather and the
ratio, plus the median ratio for one decoder layer (the 7 linears' time summed with their
weights: 4 x qkvo + 2 x gate/up + down), and next to it the A/A ratio of two modules with the
same weights and no gather (the noise floor of the measurement on a shared machine).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from awq_inductor import testing
from awq_inductor.nn import AWQLinear
from awq_inductor.nn.linear import _gather_input

SHAPES = {"q/k/v/o": (4096, 4096, 4), "gate/up": (4096, 11008, 2), "down": (11008, 4096, 1)}


def _modules(K, N, G=128):
    """(plain, plain copy, gathered): the same canonical weights packed three times."""
    q, z, s = testing.quantize_weight(torch.randn(N, K) * 0.02, G, torch.bfloat16)
    return (AWQLinear.from_canonical(q, z, s, group_size=G), AWQLinear.from_canonical(q, z, s, group_size=G),
            AWQLinear.from_canonical(q, z, s, group_size=G).set_input_perm(torch.randperm(K)))


def _pairs(a, b, x, iters):
    """Per call pair (a then b, back to back): times of a and b; noise from the other processes on
    the machine hits both calls of a pair alike. Each call gets a fresh input (``x.clone()``, timed
    on both sides), as in decode, where x is the previous op's new output: calling the op on one
    reused x is not what a model does, and it measured 199.0 us median against 219.5 us for
    ``op(x.clone())`` (K=N=4096, 1 thread), a gap larger than the gather itself."""
    ta, tb = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        a(x.clone())
        t1 = time.perf_counter()
        b(x.clone())
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return ta, tb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layer = {"plain": 0.0, "gather": 0.0}
    print(f"threads={args.threads} iters={args.iters}x{args.rounds} bf16 M=1 G=128")
    for name, (K, N, count) in SHAPES.items():
        plain, copy, gath = _modules(K, N)
        x = torch.randn(1, K, dtype=torch.bfloat16)
        with torch.no_grad():
            _pairs(plain, gath, x, 20)  # warm-up (kernel build, tuner, caches)
            _pairs(copy, gath, x, 20)
            a, b, c = [], [], []
            for r in range(args.rounds):  # interleaved, order alternating per round
                n = args.iters // args.rounds
                if r % 2:
                    tb_, ta_ = _pairs(gath, plain, x, n)
                else:
                    ta_, tb_ = _pairs(plain, gath, x, n)
                a += ta_
                b += tb_
                c += _pairs(copy, plain, x, n)[0] if r % 2 else _pairs(plain, copy, x, n)[1]
            # the gather alone, as the module runs it at M=1 (fresh input, like the pairs)
            g = []
            for _ in range(args.iters):
                xc = x.clone()
                t0 = time.perf_counter()
                _gather_input(xc, gath.perm)
                g.append(time.perf_counter() - t0)
        ta, tb, tc = statistics.median(a), statistics.median(b), statistics.median(c)
        tg = statistics.median(g)
        layer["gather_alone"] = layer.get("gather_alone", 0.0) + count * tg
        pa, pb = sorted(a)[len(a) // 10], sorted(b)[len(b) // 10]
        layer["plain"] += count * ta
        layer["gather"] += count * tb
        layer["copy"] = layer.get("copy", 0.0) + count * tc
        print(f"{name:8s} K={K:5d} N={N:5d}  median: plain {ta * 1e6:8.1f} us  gather {tb * 1e6:8.1f} us  "
              f"ratio {tb / ta:.4f}  | p10: {pa * 1e6:8.1f} / {pb * 1e6:8.1f} us ratio {pb / pa:.4f}  "
              f"| A/A noise (same weights, no gather) {tc / ta:.4f} | gather alone {tg * 1e6:.1f} us = "
              f"{100 * tg / ta:.2f}% of plain")
    print(f"decoder layer (4 qkvo + 2 gate/up + down): gather / plain {layer['gather'] / layer['plain']:.4f}, "
          f"A/A noise {layer['copy'] / layer['plain']:.4f}; gathers alone {100 * layer['gather_alone'] / layer['plain']:.2f}% "
          f"of the plain layer")


if __name__ == "__main__":
    main()
