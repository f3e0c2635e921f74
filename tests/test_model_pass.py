"""awq_inductor.transform.model_pass on hand-built models: foreign modules, fusion rules, idempotency."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from awq_inductor import formats, testing
from awq_inductor.transform import model_pass
from awq_inductor.transform.model_pass import OutputSlice, convert
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear

transformers = pytest.importorskip("transformers")


class FakeGEMM(nn.Module):
    """AutoAWQ WQLinear_GEMM look-alike (attributes and buffers only)."""

    def __init__(self, w, group_size, bias=None, scales_dtype=torch.float16):
        super().__init__()
        q, z, s = testing.quantize_weight(w, group_size, scales_dtype)
        qw, qz, sc = formats.pack_awq(q, z, s, group_size=group_size, format="gemm")
        self.w_bit, self.group_size = 4, group_size
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.register_buffer("qweight", qw)
        self.register_buffer("qzeros", qz)
        self.register_buffer("scales", sc)
        self.register_buffer("bias", bias)
        self.ref = testing.dequantize(q, z, s, group_size)


WQLinear_GEMM = type("WQLinear_GEMM", (FakeGEMM,), {})


class FakeGPTQ(nn.Module):
    def __init__(self, w, group_size):
        super().__init__()
        q, z, s = testing.quantize_weight(w, group_size)
        qw, qz, sc = formats.pack_gptq(q, z, s, group_size, format="gptq")
        self.bits, self.group_size = 4, group_size
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.register_buffer("qweight", qw)
        self.register_buffer("qzeros", qz)
        self.register_buffer("scales", sc)
        self.bias = None
        self.ref = testing.dequantize(q, z, s, group_size)


TorchQuantLinear = type("TorchQuantLinear", (FakeGPTQ,), {})


def _quantize_llama(model, group_size=32, gs_overrides=None, dtype_overrides=None):
    """Swap every decoder Linear of a float model for a foreign AutoAWQ-style module."""
    gs_overrides, dtype_overrides = gs_overrides or {}, dtype_overrides or {}
    refs = {}
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and name != "lm_head":
            leaf = name.rpartition(".")[2]
            mod = WQLinear_GEMM(m.weight.detach(), gs_overrides.get(leaf, group_size),
                                m.bias.detach().half() if m.bias is not None else None,
                                dtype_overrides.get(leaf, torch.float16))
            refs[name] = mod.ref
            model.set_submodule(name, mod)
    return refs


def _reference(model_cls_cfg, refs, seed):
    ref = testing.build_float_model(model_cls_cfg, seed=seed)
    with torch.no_grad():
        for name, w in refs.items():
            lin = ref.get_submodule(name)
            lin.weight.copy_(w)
            if lin.bias is not None:
                lin.bias.copy_(lin.bias.half().float())
    return ref


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_foreign_modules_converted_and_fused(arch):
    cfg = testing.tiny_config(arch, hidden_size=64, intermediate_size=128)
    model = testing.build_float_model(cfg, seed=3)
    refs = _quantize_llama(model)
    ref = _reference(cfg, refs, seed=3)
    assert convert(model) is model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.qkv_proj, AWQLinear) and isinstance(attn.k_proj, OutputSlice)
    hd = cfg.hidden_size // cfg.num_attention_heads
    # explicit GQA bounds, not chunk(3)
    assert (attn.q_proj.start, attn.q_proj.stop) == (0, cfg.num_attention_heads * hd)
    assert attn.v_proj.stop - attn.v_proj.start == cfg.num_key_value_heads * hd
    # gated MLP with I % 32 == 0: gate|up fused with the SiLU*mul epilogue (awq::int4_mm_silu_mul)
    assert isinstance(mlp.gate_up_proj, AWQGateUpSiluMul) and mlp.gate_up_proj.gate_up_features == 2 * cfg.intermediate_size
    assert "gate_proj" not in mlp._modules and "up_proj" not in mlp._modules
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    with torch.no_grad(), testing.Int4MMCounter() as c:
        got = model(ids).logits
    assert c.count == 4 * cfg.num_hidden_layers
    with torch.no_grad():
        torch.testing.assert_close(got, ref(ids).logits, atol=2e-3, rtol=2e-3)


def test_convert_is_idempotent():
    cfg = testing.tiny_config("llama", hidden_size=64, intermediate_size=128)
    model = testing.build_float_model(cfg)
    _quantize_llama(model)
    convert(model)
    before = {n: type(m) for n, m in model.named_modules()}
    qkv = model.model.layers[0].self_attn.qkv_proj
    convert(model)
    assert {n: type(m) for n, m in model.named_modules()} == before
    assert model.model.layers[0].self_attn.qkv_proj is qkv


def test_no_fusion_across_group_sizes_or_scale_dtypes():
    cfg = testing.tiny_config("llama", hidden_size=64, intermediate_size=128)
    model = testing.build_float_model(cfg)
    refs = _quantize_llama(model, gs_overrides={"k_proj": 64}, dtype_overrides={"up_proj": torch.bfloat16})
    ref = _reference(cfg, refs, seed=0)
    convert(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.q_proj, AWQLinear) and isinstance(attn.k_proj, AWQLinear)
    assert not hasattr(attn, "qkv_proj") and not hasattr(mlp, "gate_up_proj")
    assert type(attn) is transformers.models.llama.modeling_llama.LlamaAttention
    ids = torch.randint(0, cfg.vocab_size, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


def test_gptq_foreign_module_and_blocker_reasons():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    m = TorchQuantLinear(w, 32)
    assert model_pass.is_foreign_int4_linear(m)
    holder = nn.Sequential(m)
    convert(holder, fuse=False)
    lin = holder[0]
    assert isinstance(lin, AWQLinear) and lin.awq_source.format == "gptq"
    torch.testing.assert_close(lin.dequantize(), m.ref)
    a = AWQLinear.from_canonical(*testing.quantize_weight(w, 32), group_size=32)
    b = AWQLinear.from_canonical(*testing.quantize_weight(w, 64), group_size=64)
    assert model_pass.fusion_blocker([a, b]) == "different group sizes"


class OddAttention(nn.Module):
    """Uses its input beyond the projections: must stay unfused."""

    def __init__(self, lin):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = lin(), lin(), lin()

    def forward(self, hidden_states):
        return self.q_proj(hidden_states) + self.k_proj(hidden_states) * self.v_proj(hidden_states) + hidden_states


def test_unknown_forward_left_unfused():
    torch.manual_seed(0)

    def lin():
        return AWQLinear.from_canonical(*testing.quantize_weight(torch.randn(64, 64) * 0.05, 32), group_size=32)

    mod = OddAttention(lin)
    x = torch.randn(3, 64)
    want = mod(x)
    convert(mod)
    assert type(mod) is OddAttention and isinstance(mod.q_proj, AWQLinear)
    torch.testing.assert_close(mod(x), want)


def test_fused_mlp_compiles_without_graph_breaks():
    import torch._dynamo

    cfg = testing.tiny_config("llama", hidden_size=64, intermediate_size=128)
    model = testing.build_float_model(cfg)
    _quantize_llama(model)
    convert(model)
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, 64)
    want = mlp(x)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(mlp)(x)
    assert explain.graph_break_count == 0
    got = torch.compile(mlp, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    torch._dynamo.reset()


def test_act_quant_validation():
    with pytest.raises(ValueError):
        convert(nn.Sequential(), act_quant="int4")
    convert(nn.Sequential(), act_quant="int8")  # W4A8: tests/test_w4a8.py
