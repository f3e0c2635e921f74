"""The decode-setting tuner's timer under other set-ups (4096 x 2048 as shipped, only qweight copied cold, against all
the weight tensors cold, and 4096 x 11008): do they rank the settings alike?

    python benchmarks/results/decode_setting_timer_shapes.py

(decode_layer_overhead_amx_1207.md)."""
import dataclasses, statistics, time, sys, torch, collections
from awq_inductor.kernels import tuner, native, hugepages, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, Op, LINEAR
torch.set_num_threads(2)
isa = "amx"
settings = {n: DecodeSetting(*map(int, n.split(","))) for n in ["0,0,1,0,0", "1024,0,1,4096,0", "2048,0,1,0,0", "0,0,0,0,0", "1024,0,0,4096,0"]}
def timer_for(K, n, all_copies):
    op, G = Op(W4A16, LINEAR), 128
    ws = tuner._random_weights(op, K, n, G)
    nb = sum(w.nbytes for w in ws)
    cb = tuner.cold_bytes()
    if all_copies:
        copies = [tuple(hugepages.copy_on_huge_pages(w) for w in ws) for _ in range(max(1, cb // nb))]
    else:
        copies = [(hugepages.copy_on_huge_pages(ws[0]),) + tuple(ws[1:]) for _ in range(max(1, cb // ws[0].nbytes))]
    kern = native.get_kernel(op.name, torch.bfloat16, isa)
    x = torch.randn(1, K).to(torch.bfloat16)
    base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
    kern(x, *ws, None, G, n, plan=base)
    def t(pf):
        plan = base.with_decode(pf)
        t0 = time.perf_counter()
        for c in copies: kern(x, *c, None, G, n, plan=plan)
        return (time.perf_counter() - t0) / len(copies) * 1e3
    return t
setups = {"4096x2048 qw": timer_for(4096, 2048, False), "4096x2048 all": timer_for(4096, 2048, True),
          "4096x11008 qw": timer_for(4096, 11008, False), "4096x11008 all": timer_for(4096, 11008, True)}
print("cold bytes", tuner.cold_bytes() >> 20, "MiB")
for sname, t in setups.items():
    rounds = collections.defaultdict(list)
    for r in range(5):
        for n, st in (settings.items() if r % 2 == 0 else list(settings.items())[::-1]):
            rounds[n].append(t(st))
    med = {n: statistics.median(v) for n, v in rounds.items()}
    best = min(med.values())
    print(sname, {n: f"{v:.3f}ms {v/best:.2f}" for n, v in med.items()}, flush=True)
