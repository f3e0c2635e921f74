"""The opt-in int4 lm_head (``lm_head="int4"``): quantization error bounds against the float head,
tied embeddings keep their float table, eager and compiled, save_pretrained refuses it."""
from __future__ import annotations

import pytest
import torch

from awq_inductor import convert
from awq_inductor.nn.head import INT4_HEAD_GROUP_SIZE, Int4HeadLinear

transformers = pytest.importorskip("transformers")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402


def _linear(N, K, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g))
    return lin


def _group_scales(head: Int4HeadLinear) -> torch.Tensor:
    """fp32 [N, K] scale of each weight's group."""
    _, _, s = head.canonical()
    return s.repeat_interleave(head.group_size, dim=1)


def test_weight_error_bound():
    """Round to nearest on a grid of 15 steps spanning each group: |w - dequant| <= s / 2 except
    where the rounded zero point pushes a group's extreme one step outside [0, 15] (<= s there),
    and the mean error of uniform rounding, s / 4, within 10%."""
    lin = _linear(512, 256, bias=False)
    head = Int4HeadLinear.from_linear(lin)
    assert head.group_size == INT4_HEAD_GROUP_SIZE
    s = _group_scales(head)
    err = (head.dequantize() - lin.weight.detach()).abs()
    assert bool((err <= s * (1 + 1e-6)).all())
    assert float((err > s / 2 * (1 + 1e-6)).float().mean()) < 1e-3
    ratio = float((err / s).mean())
    assert 0.225 < ratio < 0.275, ratio


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 17])
def test_logits_error_bound(dtype, M):
    """Against the float head: each row's largest logit error within 15% (max over rows) / 10%
    (mean) of its largest |logit|. Rounding error per weight has std ~ s / sqrt(12), s ~ 4 std(w) /
    15 over a group of 32 Gaussian weights: about 8% of the logits' std, and the largest of 512
    errors ~3 of those stds against a largest logit of ~3 stds. And exactly the dequantized
    weight's product (our op against F.linear on (q - z) * s: fp32 sums, bf16 output)."""
    lin = _linear(512, 256, seed=M)
    head = Int4HeadLinear.from_linear(lin)
    x = torch.randn(M, 256, generator=torch.Generator().manual_seed(M + 1))
    with torch.no_grad():
        y = head(x.to(dtype)).float()
        ref = lin(x)
        exact = torch.nn.functional.linear(x.to(dtype).float(), head.dequantize(), lin.bias)
    assert y.shape == (M, 512)
    scale = float(exact.abs().max())
    torch.testing.assert_close(y, exact, rtol=0, atol=(1e-4 if dtype == torch.float32 else 2 ** -7) * scale)
    rel = (y - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    assert float(rel.max()) < 0.15 and float(rel.mean()) < 0.10, (float(rel.max()), float(rel.mean()))


def test_group_size_must_divide_k():
    with pytest.raises(ValueError, match="int4 head group size 32 must divide in_features=48"):
        Int4HeadLinear.from_linear(_linear(8, 48), group_size=32)


def _tied_model():
    return testing.build_float_model(testing.tiny_config("llama", tie_word_embeddings=True), seed=0)


def test_convert_int4_head_tied_embedding():
    model = _tied_model()
    emb = model.get_input_embeddings().weight
    assert model.lm_head.weight is emb  # tied
    emb_before = emb.detach().clone()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        convert(model, lm_head="int4")
        assert isinstance(model.lm_head, Int4HeadLinear)
        emb_after = model.get_input_embeddings().weight
        assert isinstance(emb_after, torch.nn.Parameter) and emb_after.dtype == torch.float32
        assert torch.equal(emb_after, emb_before)  # the embedding is untouched
        y = model(ids).logits
        convert(model, lm_head="int4")  # idempotent
        assert isinstance(model.lm_head, Int4HeadLinear)
        assert torch.equal(model(ids).logits, y)
    rel = (y - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)
    assert float(rel.max()) < 0.15, float(rel.max())
    assert float((y.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.8


def test_quantized_head_is_not_requantized():
    model = _tied_model()
    convert(model, lm_head="int8")
    with pytest.raises(ValueError, match="lm_head='int4': the head is already a Int8HeadLinear"):
        convert(model, lm_head="int4")


def _load(path, lm_head):
    try:
        awq_hf.patch_transformers(lm_head=lm_head)
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    finally:
        awq_hf.patch_transformers()


def test_patch_transformers_int4_head_eager_and_compiled(tmp_path):
    cfg = testing.tiny_config("llama", tie_word_embeddings=True)
    path = str(tmp_path / "m")
    testing.save_quantized(testing.build_float_model(cfg), path, group_size=32)
    model = _load(path, "int4")
    float_head = _load(path, "bf16")
    assert isinstance(model.lm_head, Int4HeadLinear)
    emb = model.get_input_embeddings().weight
    assert emb.dtype == torch.bfloat16 and torch.equal(emb, float_head.get_input_embeddings().weight)
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager = model(ids).logits.float()
        compiled = torch.compile(model.forward, backend="awq_inductor")(ids).logits.float()
        ref = float_head(ids).logits.float()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=2e-2 * float(eager.abs().max()))
    rel = (eager - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)
    assert float(rel.max()) < 0.15, float(rel.max())


def test_int4_head_stays_w4a16_under_act_quant(tmp_path):
    """A later convert(act_quant="int8") repacks the decoder's linears for W4A8, not the head."""
    path = str(tmp_path / "m")
    testing.save_quantized(testing.build_float_model(testing.tiny_config("llama")), path, group_size=32)
    model = _load(path, "int4")
    convert(model, act_quant="int8", lm_head="int4")
    assert isinstance(model.lm_head, Int4HeadLinear) and model.lm_head.act_quant is None
    assert model.model.layers[0].self_attn.o_proj.act_quant == "int8"


def test_save_pretrained_refuses_int4_head(tmp_path):
    path = str(tmp_path / "m")
    testing.save_quantized(testing.build_float_model(testing.tiny_config("llama")), path, group_size=32)
    model = _load(path, "int4")
    with pytest.raises(ValueError, match=r"lm_head: an int4 lm_head \(lm_head='int4'\) cannot be saved"):
        model.save_pretrained(str(tmp_path / "out"))
