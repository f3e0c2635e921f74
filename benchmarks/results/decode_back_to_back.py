"""M = 1 op time called back to back over cold copies, against bench_decode's single calls after the probe.

    python benchmarks/results/decode_back_to_back.py 4096 11008

Each line: one round. ``b2b``: the op over every copy (1 GiB in all) in a row, time per call;
``after probe``: the 256 MiB probe stream, a warm call of the same copy list's last layer, then one timed
call; ``after aten``: aten int4pack's call on its own copy, then one timed call. Why: on the AMX Xeon
(2026-12-07) bench_decode's per-call figure moved by 1.5x with what ran before the call (amx_xeon_1207.md).
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_decode as bd  # noqa: E402
import bw_probe  # noqa: E402


def main(K: int, N: int, rounds: int = 3) -> None:
    ours, aten = bd.build_copies(K, N, 128, torch.bfloat16, 1 << 30)
    x = torch.randn(1, K).to(torch.bfloat16)
    probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
    nb = bd._nbytes(ours[0])
    for c in ours[:3]:
        c(x)
    for _ in range(rounds):
        t0 = time.perf_counter()
        for c in ours:
            c(x)
        b2b = (time.perf_counter() - t0) / len(ours)
        after_probe, after_aten = [], []
        for i in range(20):
            probe()
            ours[-1](x)
            t0 = time.perf_counter()
            ours[i % len(ours)](x)
            after_probe.append(time.perf_counter() - t0)
            aten[i % len(aten)](x)
            t0 = time.perf_counter()
            ours[(i + 7) % len(ours)](x)
            after_aten.append(time.perf_counter() - t0)
        p, a = statistics.median(after_probe), statistics.median(after_aten)
        print(f"b2b {b2b * 1e3:.3f} ms {nb / b2b / 1e9:.1f} GB/s | after probe {p * 1e3:.3f} ms {nb / p / 1e9:.1f} "
              f"| after aten {a * 1e3:.3f} ms {nb / a / 1e9:.1f}")


if __name__ == "__main__":
    with torch.no_grad():
        main(int(sys.argv[1]), int(sys.argv[2]))
