"""W4A8 (``act_quant="int8"``): awq::int4_mm_a8 numerics per ISA, op checks, compile, e2e.

Accuracy figures (mean relative error vs the fp32 reference x @ ((q - z) * s).T, signed x and
signed scales) are printed (``pytest -s``) and written to ``$AWQ_W4A8_REPORT`` when set.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from helpers import op_args
from awq_inductor import config, packing, schemes
from awq_inductor.ops import oracles
from awq_inductor.kernels import native
from awq_inductor.kernels import plan as kplan
from awq_inductor.kernels import isa as isa_mod
from awq_inductor import ops as awq_ops
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear

HAS_AVX512 = isa_mod.hardware_isa() in ("avx512", "amx")
ISAS = [pytest.param("avx512", marks=pytest.mark.skipif(not HAS_AVX512, reason="needs AVX512-VNNI/BF16")),
        "portable",
        pytest.param("amx_emulated", marks=pytest.mark.skipif(not HAS_AVX512, reason="emulator built with AVX512"))]
SHAPES = [(256, 72, 64), (512, 200, 128), (128, 40, 32), (384, 96, 384)]  # (K, N, G); N % 32 != 0 mostly
MS = [1, 4, 5, 8, 32, 70, 100]  # 70: a short last M block (6 rows) on the decode kernel
_FIGURES = {}


def make_weights(K, N, G, seed=0, bias=True):
    return op_args("int4_mm_a8", N, K, G, bias=bias, seed=seed, canonical=True)[1]  # signed scales


def packed(K, N, G, seed=0, bias=True):
    return op_args("int4_mm_a8", N, K, G, bias=bias, seed=seed)


def rel_err(got, ref):
    return ((got.float() - ref.float()).abs().mean() / ref.float().abs().mean()).item()


def _kernel(isa, dtype):
    if isa == "amx_emulated":
        with config.patch(amx_emulation=True):
            return native.get_kernel("int4_mm_a8", dtype, "amx")
    return native.get_kernel("int4_mm_a8", dtype, isa)


def teardown_module(module):
    path = os.environ.get("AWQ_W4A8_REPORT")
    if path and _FIGURES:
        with open(path, "w") as f:
            json.dump(_FIGURES, f, indent=1, sort_keys=True)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_numerics_per_isa(isa, dtype):
    if isa == "amx_emulated" and dtype == torch.float16:
        pytest.skip("covered by f32/bf16 (same driver path)")
    k = _kernel(isa, dtype)
    assert k.isa == ("amx" if isa == "amx_emulated" else isa)
    g = torch.Generator().manual_seed(1)
    for K, N, G in SHAPES:
        w = packed(K, N, G)
        for M in MS:
            x = (torch.randn(M, K, generator=g) * 2).to(dtype)  # signed activations
            x[:, 3] = 7.0  # an outlier channel: the per-token scale follows it
            got = k(x, *w)
            assert got.dtype == dtype and got.shape == (M, N)
            err = rel_err(got, oracles.int4_mm("int4_mm_a8", x, *w))
            _FIGURES[f"{isa}/{str(dtype)[6:]}/K{K}_N{N}_G{G}/M{M}"] = round(err, 5)
            print(f"W4A8 {isa:12s} {str(dtype)[6:]:8s} K={K} N={N} G={G} M={M:3d} mean rel err {err:.4f}")
            assert err <= 0.03, (isa, dtype, K, N, G, M, err)
            if dtype == torch.float32:  # the integer math itself is exact: vs x quantized the same way
                exact = oracles.int4_mm("int4_mm_a8", x, *w, quantize_x=True)
                assert rel_err(got, exact) < 1e-5, (isa, K, N, G, M)


@pytest.mark.skipif(not HAS_AVX512, reason="needs AVX512-VNNI/BF16")
@pytest.mark.parametrize("K,N,G", [(512, 200, 128), (384, 96, 384)])
def test_many_rows_fold_as_the_decode_rows(K, N, G):
    """Above 32 rows the VNNI path expands q - z once per group chunk and folds each group's sums into
    C: in registers where the group is one chunk (G <= 256, vnni_buf_group), through an int32 buffer
    otherwise (flush_group). Either way the same integer per group and the same fold as the decode
    kernel's, so every row equals that row computed in 8-row calls (1 thread: no K slices)."""
    k = _kernel("avx512", torch.bfloat16)
    w = packed(K, N, G)
    x = (torch.randn(70, K, generator=torch.Generator().manual_seed(3)) * 2).bfloat16()
    with config.patch(num_threads=1):
        many = k(x, *w)
        rows = torch.cat([k(x[i:i + 8], *w) for i in range(0, 70, 8)])
    assert torch.equal(many, rows)


HAS_AMX = HAS_AVX512 and torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx()


@pytest.mark.skipif(not HAS_AVX512, reason="emulator built with AVX512")
@pytest.mark.parametrize("M", [40, 70, 300])
def test_amx_strips_fold_exactly(M):
    """W4A8's AMX path: every 32-row strip (the last one 8, 6 or 12 rows, on one 16-row tile pair) folds its
    group sums right after its tiles, a group at a time or, above 256 rows, after expanding the whole K range
    at once: exact against x quantized the same way, on the tile emulator and, where the CPU has AMX, on
    the tiles themselves, bit-identical to the emulator."""
    plan = dataclasses.replace(kplan.default_plan(), amx_min_m=1, dense_min_m=kplan.NEVER)
    emulated = _kernel("amx_emulated", torch.float32)
    hardware = native.get_kernel("int4_mm_a8", torch.float32, "amx") if HAS_AMX else None
    for K, N, G in SHAPES:
        w = packed(K, N, G)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 2
        got = emulated(x, *w, plan=plan)
        assert rel_err(got, oracles.int4_mm("int4_mm_a8", x, *w, quantize_x=True)) < 1e-5, (K, N, G, M)
        if hardware is not None:
            assert torch.equal(hardware(x, *w, plan=plan), got), (K, N, G, M)


def test_zero_rows_and_k_slicing():
    """A zero activation row (sa = 0) gives exactly the bias; M=1 with 2+ threads K-slices."""
    w = packed(512, 64, 64)
    x = torch.randn(3, 512)
    x[1] = 0
    with config.patch(num_threads=4):
        got = torch.ops.awq.int4_mm_a8(x, *w)
    torch.testing.assert_close(got[1], w[4], atol=0, rtol=0)
    assert rel_err(got, oracles.int4_mm("int4_mm_a8", x, *w, quantize_x=True)) < 1e-5


def test_packing_round_trip_and_layout():
    q, z, s, _ = make_weights(128, 40, 32)
    qw, ss, zz, comp = packing.pack_for_int8_kernel(q, z, s, 32)
    assert qw.shape == (2, 32, 64) and comp.dtype == torch.int32 and comp.shape == (4, 64)
    q2, z2, s2 = packing.unpack_from_int8_kernel(qw, ss, zz, 40)
    assert torch.equal(q2, q) and torch.equal(z2, z) and torch.equal(s2, s)
    # byte b of (panel 0, k-quad 0): v[b] | v[b + 64] << 4, v[4j + t] = q[j, t]
    assert qw[0, 0, 5].item() == (q[1, 1] | (q[17, 1] << 4)).item()
    assert comp[1, 3].item() == int((q[3, 32:64].int() - int(z[3, 1])).sum())
    assert torch.all(comp[:, 40:] == 0) and torch.all(ss[:, 40:] == 0)
    with pytest.raises(ValueError, match="group_size"):
        packing.pack_for_int8_kernel(torch.zeros(8, 12, dtype=torch.uint8), torch.zeros(8, 2, dtype=torch.uint8),
                                     torch.ones(8, 2), 6)


def test_opcheck():
    w = packed(128, 72, 64)
    for M in (1, 6):
        torch.library.opcheck(torch.ops.awq.int4_mm_a8.default, (torch.randn(M, 128, dtype=torch.bfloat16), *w))
    torch.library.opcheck(torch.ops.awq.int4_mm_a8.default, (torch.randn(3, 128), *packed(128, 72, 64, bias=False)))


def test_bad_inputs_name_tensor_expected_actual():
    qw, s, z, c, b, G, N = packed(128, 72, 64)
    x = torch.randn(2, 128)
    cases = [
        ((x.to(torch.int32), qw, s, z, c, b, G, N), r"x: expected dtype"),
        ((x[:, :64], qw, s, z, c, b, G, N), r"x: expected last dim K=128.*got 64"),
        ((x, qw.view(torch.int8), s, z, c, b, G, N), r"qweight: expected uint8 \[Np, K/4, 64\].*torch.int8"),
        ((x, qw, s.double(), z, c, b, G, N), r"scales: expected float32 \[2, 96\], got torch.float64"),
        ((x, qw, s, z, c.float(), b, G, N), r"comp: expected int32 \[2, 96\], got torch.float32"),
        ((x, qw, s, z[:1], c, b, G, N), r"zeros: expected uint8 \[2, 96\], got torch.uint8 \[1, 96\]"),
        ((x, qw, s, z, c, b.half(), G, N), r"bias: expected float32 \[72\], got torch.float16"),
        ((x, qw, s, z, c, b, 6, N), r"group_size: expected a divisor of K=128 .* got 6"),
        ((x, qw, s, z, c, b, G, 200), r"out_features: expected a value in \(64, 96\].* got 200"),
    ]
    for args, pat in cases:
        with pytest.raises(ValueError, match=pat):
            torch.ops.awq.int4_mm_a8(*args)


def test_module_act_quant_and_repack():
    q, z, s, b = make_weights(256, 100, 64)
    m16 = AWQLinear.from_canonical(q, z, s, b, group_size=64)
    m8 = AWQLinear.from_canonical(q, z, s, b, group_size=64, act_quant="int8")
    assert m8.act_quant == "int8" and m8.qweight.shape == (4, 64, 64) and m8.comp.shape == (4, 128)
    assert "act_quant='int8'" in repr(m8)
    torch.testing.assert_close(m8.dequantize(), m16.dequantize(), atol=0, rtol=0)
    x = torch.randn(2, 3, 256)
    assert rel_err(m8(x), m16(x)) < 0.03
    back = m8.with_act_quant(None)
    assert back.act_quant is None and torch.equal(back.qweight, m16.qweight)
    with pytest.raises(ValueError, match="act_quant"):
        AWQLinear(256, 100, 64, act_quant="fp8")


def test_compiled_uses_w4a8_template():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    w = packed(256, 72, 64)
    f = torch.compile(lambda a: torch.nn.functional.silu(torch.ops.awq.int4_mm_a8(a, *w)),
                      backend="awq_inductor", fullgraph=True)
    for M, dyn in ((5, False), (7, True)):
        x = torch.randn(M, 256, dtype=torch.bfloat16)
        if dyn:
            torch._dynamo.mark_dynamic(x, 0)
        out, codes = run_and_get_code(f, x)
        code = "\n".join(codes)
        assert "awq_int4_mm_a8_driver_" in code and '#define AWQ_DRIVER_LIBRARY "' in code
        assert "torch.ops.awq.int4_mm_a8" not in code  # no extern call
        ref = torch.nn.functional.silu(oracles.int4_mm("int4_mm_a8", x, *w).float())
        assert rel_err(out, ref) < 0.03
    torch._dynamo.reset()


def test_e2e_tiny_llama_greedy_matches_w4a16(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from awq_inductor import testing
    from awq_inductor.integrations import transformers as awq_hf

    cfg = testing.tiny_config("llama")
    path = str(tmp_path / "llama")
    testing.save_quantized(testing.build_float_model(cfg, seed=0), path, quant_method="awq", format="gemm",
                           group_size=32)
    try:
        awq_hf.patch_transformers()
        m16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        awq_hf.patch_transformers(act_quant="int8")
        m8 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    finally:
        awq_hf.patch_transformers()
    n8 = sum(isinstance(m, AWQLinear) and m.act_quant == "int8" for m in m8.modules())
    assert n8 >= cfg.num_hidden_layers * 3
    # a fresh int8 load fuses the gated MLP into the W4A8 silu_mul op too
    gu8 = m8.model.layers[0].mlp.gate_up_proj
    assert isinstance(gu8, AWQGateUpSiluMul) and gu8.act_quant == "int8"
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=g)
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    with torch.no_grad(), testing.Int4MMCounter():
        out16 = m16.generate(prompt, **kw)[0, 6:]
        out8 = m8.generate(prompt, **kw)[0, 6:]
    same = int((out16 == out8).sum())
    print(f"W4A8 e2e tiny llama: {same}/16 greedy tokens match W4A16")
    _FIGURES["e2e_tiny_llama_tokens_matching_of_16"] = same
    assert same >= 14
    # and convert() switches an already loaded W4A16 model to W4A8 (and back)
    from awq_inductor import transform
    from awq_inductor.transform.model_pass import convert

    sd16 = transform.checkpoint_state_dict(m16)
    q16 = m16.model.layers[0].mlp.gate_up_proj.qweight.clone()
    convert(m16, act_quant="int8")
    assert all(m.act_quant == "int8" for m in m16.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul)))
    with torch.no_grad(), testing.Int4MMCounter() as c:
        conv8 = m16.generate(prompt, **kw)[0, 6:]
    assert c.count == 4 * cfg.num_hidden_layers * 16  # qkv, o, gate|up (+ silu*mul), down per layer/step
    assert c.by_op["int4_mm_a8_silu_mul"] == cfg.num_hidden_layers * 16 and "int4_mm_silu_mul" not in c.by_op
    assert int((conv8 == out16).sum()) >= 14
    with torch.no_grad():
        assert rel_err(m16(prompt).logits, m8(prompt).logits) < 0.03
    # the checkpoint written from the W4A8 model is the original one
    sd8 = transform.checkpoint_state_dict(m16)
    assert sd8.keys() == sd16.keys() and all(torch.equal(sd8[k], sd16[k]) for k in sd16)
    from safetensors.torch import load_file

    m16.save_pretrained(str(tmp_path / "saved8"))
    orig = load_file(os.path.join(path, "model.safetensors"))
    saved = load_file(str(tmp_path / "saved8" / "model.safetensors"))
    assert set(saved) == set(orig) and all(torch.equal(saved[k], v) for k, v in orig.items())
    convert(m16)  # and back to W4A16
    gu = m16.model.layers[0].mlp.gate_up_proj
    assert gu.act_quant is None and torch.equal(gu.qweight, q16)


# ---- awq::int4_mm_a8_silu_mul (W4A8 twin of awq::int4_mm_silu_mul) -----------------------------
def packed_gate_up(K, I, G, seed=0, bias=True):
    q, z, s, b = make_weights(K, 2 * I, G, seed, bias)
    w = schemes.OPS["int4_mm_a8_silu_mul"].pack(q, z, s, G, I)
    return (*w, packing.interleave_gate_up(b, I) if bias else None, G, I), (q, z, s, b)


def _silu_kernel(isa, dtype):
    if isa == "amx_emulated":
        with config.patch(amx_emulation=True):
            return native.get_kernel("int4_mm_a8_silu_mul", dtype, "amx")
    return native.get_kernel("int4_mm_a8_silu_mul", dtype, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_silu_mul_op_vs_reference(isa, dtype):
    k = _silu_kernel(isa, dtype)
    g = torch.Generator().manual_seed(2)
    for K, I, G in ((256, 96, 64), (128, 64, 32)):
        w, (q, z, s, b) = packed_gate_up(K, I, G)
        # the fp32 W4A16 oracle: silu(x @ Wg.T + bg) * (x @ Wu.T + bu) from the canonical weights
        wf = (q.float() - z.float().repeat_interleave(G, 1)) * s.repeat_interleave(G, 1)
        for M in (1, 5, 70):
            x = (torch.randn(M, K, generator=g) * 2).to(dtype)
            x[:, 3] = 7.0
            got = k(x, *w)
            assert got.dtype == dtype and got.shape == (M, I)
            y = x.float() @ wf.t() + b
            ref = torch.nn.functional.silu(y[:, :I]) * y[:, I:]
            err = rel_err(got, ref)
            _FIGURES[f"silu_mul/{isa}/{str(dtype)[6:]}/K{K}_I{I}_G{G}/M{M}"] = round(err, 5)
            assert err <= 0.03, (isa, dtype, K, I, G, M, err)
            if dtype == torch.float32:
                exact = oracles.int4_mm("int4_mm_a8_silu_mul", x, *w, quantize_x=True)
                assert rel_err(got, exact) < 1e-5, (isa, K, I, G, M)
    # eager op entry point, K-sliced M=1 path, zero row -> silu(bg) * bu exactly
    w, _ = packed_gate_up(512, 64, 64, seed=3)
    x = torch.randn(3, 512)
    x[1] = 0
    with config.patch(num_threads=4):
        got = torch.ops.awq.int4_mm_a8_silu_mul(x, *w)
    bg, bu = packing.deinterleave_gate_up(w[4], 64)[:64], packing.deinterleave_gate_up(w[4], 64)[64:]
    torch.testing.assert_close(got[1], torch.nn.functional.silu(bg) * bu, atol=1e-6, rtol=1e-5)
    assert rel_err(got, oracles.int4_mm("int4_mm_a8_silu_mul", x, *w, quantize_x=True)) < 1e-5


def test_silu_mul_packing_round_trip_and_opcheck():
    w, (q, z, s, b) = packed_gate_up(128, 64, 32)
    q2, z2, s2 = schemes.OPS["int4_mm_a8_silu_mul"].unpack(w[0], w[1], w[2], 64)
    assert torch.equal(q2, q) and torch.equal(z2, z) and torch.equal(s2, s)
    # panel 1 (columns 32..63 of the interleaved weight) is up rows 0..31
    assert torch.equal(packing.unpack_from_int8_kernel(w[0], w[1], w[2], 128)[0][32:64], q[64:96])
    for M in (1, 6):
        torch.library.opcheck(torch.ops.awq.int4_mm_a8_silu_mul.default,
                              (torch.randn(M, 128, dtype=torch.bfloat16), *w))
    torch.library.opcheck(torch.ops.awq.int4_mm_a8_silu_mul.default,
                          (torch.randn(3, 128), *packed_gate_up(128, 64, 32, bias=False)[0]))


def test_silu_mul_bad_inputs():
    (qw, s, z, c, b, G, I), _ = packed_gate_up(128, 64, 32)
    x = torch.randn(2, 128)
    w16 = schemes.OPS["int4_mm_silu_mul"].pack(*make_weights(128, 128, 32)[:3], 32, 64)
    cases = [
        ((x, qw, s, z, c, b, G, 48), r"out_features: expected a positive multiple of 32 .* got 48"),
        ((x, qw, s, z, c, b, G, 32), r"qweight: expected 2 panels .* got \[4, 32, 64\]"),
        ((x, w16[0], s, z, c, b, G, I), r"qweight: expected uint8 \[Np, K/4, 64\]"),
        ((x, qw, s, z, c.float(), b, G, I), r"comp: expected int32 \[4, 128\], got torch.float32"),
        ((x, qw, s, z, c, b[:64], G, I), r"bias: expected float32 \[128\]"),
        ((x.to(torch.int32), qw, s, z, c, b, G, I), r"x: expected dtype"),
    ]
    for args, pat in cases:
        with pytest.raises(ValueError, match=pat):
            torch.ops.awq.int4_mm_a8_silu_mul(*args)


def test_silu_mul_compiled_one_template_kernel():
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    w, _ = packed_gate_up(256, 96, 64, seed=4)
    f = torch.compile(lambda a, r: torch.ops.awq.int4_mm_a8_silu_mul(a, *w) + r, fullgraph=True)
    x = torch.randn(7, 256, dtype=torch.bfloat16)
    r = torch.randn(7, 96, dtype=torch.bfloat16)
    out, codes = run_and_get_code(f, x, r)
    code = "\n".join(codes)
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    assert code.count("async_compile.cpp_pybinding") == 1  # GEMM + silu*mul + residual: one kernel
    assert "awq_int4_mm_a8_driver_" in code and "awq::silu_mul_tile(" in code
    assert "awq::int4_mm_a8_silu_mul (W4A8" in code
    assert "torch.ops.awq" not in code  # no extern call
    ref = oracles.int4_mm("int4_mm_a8_silu_mul", x, *w).float() + r.float()
    assert rel_err(out, ref) < 0.03
    torch._dynamo.reset()


def test_silu_mul_module_act_quant_and_repack():
    w, (q, z, s, b) = packed_gate_up(128, 64, 32, seed=5)
    m16 = AWQGateUpSiluMul.from_canonical(q, z, s, b, group_size=32, intermediate_size=64)
    m8 = m16.with_act_quant("int8")
    assert m8.act_quant == "int8" and m8.comp.shape == (4, 128) and "act_quant='int8'" in repr(m8)
    assert torch.equal(m8.qweight, w[0]) and torch.equal(m8.bias, w[4])
    torch.testing.assert_close(m8.dequantize(), m16.dequantize(), atol=0, rtol=0)
    torch.testing.assert_close(m8.canonical_bias(), b, atol=0, rtol=0)
    x = torch.randn(2, 3, 128)
    assert rel_err(m8(x), m16(x)) < 0.03
    back = m8.with_act_quant(None)
    assert back.act_quant is None and torch.equal(back.qweight, m16.qweight) and torch.equal(back.bias, m16.bias)
    gate = AWQLinear.from_canonical(q[:64], z[:64], s[:64], b[:64], group_size=32, act_quant="int8")
    up = AWQLinear.from_canonical(q[64:], z[64:], s[64:], b[64:], group_size=32)
    f8 = AWQGateUpSiluMul.from_gate_up(gate, up, act_quant="int8")
    assert torch.equal(f8.qweight, m8.qweight) and torch.equal(f8.comp, m8.comp)
    with pytest.raises(ValueError, match="act_quant"):
        AWQGateUpSiluMul(128, 64, 32, act_quant="fp8")
