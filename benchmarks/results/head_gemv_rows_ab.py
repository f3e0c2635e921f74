"""python benchmarks/results/head_gemv_rows_ab.py M[,M...]: the bf16 lm_head GEMV (``ops/head_bf16.gemv``, with its
next-group prefetch) against ``F.linear`` at M rows, 32000 x 4096 bf16, two weight copies alternating (cold), 16 calls
each in alternating order after a warm-up; prints median ms and the GEMV / F.linear ratio per M (``GEMV_MAX_M``)."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from awq_inductor.ops import head_bf16

torch.set_num_threads(2)
N, K = 32000, 4096
weights = [torch.randn(N, K).to(torch.bfloat16) for _ in range(2)]
for M in (int(v) for v in sys.argv[1].split(",")):
    x = torch.randn(M, K).to(torch.bfloat16)
    fns = {"gemv": lambda w: head_bf16.gemv(x, w), "F.linear": lambda w: F.linear(x, w)}
    for f in fns.values():
        f(weights[0])
        f(weights[1])
    torch.testing.assert_close(fns["gemv"](weights[0]).to(torch.bfloat16), fns["F.linear"](weights[0]), rtol=2e-2,
                               atol=2e-2)
    ts = {k: [] for k in fns}
    i = 0
    for rep in range(16):
        items = list(fns.items())
        for k, f in items[rep % 2:] + items[:rep % 2]:
            t0 = time.perf_counter()
            f(weights[i % 2])
            ts[k].append(time.perf_counter() - t0)
            i += 1
    med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
    print(M, {k: round(v, 2) for k, v in med.items()}, "gemv / F.linear", round(med["gemv"] / med["F.linear"], 2),
          flush=True)
