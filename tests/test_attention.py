"""convert's fp32 decode attention (awq_inductor.integrations.attention, ``awq_sdpa``): one-row
bf16 attention runs in fp32, everything else is transformers' own sdpa; the baselines go back to sdpa."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from awq_inductor import baselines, convert, testing  # noqa: E402
from awq_inductor.integrations import attention  # noqa: E402
from awq_inductor.ops import attention as attn_ops  # noqa: E402


def _model(dtype=torch.bfloat16):
    return testing.build_float_model(testing.tiny_config("llama"), dtype=dtype)


def test_decode_rows_run_in_fp32_unsupported_prefill_stays_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mod = _model().model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    q1 = torch.randn(2, 4, 1, 32, generator=g).bfloat16()
    qn = torch.randn(2, 4, 7, 32, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, 7, 32, generator=g).bfloat16() for _ in range(2))
    for mask in (None, torch.rand(2, 1, 1, 7, generator=g) > 0.3, torch.randn(2, 1, 1, 7, generator=g)):
        if mask is not None and mask.dtype == torch.bool:
            mask[:, :, :, 0] = True  # every row attends somewhere
        got, _ = attention.awq_sdpa_attention_forward(mod, q1, k, v, mask, scaling=32 ** -0.5)
        want, _ = sdpa_attention_forward(mod, q1.float(), k.float(), v.float(), mask, scaling=32 ** -0.5)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape == (2, 1, 4, 32)
        torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)  # one bf16 rounding
        torch.testing.assert_close(attn_ops.decode_attention(q1, k, v, mask, 32 ** -0.5).float(),
                                   want.bfloat16().float(), atol=1e-2, rtol=0)
    # head dim 32: no prefill kernel, sdpa as transformers calls it
    got, _ = attention.awq_sdpa_attention_forward(mod, qn, k, v, None, scaling=32 ** -0.5)
    want, _ = sdpa_attention_forward(mod, qn, k, v, None, scaling=32 ** -0.5)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_convert_switches_sdpa_models_and_baselines_switch_back():
    m = _model()
    assert m.config._attn_implementation == "sdpa"
    convert(m)
    assert m.config._attn_implementation == attention.NAME
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        ours = torch.cat(m.generate(ids, **kw).logits).float()
        dense = baselines.to_dense(m, torch.bfloat16)
        assert dense.config._attn_implementation == "sdpa"
        ref = torch.cat(dense.generate(ids, **kw).logits).float()
    # the same model, attention rounded differently at decode rows only
    assert float((ours - ref).abs().max()) < 0.05 * float(ref.abs().max())
    off = convert(_model(), fp32_decode_attention=False)
    assert off.config._attn_implementation == "sdpa"
    eager = _model()
    eager.set_attn_implementation("eager")
    assert convert(eager).config._attn_implementation == "eager"  # a user's choice stays


@pytest.mark.parametrize("with_mask", [False, True])
def test_compiled_decode_attention_stays_our_op(with_mask):
    """Under torch.compile the decode rows run awq::decode_attention, not the flash-attention
    kernel: without a mask, Inductor's attention pattern pass rewrote the plain matmul -> softmax ->
    matmul into PyTorch's flash attention (1.3 ms per decode call in a Llama-7B-shaped layer)."""
    from torch._inductor.utils import run_and_get_code

    mod = _model().model.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 1, 32, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 9, 32, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool) if with_mask else None

    def f(q, k, v):
        return attention.awq_sdpa_attention_forward(mod, q, k, v, mask, scaling=0.2)[0]

    torch._dynamo.reset()
    with torch.no_grad():
        got, code = run_and_get_code(torch.compile(f, backend="awq_inductor"), q, k, v)
    text = "\n".join(code)
    assert "awq.decode_attention" in text and "flash" not in text
    torch.testing.assert_close(got, torch.ops.awq.decode_attention(q, k, v, mask, 0.2), atol=0, rtol=0)


@pytest.mark.skipif(__import__("awq_inductor.kernels.isa", fromlist=["x"]).select() == "portable",
                    reason="the C++ decode attention needs AVX512-BF16")
@pytest.mark.parametrize("B,Hq,Hkv,D,L", [(1, 32, 8, 128, 530), (2, 32, 4, 128, 17), (1, 4, 2, 32, 1),
                                          (2, 8, 8, 64, 7), (1, 16, 1, 256, 33), (3, 6, 2, 96, 40)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_native_decode_attention_matches_the_fp32_math(B, Hq, Hkv, D, L, mask_kind):
    """The C++ kernel (the op's CPU path for bf16): within one bf16 rounding of softmax(q k^T) v in
    fp32, on K / V cache slices with row and head strides (a longer cache viewed to L rows)."""
    g = torch.Generator().manual_seed(L + D)
    k = torch.randn(B, Hkv, L + 5, D, generator=g).bfloat16()[:, :, :L]
    v = torch.randn(B, Hkv, L + 3, D, generator=g).bfloat16()[:, :, :L]
    q = torch.randn(B, Hq, 1, D, generator=g).bfloat16()
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, 1, 1, L, generator=g) > 0.3
        mask[..., 0] = True
    elif mask_kind == "additive":
        mask = torch.randn(B, 1, 1, L, generator=g)
    got = attn_ops._native_decode_attention(q, k, v, mask, D ** -0.5)
    assert got is not None and got.shape == (B, 1, Hq, D) and got.dtype == torch.bfloat16
    want = attn_ops.decode_attention(q.float(), k.float(), v.float(), mask, D ** -0.5)  # fp32 throughout
    assert ((got.float() - want).abs() <= want.abs() * 2.0 ** -8 + 1e-6).all()
    torch.testing.assert_close(torch.ops.awq.decode_attention(q, k, v, mask, D ** -0.5), got, atol=0, rtol=0)


@pytest.mark.skipif(__import__("awq_inductor.kernels.isa", fromlist=["x"]).select() == "portable",
                    reason="the C++ decode attention needs AVX512-BF16")
def test_native_decode_attention_nan_and_fallbacks():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 1, 32, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 5, 32, generator=g).bfloat16() for _ in range(2))
    k[0, 0, 2, 3] = float("nan")  # KV head 0 serves query heads 0 and 1
    got = attn_ops._native_decode_attention(q, k, v, None, 0.1)
    assert torch.isnan(got[0, 0, :2]).all() and torch.isfinite(got[0, 0, 2:]).all()
    k[0, 0, 2, 3] = 0.0
    per_head = torch.ones(1, 4, 1, 5, dtype=torch.bool)
    assert attn_ops._native_decode_attention(q, k, v, per_head, 0.1) is None  # aten math instead
    assert attn_ops._native_decode_attention(q.half(), k.half(), v.half(), None, 0.1) is None
    q48, k48 = torch.randn(1, 4, 1, 48).bfloat16(), torch.randn(1, 2, 5, 48).bfloat16()
    assert attn_ops._native_decode_attention(q48, k48, torch.randn(1, 2, 5, 48).bfloat16(), None, 0.1) is None
    # the op still answers where the kernel does not apply
    torch.testing.assert_close(torch.ops.awq.decode_attention(q, k, v, per_head, 0.1),
                               attn_ops.decode_attention(q, k, v, per_head, 0.1), atol=0, rtol=0)


_needs_avx512 = pytest.mark.skipif(__import__("awq_inductor.kernels.isa", fromlist=["x"]).select() == "portable",
                                   reason="the C++ prefill attention needs AVX512-BF16")


def _attn_reference(q, k, v, mask, scale):
    """fp32 softmax(q k^T * scale) v, causal (top-left) without a mask; [B, T, Hq, D]."""
    Hq, T, Hkv, L = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    kk = k.float().repeat_interleave(Hq // Hkv, 1)
    vv = v.float().repeat_interleave(Hq // Hkv, 1)
    s = q.float() @ kk.transpose(-1, -2) * scale
    allowed = torch.ones(T, L, dtype=torch.bool).tril()[None, None] if mask is None else mask
    return (torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ vv).transpose(1, 2)


def _prefill_inputs(B, Hq, Hkv, T, D, seed, extra=5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g).bfloat16()
    # the cache as a slice of a longer buffer: strided batch and head
    k, v = (torch.randn(B, Hkv, T + extra, D, generator=g).bfloat16()[:, :, :T] for _ in range(2))
    return q, k, v


@_needs_avx512
@pytest.mark.parametrize("B,Hq,Hkv,T,D", [(1, 32, 4, 70, 128), (2, 8, 8, 37, 64), (1, 4, 2, 33, 256),
                                          (1, 64, 1, 19, 128), (2, 6, 2, 1, 128)])
@pytest.mark.parametrize("mask_kind", ["causal", "padded"])
def test_native_prefill_attention_matches_the_fp32_math(B, Hq, Hkv, T, D, mask_kind):
    """awq::prefill_attention's C++ kernel against fp32 math: its error is that of PyTorch's bf16
    sdpa (one rounding of the probabilities and of the output), on a strided cache, GQA, head dims
    64 / 128 / 256, T not a multiple of 16, and a left-padded bool mask."""
    import torch.nn.functional as F

    q, k, v = _prefill_inputs(B, Hq, Hkv, T, D, seed=B * 1000 + T)
    mask = None
    if mask_kind == "padded":
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None].repeat(B, 1, 1, 1)
        pad = min(3, T - 1)
        mask[-1, :, :, :pad] = False
        mask[-1, :, :pad, 0] = True  # padding rows attend the first key (no row attends nothing)
    got = attn_ops._native_prefill_attention(q, k, v, mask, D ** -0.5)
    assert got is not None and got.shape == (B, T, Hq, D) and got.dtype == torch.bfloat16
    want = _attn_reference(q, k, v, mask, D ** -0.5)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=D ** -0.5,
                                          enable_gqa=True).transpose(1, 2).float()
    err, sdpa_err = float((got.float() - want).abs().max()), float((sdpa - want).abs().max())
    assert err <= 2 * sdpa_err + 2e-3, (err, sdpa_err)
    torch.testing.assert_close(torch.ops.awq.prefill_attention(q, k, v, mask, D ** -0.5), got, atol=0, rtol=0)


@_needs_avx512
def test_native_prefill_attention_fallbacks_and_nan():
    """What the kernel does not take runs PyTorch's sdpa inside the op (a row that attends nothing,
    head dim 96, fp16, no mask with T != L); a NaN key reaches only the rows that see it."""
    import torch.nn.functional as F

    q, k, v = _prefill_inputs(1, 8, 2, 24, 128, seed=5)
    mask = torch.ones(1, 1, 24, 24, dtype=torch.bool).tril()
    mask[0, 0, 3] = False  # row 3 attends no key
    assert attn_ops._native_prefill_attention(q, k, v, mask, 0.1) is None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.1, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(torch.ops.awq.prefill_attention(q, k, v, mask, 0.1), want, atol=0, rtol=0,
                               equal_nan=True)
    q96, k96, v96 = _prefill_inputs(1, 4, 2, 9, 96, seed=6)
    assert attn_ops._native_prefill_attention(q96, k96, v96, None, 0.1) is None
    assert attn_ops._native_prefill_attention(q.half(), k.half(), v.half(), None, 0.1) is None
    assert attn_ops._native_prefill_attention(q[:, :, :20], k, v, None, 0.1) is None  # T != L, no mask
    k = k.clone()
    k[0, 1, 10, 0] = float("nan")  # KV head 1, key 10: query heads 4..7, rows 10 and later
    got = attn_ops._native_prefill_attention(q, k, v, None, 0.1)
    nan_rows = got[0].float().isnan().any(-1)  # [T, Hq]
    assert nan_rows[10:, 4:].all() and not nan_rows[:10].any() and not nan_rows[:, :4].any()


def test_prefill_rows_run_our_op_in_a_model_eager_and_compiled():
    """A bf16 model with head dim 64 after convert: prefill attention is awq::prefill_attention
    (no flash kernel in the compiled code), logits within bf16 tolerance of transformers' sdpa,
    eager and compiled."""
    from torch._inductor.utils import run_and_get_code

    m = testing.build_float_model(testing.tiny_config("llama", num_attention_heads=2, num_key_value_heads=1),
                                  dtype=torch.bfloat16)
    ref = __import__("copy").deepcopy(m)  # stays on transformers' sdpa
    convert(m)
    assert ref.config._attn_implementation == "sdpa" and m.config._attn_implementation == attention.NAME
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits.float()
        got = m(ids).logits.float()
        assert float((got - want).abs().max()) < 0.03 * float(want.abs().max())
        torch._dynamo.reset()
        fwd = m.forward
        m.forward = torch.compile(fwd, backend="awq_inductor")
        got_c, code = run_and_get_code(m, ids)
        m.forward = fwd
    text = "\n".join(code)
    assert "awq.prefill_attention" in text and "flash" not in text
    torch.testing.assert_close(got_c.logits.float(), got, atol=0.03 * float(want.abs().max()), rtol=0)


def test_prefill_dispatch_mirrors_transformers_sdpa():
    """awq_sdpa's prefill follows transformers' sdpa path: causal without a mask crops a longer
    cache to the first T keys; an explicit is_causal=False runs transformers' sdpa on the whole
    cache (bitwise)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cfg = testing.tiny_config("llama", num_attention_heads=2, num_key_value_heads=1)
    mod = testing.build_float_model(cfg, dtype=torch.bfloat16).model.layers[0].self_attn
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 5, 64, generator=g).bfloat16()
    k, v = (torch.randn(1, 1, 9, 64, generator=g).bfloat16() for _ in range(2))
    with torch.no_grad():
        got, _ = attention.awq_sdpa_attention_forward(mod, q, k, v, None, scaling=0.125)
        want, _ = sdpa_attention_forward(mod, q, k, v, None, scaling=0.125)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
        got, _ = attention.awq_sdpa_attention_forward(mod, q, k, v, None, scaling=0.125, is_causal=False)
        want, _ = sdpa_attention_forward(mod, q, k, v, None, scaling=0.125, is_causal=False)
    assert torch.equal(got, want)


def test_prefill_library_is_rendered_for_one_head_size():
    """One register blocking per library (g++ time): the source for head size 128 instantiates only
    run<8>, and each head size the kernel supports gets its own library."""
    from awq_inductor.kernels import codegen, isa as isa_mod
    from awq_inductor.ops import attention as attention_ops

    src = codegen.env().get_template("attention/prefill_attention.cpp.j2").render(isa=isa_mod.get("avx512"), head_dim=128)
    assert "case 128: return run<8>(a, num_threads);" in src and "run<4>" not in src and "run<16>" not in src
    if isa_mod.select().avx512_bf16:
        assert attention_ops._prefill_kernel(64) is not attention_ops._prefill_kernel(128)
