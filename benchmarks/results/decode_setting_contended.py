"""The decode-setting tuner's 1-thread M = 1 timer (4096 x 2048, qweight cold) for five settings, pinned to vCPU 0, alone
and with a streaming reader (torch.sum over 256 MiB in a loop) pinned to vCPU 1, two passes each: does contention
from the other core turn the ranking of prefetch against no prefetch?

    python benchmarks/results/decode_setting_contended.py

(decode_layer_overhead_amx_1207.md)."""
import dataclasses, statistics, time, sys, os, subprocess, torch
from awq_inductor.kernels import tuner, native, hugepages, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, Op, LINEAR
from awq_inductor import config
torch.set_num_threads(1)
os.sched_setaffinity(0, {0})
op, G, K, n = Op(W4A16, LINEAR), 128, 4096, 2048
ws = tuner._random_weights(op, K, n, G)
copies = [hugepages.copy_on_huge_pages(ws[0]) for _ in range(tuner.cold_bytes() // ws[0].nbytes)]
kern = native.get_kernel(op.name, torch.bfloat16, "amx")
x = torch.randn(1, K).to(torch.bfloat16)
base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
settings = {n_: DecodeSetting(*map(int, n_.split(","))) for n_ in ["0,0,1,0,0", "2048,0,1,0,0", "1024,0,1,4096,0", "0,0,0,0,0", "2048,0,0,0,0"]}
def t(st):
    plan = base.with_decode(st)
    with config.patch(num_threads=1):
        t0 = time.perf_counter()
        for q in copies: kern(x, q, *ws[1:], None, G, n, plan=plan)
        return (time.perf_counter() - t0) / len(copies) * 1e3
for s in settings.values(): t(s)
hog_code = "import os, torch; os.sched_setaffinity(0, {1}); torch.set_num_threads(1); a = torch.empty(1 << 28, dtype=torch.uint8).fill_(1)\nwhile True: a.sum(dtype=torch.int64)"
for mode in ["alone", "hog", "alone", "hog"]:
    hog = subprocess.Popen([sys.executable, "-c", hog_code]) if mode == "hog" else None
    if hog: time.sleep(3)
    res = {k: [] for k in settings}
    for r in range(5):
        for k, s in (settings.items() if r % 2 == 0 else list(settings.items())[::-1]):
            res[k].append(t(s))
    if hog: hog.kill(); hog.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    b = min(med.values())
    print(mode, {k: f"{v:.3f} ({v/b:.2f})" for k, v in med.items()}, flush=True)
