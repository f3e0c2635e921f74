"""The opt-in int8 lm_head: awq::int8_linear against its oracle, quantization error bounds, the
model pass and transformers loading (tied embeddings keep their float table)."""
from __future__ import annotations

import os

import pytest
import torch

from awq_inductor import convert
from awq_inductor.ops import head_int8 as int8_head, oracles
from awq_inductor.nn.head import Int8HeadLinear

transformers = pytest.importorskip("transformers")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402


def _weights(N, K, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    b = torch.randn(N, generator=g) if bias else None
    q, s = int8_head.quantize_per_channel(w)
    return w, q, s, b


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3), (torch.float16, 2e-3)])
@pytest.mark.parametrize("M", [0, 1, 3, 4, 5, 8, 9, 33])
def test_op_matches_reference(dtype, tol, M):
    """K = 200 (not a multiple of 16: masked tail), N = 37 (not a multiple of 4 channels); M > 8
    takes the chunked dequantize path."""
    _, q, s, b = _weights(37, 200, seed=M)
    x = torch.randn(M, 200, generator=torch.Generator().manual_seed(M + 1)).to(dtype)
    y = int8_head.int8_linear(x, q, s, b)
    assert y.shape == (M, 37) and y.dtype == dtype
    ref = oracles.int8_linear(x, q, s, b).float()
    scale = ref.abs().max().clamp_min(1e-6) if M else 1.0
    torch.testing.assert_close(y.float() / scale, ref / scale, rtol=0, atol=tol)


@pytest.mark.parametrize("kc", [4, 8])
def test_one_row_channel_blocking(kc):
    """Both one-row blockings (KC_ONE_ROW) against the oracle: N = 37 leaves a partial block of
    channels at the end of each thread's range, K = 200 a masked tail."""
    _, q, s, _ = _weights(37, 200, seed=7, bias=False)
    x = torch.randn(1, 200, generator=torch.Generator().manual_seed(8))
    ref = oracles.int8_linear(x, q, s, None).float()
    torch.testing.assert_close(int8_head._gemv(x, q, s, kc), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("M", [1, 2, 3, 4, 7])
def test_vnni_and_portable_kernels_agree(M):
    """The AVX512 (VNNI, unsigned w + 128 against signed x, the 128 * sum(a) taken off) and the
    portable (signed int32 dot) kernels compute the same integer sums: equal up to fp32 sums.
    K = 300: two whole groups of 128 and a partial one ending inside a 64-byte step."""
    from awq_inductor.kernels import isa as isa_mod

    if not isa_mod.select().avx512_bf16:
        pytest.skip("no AVX512-BF16 / VNNI on this machine")
    _, q, s, _ = _weights(45, 300, seed=M, bias=False)
    x = torch.randn(M, 300, generator=torch.Generator().manual_seed(M)) * torch.linspace(0.1, 4, 300)
    fast, portable = (int8_head._gemv(x, q, s, isa=i) for i in ("avx512", "portable"))
    torch.testing.assert_close(fast, portable, rtol=0, atol=2e-6 * float(portable.abs().max()))
    ref = oracles.int8_linear(x, q, s, None).float()
    torch.testing.assert_close(fast, ref, rtol=0, atol=2e-6 * float(ref.abs().max()))


def test_nonfinite_x_gives_nan_logits_not_garbage():
    _, q, s, _ = _weights(16, 256, bias=False)
    x = torch.randn(3, 256)
    x[1, 200] = float("nan")
    x[2, 5] = float("inf")
    y = int8_head.int8_linear(x, q, s)
    assert bool(torch.isfinite(y[0]).all()) and bool(torch.isnan(y[1]).all()) and bool(torch.isnan(y[2]).all())


def test_quantization_error_bounds():
    """Elementwise |w - dequant| <= s / 2 (round to nearest, no clipping: s = max|w| / 127), x's
    rounding per group (quantize_x) within max|x_g| / 254, and each row's largest logit error
    within 2% (max over rows) / 1% (mean) of its largest |logit|: each rounding adds an error per
    logit of std ~ (max / 127) / sqrt(12) * sqrt(K) * rms of the other factor, about 0.6% of the
    logits' std for Gaussian weights and x, and the largest of 512 channels ~3 stds of either."""
    w, q, s, _ = _weights(512, 256, bias=False)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and int(q.abs().max()) == 127
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] / 2 * (1 + 1e-6)).all())
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    xg = x.reshape(64, -1, int8_head.X_GROUP)
    xerr = (int8_head.quantize_x(x) - x).reshape(xg.shape).abs()
    assert bool((xerr <= xg.abs().amax(dim=2, keepdim=True) / 254 * (1 + 1e-6)).all())
    ref = x @ w.t()
    y = int8_head.int8_linear(x, q, s)
    rel = (y - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    assert float(rel.max()) < 2e-2 and float(rel.mean()) < 1e-2, (float(rel.max()), float(rel.mean()))


def test_quantize_zero_channel_and_nonfinite():
    w = torch.randn(4, 32)
    w[1] = 0
    q, s = int8_head.quantize_per_channel(w)
    assert float(s[1]) == 1.0 and int(q[1].abs().max()) == 0
    w[2, 5] = float("inf")
    with pytest.raises(ValueError, match="channel 2"):
        int8_head.quantize_per_channel(w)


@pytest.mark.parametrize("over,match", [
    ({"x": torch.randn(2, 31)}, "x: expected last dim K=32"),
    ({"weight": torch.zeros(8, 32, dtype=torch.uint8)}, "weight: expected int8"),
    ({"scales": torch.ones(8, dtype=torch.bfloat16)}, r"scales: expected float32 \[8\]"),
    ({"bias": torch.ones(7)}, r"bias: expected float32 \[8\]"),
])
def test_bad_input(over, match):
    args = {"x": torch.randn(2, 32), "weight": torch.zeros(8, 32, dtype=torch.int8), "scales": torch.ones(8),
            "bias": None, **over}
    with pytest.raises(ValueError, match=match):
        int8_head.int8_linear(args["x"], args["weight"], args["scales"], args["bias"])


def _tied_model():
    cfg = testing.tiny_config("llama", tie_word_embeddings=True)
    return testing.build_float_model(cfg, seed=0)


def test_convert_int8_head_tied_embedding():
    model = _tied_model()
    emb = model.get_input_embeddings().weight
    assert model.lm_head.weight is emb  # tied
    emb_before = emb.detach().clone()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        convert(model, lm_head="int8")
        assert isinstance(model.lm_head, Int8HeadLinear)
        assert model.get_input_embeddings().weight.dtype == torch.float32
        assert torch.equal(model.get_input_embeddings().weight, emb_before)  # the embedding is untouched
        y = model(ids).logits
        convert(model, lm_head="int8")  # idempotent
        assert torch.equal(model(ids).logits, y)
    rel = (y - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)
    assert float(rel.max()) < 3e-2, float(rel.max())
    assert float((y.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9


def test_bad_lm_head_choice():
    with pytest.raises(ValueError, match=r"lm_head: expected one of \('bf16', None, 'int8', 'int4'\), got 'int2'"):
        convert(_tied_model(), lm_head="int2")
    with pytest.raises(ValueError, match="lm_head: expected one of"):
        awq_hf.patch_transformers(lm_head="fp8")


def test_patch_transformers_int8_head_compiled(tmp_path):
    cfg = testing.tiny_config("llama")
    ref = testing.save_quantized(testing.build_float_model(cfg), str(tmp_path / "m"), group_size=32)
    try:
        awq_hf.patch_transformers(lm_head="int8")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16).eval()
    finally:
        awq_hf.patch_transformers()
    assert isinstance(model.lm_head, Int8HeadLinear)
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager = model(ids).logits.float()
        compiled = torch.compile(model.forward, backend="awq_inductor")(ids).logits.float()
        dense = ref.to(torch.bfloat16)(ids).logits.float()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=2e-2 * float(eager.abs().max()))
    rel = (eager - dense).abs().amax(dim=-1) / dense.abs().amax(dim=-1)
    assert float(rel.max()) < 0.1, float(rel.max())


def test_save_pretrained_refuses_int8_head(tmp_path):
    cfg = testing.tiny_config("llama")
    testing.save_quantized(testing.build_float_model(cfg), str(tmp_path / "m"), group_size=32)
    try:
        awq_hf.patch_transformers(lm_head="int8")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16)
    finally:
        awq_hf.patch_transformers()
    with pytest.raises(ValueError, match=r"lm_head: an int8 lm_head .* cannot be saved as the checkpoint's float "
                                         r"lm_head\.weight"):
        model.save_pretrained(str(tmp_path / "out"))
    assert not os.path.exists(os.path.join(tmp_path, "out", "model.safetensors"))
