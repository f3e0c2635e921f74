"""The AMX W4A16 path (forced: amx from M = 0) vs F.linear on the dequantized bf16 weight, hot,
interleaved in one process (median of alternating-order reps): ms, TF/s, ours / dense, max relative
error. Used for amx_blocking_1204.md, where the variants were template edits timed with this.

    python benchmarks/results/amx_blocking_1204.py 4096x4096,11008x4096 128,512
"""
import os, sys, time, statistics, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_linear import make_layer  # noqa: E402
from awq_inductor import AWQLinear, config
torch.set_num_threads(2)
config.kernel_plan = dict(amx_min_m=0, panel_min_m=1 << 40, bf16_f32_min_m=1 << 40)
shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1].split(",")]
Ms = [int(m) for m in sys.argv[2].split(",")]
for K, N in shapes:
    q, z, s = make_layer(K, N, 128)
    lin = AWQLinear.from_canonical(q, z, s, group_size=128)
    w = lin.dequantize().to(torch.bfloat16)
    for M in Ms:
        x = torch.randn(M, K, dtype=torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        y = lin(x)
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        fns = {"ours": lambda: lin(x), "dense": lambda: F.linear(x, w)}
        for f in fns.values(): f(); f()
        ts = {k: [] for k in fns}
        reps = max(5, int(200 / M))
        for r in range(reps):
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = time.perf_counter(); fns[k](); ts[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        fl = 2 * M * N * K
        print(f"K={K} N={N} M={M}: ours {med['ours']:.3f} ms ({fl/med['ours']/1e9:.2f} TF/s) dense {med['dense']:.3f} ms ({fl/med['dense']/1e9:.2f}) ours/dense {med['ours']/med['dense']:.3f} relerr {err:.1e}", flush=True)
