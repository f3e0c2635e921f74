"""One int4 linear layer, every method side by side in one process.

    python benchmarks/bench_linear.py                      # K=4096 N=11008 G=128, M = 1..2048
    python benchmarks/bench_linear.py --shapes llama7b     # the four Llama-7B shapes
    python benchmarks/bench_linear.py --smoke              # seconds-long harness check (CI)

Methods: ``ours_compiled`` (torch.compile, backend awq_inductor), ``ours_eager`` (the op's eager
native kernel), ``dense_bf16`` (F.linear on the dequantized weight in bf16), ``aten_int4pack``
(``aten._weight_int4pack_mm_for_cpu``, zeros ``(8 - z) * s``: the path transformers 5 /
gptqmodel take on CPU) and ``inductor_woq`` (the same aten op in an eval-mode module compiled
per M with mode="max-autotune" + freezing: Inductor's own WOQ template where it applies,
``baselines.compile_inductor_woq``; the kernel its generated code runs is recorded in
``inductor_woq_kernel`` and printed, and a run that compiled nothing fails). Medians in ms;
``cold`` evicts the caches before every call by streaming a buffer larger than the L3, ``hot``
does not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import awq_inductor
from awq_inductor import AWQLinear
from awq_inductor.baselines import Int4PackLinear, compile_inductor_woq

SHAPES = {
    "mlp_up": [(4096, 11008)],
    "llama7b": [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288)],
    "smoke": [(256, 320)],
}
ALL_METHODS = ["ours_compiled", "ours_eager", "dense_bf16", "aten_int4pack", "inductor_woq"]


def make_layer(K, N, G, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.rand(N, K // G, generator=g) * 0.01 + 0.001).to(torch.float16)
    return q, z, s


class _Dense(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return F.linear(x, self.w)


def build_methods(methods, q, z, s, G, dtype, dynamic_m):
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    fns = {}
    if "ours_eager" in methods:
        fns["ours_eager"] = lin
    if "ours_compiled" in methods:
        fns["ours_compiled"] = torch.compile(lin, backend="awq_inductor", dynamic=dynamic_m)
    if "dense_bf16" in methods:
        fns["dense_bf16"] = _Dense(lin.dequantize().to(torch.bfloat16))
    if "aten_int4pack" in methods:
        fns["aten_int4pack"] = Int4PackLinear(q, z, s, None, G, dtype)
    if "inductor_woq" in methods:  # compiled per M (static shapes) by woq_for_m
        fns["inductor_woq"] = Int4PackLinear(q, z, s, None, G, dtype)
    return fns


def woq_for_m(module, x):
    """The Inductor-WOQ baseline compiled for x's shape, and the kernel it runs (asserted)."""
    fn, kernel = compile_inductor_woq(module, x)
    if kernel == "none":
        raise RuntimeError(f"inductor_woq: no compiled code for x {list(x.shape)} (Dynamo fell back to eager)")
    if kernel == "aten_extern":
        print(f"inductor_woq: M={x.shape[0]}: Inductor chose the aten extern kernel, not its WOQ template",
              file=sys.stderr)
    return fn, kernel


def bench(fn, x, reps, cold, flush):
    for _ in range(2):
        fn(x)
    ts = []
    for _ in range(reps):
        if cold:
            flush.add_(1.0)
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="mlp_up", choices=sorted(SHAPES))
    p.add_argument("--m", default="1,4,32,128,512,2048", help="comma-separated rows of activations")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--methods", default=",".join(ALL_METHODS))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mode", default="cold", choices=["cold", "hot", "both"])
    p.add_argument("--hot-max-m", type=int, default=32, help="hot numbers only up to this M")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--tag", default="bench_linear")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, few reps: checks the harness runs")
    a = p.parse_args(argv)
    if a.smoke:
        a.shapes, a.m, a.reps, a.mode, a.tag = "smoke", "1,5", 2, "hot", a.tag + "_smoke"
        a.methods = "ours_compiled,ours_eager,dense_bf16,aten_int4pack"
    torch.set_num_threads(a.threads)
    # the WOQ baseline compiles Int4PackLinear.forward once per (shape, M): above Dynamo's default
    # limit of 8 it would silently run eager (woq_for_m checks)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    dtype = getattr(torch, a.dtype)
    methods = a.methods.split(",")
    ms = [int(m) for m in a.m.split(",")]
    modes = ["cold", "hot"] if a.mode == "both" else [a.mode]
    flush = torch.empty((768 << 20) // 4) if "cold" in modes else None  # 768 MiB > 480 MB L3
    rows = []
    with torch.no_grad():
        for K, N in SHAPES[a.shapes]:
            q, z, s = make_layer(K, N, a.group_size)
            fns = build_methods(methods, q, z, s, a.group_size, dtype, dynamic_m=False)
            for M in ms:
                x = torch.randn(M, K).to(dtype)
                mfns = dict(fns)
                woq_kernel = None
                if "inductor_woq" in fns:
                    mfns["inductor_woq"], woq_kernel = woq_for_m(fns["inductor_woq"], x)
                for mode in modes:
                    if mode == "hot" and M > a.hot_max_m and a.mode == "both":
                        continue
                    row = {"K": K, "N": N, "M": M, "mode": mode}
                    if woq_kernel is not None:
                        row["inductor_woq_kernel"] = woq_kernel
                    for name, fn in mfns.items():
                        xx = x.to(torch.bfloat16) if name == "dense_bf16" else x
                        row[name] = bench(fn, xx, a.reps, mode == "cold", flush)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    cols = [m for m in ALL_METHODS if m in methods]
    lines = [f"threads={a.threads} dtype={a.dtype} G={a.group_size} torch={torch.__version__} "
             f"awq_inductor={awq_inductor.__version__}", "",
             "| K | N | M | cache | " + " | ".join(cols) + " | ours/dense | inductor_woq ran |",
             "|---|---|---|---|" + "---|" * len(cols) + "---|---|"]
    for r in rows:
        ratio = ""
        best = r.get("ours_compiled", r.get("ours_eager"))
        if best is not None and "dense_bf16" in r:
            ratio = f"{best / r['dense_bf16']:.2f}"
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {r['mode']} | "
                     + " | ".join(f"{r[c]:.3f}" for c in cols) + f" | {ratio} | {r.get('inductor_woq_kernel', '')} |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.tag + ".json"), "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, a.tag + ".md"), "w") as f:
        f.write(table + "\n")
    _plot(rows, cols, os.path.join(a.out, a.tag + ".png"))
    return rows


def _plot(rows, cols, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plotting is optional: matplotlib is not a dependency
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for K, N in sorted({(r["K"], r["N"]) for r in rows}):
        for c in cols:
            if c == "dense_bf16":
                continue
            pts = [(r["M"], r[c] / r["dense_bf16"]) for r in rows
                   if (r["K"], r["N"]) == (K, N) and r["mode"] == "cold" and c in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{c} {K}x{N}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (rows)")
    ax.set_ylabel("time / dense bf16 time")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
