"""M = 1 op of 4096 x 11008 over 1 GiB of cold copies, back to back: through the module (AWQLinear, the eager
op) or the native kernel called directly with the same plan; median ms per call over passes for N seconds:

    python benchmarks/results/module_vs_kernel_b2b.py module|direct SECONDS

(decode_step_budget_amx_1207.md: about 80 us of Python per op call on the AMX Xeon)."""
import sys, os, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_decode as bd
torch.set_num_threads(2)
ours, aten = bd.build_copies(4096, 11008, 128, torch.bfloat16, 1 << 30)
from awq_inductor.kernels import native, tuning_cache
layer = ours[0]; op = layer.op
kern = native.get_kernel(op.name, torch.bfloat16)
plan = tuning_cache.plan_for(op, kern.isa, torch.bfloat16, 4096, 11008, 128)
x = torch.randn(1, 4096).bfloat16()
W = [[getattr(l, w.name) for w in op.scheme.weights] for l in ours]
with torch.no_grad():
    for c in ours[:3]: c(x)
    mode = sys.argv[1]

    end = time.time() + float(sys.argv[2]); ts = []
    while time.time() < end:
        t0 = time.perf_counter()
        if mode == "module":
            for c in ours: c(x)
        else:
            for w in W: kern(x, *w, None, 128, 11008, plan=plan)
        ts.append((time.perf_counter() - t0) / len(ours))
    ts.sort(); print(mode, "median ms per call", round(ts[len(ts)//2] * 1e3, 3), "passes", len(ts), flush=True)
