"""python benchmarks/results/decode_rows_int16_ab.py TAG: W4A16 decode rows on the int16-x kernel, forced (prefetch 1 KB + next tile + int16 x + L2 4 KB), against the
same rows on the dpbf16 kernel, in one process, interleaved; hot 4096 x 11008 and L2-sized 4096 x 1024."""
import sys, time, statistics, torch
from awq_inductor.kernels import native, plan as kplan
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "..", "..", "tests"))
from helpers import op_args
torch.set_num_threads(2)
base = kplan.forced_plan({"bf16_f32_min_m": 16, "panel_min_m": 1 << 40, "amx_min_m": 1 << 40})
plans = {"int16": base.with_decode(kplan.DecodeSetting(1024, 1, 1, 4096)), "bf16": base.with_decode(kplan.DecodeSetting(1024, 1, 0, 4096))}
kern = native.get_kernel("int4_mm", torch.bfloat16)
for N in (11008, 1024):
    K, G = 4096, 128
    w = op_args("int4_mm", N, K, G, bias=False, seed=5)[:3]
    for M in (1, 2, 4, 8):
        x = torch.randn(M, K).bfloat16()
        ts = {k: [] for k in plans}
        for r in range(60):
            for k in (list(plans) if r % 2 == 0 else list(plans)[::-1]):
                t = time.perf_counter(); kern(x, *w, None, G, N, plan=plans[k]); ts[k].append(time.perf_counter() - t)
        print(f"{sys.argv[1]} N={N} M={M}: " + "  ".join(f"{k} {statistics.median(v)*1e3:.3f} ms" for k, v in ts.items()), flush=True)
