"""python benchmarks/results/head_prefetch_ab.py [THREADS] [ROUNDS] [bf16|int8] [M]: the bf16 lm_head GEMV
(``head/bf16_linear.cpp.j2``, 32000 x 4096, 262 MB) or the int8 one (``head/int8_linear.cpp.j2``, 131 MB) on M rows
(default 1), built without and with the next channel group's prefetch (``NEXT_GROUP_PREFETCH``) in one process, timed
call by call in rotating order with the streaming-read probe (``rotating_rounds``), each call on the other of two
weight copies (each far larger than the L3: cold). Prints ms per call and the share of the probe's GB/s per variant
and round."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for bw_probe

import torch  # noqa: E402

import bw_probe  # noqa: E402
from rotating_rounds import rotating_rounds  # noqa: E402
from awq_inductor.ops import head_bf16, head_int8  # noqa: E402

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.set_num_threads(threads)
N, K = 32000, 4096
VARIANTS = {"none": 0, "next group": 1}  # next_group_prefetch
kind = sys.argv[3] if len(sys.argv) > 3 else "bf16"
M = int(sys.argv[4]) if len(sys.argv) > 4 else 1
x = torch.randn(M, K).to(torch.bfloat16)
y = torch.empty(M, N)
if kind == "bf16":
    kernels = {name: head_bf16._kernel(head_bf16.KC_ONE_ROW, v) for name, v in VARIANTS.items()}
    weights = [torch.randn(N, K).to(torch.bfloat16) for _ in range(2)]
    calls = {name: (lambda w, fn=fn: fn(x.data_ptr(), M, w.data_ptr(), y.data_ptr(), N, K, threads))
             for name, fn in kernels.items()}
    ref = x.float() @ weights[0].float().T
    tol = dict(rtol=1e-3, atol=1e-2)
else:
    kernels = {name: head_int8._kernel("avx512", head_int8.KC_ONE_ROW, v) for name, v in VARIANTS.items()}
    weights = [torch.randint(-127, 128, (N, K), dtype=torch.int8) for _ in range(2)]
    scales = torch.rand(N) * 1e-2
    xf = x.float()
    calls = {name: (lambda w, fn=fn: fn(xf.data_ptr(), M, w.data_ptr(), scales.data_ptr(), y.data_ptr(), N, K,
                                        threads)) for name, fn in kernels.items()}
    ref = head_int8._gemv(x, weights[0], scales)
    tol = dict(rtol=0, atol=0)
probe, probe_bytes = bw_probe.stream_calls(threads, 256 << 20, 1)
for name, call in calls.items():  # every variant computes the same product
    call(weights[0])
    torch.testing.assert_close(y, ref, msg=name, **tol)
weight_bytes = weights[0].nbytes


def timed(call):
    def run(i):
        t0 = time.perf_counter()
        call(weights[i % 2])
        return time.perf_counter() - t0

    return run


rotating_rounds({name: timed(call) for name, call in calls.items()}, probe[0], probe_bytes, weight_bytes, count, 12,
                digits=2)
