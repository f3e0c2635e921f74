"""awq::int4_mm_silu_mul: op vs reference per ISA/dtype, opcheck, bad input, Inductor fusion
(counters, generated code), and the model pass on a tiny Llama (4 int4 ops per layer)."""
from __future__ import annotations

import pytest
import torch

from awq_inductor.formats import CheckpointSource
from awq_inductor.ops import oracles
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from helpers import op_args
from awq_inductor import config as awq_config
from awq_inductor import ops, packing, testing
from awq_inductor.schemes import OPS
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear

AVX512_OK = bool(torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported())
ISAS = ["portable", pytest.param("avx512", marks=pytest.mark.skipif(not AVX512_OK, reason="no AVX512-BF16"))]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make(I, K, G, bias, seed=0):
    args, (q, z, s, _) = op_args("int4_mm_silu_mul", I, K, G, bias=bias, seed=seed, canonical=True)
    return args, (q, z, s)


def check(y, ref):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    if ref.numel() == 0:
        return
    scale = ref.float().abs().max().item() + 1e-6
    err = (y.float() - ref.float()).abs().max().item()
    assert err <= TOL[y.dtype] * scale, f"max abs err {err:.3g} vs scale {scale:.3g} ({y.dtype})"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_op_matches_reference(isa, dtype):
    for bias in (False, True):
        args, (q, z, s) = make(96, 128, 32, bias)
        for M in (0, 1, 5, 33):
            x = torch.randn(M, 128).to(dtype)
            with awq_config.patch(force_isa=isa):
                y = torch.ops.awq.int4_mm_silu_mul(x, *args)
            ref = oracles.int4_mm("int4_mm_silu_mul", x, *args)
            check(y, ref)
            # the reference itself: silu(x Wg^T + bg) * (x Wu^T + bu) from the canonical weights
            w = testing.dequantize(q, z, s, 32)
            h = x.float() @ w.t() + (packing.deinterleave_gate_up(args[3], 96) if bias else 0)
            torch.testing.assert_close(ref.float(), (torch.nn.functional.silu(h[:, :96]) * h[:, 96:]).to(dtype).float())


def test_opcheck():
    args, _ = make(64, 64, 32, True)
    for x in (torch.randn(3, 64), torch.randn(2, 64).bfloat16()):
        torch.library.opcheck(torch.ops.awq.int4_mm_silu_mul.default, (x, *args),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_bad_input_names_tensor():
    (qw, sc, zr, b, G, I), _ = make(64, 64, 32, True)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="out_features: expected a positive multiple of 32"):
        torch.ops.awq.int4_mm_silu_mul(x, qw, sc, zr, None, G, 48)
    with pytest.raises(ValueError, match=r"qweight: expected 2 panels"):
        torch.ops.awq.int4_mm_silu_mul(x, qw, sc, zr, None, G, 32)
    with pytest.raises(ValueError, match=r"bias: expected float32 \[128\]"):
        torch.ops.awq.int4_mm_silu_mul(x, qw, sc, zr, b[:64], G, I)
    with pytest.raises(ValueError, match="x: expected last dim K=64"):
        torch.ops.awq.int4_mm_silu_mul(torch.randn(2, 32), qw, sc, zr, b, G, I)
    with pytest.raises(ValueError, match="intermediate_size: expected a positive multiple of 32"):
        packing.interleave_gate_up(torch.zeros(96, 4), 48)


def test_packing_round_trip():
    _, (q, z, s) = make(64, 64, 32, False)
    qw, sc, zr = OPS["int4_mm_silu_mul"].pack(q, z, s, 32, 64)
    q2, z2, s2 = OPS["int4_mm_silu_mul"].unpack(qw, sc, zr, 64)
    assert torch.equal(q2, q) and torch.equal(z2, z) and torch.equal(s2, s.float())
    # panel 1 of the kernel layout is up rows 0..31
    assert torch.equal(packing.unpack_from_kernel(qw, sc, zr, 128)[0][32:64], q[64:96])


# ------------------------------------------------------------------------------------- compiled
@pytest.fixture
def clean(inductor_clean):
    yield


@pytest.mark.parametrize("isa", ISAS)
def test_compiled_fuses_silu_mul_and_residual(clean, isa):
    args, _ = make(96, 128, 32, True, seed=3)
    x = torch.randn(7, 128, dtype=torch.bfloat16)
    r = torch.randn(7, 96, dtype=torch.bfloat16)

    def f(a, res):
        return torch.ops.awq.int4_mm_silu_mul(a, *args) + res

    with awq_config.patch(force_isa=isa):
        out, codes = run_and_get_code(torch.compile(f, fullgraph=True), x, r)
    ref = (oracles.int4_mm("int4_mm_silu_mul", x.float(), *args) + r.float()).to(torch.bfloat16)
    check(out, ref)
    code = "\n".join(codes)
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    assert counters["inductor"]["cpp_epilogue_fusion_counter"] == 1
    assert code.count("async_compile.cpp_pybinding") == 1  # one kernel: GEMM + silu*mul + residual
    assert "awq::silu_mul_tile(" in code and f"awq::int4_mm_silu_mul  isa={isa}" in code
    assert "torch.ops.awq.int4_mm" not in code  # no extern fallback call


def test_compiled_dynamic_m(clean):
    args, _ = make(64, 64, 32, False, seed=4)
    f = torch.compile(lambda a: torch.ops.awq.int4_mm_silu_mul(a, *args).float(), fullgraph=True)
    for M in (2, 9, 40):
        x = torch.randn(M, 64)
        torch._dynamo.mark_dynamic(x, 0)
        check(f(x), oracles.int4_mm("int4_mm_silu_mul", x, *args))
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1


# ------------------------------------------------------------------------------------- model pass
def _tiny_llama():
    cfg = testing.tiny_config("llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2)
    model = testing.build_float_model(cfg, seed=5)
    sd, ref = testing.quantize_to_state_dict(model, group_size=32, scales_dtype=torch.float32)
    return cfg, model, ref


def test_model_pass_llama_uses_fused_op():
    from awq_inductor import transform

    cfg, model, ref = _tiny_llama()
    # quantize in place: every decoder Linear -> AWQLinear with the reference's dequantized weight
    for name, m in list(model.named_modules()):
        if isinstance(m, torch.nn.Linear) and name != "lm_head":
            q, z, s = testing.quantize_weight(m.weight, 32, torch.float32)
            lin = AWQLinear.from_canonical(q, z, s, group_size=32)
            lin.awq_source = CheckpointSource(format="gemm", scales_dtype=torch.float32)
            model.set_submodule(name, lin)
    unfused = transform.convert(__import__("copy").deepcopy(model), fuse=False)
    transform.convert(model)
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp.gate_up_proj, AWQGateUpSiluMul) and type(mlp).__name__ == "AWQSiluMulLlamaMLP"
    assert transform.convert(model) is model and isinstance(model.model.layers[0].mlp.gate_up_proj, AWQGateUpSiluMul)
    ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), testing.Int4MMCounter() as c:
        got = model(ids).logits
    assert c.count == 4 * cfg.num_hidden_layers and c.by_op["int4_mm_silu_mul"] == cfg.num_hidden_layers
    with torch.no_grad():
        torch.testing.assert_close(got, unfused(ids).logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got, ref(ids).logits, atol=2e-3, rtol=2e-3)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids[:1, :5], **kw), ref.generate(ids[:1, :5], **kw))
    # save path: gate_proj / up_proj written back in the original format
    sd = transform.checkpoint_state_dict(model)
    assert "model.layers.0.mlp.gate_proj.qweight" in sd and "model.layers.0.mlp.gate_up_proj.qweight" not in sd
    usd = transform.checkpoint_state_dict(unfused)
    for k in ("gate_proj", "up_proj"):
        for t in ("qweight", "qzeros", "scales"):
            key = f"model.layers.1.mlp.{k}.{t}"
            assert torch.equal(sd[key], usd[key]), key


def test_model_pass_keeps_plain_fusion_when_i_not_multiple_of_32():
    from awq_inductor import transform

    cfg = testing.tiny_config("llama", hidden_size=64, intermediate_size=80, num_hidden_layers=1)
    model = testing.build_float_model(cfg, seed=6)
    for name, m in list(model.named_modules()):
        if isinstance(m, torch.nn.Linear) and name != "lm_head":
            model.set_submodule(name, AWQLinear.from_canonical(*testing.quantize_weight(m.weight, 16), group_size=16))
    transform.convert(model)
    mlp = model.model.layers[0].mlp
    assert type(mlp.gate_up_proj) is AWQLinear and mlp.gate_up_proj.out_features == 160
