"""A shipped kernel change against the kernels before it: the library rendered as shipped, and rendered with
text substitutions that restore the earlier code path. One K x N layer, hot (the same layer every call),
interleaved call by call with the dot-product peak, order rotated; outputs checked bit-identical.

    python benchmarks/results/template_ab.py CHANGE M,M,... KxN [FIELD=VALUE,...] [REPS]

CHANGE (see CHANGES): ``group_sums`` (W4A16 decode kernels reading the rows' sums of x per group, computed once
per call, against computing them for every panel pass; FIELD ``decode_int16=0|1`` picks the x form) or
``group_fold`` (W4A8 many-row VNNI path folding a one-chunk group's sums in registers, against the int32
buffer, cleared, loaded, stored and reloaded by flush_group) or ``expand_prefetch`` (the same path's expansion of the
weights prefetching with the rows' setting, against no prefetch) or ``strip_fold`` (W4A8's AMX path folding each
32-row strip's group sums right after its tiles, against folding the whole M block after all its strips) or ``whole_k``
(the same path expanding a unit's whole K range at once above 64 rows, strips outer and groups inner, against a
group at a time). FIELD=VALUE: plan fields replaced. Share: 2 M N K /
time over the peak (vdpbf16ps for W4A16, vpdpbusd for W4A8).
"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import peak_probe  # noqa: E402
from rotating_rounds import rotated_medians  # noqa: E402
from awq_inductor import AWQLinear  # noqa: E402
from awq_inductor.kernels import codegen, native, tuning_cache  # noqa: E402

#: change -> (act_quant, the substitutions that restore the code before it)
CHANGES = {
    "group_sums": (None, [("const bool whole = sums != nullptr &&", "const bool whole = false && sums != nullptr &&")]),
    "group_fold": ("int8", [("const bool one_chunk = kc_max == G;", "const bool one_chunk = false && kc_max == G;")]),
    "expand_prefetch": ("int8", [("kc, ke, B + p * bstride, pf_l2, ahead);", "kc, ke, B + p * bstride, 0, 0);")]),
    "strip_fold": ("int8", [("    const int kstep = G % 64 == 0 ? 64 : 32;\n    const int64_t kb_max = std::min<int64_t>(G, kAmxKb8);\n    const int64_t kchunk = mrows > kAmxWholeKRows ? k1 - k0 : G;  // k expanded at once\n    const int64_t bstride = kchunk * 32;  // one panel's expanded chunk\n    int8_t* B = static_cast<int8_t*>(tls_bytes(detail::kTlsW, size_t(bstride) * 2));\n    int32_t* Ci = static_cast<int32_t*>(tls_bytes(detail::kTlsCi, size_t(32) * kTileN * 4));\n    amx_configure(kstep);\n    for (int64_t c0 = k0; c0 < k1; c0 += kchunk) {\n      const int64_t c1 = std::min(k1, c0 + kchunk);\n      for (int64_t g0 = c0; g0 < c1; g0 += G)\n        for (int p = 0; p < np; ++p)\n          micro::expand_panel(qw_ + p * pstride, z + (g0 / G) * ldsz + p * 32, g0, g0 + G,\n                              B + p * bstride + (g0 - c0) * 32, 0, 0);\n      AWQ_AMX_COUNT_DEQUANT(np * (c1 - c0) * 32);\n      for (int64_t mt = 0; mt < mrows; mt += 32) {\n        const bool two = mrows - mt > 16;\n        const uint8_t* a0 = ap + ((m0 + mt) / 16) * kt * kATile;\n        for (int64_t g0 = c0; g0 < c1; g0 += G) {\n          for (int64_t kb = g0; kb < g0 + G; kb += kb_max) {\n            const int64_t ke = std::min(g0 + G, kb + kb_max);\n            for (int p = 0; p < np; ++p)\n              micro::amx_block(a0, two ? a0 + kt * kATile : nullptr, kb, B + p * bstride + (kb - c0) * 32, ke - kb,\n                               Ci + p * 32, kTileN, two, kstep, kb == g0);\n          }\n          fold_group_amx(Ci, kTileN, cp + (g0 / G) * ldsz, s + (g0 / G) * ldsz, int(std::min<int64_t>(32, mrows - mt)),\n                         np, C + mt * kTileN, kTileN);\n        }\n      }\n    }\n",
                            "    const int kstep = G % 64 == 0 ? 64 : 32;\n    const int64_t kb_max = std::min<int64_t>(G, kAmxKb8);\n    const int64_t bstride = kb_max / 4 * 128;\n    const int64_t prows = (mrows + 31) / 32 * 32;  // padding rows of the last strip's tiles\n    int8_t* B = static_cast<int8_t*>(tls_bytes(detail::kTlsW, size_t(bstride) * 2));\n    int32_t* Ci = static_cast<int32_t*>(tls_bytes(detail::kTlsCi, size_t(prows) * kTileN * 4));\n    amx_configure(kstep);\n    for (int64_t g0 = k0; g0 < k1; g0 += G) {\n      const int64_t g = g0 / G;\n      for (int64_t kb = g0; kb < g0 + G; kb += kb_max) {\n        const int64_t ke = std::min(g0 + G, kb + kb_max);\n        for (int p = 0; p < np; ++p)\n          // (no prefetch on AMX: not timed there yet)\n          micro::expand_panel(qw_ + p * pstride, z + g * ldsz + p * 32, kb, ke, B + p * bstride, 0, 0);\n        AWQ_AMX_COUNT_DEQUANT(np * (ke - kb) * 32);\n        for (int p = 0; p < np; ++p)\n          for (int mt = 0; mt < mrows; mt += 32) {\n            const bool two = mrows - mt > 16;\n            const uint8_t* a0 = ap + ((m0 + mt) / 16) * kt * kATile;\n            micro::amx_block(a0, two ? a0 + kt * kATile : nullptr, kb, B + p * bstride, ke - kb,\n                             Ci + mt * kTileN + p * 32, kTileN, two, kstep, kb == g0);\n          }\n      }\n      fold_group_amx(Ci, kTileN, cp + g * ldsz, s + g * ldsz, mrows, np, C, kTileN);\n    }\n")]),
    "whole_k": ("int8", [("const int64_t kchunk = mrows > kAmxWholeKRows ? k1 - k0 : G;",
                          "const int64_t kchunk = G;")]),
}


def _kernel(op_name: str, subs, every: bool = False):
    """The op's eager kernel from the library rendered with ``subs`` applied (each must match once;
    ``every``: wherever it matches, at least once)."""
    for cached in (native._kernel, native._library, native._library_path):
        cached.cache_clear()
    render = codegen.render_eager

    def patched(*args, **kwargs):
        src = render(*args, **kwargs)
        for old, new in subs:
            if src.count(old) < 1 or (src.count(old) > 1 and not every):
                raise SystemExit(f"template_ab: expected one {old!r} in the rendered source")
            src = src.replace(old, new)
        return src

    codegen.render_eager = patched
    try:
        return native.get_kernel(op_name, torch.bfloat16)
    finally:
        codegen.render_eager = render


def main(argv):
    change, ms = argv[0], [int(m) for m in argv[1].split(",")]
    K, N = map(int, argv[2].split("x"))
    fields = dict(kv.split("=") for kv in argv[3].split(",") if kv) if len(argv) > 3 else {}
    reps, G = int(argv[4]) if len(argv) > 4 else 30, 128
    act_quant, subs = CHANGES[change]
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn(N, K // G, generator=g) * 0.01).to(torch.float16)
    layer = AWQLinear.from_canonical(q, z, s, group_size=G, act_quant=act_quant)
    weights = [getattr(layer, w.name) for w in layer.op.scheme.weights]
    kerns = {"before": _kernel(layer.op.name, subs), "shipped": _kernel(layer.op.name, [])}
    plan = tuning_cache.plan_for(layer.op, kerns["shipped"].isa, torch.bfloat16, K, N, G)
    plan = dataclasses.replace(plan, **{k: int(v) for k, v in fields.items()})
    print(f"{change}: {layer.op.name} {K}x{N} G{G}, 2 threads, plan {plan}")
    peak, peak_ops = peak_probe.peak_calls(2, "int8" if act_quant else "bf16", iters=1 << 18)
    for M in ms:
        x = torch.randn(M, K, dtype=torch.bfloat16)
        fns = {k: (lambda kk: lambda: kk(x, *weights, None, G, N, plan=plan))(kk) for k, kk in kerns.items()}
        outs = [f() for f in fns.values()]
        assert all(torch.equal(o, outs[0]) for o in outs), "outputs differ"
        fns["peak"] = peak
        med = rotated_medians(fns, reps)
        rate = peak_ops / med["peak"]
        cells = "  ".join(f"{k} {med[k] * 1e3:.3f} ms ({2 * M * K * N / med[k] / rate:.0%})" for k in kerns)
        print(f"M={M}: {cells}  before/shipped {med['before'] / med['shipped']:.2f}  peak {rate / 1e12:.3f} T/s",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
