"""The decode kernels' settings (software prefetch, int16 x) side by side, cold, against the read probe.

    python benchmarks/bench_prefetch.py                          # W4A16 + W4A8, 4096x11008 and 11008x4096
    python benchmarks/bench_prefetch.py --ops int4_mm --shapes 4096x4096 --m 1,2 --threads 1,2
    python benchmarks/bench_prefetch.py --smoke

Every setting of ``kernels.tuner.decode_candidates`` of the op's scheme (distance within each
weight stream, next N tile into L2, bf16 or int16 x where the scheme has that choice) is one method: the op's eager kernel called with the per-machine plan
of the shape, only the decode fields replaced (outputs checked bit-identical to no prefetch with the
same x first). The methods and one
pass of ``bw_probe`` (256 MiB, same threads) are interleaved in every rep, in alternating order,
each call on another cold copy of the packed weight (256 MiB of copies in rotation, on huge pages as
a loaded model's). Prints the median GB/s of each setting as a share of the probe's median.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bw_probe, when loaded by path (tests)
import bw_probe  # noqa: E402
from awq_inductor import testing  # noqa: E402
from awq_inductor.kernels import hugepages, isa as isa_mod, native, tuner, tuning_cache  # noqa: E402
from awq_inductor.schemes import OPS  # noqa: E402


def time_settings(op_name: str, K: int, N: int, M: int, threads: int, reps: int, G: int, cold_bytes: int,
                  probe_bytes: int) -> dict:
    """{setting name: median GB/s, "probe": median GB/s} of one (op, shape, M, threads)."""
    op, isa = OPS[op_name], isa_mod.select()
    torch.set_num_threads(threads)
    kern = native.get_kernel(op.name, torch.bfloat16, isa)
    q, z, s = testing.quantize_weight(torch.randn(op.columns(N), K, generator=torch.Generator().manual_seed(0)) * 0.05, G)
    w = op.pack(q, z, s, G, N)
    nbytes = sum(t.nbytes for t in w)
    cold = [hugepages.copy_on_huge_pages(w[0]) for _ in range(max(2, cold_bytes // w[0].nbytes))]
    (probe,), pbytes = bw_probe.stream_calls(threads, probe_bytes)
    base = tuning_cache.plan_for(op, isa, torch.bfloat16, K, N, G)
    settings = tuner.decode_candidates(op.scheme)
    plans = {tuner.setting_name(pf): base.with_decode(pf) for pf in settings}
    x = torch.randn(M, K).bfloat16()
    ref = {i: kern(x, *w, None, G, N, plan=base.with_decode(tuner.DecodeSetting(0, 0, i))) for i in (0, 1)}
    for pf in settings:
        name = tuner.setting_name(pf)
        if not torch.equal(kern(x, *w, None, G, N, plan=plans[name]), ref[pf.int16_x]):
            raise AssertionError(f"{op_name} {K}x{N} M={M}: prefetch setting {name} changed the output")
    gbps = {name: [] for name in list(plans) + ["probe"]}
    i = 0
    for rep in range(reps):
        t0 = time.perf_counter()
        probe()
        gbps["probe"].append(pbytes / (time.perf_counter() - t0) / 1e9)
        for name in (list(plans) if rep % 2 == 0 else list(plans)[::-1]):
            c = cold[i % len(cold)]
            i += 1
            t0 = time.perf_counter()
            kern(x, c, *w[1:], None, G, N, plan=plans[name])
            gbps[name].append(nbytes / (time.perf_counter() - t0) / 1e9)
    return {name: statistics.median(v) for name, v in gbps.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="int4_mm,int4_mm_a8")
    p.add_argument("--shapes", default="4096x11008,11008x4096", help="KxN,KxN,...")
    p.add_argument("--m", default="1,2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_prefetch.json"))
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    cold, probe_bytes = 256 << 20, 256 << 20
    if a.smoke:
        a.shapes, a.m, a.threads, a.reps, cold, probe_bytes = "256x128", "1", "1", 3, 1 << 20, 1 << 20
    rows = []
    for op_name in a.ops.split(","):
        for shape in a.shapes.split(","):
            K, N = (int(v) for v in shape.split("x"))
            for nt in (int(v) for v in a.threads.split(",")):
                for M in (int(v) for v in a.m.split(",")):
                    r = time_settings(op_name, K, N, M, nt, a.reps, a.group_size, cold, probe_bytes)
                    rows.append({"op": op_name, "K": K, "N": N, "M": M, "threads": nt, "GBps": r})
                    shares = ", ".join(f"{k} {v / r['probe']:.0%}" for k, v in r.items() if k != "probe")
                    print(f"{op_name} {K}x{N} M={M} threads={nt}: probe {r['probe']:.1f} GB/s; {shares}", flush=True)
    if not a.smoke:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "threads_available": os.cpu_count()}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
