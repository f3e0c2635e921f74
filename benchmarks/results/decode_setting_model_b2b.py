"""The compiled model's own int4 layer tensors (4 layers x 4 ops) called back to back through the native kernel at
M = 1 under several decode settings (DecodeSetting fields pf,next_tile,int16_x,l2,rows_prefetch), interleaved with
the 256 MiB read probe per round:

    SETTINGS="0,0,1,0,0 1024,0,1,4096,0 2048,0,1,0,0" python benchmarks/results/decode_setting_model_b2b.py --head bf16

(decode_layer_overhead_amx_1207.md)."""
import sys, os, time, argparse, statistics, collections, torch
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
from decode_harness import compiled_model, model_args
from awq_inductor.kernels import tuning_cache, native
from awq_inductor.kernels.plan import DecodeSetting
import bw_probe
p = model_args(argparse.ArgumentParser()); a = p.parse_args(); torch.set_num_threads(2)
model = compiled_model(a)
ids = torch.randint(0, 32000, (1, 32))
with torch.no_grad():
    model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
calls = []
for name, m in model.model.layers.named_modules():
    op = getattr(m, "op", None)
    if op is None or not hasattr(op, "scheme"): continue
    w = [getattr(m, x.name) for x in op.scheme.weights]
    kern = native.get_kernel(op.name, torch.bfloat16)
    K, N, G = m.in_features, m.out_features, m.group_size
    plan = tuning_cache.plan_for(op, kern.isa, torch.bfloat16, K, N, G)
    nb = sum(t.numel() * t.element_size() for t in w)
    calls.append((name, kern, w, K, N, G, plan, nb))
print(len(calls), "calls", calls[0][6], [(c[0], c[3], c[4]) for c in calls[:4]])
probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
tot = sum(c[7] for c in calls)
settings = {n: DecodeSetting(*map(int, n.split(","))) for n in os.environ["SETTINGS"].split()}
res = collections.defaultdict(list)
with torch.no_grad():
    for r in range(8):
        t0 = time.perf_counter(); probe(); pr = (256 << 20) / (time.perf_counter() - t0) / 1e9
        order = list(settings) if r % 2 == 0 else list(settings)[::-1]
        line = []
        for sn in order:
            st = settings[sn]
            xs = [torch.randn(1, c[3]).to(torch.bfloat16) for c in calls]
            t0 = time.perf_counter()
            for (name, kern, w, K, N, G, plan, nb), x in zip(calls, xs):
                kern(x, *w, None, G, N, plan=plan.with_decode(st))
            t = time.perf_counter() - t0
            res[sn].append(tot / t / 1e9 / pr)
            line.append(f"{sn} {tot/t/1e9:.1f} GB/s {res[sn][-1]*100:.0f}%")
        print(f"round {r} probe {pr:.1f}", " | ".join(line), flush=True)
print("median share of probe", {k: round(statistics.median(v) * 100, 1) for k, v in res.items()})
