"""python benchmarks/results/amx_large_m_flush.py 256,512,1024,2048 5: flush harness (as bench_report): F.linear (pre-dequantized) vs our AMX path vs our dense path, M >= 256."""
import os, sys, time, statistics, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_linear
from awq_inductor import AWQLinear
from awq_inductor.kernels import dense, native, plan as kplan
from awq_inductor.schemes import OPS
op = OPS["int4_mm"]
G = 128
flush = torch.ones(768 << 18, dtype=torch.float32)  # 768 MiB
shapes = [(4096, 4096), (4096, 11008), (11008, 4096)]
Ms = [int(a) for a in sys.argv[1].split(",")]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
kern = native.get_kernel("int4_mm", torch.bfloat16)
amx_plan = kplan.Plan(4, kplan.NEVER, 2, kplan.NEVER)
for K, N in shapes:
    q, z, s = bench_linear.make_layer(K, N, G)
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    W = lin.dequantize().to(torch.bfloat16).contiguous()
    args = (lin.qweight, lin.scales, lin.zeros, None, G, N)
    for M in Ms:
        x = torch.randn(M, K).to(torch.bfloat16)
        fns = {"flinear": lambda: F.linear(x, W), "amx": lambda: kern(x, *args, plan=amx_plan),
               "dense": lambda: dense.dense_call(op, x, *args)}
        ts = {k: [] for k in fns}
        for f in fns.values():
            f(); f()
        for _ in range(reps):
            for k, f in fns.items():
                flush.sum(); f()  # re-warm code on the same call: small cost vs ms
                flush.sum()
                t0 = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        print(f"{K}x{N} M={M}: " + ", ".join(f"{k} {v:.2f} ({v / med['flinear']:.2f})" for k, v in med.items()), flush=True)
