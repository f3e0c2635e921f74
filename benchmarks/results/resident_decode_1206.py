"""python benchmarks/results/resident_decode_1206.py: M = 1, warm (cache-resident) time of the tiny Llama's four int4 ops (qkv, o, gate|up, down; G = 128) under decode settings, 9 interleaved rounds (odd rounds reversed). Output of 12-06 on the 2-vCPU AMX Xeon in resident_decode_1206.txt."""
import torch, time, statistics, sys
from awq_inductor.kernels import native, isa as isa_mod, plan as kplan, tuner
from awq_inductor.schemes import op_for, LINEAR, GATE_UP_SILU
from awq_inductor.kernels.plan import DecodeSetting, NEVER
import dataclasses
isa = isa_mod.select(); G = 128
shapes = [(LINEAR, 256, 512), (LINEAR, 256, 256), (GATE_UP_SILU, 256, 768), (LINEAR, 768, 256)]  # qkv(4/2 heads x64: 256+2*128), o, gate_up, down
if len(sys.argv) > 1: shapes = [(LINEAR, 4096, 4096)]
settings = [kplan.DEFAULT_DECODE, DecodeSetting(2048, 0, 1, 0), DecodeSetting(0, 0, 1, 0), DecodeSetting(2048, 0, 0, 0)]
layers = []
for opk, K, N in shapes:
    op = op_for(None, opk)
    w = tuner._random_weights(op, K, N, G)
    kern = native.get_kernel(op.name, torch.bfloat16, isa)
    layers += [(kern, w, N)] * 1
x = {K: torch.randn(1, K).to(torch.bfloat16) for _, K, _ in shapes}
base = dataclasses.replace(kplan.default_plan(), bf16_f32_min_m=NEVER, amx_min_m=NEVER, panel_min_m=NEVER)
def run(pf, n=400):
    plan = base.with_decode(pf)
    t0 = time.perf_counter()
    for _ in range(n):
        for (kern, w, N), (_, K, _) in zip(layers, shapes):
            kern(x[K], *w, None, G, N, plan=plan)
    return (time.perf_counter() - t0) / n * 1e6
for pf in settings: run(pf, 50)
times = {pf: [] for pf in settings}
for r in range(9):
    order = settings if r % 2 == 0 else settings[::-1]
    for pf in order: times[pf].append(run(pf))
for pf in settings:
    print(tuner.setting_name(pf), "median us per 4-shape layer", round(statistics.median(times[pf]), 2), "ratio to default", round(statistics.median(times[pf]) / statistics.median(times[kplan.DEFAULT_DECODE]), 3))
