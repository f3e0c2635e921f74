"""Decode at the memory limit: the machine's cold read bandwidth and each kernel's share of it.

    python benchmarks/bench_decode.py                     # four Llama-7B shapes, M = 1, 2, 4, 8
    python benchmarks/bench_decode.py --shapes 4096x11008 --m 1,8 --reps 30
    python benchmarks/bench_decode.py --smoke             # seconds-long harness check

The probe (``benchmarks/bw_probe.py``) streams a 1 GiB buffer (far larger than any L3 here) with
our own AVX512 C++ read, exactly ``--threads`` threads, built with the package's toolchain; the best
of several passes is the machine's read bandwidth. ``torch.sum`` over the same buffer is
printed beside it as a cross-check.

Each layer is timed cold: ``copies`` independent copies of its weights, together at least
``--cold-bytes`` (default 256 MiB, 8x a 32 MiB L3), are used in rotation, so every call reads
weights that were evicted since their last use (no flush buffer: a flush leaves dirty lines whose
write-back would be charged to the kernel). Methods are interleaved call by call: ours (the op's
eager kernel, ``awq::int4_mm``) and ``aten._weight_int4pack_mm_for_cpu`` (the gptqmodel path).
Before each timed call the same method runs once, untimed, on a small layer that stays in cache:
weights cold, code warm, as in decode (``--no-rewarm``: the old order, where the method timed right
after the probe also ran with cold code; see ``time_interleaved``).

Bytes per call: packed weights + scales + zeros of the method's own layout + x + y. GB/s is
bytes / median time; ``share`` is GB/s / the GB/s of the probe (a 256 MiB stream) timed as one more
method in the same interleaved reps, so a machine shared with other jobs loads both alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bw_probe, when loaded by path (tests)
import bw_probe  # noqa: E402
import awq_inductor  # noqa: E402
from awq_inductor import AWQLinear  # noqa: E402
from awq_inductor.baselines import Int4PackLinear  # noqa: E402
from awq_inductor.kernels import hugepages, isa as isa_mod, plan as kplan, tuning_cache  # noqa: E402

LLAMA7B = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288)]


def probe_calls(threads: int, nbytes: int, copies: int = 1):
    """Callables streaming ``nbytes`` (far larger than the L3: cold by itself): the probe as a "method"
    interleaved with the kernels, so its median sees the same machine load as theirs."""
    return bw_probe.stream_calls(threads, nbytes, copies)


def read_bandwidth(threads: int, nbytes: int = 1 << 30, reps: int = 7) -> dict:
    """Best-of-``reps`` GB/s of our streaming read (bw_probe) over ``nbytes`` and, as a cross-check,
    of ``torch.sum`` over an int64 buffer of the same size."""
    buf = torch.ones(nbytes // 8, dtype=torch.int64)  # touched: pages are mapped before timing
    tsum = []
    for _ in range(reps):
        t0 = time.perf_counter()
        buf.sum()
        tsum.append(time.perf_counter() - t0)
    del buf
    return {"bytes": nbytes, "probe_gbs": bw_probe.read_gbps(threads, nbytes, reps),
            "torch_sum_gbs": nbytes / min(tsum) / 1e9}


def make_layer(K, N, G, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.rand(N, K // G, generator=g) * 0.01 + 0.001).to(torch.float16)
    return q, z, s


def _nbytes(mod) -> int:
    return sum(b.numel() * b.element_size() for b in mod.buffers() if b is not None)


def _read_nbytes(layer, M: int, dtype) -> int:
    """Bytes of ``layer``'s buffers its kernel path reads at M rows (``plan.weights_read``; a bias
    and the other buffers counted as before)."""
    op, isa = layer.op, isa_mod.select()
    plan = tuning_cache.plan_for(op, isa, dtype, layer.in_features, layer.out_features, layer.group_size)
    skipped = {w.name for w in op.scheme.weights} - {w.name for w in kplan.weights_read(plan, op, isa, dtype, M)}
    return sum(b.numel() * b.element_size() for n, b in layer.named_buffers() if b is not None and n not in skipped)


def build_copies(K, N, G, dtype, cold_bytes, act_quant=None):
    """``copies`` independent (ours, aten) layer pairs, at least ``cold_bytes`` of our weights;
    ``act_quant="int8"``: ours is the W4A8 layer (no aten copies)."""
    q, z, s = make_layer(K, N, G, seed=0)
    first = AWQLinear.from_canonical(q, z, s, group_size=G, act_quant=act_quant)
    if dtype == torch.bfloat16:  # the copies stream from DRAM as a large model's weights do: their plans
        tuning_cache.decode_setting(isa_mod.select(), first.op.scheme)  # carry the machine's decode setting
    n = max(2, -(-cold_bytes // _nbytes(first)))
    ours = [first] + [AWQLinear.from_canonical(q, z, s, group_size=G, act_quant=act_quant) for _ in range(n - 1)]
    for layer in ours:  # as a loaded model's weights are (convert places them; from_canonical does not)
        hugepages.place_streamed_weights(layer)
    aten = [] if act_quant else [Int4PackLinear(q, z, s, None, G, dtype) for _ in range(n)]
    return ours, aten


def rewarm_calls(K, G, dtype, compiled: bool, w4a8: bool) -> dict:
    """Untimed calls of each method on a small layer (K x 256) that stays in cache: see time_interleaved."""
    ours, aten = build_copies(K, 256, G, dtype, 0)
    calls = {"ours": ours[0], "aten": aten[0]}
    if compiled:
        calls["compiled"] = compiled_calls(ours[:1])[0]
    if w4a8:
        calls["w4a8"] = build_copies(K, 256, G, dtype, 0, act_quant="int8")[0][0]
    return calls


def compiled_calls(ours):
    """One ``torch.compile`` (backend awq_inductor, static M) of the op with the weights as graph
    inputs, called on each copy: the generated C++ kernel without the eager op's Python checks."""
    lin = ours[0]

    def f(x, qweight, scales, zeros):
        return torch.ops.awq.int4_mm(x, qweight, scales, zeros, None, lin.group_size, lin.out_features)

    cf = torch.compile(f, backend="awq_inductor", dynamic=False)
    # rotated by half the copies: the eager call just before read ours[i], which must stay cold here
    h = len(ours) // 2
    return [lambda x, m=m: cf(x, m.qweight, m.scales, m.zeros) for m in ours[h:] + ours[:h]]


def time_interleaved(fns: dict, x, reps: int, rewarm: dict = None) -> dict:
    """Median ms per method; each rep calls every method once on its next (cold) copy.

    ``rewarm[k]`` (optional, untimed) is called just before each timed call of method ``k``: the same
    method on a small layer whose weights stay in cache. The probe streams 256 MiB and leaves the
    interpreter, the dispatcher and the kernel code cold as well as the weights; whichever method
    came right after it paid about 0.2-0.3 ms for that (measured 1 thread, interleaved, method
    order swapped: aten 301 vs 123 us, ours 389 vs 91 us at 4096x256), which decode, where the
    same code runs for every layer, never pays. Re-warming times cold weights with warm code."""
    ts = {k: [] for k in fns}
    n = {k: len(v) for k, v in fns.items()}
    rewarm = rewarm or {}
    for k, copies in fns.items():  # warm-up: builds kernels, faults pages in
        for c in copies[:2]:
            c(x)
    i = 0
    for _ in range(reps):
        for k, copies in fns.items():
            c = copies[i % n[k]]
            if k in rewarm:
                rewarm[k](x)
            t0 = time.perf_counter()
            c(x)
            ts[k].append(time.perf_counter() - t0)
        i += 1
    return {k: statistics.median(v) * 1e3 for k, v in ts.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in LLAMA7B), help="KxN,KxN,...")
    p.add_argument("--m", default="1,2,4,8")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--cold-bytes", type=int, default=256 << 20)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--tag", default="bench_decode")
    p.add_argument("--compiled", action="store_true", help="also time the torch.compile'd op (generated kernel)")
    p.add_argument("--no-rewarm", action="store_true",
                   help="time each method right after the others as before (the one after the probe runs with cold code)")
    p.add_argument("--w4a8", action="store_true", help="also time the W4A8 layer (act_quant=\"int8\", "
                   "awq::int4_mm_a8) on its own cold copies")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--small-pages", action="store_true", help="our weights and the probe's buffer on 4 KiB "
                   "pages (config.huge_pages off): the code before huge pages")
    a = p.parse_args(argv)
    awq_inductor.config.huge_pages = not a.small_pages
    if a.smoke:
        a.shapes, a.m, a.reps, a.cold_bytes, a.tag = "256x320", "1,8", 3, 1 << 20, a.tag + "_smoke"
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    load = os.getloadavg()
    bw = read_bandwidth(a.threads, nbytes=(64 << 20) if a.smoke else (1 << 30))
    print(f"read bandwidth ({a.threads} threads, {bw['bytes'] >> 20} MiB): probe {bw['probe_gbs']:.1f} GB/s, "
          f"torch.sum {bw['torch_sum_gbs']:.1f} GB/s; load average {load[0]:.2f}", file=sys.stderr, flush=True)
    probe, probe_bytes = probe_calls(a.threads, (4 << 20) if a.smoke else (256 << 20))
    rows = []
    with torch.no_grad():
        for shape in a.shapes.split(","):
            K, N = (int(v) for v in shape.split("x"))
            ours, aten = build_copies(K, N, a.group_size, dtype, a.cold_bytes)
            warm = rewarm_calls(K, a.group_size, dtype, a.compiled, a.w4a8)
            w4a8 = build_copies(K, N, a.group_size, dtype, a.cold_bytes, act_quant="int8")[0] if a.w4a8 else None
            for M in (int(m) for m in a.m.split(",")):
                x = torch.randn(M, K).to(dtype)
                io = (M * K + M * N) * x.element_size()
                fns = {"ours": ours, "aten": aten, "probe": probe}
                if a.compiled:
                    fns["compiled"] = compiled_calls(ours)
                if w4a8:
                    fns["w4a8"] = w4a8
                t = time_interleaved(fns, x, a.reps, rewarm=None if a.no_rewarm else warm)
                row = {"K": K, "N": N, "M": M, "copies": len(ours), "ours_bytes": _read_nbytes(ours[0], M, dtype) + io,
                       "aten_bytes": _nbytes(aten[0]) + io, "probe_bytes": probe_bytes}
                row["compiled_bytes"] = row["ours_bytes"]
                if w4a8:
                    row["w4a8_bytes"] = _read_nbytes(w4a8[0], M, dtype) + io
                for k in fns:
                    row[f"{k}_ms"] = t[k]
                    row[f"{k}_gbs"] = row[f"{k}_bytes"] / (row[f"{k}_ms"] * 1e-3) / 1e9
                for k in fns:  # share of the bandwidth the probe measured in the same interleaved reps
                    row[f"{k}_share"] = row[f"{k}_gbs"] / row["probe_gbs"]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            del ours, aten, w4a8
    by_shape = {}
    for r in rows:
        by_shape.setdefault((r["K"], r["N"]), {})[r["M"]] = r["ours_ms"]
    lines = [f"threads={a.threads} dtype={a.dtype} G={a.group_size} torch={torch.__version__} "
             f"awq_inductor={awq_inductor.__version__} load_avg_before={load[0]:.2f}",
             f"read bandwidth: probe {bw['probe_gbs']:.1f} GB/s (1 GiB stream, best of 7), "
             f"torch.sum {bw['torch_sum_gbs']:.1f} GB/s", "",
             "share = GB/s / the probe's GB/s (256 MiB stream) measured interleaved in the same reps", "",
             "| K | N | M | ours ms | aten ms | ours/aten | ours GB/s | ours share | aten GB/s | aten share "
             "| ours / ours(M=1) | compiled ms | compiled share | w4a8 ms | w4a8 share | ours/w4a8 | probe GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m1 = by_shape[(r["K"], r["N"])].get(1)
        rel = f"{r['ours_ms'] / m1:.2f}" if m1 else ""
        comp = f"{r['compiled_ms']:.3f} | {r['compiled_share']:.0%}" if "compiled_ms" in r else " | "
        a8 = (f"{r['w4a8_ms']:.3f} | {r['w4a8_share']:.0%} | {r['ours_ms'] / r['w4a8_ms']:.2f}"
              if "w4a8_ms" in r else " | | ")
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {r['ours_ms']:.3f} | {r['aten_ms']:.3f} | "
                     f"{r['ours_ms'] / r['aten_ms']:.2f} | {r['ours_gbs']:.1f} | {r['ours_share']:.0%} | "
                     f"{r['aten_gbs']:.1f} | {r['aten_share']:.0%} | {rel} | {comp} | {a8} | {r['probe_gbs']:.1f} |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.tag + ".json"), "w") as f:
        json.dump({"args": vars(a), "bandwidth": bw, "load_avg": load, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, a.tag + ".md"), "w") as f:
        f.write(table + "\n")
    return rows


if __name__ == "__main__":
    main()
