"""M = 1 op over 1 GiB of cold copies, back to back, under several decode settings (DecodeSetting fields:
distance,next_tile,int16_x,l2_distance,rows_prefetch), interleaved with the 256 MiB read probe per round:

    python benchmarks/results/decode_setting_b2b.py 4096x11008 6 2048,0,1,0,1 1024,0,1,4096,1

decode_step_budget_amx_1207.md."""
import dataclasses, os, sys, statistics, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bw_probe
from decode_harness import cold_copies, random_layer
from awq_inductor.kernels import tuning_cache, native
from awq_inductor.kernels.plan import DecodeSetting
K, N = map(int, sys.argv[1].split("x")); rounds = int(sys.argv[2]); G = 128
settings = {s: DecodeSetting(*map(int, s.split(","))) for s in sys.argv[3:]}
torch.set_num_threads(2)
layer, weights, nb = random_layer(K, N, G)
kern = native.get_kernel(layer.op.name, torch.bfloat16)
base = tuning_cache.plan_for(layer.op, kern.isa, torch.bfloat16, K, N, G)
plans = {n: base.with_decode(st) for n, st in settings.items()}
copies = cold_copies(weights)
x = torch.randn(1, K).to(torch.bfloat16)
probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
res = {n: [] for n in plans}; pr = []
with torch.no_grad():
  for r in range(rounds):
    t0 = time.perf_counter(); probe(); pr.append((256 << 20) / (time.perf_counter() - t0) / 1e9)
    order = list(plans) if r % 2 == 0 else list(plans)[::-1]
    for n in order:
        kern(x, *copies[0], None, G, N, plan=plans[n])
        t0 = time.perf_counter()
        for c in copies: kern(x, *c, None, G, N, plan=plans[n])
        res[n].append(nb * len(copies) / (time.perf_counter() - t0) / 1e9)
    print(f"round {r+1} probe {pr[-1]:.1f} | " + " | ".join(f"{n} {res[n][-1]:.1f} GB/s ({res[n][-1]/pr[-1]*100:.0f}%)" for n in plans), flush=True)
print("median GB/s:", {n: round(statistics.median(v), 1) for n, v in res.items()}, "probe", round(statistics.median(pr), 1))
