"""python benchmarks/results/decode_setting_regimes.py M KxN [THREADS]: the W4A16 decode kernel (eager library, bf16
x, M rows, G = 128) under several decode settings, cold (copies of the weights over 256 MiB in rotation), interleaved
call by call with the streaming-read probe in 3 rounds of 20 (``rotating_rounds``: the order rotates every rep, so no
setting is always the one after the probe). Each timed call comes after an untimed call of the same setting on a
small layer (code warm, weights cold). Prints ms per call and the share of the probe's GB/s per setting."""
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for bw_probe

import torch  # noqa: E402

import bw_probe  # noqa: E402
from rotating_rounds import rotating_rounds  # noqa: E402
from awq_inductor.kernels import hugepages, native, plan as kplan, tuner  # noqa: E402
from awq_inductor.schemes import LINEAR, W4A16, Op  # noqa: E402

M, (K, N), G = int(sys.argv[1]), map(int, sys.argv[2].split("x")), 128
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
D = kplan.DecodeSetting
SETTINGS = {"none": D(0, 0, 0, 0), "1k+nt+l2": D(1024, 1, 0, 4096), "1k+nt+i16+l2": D(1024, 1, 1, 4096),
            "512+nt+l2": D(512, 1, 0, 4096)}
op = Op(W4A16, LINEAR)
qw, *rest = tuner._random_weights(op, K, N, G)
small, *small_rest = tuner._random_weights(op, K, 256, G)
copies = [hugepages.copy_on_huge_pages(qw) for _ in range(max(2, (256 << 20) // qw.nbytes))]
kern = native.get_kernel(op.name, torch.bfloat16, "avx512")
x = torch.randn(M, K).to(torch.bfloat16)
base = dataclasses.replace(kplan.default_plan(), bf16_f32_min_m=kplan.NEVER, amx_min_m=kplan.NEVER,
                           panel_min_m=kplan.NEVER)
probe, probe_bytes = bw_probe.stream_calls(torch.get_num_threads(), 256 << 20, 1)
weight_bytes = qw.nbytes + sum(r.nbytes for r in rest if isinstance(r, torch.Tensor))


def timed(setting):
    plan = base.with_decode(setting)

    def call(i):
        kern(x, small, *small_rest, None, G, 256, plan=plan)  # code warm, weights cold
        t0 = time.perf_counter()
        kern(x, copies[i % len(copies)], *rest, None, G, N, plan=plan)
        return time.perf_counter() - t0

    return call


rotating_rounds({name: timed(s) for name, s in SETTINGS.items()}, probe[0], probe_bytes, weight_bytes, 3, 20)
