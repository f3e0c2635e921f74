"""W4A8 against W4A16 at M = 1 on the Llama-7B layer shapes (q/k/v fused, o, gate/up, down), each at this machine's
tuned decode setting (run `python -m awq_inductor tune --shapes 4096x2048 [--act-quant int8]` first, or the plans
carry the constants), cold copies (640 MiB per shape and scheme), 6 interleaved rounds:

    python benchmarks/results/decode_a8_vs_a16.py

(decode_k_streams_amx_1207.md)."""
import time, statistics, torch
from awq_inductor.kernels import tuner, native, plan as P, tuning_cache
from awq_inductor.schemes import W4A16, W4A8, Op, LINEAR
from awq_inductor import config
G = 128
for K, N in [(4096, 6144), (4096, 4096), (4096, 22016), (11008, 4096)]:
    res = {}; data = {}
    for sch in (W4A16, W4A8):
        op = Op(sch, LINEAR)
        kern = native.get_kernel(op.name, torch.bfloat16)
        plan = tuning_cache.plan_for(op, kern.isa, torch.bfloat16, K, N, G)
        ws = tuner._random_weights(op, K, N, G)
        nb = sum(t.nbytes for t in ws)
        copies = [[w.clone() for w in ws] for _ in range(max(2, (640 << 20) // nb))]
        data[sch.name] = (kern, plan, copies, nb); res[sch.name] = []
        print(sch.name, K, N, "plan", plan.decode_prefetch, plan.prefetch_next_tile, plan.decode_int16, plan.decode_prefetch_l2, plan.decode_k_streams, "bytes", nb)
    x = torch.randn(1, K).to(torch.bfloat16)
    for rnd in range(6):
        order = list(data) if rnd % 2 == 0 else list(data)[::-1]
        for name in order:
            kern, plan, copies, nb = data[name]
            with config.patch(num_threads=2):
                t0 = time.perf_counter()
                for c in copies: kern(x, *c, None, G, N, plan=plan)
                res[name].append((time.perf_counter() - t0) / len(copies) * 1e3)
    r = [b / a for a, b in zip(res["w4a16"], res["w4a8"])]
    print(f"{K}x{N}: ms w4a16 {statistics.median(res['w4a16']):.3f} w4a8 {statistics.median(res['w4a8']):.3f}; w4a8/w4a16 time per round", " ".join(f"{v:.2f}" for v in r), flush=True)
