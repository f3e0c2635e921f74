"""The int4 head's op (4096 x 32000, M = 1) at G = 32 and G = 128, over 1 GiB of cold copies back to
back, alternating, with the read probe per round: python benchmarks/results/head_group_size_b2b.py
(decode_step_budget_amx_1207.md)."""
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from decode_harness import cold_copies, random_layer
from awq_inductor.kernels import tuning_cache, native
import bw_probe
torch.set_num_threads(2)
K, N = 4096, 32000
res = {}; setups = {}
for G in (32, 128):
    layer, W, nb = random_layer(K, N, G)
    kern = native.get_kernel(layer.op.name, torch.bfloat16)
    plan = tuning_cache.plan_for(layer.op, kern.isa, torch.bfloat16, K, N, G)
    copies = cold_copies(W)
    setups[G] = (kern, plan, copies, nb); res[G] = []
    print(G, plan, nb / 1e6, "MB", len(copies), "copies", flush=True)
x = torch.randn(1, K).bfloat16()
probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
with torch.no_grad():
    for r in range(6):
        t0 = time.perf_counter(); probe(); pr = (256 << 20) / (time.perf_counter() - t0) / 1e9
        for G in ((32, 128) if r % 2 == 0 else (128, 32)):
            kern, plan, copies, nb = setups[G]
            t0 = time.perf_counter()
            for c in copies: kern(x, *c, None, G, N, plan=plan)
            t = (time.perf_counter() - t0) / len(copies); res[G].append(t)
        print(f"probe {pr:.1f} | " + " | ".join(f"G{G} {res[G][-1]*1e3:.2f} ms {setups[G][3]/res[G][-1]/1e9:.1f} GB/s" for G in (32, 128)), flush=True)
