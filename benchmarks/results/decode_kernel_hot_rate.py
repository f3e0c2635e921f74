"""The W4A16 M = 1 decode kernel with its weights hot (4096 x 1024: 2 MiB, in L2; 4096 x 11008: 23 MiB, from L3) under
four decode settings at 1 and 2 threads: the per-core rate of the loop itself, against the ~28 GB/s the memory
gives 2 threads.

    python benchmarks/results/decode_kernel_hot_rate.py

(decode_layer_overhead_amx_1207.md)."""
import dataclasses, time, torch, statistics
from awq_inductor.kernels import tuner, native, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, Op, LINEAR
from awq_inductor import config
op, G = Op(W4A16, LINEAR), 128
kern = native.get_kernel(op.name, torch.bfloat16, "amx")
base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
for K, N in [(4096, 1024), (4096, 11008)]:
    ws = tuner._random_weights(op, K, N, G); nb = sum(w.nbytes for w in ws)
    x = torch.randn(1, K).to(torch.bfloat16)
    for st in ["0,0,1,0,0", "2048,0,1,0,0", "0,0,0,0,0", "2048,0,0,0,0"]:
        plan = base.with_decode(DecodeSetting(*map(int, st.split(","))))
        for th in (1, 2):
            with config.patch(num_threads=th):
                for _ in range(20): kern(x, *ws, None, G, N, plan=plan)
                ts = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    for _ in range(20): kern(x, *ws, None, G, N, plan=plan)
                    ts.append((time.perf_counter() - t0) / 20)
            print(f"{K}x{N} ({nb>>20} MiB) {st} {th}t hot: {nb/statistics.median(ts)/1e9:.1f} GB/s", flush=True)
