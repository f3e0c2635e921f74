"""The default bf16 lm_head: awq::bf16_linear (our AVX512-BF16 GEMV up to GEMV_MAX_M rows, F.linear
above) against fp32 references, and convert()'s default lm_head="bf16" (class switched in place,
tied embeddings still share the weight)."""
from __future__ import annotations

import pytest
import torch

from awq_inductor import convert
from awq_inductor.ops import head_bf16 as bf16_head
from awq_inductor.nn.head import Bf16HeadLinear, Int8HeadLinear

transformers = pytest.importorskip("transformers")

from awq_inductor import testing  # noqa: E402

needs_gemv = pytest.mark.skipif(not bf16_head.gemv_available(), reason="no AVX512-BF16: the head stays on F.linear")


def _data(M, N, K, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(N, generator=g).to(torch.bfloat16) if bias else None
    return x, w, b


def _bound(x, w):
    """fp32 summation-order error allowance: a few ulps of fp32 over sum |x| |w|."""
    return 4e-6 * (x.float().abs() @ w.float().abs().t())


@needs_gemv
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 8, 9])
@pytest.mark.parametrize("K", [4096, 200, 31])
def test_gemv_matches_fp32(M, K):
    """The C++ GEMV itself (fp32 out) for every row count it has a kernel for, K a multiple of 32 or
    not (masked tail, odd K), N = 37 channels (not a multiple of the 8-channel step), 2 threads."""
    x, w, _ = _data(M, 37, K, seed=M * 100 + K)
    ref = x.float() @ w.float().t()
    for kc in (4, 8):
        y = bf16_head.gemv(x, w, kc)
        assert y.dtype == torch.float32 and y.shape == (M, 37)
        assert bool(((y - ref).abs() <= _bound(x, w)).all()), float((y - ref).abs().max())


@needs_gemv
def test_the_gemv_serves_up_to_gemv_max_m_rows(monkeypatch):
    """Decode of up to GEMV_MAX_M = 4 rows runs the GEMV (with its next-group prefetch it took 0.43-0.70x
    F.linear's time at 2-4 rows of 32000 x 4096, and 0.90 / 1.06x at 8); more rows run F.linear."""
    calls = []
    real = bf16_head.gemv
    monkeypatch.setattr(bf16_head, "gemv", lambda x, w, *a: (calls.append(x.shape[0]), real(x, w, *a))[1])
    assert bf16_head.GEMV_MAX_M == 4
    for M in (1, 2, 4, 5, 8):
        x, w, _ = _data(M, 64, 256, seed=M)
        assert bf16_head.bf16_linear(x, w, None).shape == (M, 64)
    assert calls == [1, 2, 4]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M", [0, 1, 4, 5, 9])
def test_op_within_bf16_rounding(M, bias):
    """The op's bf16 result is the fp32 product rounded once to bf16 (plus fp32 ordering error)."""
    x, w, b = _data(M, 300, 256, seed=M, bias=bias)
    y = bf16_head.bf16_linear(x, w, b)
    assert y.shape == (M, 300) and y.dtype == torch.bfloat16
    ref = x.float() @ w.float().t()
    if b is not None:
        ref = ref + b.float()
    tol = ref.abs() * 2.0 ** -8 + _bound(x, w) + (0.0 if b is None else 2.0 ** -8 * b.float().abs().max())
    assert bool(((y.float() - ref).abs() <= tol).all())


def test_op_compiles_dynamic_rows():
    x, w, _ = _data(3, 64, 128, seed=1)
    f = torch.compile(lambda x, w: bf16_head.bf16_linear(x, w) * 2, backend="awq_inductor", dynamic=True)
    for m in (3, 1, 6):
        xm = x[:1].repeat(m, 1) if m != 3 else x
        torch.testing.assert_close(f(xm, w), bf16_head.bf16_linear(xm, w) * 2, rtol=0, atol=0)


@pytest.mark.parametrize("args,match", [
    ((torch.randn(2, 32), torch.zeros(8, 32, dtype=torch.bfloat16), None), "x: expected a bfloat16"),
    ((torch.randn(2, 31).bfloat16(), torch.zeros(8, 32, dtype=torch.bfloat16), None), "x: expected last dim K=32"),
    ((torch.randn(2, 32).bfloat16(), torch.zeros(8, 32), None), r"weight: expected bfloat16 \[N, K\]"),
    ((torch.randn(2, 32).bfloat16(), torch.zeros(8, 32, dtype=torch.bfloat16), torch.zeros(7)), r"bias: expected \[8\]"),
])
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        bf16_head.bf16_linear(*args)


def _tied_bf16_model():
    cfg = testing.tiny_config("llama", tie_word_embeddings=True)
    return testing.build_float_model(cfg, seed=0).to(torch.bfloat16)


@needs_gemv
def test_convert_default_bf16_head_tied():
    model = _tied_bf16_model()
    emb = model.get_input_embeddings().weight
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits.float()
        ref1 = model(ids[:1, :1]).logits.float()
        convert(model)
        assert type(model.lm_head) is Bf16HeadLinear
        assert model.lm_head.weight is emb and model.get_input_embeddings().weight is emb  # still tied
        assert "lm_head.weight" in model.state_dict()
        y = model(ids).logits.float()  # 24 rows: F.linear
        y1 = model(ids[:1, :1]).logits.float()  # 1 row: the GEMV
        convert(model)  # idempotent
        assert type(model.lm_head) is Bf16HeadLinear
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    scale = float(ref1.abs().max())
    torch.testing.assert_close(y1, ref1, rtol=0, atol=2.0 ** -7 * scale)


def test_convert_head_choices():
    """lm_head=None keeps the nn.Linear; fp32 heads are never switched; int8 after the bf16 default."""
    model = _tied_bf16_model()
    convert(model, lm_head=None)
    assert type(model.lm_head) is torch.nn.Linear
    fp32 = testing.build_float_model(testing.tiny_config("llama"), seed=0)
    convert(fp32)
    assert type(fp32.lm_head) is torch.nn.Linear
    convert(model)
    convert(model, lm_head="int8")
    assert isinstance(model.lm_head, Int8HeadLinear)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16


@needs_gemv
def test_baselines_get_the_plain_head():
    """The int4pack / dense baselines run transformers' head (F.linear), not our GEMV."""
    from awq_inductor.baselines import to_dense, to_int4pack

    for to in (lambda m: to_dense(m, torch.bfloat16), lambda m: to_int4pack(m, torch.bfloat16)):
        model = convert(_tied_bf16_model())
        assert type(model.lm_head) is Bf16HeadLinear
        emb = model.get_input_embeddings().weight
        to(model)
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is emb
