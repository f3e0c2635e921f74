"""Small M on the AMX plans: our op (plan forced: AMX from M = amx_min_m, default 0, so M <= 32 runs
amx_groups; a third argument >= 9 sets amx_min_m and leaves M <= 8 on the bf16 decode kernel) on
one weight copy ("hot") and round robin over 6 copies (48 MiB at 4096 x 4096: L3-resident on the
AMX Xeon's 480 MiB L3, not DRAM), vs F.linear on the dequantized bf16 weight. Medians of 40.

    python benchmarks/results/amx_small_m_1204.py 4096x4096,4096x11008 4,16,32
    python benchmarks/results/amx_small_m_1204.py 4096x4096 1,4,8 1099511627776
"""
import os, sys, time, statistics, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_linear import make_layer  # noqa: E402
from awq_inductor import AWQLinear, config  # noqa: E402
torch.set_num_threads(2)
config.kernel_plan = dict(amx_min_m=int(sys.argv[3]) if len(sys.argv) > 3 else 0, panel_min_m=1 << 40, bf16_f32_min_m=1 << 40 if len(sys.argv) <= 3 else 9)
shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1].split(",")]
Ms = [int(m) for m in sys.argv[2].split(",")]
for K, N in shapes:
    q, z, s = make_layer(K, N, 128)
    lins = [AWQLinear.from_canonical(q, z, s, group_size=128) for _ in range(6)]
    w = lins[0].dequantize().to(torch.bfloat16)
    for M in Ms:
        x = torch.randn(M, K, dtype=torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        err = ((lins[0](x).float() - ref).abs().max() / ref.abs().max()).item()
        for lin in lins: lin(x)
        ts = {"hot": [], "rr": [], "dense": []}
        for r in range(40):
            t0 = time.perf_counter(); lins[0](x); ts["hot"].append(time.perf_counter() - t0)
            for lin in lins:
                t0 = time.perf_counter(); lin(x); ts["rr"].append(time.perf_counter() - t0)
            t0 = time.perf_counter(); F.linear(x, w); ts["dense"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        gb = K * N / 2 / 1e6
        print(f"K={K} N={N} M={M}: hot {med['hot']:.3f} ms ({gb/med['hot']:.1f} GB/s)  round-robin {med['rr']:.3f} ms ({gb/med['rr']:.1f} GB/s)  dense {med['dense']:.3f}  relerr {err:.1e}", flush=True)
