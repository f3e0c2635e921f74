"""W4A8 op (4096 x 4096, G 128, 2 threads, hot) at M = 2-16, median ms of 60 calls, each after 0 or 300 us
of busy Python (a decode step's gap between ops). Run once per build being compared, alternating:

    python benchmarks/results/w4a8_small_m_calls.py LABEL
"""
import sys, time, statistics, torch
from awq_inductor import AWQLinear
torch.set_num_threads(2)
K, N, G = 4096, 4096, 128
g = torch.Generator().manual_seed(0)
q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g); z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
lay = AWQLinear.from_canonical(q, z, s, group_size=G, act_quant="int8")
def busy(us):
    t = time.perf_counter() + us * 1e-6
    while time.perf_counter() < t: pass
out = []
with torch.no_grad():
    for M in (2, 4, 8, 16):
        x = torch.randn(M, K, dtype=torch.bfloat16)
        for _ in range(20): lay(x)
        for gap in (0, 300):
            t = []
            for _ in range(60):
                busy(gap)
                t0 = time.perf_counter(); lay(x); t.append(time.perf_counter() - t0)
            out.append(f"M{M}/gap{gap} {statistics.median(t)*1e3:.3f}")
print(sys.argv[1] if len(sys.argv) > 1 else "", "  ".join(out))
