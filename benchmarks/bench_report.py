"""What ran and how fast: one int4 linear per shape, every M, against dense bf16, aten int4pack and
Inductor's own WOQ template, with the kernel path the per-machine plan picks.

    python benchmarks/bench_report.py                        # the four Llama-7B shapes, M = 1..2048
    python benchmarks/bench_report.py --shapes smoke --m 1,8 --reps 3   # seconds (CI smoke)
    python benchmarks/bench_report.py --kn 4096x4096 --m 16,128 --no-tuner-cost   # chosen shapes

For each (K, N, M): the ISA, the kernel path of our compiled op (``kplan.path_for`` of the shape's
plan: tuned on first use, or from the cache), its GB/s (int4 weight + scales/zeros + x + y bytes
per call) and TFLOP/s, the ratios to dense bf16 (F.linear of the dequantized weight), aten int4pack
and the Inductor WOQ template (and which kernel that baseline ran), and the issue's guarantee:
ours <= 1.05 x min(dense bf16, aten int4pack), ``ok`` or ``SLOWER``. Before the table: the tuner's
cold cost (measuring every shape into an empty cache, g++ builds excluded) and warm cost (plans
read back from the cache file in a fresh lookup, and from memory). Writes <tag>.md, <tag>.json
and, where matplotlib is installed, <tag>.png under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decode  # noqa: E402  (build_copies, compiled_calls, rewarm_calls: decode's cold harness)
import bench_linear  # noqa: E402  (make_layer, bench, woq_for_m: the same harness)

import awq_inductor  # noqa: E402
from awq_inductor import AWQLinear  # noqa: E402
from awq_inductor.baselines import Int4PackLinear  # noqa: E402
from awq_inductor.kernels import isa as isa_mod, native, plan as kplan, tuning_cache  # noqa: E402
from awq_inductor.schemes import OPS  # noqa: E402

GUARANTEE = 1.05
#: Up to this M, cold mode times ours and aten int4pack as benchmarks/bench_decode.py does: each
#: call on the next of enough independent copies of the layer (COLD_BYTES of ours) that its weights
#: come from DRAM while the code stays warm, as in decode, where the same code runs layer after
#: layer. After the flush pass, a call there also pays for page-table walks and cold code, which
#: at M = 1 (under 1 ms) moved ours / aten from 0.62 (bench_decode) to 1.06 (4096 x 4096).
DECODE_M = 8
COLD_BYTES = 256 << 20


def tuner_costs(shapes, dtype):
    """(cold s, warm-from-disk s, warm-in-memory s, shapes whose timings were too noisy to keep)
    for ``shapes`` (K, N) in a fresh cache dir; the eager kernels are built first (the build is
    not tuning)."""
    old = os.environ.get("AWQ_INDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        # built (or loaded) from the real cache and kept in this process: the empty cache dir
        # below then holds only the plans
        native.get_kernel("int4_mm", dtype)
        native.get_kernel("int4_mm_silu_mul", dtype)
        os.environ["AWQ_INDUCTOR_CACHE_DIR"] = d
        try:
            ss = [tuning_cache.Shape(OPS["int4_mm"], K, N, G) for K, N, G in shapes]
            tuning_cache.forget()
            t0 = time.perf_counter()
            plans = tuning_cache.tune_shapes(ss, dtype, show=False)
            cold = time.perf_counter() - t0
            noisy = sum(p.source == "noisy" for _, p in plans)
            tuning_cache.forget()
            isa = isa_mod.select()
            with awq_inductor.config.patch(tune="cached"):  # a lookup, never a measurement
                t0 = time.perf_counter()
                for s in ss:
                    tuning_cache.plan_for(s.op, isa, dtype, s.K, s.out_features, s.G)
                disk = time.perf_counter() - t0
                t0 = time.perf_counter()
                for s in ss:
                    tuning_cache.plan_for(s.op, isa, dtype, s.K, s.out_features, s.G)
                memo = time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("AWQ_INDUCTOR_CACHE_DIR", None)
            else:
                os.environ["AWQ_INDUCTOR_CACHE_DIR"] = old
            tuning_cache.forget()
    return cold, disk, memo, noisy


def layer_bytes(M, K, N, G, x_bytes):
    return K * N // 2 + (K // G) * N * 5 + M * K * x_bytes + M * N * x_bytes


def methods(K, N, G, dtype):
    """name -> module for one K x N layer: ours compiled, dense bf16, aten int4pack."""
    q, z, s = bench_linear.make_layer(K, N, G)
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    return {"ours": torch.compile(lin, backend="awq_inductor", dynamic=False),
            "dense_bf16": bench_linear._Dense(lin.dequantize().to(torch.bfloat16)),
            "aten_int4pack": Int4PackLinear(q, z, s, None, G, dtype)}, (q, z, s)


def flush_then_rewarm(flush, rewarm):
    """bench_decode.time_interleaved's per-method ``rewarm`` for the flush harness: before each timed
    call a read-only pass over a buffer larger than the L3 evicts the weights, then the same method
    runs on a small layer (``rewarm[name]``, its weights stay in cache): the pass also evicts the
    code, interpreter and dispatcher state, which the first method after it paid for (0.2-0.3 ms at
    M = 1, benchmarks/bench_decode.py) and decode, running the same code layer after layer, never
    pays. A write pass (the old ``add_``) also left 768 MiB of dirty lines whose write-back competed
    with the timed call for bandwidth."""
    def make(fn):
        def before(x):
            flush.sum()
            if fn is not None:
                fn(x)
        return before
    return {k: make(fn) for k, fn in rewarm.items()}


def run_shape(K, N, G, ms, dtype, reps, cold, flush):
    fns, (q, z, s) = methods(K, N, G, dtype)
    # the re-warm layers: K x 256, their weights stay in cache; ours has its own compiled graph
    rewarm = methods(K, 256, G, dtype)[0] if cold else None
    op, isa = OPS["int4_mm"], isa_mod.select()
    if cold:  # its copies stream from DRAM as a model's weights do: the plan is timed under the machine's
        tuning_cache.decode_setting(isa, op.scheme)  # decode setting, as a model's load measures it first
    plan = tuning_cache.plan_for(op, isa, dtype, K, N, G)
    woq_mod = Int4PackLinear(q, z, s, None, G, dtype)
    copies = None
    if cold and any(m <= DECODE_M for m in ms):
        ours_c, aten_c = bench_decode.build_copies(K, N, G, dtype, COLD_BYTES)
        copies = {"ours": bench_decode.compiled_calls(ours_c), "aten_int4pack": aten_c}
        decode_warm = bench_decode.rewarm_calls(K, G, dtype, compiled=True, w4a8=False)
        decode_warm = {"ours": decode_warm["compiled"], "aten_int4pack": decode_warm["aten"]}
    rows = []
    for M in ms:
        x = torch.randn(M, K).to(dtype)
        mfns = dict(fns)
        mfns["inductor_woq"], woq_kernel = bench_linear.woq_for_m(woq_mod, x)
        row = {"K": K, "N": N, "M": M, "isa": isa, "kernel": kplan.path_for(plan, op, isa, dtype, M),
               "plan": plan.source, "inductor_woq_kernel": woq_kernel,
               "harness": "copies" if copies is not None and M <= DECODE_M else ("flush" if cold else "hot")}
        if row["harness"] == "copies":
            row.update(bench_decode.time_interleaved(copies, x, reps, rewarm=decode_warm))
            for k in copies:
                mfns.pop(k)
        before = flush_then_rewarm(flush, {k: rewarm.get(k) for k in mfns}) if cold else None
        # the methods interleaved within each rep: a load burst on the shared machine hits them alike
        row.update(bench_decode.time_interleaved({k: [fn] for k, fn in mfns.items()}, x, reps, rewarm=before))
        t = row["ours"] * 1e-3
        row["GB/s"] = layer_bytes(M, K, N, G, x.element_size()) / t / 1e9
        row["TFLOP/s"] = 2 * M * N * K / t / 1e12
        floor = min(row["dense_bf16"], row["aten_int4pack"])
        row["guarantee"] = "ok" if row["ours"] <= GUARANTEE * floor else "SLOWER"
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows, header):
    cols = ["K", "N", "M", "isa", "kernel (plan)", "ours ms", "GB/s", "TFLOP/s", "/dense", "/aten", "/woq",
            "woq ran", f"<= {GUARANTEE}x best"]
    lines = header + ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        vals = [r["K"], r["N"], r["M"], r["isa"], f"{r['kernel']} ({r['plan']})", f"{r['ours']:.3f}",
                f"{r['GB/s']:.1f}", f"{r['TFLOP/s']:.3f}", f"{r['ours'] / r['dense_bf16']:.2f}", f"{r['ours'] / r['aten_int4pack']:.2f}",
                f"{r['ours'] / r['inductor_woq']:.2f}", r["inductor_woq_kernel"], r["guarantee"]]
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # optional: matplotlib is not a dependency
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for K, N in sorted({(r["K"], r["N"]) for r in rows}):
        rs = [r for r in rows if (r["K"], r["N"]) == (K, N)]
        for base, style in (("dense_bf16", "-o"), ("aten_int4pack", "--s"), ("inductor_woq", ":^")):
            ax.plot([r["M"] for r in rs], [r["ours"] / r[base] for r in rs], style, label=f"{K}x{N} / {base}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (rows)")
    ax.set_ylabel("ours time / baseline time")
    ax.legend(fontsize=5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama7b", choices=sorted(bench_linear.SHAPES))
    p.add_argument("--kn", default=None, metavar="KxN,...",
                   help="these K x N shapes instead of --shapes (e.g. one shape per run, to keep each under "
                        "a few minutes on a shared machine)")
    p.add_argument("--m", default="1,2,4,8,16,32,64,128,256,512,1024,2048")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--mode", default="cold", choices=["cold", "hot"])
    p.add_argument("--no-tuner-cost", action="store_true", help="skip the cold/warm tuning measurement")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--tag", default="bench_report")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    dtype, G = torch.bfloat16, a.group_size
    shapes = bench_linear.SHAPES[a.shapes]
    if a.kn:
        shapes = [(s.K, s.out_features) for s in tuning_cache.parse_shapes(a.kn, G)]
    ms = [int(m) for m in a.m.split(",")]
    header = [f"isa={isa_mod.select()} threads={a.threads} dtype=bfloat16 G={G} cache={a.mode} "
              f"torch={torch.__version__} awq_inductor={awq_inductor.__version__} "
              f"load={os.getloadavg()[0]:.2f}"]
    costs = None
    if not a.no_tuner_cost:
        costs = tuner_costs([(K, N, G) for K, N in shapes], dtype)
        header.append(f"tuner ({len(shapes)} shapes): cold {costs[0]:.2f} s, warm from the cache file "
                      f"{costs[1] * 1e3:.1f} ms, warm in memory {costs[2] * 1e3:.3f} ms; "
                      f"{costs[3]} shape(s) not repeatable (constants kept, cached as noisy)")
    flush = torch.empty((768 << 20) // 4) if a.mode == "cold" else None
    rows = []
    with torch.no_grad():
        for K, N in shapes:
            rows += run_shape(K, N, G, ms, dtype, a.reps, a.mode == "cold", flush)
    text = table(rows, header)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.tag + ".md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, a.tag + ".json"), "w") as f:
        json.dump({"args": vars(a), "tuner_cost_s": costs, "rows": rows}, f, indent=1)
    plot(rows, os.path.join(a.out, a.tag + ".png"))
    return rows


if __name__ == "__main__":
    main()
