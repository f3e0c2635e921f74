"""Loading real (tiny, random) AWQ / GPTQ checkpoints through awq_inductor.patch_transformers."""
from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear, ScaledActivation  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    awq_hf.patch_transformers()
    yield


def _load(path, dtype=torch.float32, **kw):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)


def _make(tmp_path, arch="llama", quant_method="awq", fmt="gemm", group_size=32, seed=0, cfg_kw=None, **kw):
    cfg = testing.tiny_config(arch, **(cfg_kw or {}))
    model = testing.build_float_model(cfg, seed=seed)
    path = str(tmp_path / f"{arch}-{fmt}")
    ref = testing.save_quantized(model, path, quant_method=quant_method, format=fmt, group_size=group_size, **kw)
    return path, ref


def _ids(n=10, vocab=256, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, n), generator=g)


CASES = [
    ("llama", "awq", "gemm", 32),
    ("qwen2", "awq", "gemv", 32),
    ("mistral", "awq", "gemv_fast", 64),
    ("phi3", "awq", "gemm", 64),
    ("llama", "gptq", "gptq", 32),
    ("qwen2", "gptq", "gptq_v2", 64),
]
#: the compiled check runs once per architecture: a format changes only what is loaded (checked eagerly
#: above it), and the compiled graph of the converted modules is the same (whole-model compiles cost
#: 20-25 s a case on 2 cores)
COMPILED_CASES = {next(c for c in CASES if c[0] == arch) for arch in dict.fromkeys(c[0] for c in CASES)}


@pytest.mark.parametrize("arch,qm,fmt,gs", CASES, ids=[f"{a}-{f}" for a, _, f, _ in CASES])
def test_load_matches_dequantized_reference(tmp_path, arch, qm, fmt, gs):
    path, ref = _make(tmp_path, arch, qm, fmt, gs)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    n_layers = model.config.num_hidden_layers
    # every quantized projection is an AWQLinear, 4 int4 modules per decoder layer after fusion, the
    # gate|up one with the SiLU*mul epilogue (I = 256 is a multiple of 32)
    assert sum(isinstance(m, AWQLinear) for m in model.model.layers.modules()) == 3 * n_layers
    assert sum(isinstance(m, AWQGateUpSiluMul) for m in model.model.layers.modules()) == n_layers
    assert isinstance(model.lm_head, torch.nn.Linear)
    if arch == "qwen2":  # q/k/v biases survive the fusion
        assert model.model.layers[0].self_attn.qkv_proj.bias is not None
    ids = _ids()
    with torch.no_grad(), testing.Int4MMCounter() as c:
        logits = model(ids).logits
    assert c.count == 4 * n_layers and c.by_op.get("int4_mm_silu_mul") == n_layers
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(logits, want, atol=2e-3, rtol=2e-3)
    # greedy generation with fp32 activations is token-identical
    prompt = _ids(6)[:1]
    kw = dict(max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=0)
    out = model.generate(prompt, **kw)
    exp = ref.generate(prompt, **kw)
    assert torch.equal(out, exp)
    if (arch, qm, fmt, gs) not in COMPILED_CASES:
        return
    # the same through torch.compile with our backend (dynamic KV cache; prefill + decode graphs)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="awq_inductor")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, atol=2e-3, rtol=2e-3)
        assert torch.equal(model.generate(prompt, **kw), exp)
    torch._dynamo.reset()


def test_group_size_minus_one_and_modules_to_not_convert(tmp_path):
    path, ref = _make(tmp_path, "llama", "awq", "gemm", -1, modules_to_not_convert=["down_proj"])
    model = _load(path)
    layer = model.model.layers[0]
    assert type(layer.mlp.down_proj) is torch.nn.Linear
    assert layer.self_attn.qkv_proj.group_size == model.config.hidden_size
    ids = _ids()
    with torch.no_grad(), testing.Int4MMCounter() as c:
        logits = model(ids).logits
    assert c.count == 3 * model.config.num_hidden_layers
    with torch.no_grad():
        torch.testing.assert_close(logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


def test_bf16_load(tmp_path):
    path, ref = _make(tmp_path, "qwen2", "awq", "gemm", 32)
    model = _load(path, dtype=torch.bfloat16)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = _ids()
    with torch.no_grad():
        got = model(ids).logits.float()
        want = ref(ids).logits
    assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_patch_is_idempotent_and_validates_act_quant():
    from transformers.quantizers import auto as qauto

    awq_hf.patch_transformers()
    cls = qauto.AUTO_QUANTIZER_MAPPING["awq"]
    awq_hf.patch_transformers()
    assert qauto.AUTO_QUANTIZER_MAPPING["awq"] is cls
    assert qauto.AUTO_QUANTIZER_MAPPING["gptq"].__name__ == "GptqInductorQuantizer"
    with pytest.raises(ValueError, match="act_quant"):
        awq_hf.patch_transformers(act_quant="fp8")
    awq_hf.patch_transformers(act_quant="int8")  # W4A8 (tests/test_w4a8.py)
    awq_hf.patch_transformers()


@pytest.mark.parametrize("fmt", ["gemm", "gemv_fast"])
def test_save_load_round_trip(tmp_path, fmt):
    from safetensors.torch import load_file

    path, ref = _make(tmp_path, "llama", "awq", fmt, 64)
    model = _load(path)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    orig = load_file(os.path.join(path, "model.safetensors"))
    saved = load_file(os.path.join(out, "model.safetensors"))
    assert set(saved) == set(orig)
    for k, v in orig.items():  # written back bit-exactly in the original format and names
        assert saved[k].dtype == v.dtype and torch.equal(saved[k], v), k
    again = _load(out)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_act_scales_gpt_neox(tmp_path):
    cfg = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=128, tie_word_embeddings=False)
    model = testing.build_float_model(cfg)
    scales = {f"gpt_neox.layers.{i}.mlp.act.scales": (torch.rand(128) + 0.5).to(torch.float16) for i in range(2)}
    path = str(tmp_path / "neox")
    ref = testing.save_quantized(model, path, format="gemm", group_size=32, extra_tensors=scales)
    for i in range(2):
        mlp = ref.gpt_neox.layers[i].mlp
        act = ScaledActivation(mlp.act, 128, dtype=torch.float32)
        act.scales.data = scales[f"gpt_neox.layers.{i}.mlp.act.scales"].float()
        mlp.act = act
    loaded = _load(path)
    assert isinstance(loaded.gpt_neox.layers[0].mlp.act, ScaledActivation)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_experts_module_per_expert_keys_raise(tmp_path):
    """Per-expert int4 keys of an experts module awq_inductor does not know (here: more experts than
    the config has) still raise instead of being dropped. Known MoE models: tests/test_moe_models.py."""
    path, _ = _make(tmp_path, "llama", "awq", "gemm", 32)
    q, z, s = testing.quantize_weight(torch.randn(64, 128) * 0.05, 32)
    from awq_inductor import formats

    qw, qz, sc = formats.pack_awq(q, z, s, group_size=32, format="gemm")
    base = "model.layers.0.mlp.experts.0.gate_proj"
    testing.rewrite_checkpoint(path, lambda sd: sd.update({f"{base}.qweight": qw, f"{base}.qzeros": qz,
                                                           f"{base}.scales": sc}))
    with pytest.raises(awq_hf.CheckpointError, match=r"experts\.0\.gate_proj\.(qweight|qzeros|scales).*Per-expert"):
        _load(path)


@pytest.mark.parametrize("key,edit,suffix", [
    ("model.layers.1.self_attn.k_proj.qweight", lambda sd, k: sd.__setitem__(k, sd[k][:, :-1].contiguous()), ""),
    ("model.layers.0.mlp.up_proj.qzeros", lambda sd, k: sd.pop(k), ": missing"),
    ("model.layers.0.mlp.extra_proj.qweight", lambda sd, k: sd.__setitem__(k, torch.zeros(128, 16, dtype=torch.int32)), ""),
    ("model.layers.0.input_layernorm.weight", lambda sd, k: sd.pop(k), ""),
], ids=["wrong_qweight_shape", "missing_qzeros", "unknown_quantized_module", "missing_float_weight"])
def test_bad_checkpoint_raises_naming_tensor(tmp_path, key, edit, suffix):
    path, _ = _make(tmp_path, "llama", "awq", "gemm", 32)
    testing.rewrite_checkpoint(path, lambda sd: edit(sd, key))
    with pytest.raises(awq_hf.CheckpointError, match=key.replace(".", r"\.") + suffix):
        _load(path)


def test_marlin_version_raises(tmp_path):
    import json

    path, _ = _make(tmp_path, "llama", "awq", "gemm", 32)
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"]["version"] = "marlin"
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(NotImplementedError, match="marlin"):
        _load(path)


def test_desc_act_gptq_with_trivial_g_idx_loads(tmp_path):
    # desc_act=True is supported (act-order: tests/test_load_new_formats.py); a g_idx equal to
    # k // G (static_groups) needs no permutation at all
    import json

    path, ref = _make(tmp_path, "llama", "gptq", "gptq", 32)
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"]["desc_act"] = True
    json.dump(cfg, open(cfg_path, "w"))
    model = _load(path)
    assert all(m.perm is None for m in model.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul)))
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------------------------- compile
def _backend():
    try:
        from awq_inductor.inductor.backend import awq_inductor_backend
        return awq_inductor_backend
    except ImportError:
        return "inductor"


def test_compiled_model_matches_eager_without_graph_breaks(tmp_path):
    import torch._dynamo

    path, _ = _make(tmp_path, "llama", "awq", "gemm", 32)
    model = _load(path)
    ids = _ids(8)
    with torch.no_grad():
        want = model(ids).logits
    torch._dynamo.reset()
    layer = model.model.layers[0]
    hidden = torch.randn(2, 8, model.config.hidden_size)
    pos = torch.arange(8)[None].expand(2, 8)
    pe = model.model.rotary_emb(hidden, pos)
    explain = torch._dynamo.explain(layer)(hidden, position_embeddings=pe, attention_mask=None)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(model, backend=_backend())
    with torch.no_grad():
        got = compiled(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
