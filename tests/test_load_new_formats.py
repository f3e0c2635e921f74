"""Tiny Llama checkpoints in compressed-tensors, AutoRound and GPTQ act-order formats (written by
awq_inductor.testing through each format's own pack + quantization_config, the packers being
checked bit for bit against the libraries' vectors in test_formats_new.py), loaded through
``from_pretrained`` with awq_inductor.patch_transformers (no compressed-tensors / auto-round
package installed)."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch._dynamo

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    awq_hf.patch_transformers()
    yield
    awq_hf.patch_transformers()


def _make(tmp_path, qm, fmt, gs, seed=0, scales_dtype=torch.float16, arch="llama", **kw):
    model = testing.build_float_model(testing.tiny_config(arch), seed=seed)
    path = str(tmp_path / fmt)
    ref = testing.save_quantized(model, path, quant_method=qm, format=fmt, group_size=gs, scales_dtype=scales_dtype,
                                 **kw)
    return path, ref


def _load(path, dtype=torch.float32, **kw):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)


def _ids(n=10, seed=1):
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


GEN = dict(max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=0)

CASES = [
    ("compressed-tensors", "compressed_tensors", 32, torch.bfloat16),
    ("compressed-tensors", "compressed_tensors_asym", -1, torch.bfloat16),
    ("auto-round", "autoround_gptq", 32, torch.float16),
    ("auto-round", "autoround", 64, torch.float16),
    ("auto-round", "autoround_gptqmodel", 32, torch.float16),
    ("auto-round", "autoround_awq", 32, torch.float16),
]


def _check_logits_and_greedy(model, ref):
    ids = _ids()
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    prompt = _ids(6)[:1]
    assert torch.equal(model.generate(prompt, **GEN), ref.generate(prompt, **GEN))


def _check_saved_byte_identical(model, path, tmp_path) -> str:
    """save_pretrained writes the loaded checkpoint's tensors back bit for bit (same keys, dtypes,
    bytes); returns the saved folder."""
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    a, b = load_file(os.path.join(path, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k],
                                                        b[k].view(torch.uint8) if b[k].dim() else b[k]), k
    return out


@pytest.mark.parametrize("qm,fmt,gs,sdt", CASES, ids=[c[1] for c in CASES])
def test_load_logits_greedy_and_save_round_trip(tmp_path, qm, fmt, gs, sdt):
    path, ref = _make(tmp_path, qm, fmt, gs, scales_dtype=sdt)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    layers = model.model.layers
    assert sum(isinstance(m, AWQLinear) for m in layers.modules()) == 3 * 2
    assert sum(isinstance(m, AWQGateUpSiluMul) for m in layers.modules()) == 2
    _check_logits_and_greedy(model, ref)
    out = _check_saved_byte_identical(model, path, tmp_path)
    with open(os.path.join(path, "config.json")) as f1, open(os.path.join(out, "config.json")) as f2:
        qa, qb = json.load(f1)["quantization_config"], json.load(f2)["quantization_config"]
    assert {k: qb.get(k) for k in qa} == qa


def test_ct_ignore_and_autoround_extra_config_load_as_float(tmp_path):
    skip = ["model.layers.0.mlp.down_proj"]
    for qm, fmt in (("compressed-tensors", "compressed_tensors"), ("auto-round", "autoround_gptq")):
        path, ref = _make(tmp_path / fmt, qm, fmt, 32, modules_to_not_convert=skip)
        model = _load(path)
        assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
        assert isinstance(model.model.layers[1].mlp.down_proj, AWQLinear)
        _check_logits_and_greedy(model, ref)


@pytest.mark.parametrize("method, fmt, sdt", [
    ("compressed-tensors", "compressed_tensors", torch.bfloat16),
    ("auto-round", "autoround_gptq", torch.float16),
    ("auto-round", "autoround_awq", torch.float16),
], ids=["compressed_tensors", "autoround_gptq", "autoround_awq"])
def test_compiled_bf16(tmp_path, method, fmt, sdt):
    """Compiled (backend awq_inductor) bf16 logits of a checkpoint in each new layout family:
    within bf16 tolerance of eager and of the dequantized reference."""
    path, ref = _make(tmp_path, method, fmt, 32, scales_dtype=sdt)
    model = _load(path, dtype=torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="awq_inductor", fullgraph=False)
        comp = model(ids).logits
        want = ref(ids).logits
    torch.testing.assert_close(comp.float(), eager.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(comp.float(), want, atol=6e-2, rtol=6e-2)
    torch._dynamo.reset()


def test_w4a8_autoround(tmp_path):
    path, ref = _make(tmp_path, "auto-round", "autoround_gptq", 32)
    awq_hf.patch_transformers(act_quant="int8")
    model = _load(path)
    assert model.model.layers[0].self_attn.o_proj.act_quant == "int8"
    ids = _ids()
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    # int8 per-token activations: compare like tests/test_w4a8.py (relative error, not 1e-3)
    rel = (got - want).norm() / want.norm()
    assert rel < 0.03, float(rel)


@pytest.mark.parametrize("qc_edit, match", [
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=8),
     r"config_groups\.group_0\.weights\.num_bits: expected 4, got 8"),
    (lambda qc: qc["config_groups"]["group_0"].update(input_activations={"num_bits": 8, "type": "int"}),
     r"config_groups\.group_0\.input_activations: expected null"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(type="float", num_bits=8),
     r"weights\.type: expected 'int', got 'float'"),
])
def test_ct_unsupported_config_refused_by_field(tmp_path, qc_edit, match):
    path, _ = _make(tmp_path, "compressed-tensors", "compressed_tensors", 32)
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    qc_edit(cfg["quantization_config"])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(awq_hf.CheckpointError, match=match):
        _load(path)


# --------------------------------------------------------------------------- GPTQ act-order
def _perms(model):
    return [m.perm for m in model.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul))]


@pytest.mark.parametrize("act_order", ["per_layer", "shared"])
def test_gptq_act_order_load_fusion_save(tmp_path, act_order):
    path, ref = _make(tmp_path, "gptq", "gptq", 32, act_order=act_order)
    model = _load(path)
    layer = model.model.layers[0]
    if act_order == "per_layer":  # every permutation differs: nothing fuses, one gather per linear
        assert isinstance(layer.self_attn.q_proj, AWQLinear) and isinstance(layer.mlp.gate_proj, AWQLinear)
        assert sum(isinstance(m, AWQLinear) for m in model.model.layers.modules()) == 7 * 2
    else:  # q/k/v share one permutation, gate/up another: fused, one gather each
        assert isinstance(layer.self_attn.qkv_proj, AWQLinear) and layer.self_attn.qkv_proj.perm is not None
        assert isinstance(layer.mlp.gate_up_proj, AWQGateUpSiluMul) and layer.mlp.gate_up_proj.perm is not None
    assert all(p is not None for p in _perms(model))
    _check_logits_and_greedy(model, ref)
    _check_saved_byte_identical(model, path, tmp_path)


def test_gptq_act_order_w4a8_keeps_the_permutation(tmp_path):
    from awq_inductor.transform import convert

    path, ref = _make(tmp_path, "gptq", "gptq", 32, act_order="shared")
    model = convert(_load(path), act_quant="int8")
    assert model.model.layers[0].mlp.gate_up_proj.act_quant == "int8"
    assert all(p is not None for p in _perms(model))
    ids = _ids()
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert float((got - want).norm() / want.norm()) < 0.03


def test_gptq_act_order_compiled_one_gather_no_graph_break(tmp_path):
    path, ref = _make(tmp_path, "gptq", "gptq", 32, act_order="shared")
    model = _load(path, dtype=torch.bfloat16)
    layer = model.model.layers[0]
    hidden = torch.randn(1, 4, model.config.hidden_size, dtype=torch.bfloat16)
    pe = model.model.rotary_emb(hidden, torch.arange(4)[None])
    torch._dynamo.reset()
    explain = torch._dynamo.explain(layer)(hidden, position_embeddings=pe, attention_mask=None)
    assert explain.graph_break_count == 0, explain.break_reasons
    # one index_select per distinct permutation of the layer: qkv, o, gate|up, down
    gathers = sum(str(n.target).endswith("index_select") for g in explain.graphs for n in g.graph.nodes)
    assert gathers == 4, gathers
    ids = _ids()
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="awq_inductor")
        comp = model(ids).logits
        want = ref(ids).logits
    torch.testing.assert_close(comp.float(), eager.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(comp.float(), want, atol=6e-2, rtol=6e-2)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- MoE experts
@pytest.mark.parametrize("qm,fmt", [("compressed-tensors", "compressed_tensors_asym"), ("auto-round", "autoround_gptq")])
def test_moe_experts_new_formats(tmp_path, qm, fmt):
    """Qwen3-MoE with per-expert int4 keys in the new formats: one AWQMoEExperts per layer, logits
    within 1e-3 of the dequantized reference, saved back byte-identically."""
    from awq_inductor.nn import AWQMoEExperts

    path, ref = _make(tmp_path, qm, fmt, 32, arch="qwen3_moe")
    model = _load(path)
    assert sum(isinstance(m, AWQMoEExperts) for m in model.modules()) == model.config.num_hidden_layers
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-3, rtol=1e-3)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    a, b = load_file(os.path.join(path, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
    assert set(a) == set(b)
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
