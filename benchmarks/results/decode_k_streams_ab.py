"""decode_k_streams 1 against 2 in the shipped kernels at M = 1 on the Llama-7B layer shapes, cold copies (640 MiB
per shape), 7 interleaved rounds beside the 256 MiB read probe; A8=1 for W4A8 (its settings: 2048, and 1024 + the
next tile), BF16X=1 for W4A16 on bf16 x (the same two), W4A16 on int16 x otherwise (2048 + int16 x, and 1024 +
int16 x + 4 KB into L2):

    python benchmarks/results/decode_k_streams_ab.py; A8=1 python ...; BF16X=1 python ...

(decode_k_streams_amx_1207.md)."""
import dataclasses, os, sys, time, statistics, torch
from awq_inductor.kernels import tuner, native, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, W4A8, Op, LINEAR
from awq_inductor import config
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))); import bw_probe
A8 = os.environ.get("A8") == "1"
op, G = Op(W4A8 if A8 else W4A16, LINEAR), 128
kern = native.get_kernel(op.name, torch.bfloat16)
base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
BF16X = os.environ.get("BF16X") == "1"
first = DecodeSetting(2048, 0, 0) if A8 or BF16X else DecodeSetting(2048, 0, 1)
second = DecodeSetting(1024, 1, 0) if A8 or BF16X else DecodeSetting(1024, 0, 1, 4096)
# numerics: the two streams' result against one stream's (only the fp32 order of the groups' sum differs)
for K, N in [(4096, 4096), (11008, 4096), (4096, 12288), (384, 96), (640, 64)]:
    ws = tuner._random_weights(op, K, N, G); x = torch.randn(1, K).to(torch.bfloat16)
    a = kern(x, *ws, None, G, N, plan=base.with_decode(first))
    b = kern(x, *ws, None, G, N, plan=base.with_decode(first._replace(k_streams=2)))
    print(K, N, "max |k2-k1| / max|k1|", ((a.float() - b.float()).abs().max() / a.float().abs().max()).item(), flush=True)
n1, n2 = tuner.setting_name(first), tuner.setting_name(second)
sets = {n1: first, n1 + "+k2": first._replace(k_streams=2), n2: second, n2 + "+k2": second._replace(k_streams=2)}
probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
for K, N in [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)]:
    qw, *rest = tuner._random_weights(op, K, N, G)
    nb = sum(t.nbytes for t in [qw, *rest])
    copies = [[qw.clone()] + [r.clone() for r in rest] for _ in range(max(2, (640 << 20) // nb))]
    x = torch.randn(1, K).to(torch.bfloat16)
    res = {k: [] for k in sets}; prs = []
    for rnd in range(7):
        t0 = time.perf_counter(); probe(); prs.append((256 << 20) / (time.perf_counter() - t0) / 1e9)
        order = list(sets) if rnd % 2 == 0 else list(sets)[::-1]
        for name in order:
            plan = base.with_decode(sets[name])
            with config.patch(num_threads=2):
                t0 = time.perf_counter()
                for c in copies: kern(x, *c, None, G, N, plan=plan)
                res[name].append(nb * len(copies) / (time.perf_counter() - t0) / 1e9)
    pm = statistics.median(prs)
    print(f"{K}x{N} probe {pm:.1f}: " + "  ".join(f"{k} {statistics.median(v):.1f} ({100*statistics.median(v)/pm:.0f}%)" for k, v in res.items()), flush=True)
    r1 = [b / a for a, b in zip(res[n1], res[n1 + "+k2"])]
    r2 = [b / a for a, b in zip(res[n2], res[n2 + "+k2"])]
    print(f"   k2/k1 per round ({n1}):", " ".join(f"{r:.2f}" for r in r1), f" ({n2}):", " ".join(f"{r:.2f}" for r in r2), flush=True)
