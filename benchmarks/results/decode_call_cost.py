"""The hot cost of one eager call of the W4A16 M = 1 kernel (ctypes binding, output allocation, x quantized to int16,
the OpenMP region) on tiny shapes, 2 threads: python benchmarks/results/decode_call_cost.py
(decode_whole_vs_regional_amx_1208.md)."""
import dataclasses, time, statistics, torch
from awq_inductor.kernels import tuner, native, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, Op, LINEAR
torch.set_num_threads(2)
op, G = Op(W4A16, LINEAR), 128
kern = native.get_kernel(op.name, torch.bfloat16)
base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
plan = base.with_decode(DecodeSetting(1024, 0, 1)._replace(k_streams=2))
for K, N in [(128, 64), (4096, 128), (4096, 256)]:
    ws = tuner._random_weights(op, K, N, G); x = torch.randn(1, K).to(torch.bfloat16)
    for _ in range(100): kern(x, *ws, None, G, N, plan=plan)
    ts = []
    for r in range(5):
        t0 = time.perf_counter()
        for _ in range(2000): kern(x, *ws, None, G, N, plan=plan)
        ts.append((time.perf_counter() - t0) / 2000 * 1e6)
    print(K, N, f"{min(ts):.1f} us hot per call")
