"""What bounds the M = 1 decode kernels on a machine: prefetch settings cold, and the loop hot.

    python benchmarks/results/decode_bound_1207.py            # W4A16 (int16 x) prefetch table, then hot loops

Cold: the tuner's own decode timer (4096 x 2048, G = 128, cold copies of tuner.cold_bytes()) for L1 prefetch
distances 1-4 KB with and without an L2 prefetch 8-16 KB ahead, 5 interleaved rounds, 2 threads and 1 (median).
Hot: the same layer, one copy (4 MiB: a thread's half stays in its 2 MiB L2 at 2 threads), best and median of
200 calls, W4A16 with int16 x and with bf16 x, and W4A8. Results: amx_xeon_1207.md.
"""
import dataclasses
import statistics
import time

import torch

from awq_inductor import config
from awq_inductor.kernels import native, tuner
from awq_inductor.kernels.plan import NEVER, DecodeSetting, default_plan
from awq_inductor.schemes import LINEAR, W4A8, W4A16, Op

K, N, G = 4096, 2048, 128


def cold_table(isa: str) -> None:
    timer = tuner._cold_decode_timer(isa, W4A16)
    sets = [DecodeSetting(d, 0, 1, l2) for d, l2 in ((2048, 0), (1024, 0), (4096, 0), (2048, 8192), (1024, 8192),
                                                       (1024, 16384), (2048, 16384))]
    res = {s: {1: [], 2: []} for s in sets}
    for _ in range(5):
        for th in (2, 1):
            for s in sets:
                res[s][th].append(timer(s, th))
    nbytes = K * N // 2
    for s in sets:
        m2, m1 = statistics.median(res[s][2]), statistics.median(res[s][1])
        print(f"{tuner.setting_name(s)}: 2 threads {m2 * 1e3:.4f} ms {nbytes / m2 / 1e9:.1f} GB/s, "
              f"1 thread {m1 * 1e3:.4f} ms {nbytes / m1 / 1e9:.1f} GB/s")


def hot_loops(isa: str) -> None:
    for scheme, int16 in ((W4A16, 1), (W4A16, 0), (W4A8, 0)):
        op = Op(scheme, LINEAR)
        qw, *rest = tuner._random_weights(op, K, N, G)
        kern = native.get_kernel(op.name, torch.bfloat16, isa)
        x = torch.randn(1, K).to(torch.bfloat16)
        base = dataclasses.replace(default_plan(), bf16_f32_min_m=NEVER, amx_min_m=NEVER, panel_min_m=NEVER)
        plan = base.with_decode(DecodeSetting(2048, 0, int16, 0))
        for threads in (1, 2):
            with config.patch(num_threads=threads):
                for _ in range(20):
                    kern(x, qw, *rest, None, G, N, plan=plan)
                ts = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    kern(x, qw, *rest, None, G, N, plan=plan)
                    ts.append(time.perf_counter() - t0)
            best, med = min(ts), statistics.median(ts)
            print(f"hot {op.name} {'int16 x' if int16 else 'bf16 x'} {threads} thread(s): best {best * 1e6:.1f} us "
                  f"{qw.nbytes / best / 1e9:.1f} GB/s, median {med * 1e6:.1f} us {qw.nbytes / med / 1e9:.1f} GB/s")


if __name__ == "__main__":
    from awq_inductor.kernels import isa as isa_mod
    cold_table(isa_mod.select())
    hot_loops(isa_mod.select())
