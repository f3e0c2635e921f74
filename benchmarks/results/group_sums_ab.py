"""W4A16 decode kernels with the rows' sums of x per group precomputed once per call (w4a16::group_sums,
quantize_x_int16's sums of xi; shipped) against the same kernels computing them for every panel pass (the
library rendered with ``segment_sums`` never reading the precomputed ones: the kernels before the change).
One K x N layer, hot, interleaved call by call with the vdpbf16ps peak, order rotated; outputs checked
bit-identical.

    python benchmarks/results/group_sums_ab.py M,M,... KxN INT16_X [REPS]

INT16_X: the plan's ``decode_int16`` (0: bf16 x on vdpbf16ps, 1: int16 x on vpdpwssd). Share: 2 M N K / time
over the peak.
"""
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import peak_probe  # noqa: E402
from awq_inductor import AWQLinear  # noqa: E402
from awq_inductor.kernels import codegen, native, tuning_cache  # noqa: E402

# the kernels' sums read only where they computed them themselves: never
KERNEL_SUMS = [("const bool whole = xsum != nullptr &&", "const bool whole = false && xsum != nullptr &&"),
               ("const bool whole = xisum != nullptr &&", "const bool whole = false && xisum != nullptr &&")]


def _kernel(op_name: str, subs):
    """The op's eager kernel from the library rendered with ``subs`` applied (each must match once)."""
    for cached in (native._kernel, native._library, native._library_path):
        cached.cache_clear()
    render = codegen.render_eager

    def patched(*args, **kwargs):
        src = render(*args, **kwargs)
        for old, new in subs:
            if src.count(old) != 1:
                raise SystemExit(f"group_sums_ab: expected one {old!r} in the rendered source")
            src = src.replace(old, new)
        return src

    codegen.render_eager = patched
    try:
        return native.get_kernel(op_name, torch.bfloat16)
    finally:
        codegen.render_eager = render


def main(argv):
    ms = [int(m) for m in argv[0].split(",")]
    K, N = map(int, argv[1].split("x"))
    int16_x, reps, G = int(argv[2]), int(argv[3]) if len(argv) > 3 else 30, 128
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
    layer = AWQLinear.from_canonical(q, z, s, group_size=G)
    weights = [getattr(layer, w.name) for w in layer.op.scheme.weights]
    kerns = {"kernel sums": _kernel(layer.op.name, KERNEL_SUMS), "precomputed": _kernel(layer.op.name, [])}
    plan = tuning_cache.plan_for(layer.op, kerns["precomputed"].isa, torch.bfloat16, K, N, G)
    plan = dataclasses.replace(plan, decode_int16=int16_x)
    print(f"w4a16 {K}x{N} G{G}, 2 threads, plan {plan}")
    peak, peak_ops = peak_probe.peak_calls(2, "bf16", iters=1 << 18)
    for M in ms:
        x = torch.randn(M, K, dtype=torch.bfloat16)
        fns = {k: (lambda kk: lambda: kk(x, *weights, None, G, N, plan=plan))(kk) for k, kk in kerns.items()}
        outs = [f() for f in fns.values()]
        assert all(torch.equal(o, outs[0]) for o in outs), "outputs differ"
        fns["peak"] = peak
        names, t = list(fns), {k: [] for k in fns}
        for rep in range(reps):
            for k in names[rep % len(names):] + names[:rep % len(names)]:
                t0 = time.perf_counter()
                fns[k]()
                t[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in t.items()}
        rate = peak_ops / med["peak"]
        cells = "  ".join(f"{k} {med[k] * 1e3:.3f} ms ({2 * M * K * N / med[k] / rate:.0%})" for k in kerns)
        print(f"M={M}: {cells}  kernel/precomputed {med['kernel sums'] / med['precomputed']:.2f}  "
              f"peak {rate / 1e12:.3f} T/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
