"""The M = 1 kernel (W4A16, int16 x, 2048 B prefetch, two K streams) and the read probe as a fixed cost per call plus a
rate: K = 4096, N = 256-16384 (kernel) and 0.5-36 MiB (probe), cold copies (640 MiB per size) called round robin, 5
interleaved rounds, least squares over the medians. The kernel is called through its eager ctypes binding (the compiled
graphs call it from C++); `hot` times that call on tiny shapes instead (ctypes, output allocation, x quantized to
int16, the OpenMP region), 2000 calls, best of 5.

    python benchmarks/results/decode_fixed_cost.py [hot]

(decode_whole_vs_regional_amx_1208.md)."""
import dataclasses, os, sys, time, statistics, torch
from awq_inductor.kernels import tuner, native, plan as P
from awq_inductor.kernels.plan import DecodeSetting
from awq_inductor.schemes import W4A16, Op, LINEAR
from awq_inductor import config
import numpy as np
torch.set_num_threads(2)
op, G = Op(W4A16, LINEAR), 128
kern = native.get_kernel(op.name, torch.bfloat16)
base = dataclasses.replace(P.default_plan(), bf16_f32_min_m=P.NEVER, amx_min_m=P.NEVER, panel_min_m=P.NEVER)
plan = base.with_decode(DecodeSetting(2048, 0, 1)._replace(k_streams=2))
if sys.argv[1:] == ["hot"]:
    for K, N in [(128, 64), (4096, 128), (4096, 256)]:
        ws = tuner._random_weights(op, K, N, G); x = torch.randn(1, K).to(torch.bfloat16)
        for _ in range(100): kern(x, *ws, None, G, N, plan=plan)
        ts = []
        for r in range(5):
            t0 = time.perf_counter()
            for _ in range(2000): kern(x, *ws, None, G, N, plan=plan)
            ts.append((time.perf_counter() - t0) / 2000 * 1e6)
        print(K, N, f"{min(ts):.1f} us hot per call")
    sys.exit(0)
K = 4096
Ns = [256, 512, 1024, 2048, 4096, 8192, 16384]
data = {}
for N in Ns:
    qw, *rest = tuner._random_weights(op, K, N, G)
    nb = sum(t.nbytes for t in [qw, *rest])
    copies = [[qw.clone()] + [r.clone() for r in rest] for _ in range(max(2, (640 << 20) // nb))]
    data[N] = (nb, copies)
x = torch.randn(1, K).to(torch.bfloat16)
res = {N: [] for N in Ns}
for rnd in range(5):
    for N in (Ns if rnd % 2 == 0 else Ns[::-1]):
        nb, copies = data[N]
        t0 = time.perf_counter()
        for c in copies: kern(x, *c, None, G, N, plan=plan)
        res[N].append((time.perf_counter() - t0) / len(copies))
xs = np.array([data[N][0] for N in Ns], float); ys = np.array([statistics.median(res[N]) for N in Ns])
for N, b, t in zip(Ns, xs, ys): print(f"N={N} {b/1e6:.2f} MB {t*1e6:.1f} us {b/t/1e9:.1f} GB/s")
A = np.vstack([np.ones_like(xs), xs]).T
(a, slope), *_ = np.linalg.lstsq(A, ys, rcond=None)
print(f"fit: fixed {a*1e6:.1f} us + {1/slope/1e9:.1f} GB/s")

# the read probe the same way
import os, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bw_probe
sizes = [int(s * (1 << 20)) for s in (0.5, 1, 2, 4, 9, 18, 36)]
calls = {s: bw_probe.stream_calls(2, s, max(2, (640 << 20) // s))[0] for s in sizes}
res = {s: [] for s in sizes}
for rnd in range(5):
    for s in (sizes if rnd % 2 == 0 else sizes[::-1]):
        cs = calls[s]; t0 = time.perf_counter()
        for c in cs: c()
        res[s].append((time.perf_counter() - t0) / len(cs))
xs = np.array(sizes, float); ys = np.array([statistics.median(res[s]) for s in sizes])
for s, t in zip(sizes, ys): print(f"{s/1e6:.2f} MB {t*1e6:.1f} us {s/t/1e9:.1f} GB/s")
(a, b), *_ = np.linalg.lstsq(np.vstack([np.ones_like(xs), xs]).T, ys, rcond=None)
print(f"fit: fixed {a*1e6:.1f} us + {1/b/1e9:.1f} GB/s")
