"""M = 1 op over 1 GiB of cold copies, back to back, under several decode settings (DecodeSetting fields:
distance,next_tile,int16_x,l2_distance,rows_prefetch), interleaved with the 256 MiB read probe per round:

    python benchmarks/results/decode_setting_b2b.py 4096x11008 6 2048,0,1,0,1 1024,0,1,4096,1

decode_step_budget_amx_1207.md."""
import dataclasses, os, sys, statistics, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bw_probe
from awq_inductor import AWQLinear
from awq_inductor.kernels import hugepages, tuning_cache, native
from awq_inductor.kernels.plan import DecodeSetting
K, N = map(int, sys.argv[1].split("x")); rounds = int(sys.argv[2]); G = 128
settings = {s: DecodeSetting(*map(int, s.split(","))) for s in sys.argv[3:]}
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
layer = AWQLinear.from_canonical(q, z, s, group_size=G)
weights = [getattr(layer, w.name) for w in layer.op.scheme.weights]
kern = native.get_kernel(layer.op.name, torch.bfloat16)
base = tuning_cache.plan_for(layer.op, kern.isa, torch.bfloat16, K, N, G)
plans = {n: base.with_decode(st) for n, st in settings.items()}
nb = sum(w.numel() * w.element_size() for w in weights)
copies = [(hugepages.copy_on_huge_pages(weights[0]), *weights[1:]) for _ in range(max(2, (1 << 30) // nb))]
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
