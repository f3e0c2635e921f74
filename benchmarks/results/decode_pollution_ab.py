"""What the weight stream does to the Python after it: the M = 1 op (4096 x 11008) over 1 GiB of cold copies,
each call followed by an eager RMSNorm of 4096 values (6 torch ops), the op rendered as shipped and with a
variant, alternating by pass; GEMV GB/s and the RMSNorm's time after the call:

    python benchmarks/results/decode_pollution_ab.py nta     # weight prefetches with the non-temporal hint
    python benchmarks/results/decode_pollution_ab.py flush   # each weight line clflushopt'ed after use

decode_step_budget_amx_1207.md."""
import dataclasses, os, sys, statistics, time, torch
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.join(HERE, ".."))
import template_ab
from decode_harness import cold_copies, random_layer
from awq_inductor.kernels import tuning_cache
def kernel_with(subs):
    return template_ab._kernel("int4_mm", subs, every=True)
K, N, G = 4096, 11008, 128
torch.set_num_threads(2)
layer, W, nb = random_layer(K, N, G)
FLUSH = ('if (pf > 0 && (kp & 1) == 0) _mm_prefetch((const char*)(src + pf), _MM_HINT_T0);',
         'if ((kp & 1) == 1 && kp >= 3) __asm__ volatile("clflushopt %0" :: "m"(*(const char*)(src - 64))); '
         'if (pf > 0 && (kp & 1) == 0) _mm_prefetch((const char*)(src + pf), _MM_HINT_T0);')
VARIANTS = {"nta": [("_MM_HINT_T0", "_MM_HINT_NTA"), ("_MM_HINT_T1", "_MM_HINT_NTA")], "flush": [FLUSH]}
kerns = {"t0": kernel_with([]), sys.argv[1]: kernel_with(VARIANTS[sys.argv[1]])}
plan = tuning_cache.plan_for(layer.op, kerns["t0"].isa, torch.bfloat16, K, N, G)
print(plan)
copies = cold_copies(W)
x = torch.randn(1, K).to(torch.bfloat16)
a = torch.randn(1, 4096).bfloat16(); wln = torch.randn(4096).bfloat16()
def pywork():
    h = a.float(); v = h.pow(2).mean(-1, keepdim=True); h = h * torch.rsqrt(v + 1e-6); h = (wln * h.to(torch.bfloat16))
    return h + a
assert torch.equal(kerns["t0"](x, *W, None, G, N, plan=plan), kerns[sys.argv[1]](x, *W, None, G, N, plan=plan))
res = {n: {"gemv": [], "py": []} for n in kerns}
with torch.no_grad():
  for r in range(8):
    for n in (list(kerns) if r % 2 == 0 else list(kerns)[::-1]):
        k = kerns[n]; tg = tp = 0.0
        for c in copies:
            t0 = time.perf_counter(); k(x, *c, None, G, N, plan=plan); t1 = time.perf_counter(); pywork(); t2 = time.perf_counter()
            tg += t1 - t0; tp += t2 - t1
        res[n]["gemv"].append(nb * len(copies) / tg / 1e9); res[n]["py"].append(tp / len(copies) * 1e6)
    print(f"round {r}: " + " | ".join(f"{n} gemv {res[n]['gemv'][-1]:.1f} GB/s, py after {res[n]['py'][-1]:.0f} us" for n in kerns), flush=True)
for n in kerns: print(n, "median gemv GB/s", round(statistics.median(res[n]["gemv"]), 1), "py us", round(statistics.median(res[n]["py"]), 1))
