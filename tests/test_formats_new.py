"""compressed-tensors, AutoRound and GPTQ act-order <-> canonical form, against vectors made by the
formats' own code (tests/data/vectors24: compressed-tensors 0.20 + llm-compressor 0.14,
auto-round 0.16.1, AutoGPTQ 0.7.1; generator benchmarks/make_format_vectors.py, which needs those
libraries and is not run here). Each vector holds one linear's tensors under their checkpoint
names, the library's own dequantization ``ref_weight`` and ``ref_q`` / ``ref_zero`` / ``ref_scale``,
and the exact ``quantization_config`` JSON in its metadata, so recognition is tested too."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from awq_inductor import formats as F

VECTOR_DIR = Path(__file__).parent / "data" / "vectors24"
VECTORS = sorted(VECTOR_DIR.glob("*.safetensors"))
EXPECTED_FORMAT = {
    "ct_w4a16_sym": "compressed_tensors", "ct_w4a16_asym": "compressed_tensors_asym",
    "ar_sym_g128_autogptq": "autoround_gptq", "ar_sym_g32_autogptq": "autoround_gptq",
    "ar_sym_channel_autogptq": "autoround_gptq", "ar_asym_g128_autogptq": "autoround_gptq",
    "ar_asym_g128_autoawq": "autoround_awq", "ar_asym_g64_autoawq": "autoround_awq",
    "ar_asym_channel_autoawq": "autoround_awq", "ar_asym_g128_native": "autoround",
    "ar_asym_g64_gptqmodel": "autoround_gptqmodel", "gptq_actorder": "gptq",
}


def _load(path):
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    target = meta.get("target") or next(k for k in t if k.endswith(".qweight"))[:-len(".qweight")]
    stored = {k[len(target) + 1:]: v for k, v in t.items() if k.startswith(target + ".")}
    return meta, json.loads(meta["quantization_config"]), stored, t


def _bits(t):
    return t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t


def _expected(stem):
    return next(v for k, v in EXPECTED_FORMAT.items() if stem.startswith(k))


def test_vectors_present():
    assert len(VECTORS) == 17


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_vector_canonical_exact_and_pack_round_trip(path):
    meta, qc, stored, t = _load(path)
    extra = qc.get("extra_config") or {}
    eight = [k for k, e in extra.items() if e.get("bits") == 8]
    if eight:  # an 8-bit layer elsewhere in the checkpoint is refused by name; this vector's layer is int4
        with pytest.raises(F.UnsupportedCheckpoint, match=rf"extra_config\.{eight[0]}\.bits: expected 4 or 16, got 8"):
            F.from_quantization_config(qc)
        qc = {**qc, "extra_config": {k: e for k, e in extra.items() if k not in eight}}
    spec = F.from_quantization_config(qc)
    assert spec.format.name == _expected(path.stem)
    K, N = int(meta["K"]), int(meta["N"])
    G = K if spec.group_size == -1 else spec.group_size
    fmt = spec.format
    args = [stored[n] for n in fmt.tensors]
    if fmt.has_g_idx:
        can, perm = fmt.unpack_act_order(*args, G, stored["g_idx"])
    else:
        can, perm = fmt.unpack(*args, G), None
    q, z, s = can
    ref_q, ref_z, ref_s = t["ref_q"], t["ref_zero"], t["ref_scale"]
    if perm is not None:  # act-order: canonical is W[:, perm] with contiguous groups
        assert path.stem.startswith("gptq_actorder")
        assert torch.equal(perm, t["ref_perm"].to(torch.int64))
        gidx = stored["g_idx"].to(torch.int64)
        assert torch.equal(q, ref_q[:, perm])
        assert torch.equal(z, ref_z) and torch.equal(s.float(), ref_s)
        w = ((q.to(s.dtype) - z.to(s.dtype).repeat_interleave(G, 1)) * s.repeat_interleave(G, 1))  # fp16, as AutoGPTQ
        assert torch.equal(w.float(), t["ref_weight"][:, perm])
        assert torch.equal(gidx[perm], torch.arange(K) // G)
    else:
        assert torch.equal(q, ref_q), "q"
        assert torch.equal(z, ref_z), "zeros"
        assert torch.equal(s.to(torch.float32), ref_s), "scales"
        # the library's dequant, computed in the scale dtype, bit for bit
        w = ((q.to(s.dtype) - z.to(s.dtype).repeat_interleave(G, 1)) * s.repeat_interleave(G, 1))
        assert torch.equal(w.float(), t["ref_weight"])
    packed = fmt.pack_act_order(q, z, s, G, perm) if fmt.has_g_idx else fmt.pack(q, z, s, G)
    assert set(packed) == set(stored), (sorted(packed), sorted(stored))
    for name, v in stored.items():
        assert packed[name].dtype == v.dtype and packed[name].shape == v.shape, name
        assert torch.equal(_bits(packed[name]), _bits(v)), name


def test_ct_symmetric_zero_is_exactly_eight():
    _, qc, stored, t = _load(VECTOR_DIR / "ct_w4a16_sym_g128.safetensors")
    fmt = F.get("compressed_tensors")
    assert "weight_zero_point" not in stored
    q, z, s = fmt.unpack(*(stored[n] for n in fmt.tensors), 128)
    assert bool((z == 8).all())
    with pytest.raises(ValueError, match="zeros: expected all 8"):
        fmt.pack(q, torch.full_like(z, 7), s, 128)


def test_ct_channel_ragged_k_uses_weight_shape():
    _, qc, stored, t = _load(VECTOR_DIR / "ct_w4a16_asym_channel_k100.safetensors")
    spec = F.from_quantization_config(qc)
    assert spec.group_size == -1 and stored["weight_packed"].shape == (60, 13)
    q, z, s = spec.format.unpack(*(stored[n] for n in spec.format.tensors), 100)
    assert q.shape == (60, 100) and z.shape == (60, 1)


def test_autoround_v1_clamped_zero_decodes_as_one():
    _, qc, stored, t = _load(VECTOR_DIR / "ar_asym_g128_autogptq.safetensors")
    fmt = F.from_quantization_config(qc).format
    q, z, s = fmt.unpack(stored["qweight"], stored["qzeros"], stored["scales"], 128)
    clamped = t["ref_zero_calib"] == 0
    assert int(clamped.sum()) == 4 and bool((z[clamped] == 1).all())


@pytest.mark.parametrize("fmt", ["autoround", "autoround_gptq", "gemm"])
def test_act_order_checkpoint_needs_a_format_with_g_idx(fmt):
    # the test-checkpoint writer names the format instead of failing inside the packer (KeyError 'g_idx')
    from awq_inductor import testing

    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    with pytest.raises(ValueError, match=f"act_order: .*format '{fmt}' \\(no g_idx\\)"):
        testing.quantize_to_state_dict(model, quant_method=F.get(fmt).quant_method, format=fmt, act_order="per_layer")


def test_act_order_perm_refuses_unbalanced_groups():
    g = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(ValueError, match="exactly 32 times"):
        F.base.act_order_perm(g, 64, 32)
    assert F.base.act_order_perm(torch.arange(64) // 32, 64, 32) is None


# --------------------------------------------------------------------------- config errors
def _ct(**weights):
    w = {"dynamic": False, "group_size": 128, "num_bits": 4, "strategy": "group", "symmetric": True, "type": "int"}
    w.update(weights)
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"format": "pack-quantized", "input_activations": None,
                                          "output_activations": None, "targets": ["Linear"], "weights": w}}}


@pytest.mark.parametrize("qc, match", [
    (_ct(num_bits=8), r"config_groups\.group_0\.weights\.num_bits: expected 4, got 8"),
    (_ct(type="float", num_bits=8), r"weights\.type: expected 'int', got 'float'"),
    (_ct(strategy="tensor"), r"weights\.strategy: expected .*got 'tensor'"),
    (_ct(strategy="block"), r"weights\.strategy: expected .*got 'block'"),
    (_ct(actorder="group"), r"weights\.actorder: .*got 'group'"),
    ({**_ct(), "config_groups": {"group_0": {**_ct()["config_groups"]["group_0"],
                                             "input_activations": {"num_bits": 8, "type": "int"}}}},
     r"group_0\.input_activations: expected null"),
    ({**_ct(), "config_groups": {"group_0": {**_ct()["config_groups"]["group_0"], "format": "float-quantized"}}},
     r"group_0\.format: expected 'pack-quantized'.*got 'float-quantized'"),
    ({**_ct(), "kv_cache_scheme": {"num_bits": 8}}, r"kv_cache_scheme: expected null"),
    ({"quant_method": "auto-round", "bits": 8, "group_size": 128, "sym": True},
     r"quantization_config\.bits: expected 4 .*got 8"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "data_type": "fp"},
     r"quantization_config\.data_type: expected 'int', got 'fp'"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "act_bits": 8},
     r"quantization_config\.act_bits: expected 16 .*got 8"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "packing_format": "auto_round:fp8"},
     r"quantization_config\.packing_format: expected one of .*got 'auto_round:fp8'"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128,
      "extra_config": {"model.layers.0.mlp.down_proj": {"bits": 8, "sym": True}}},
     r"extra_config\.model\.layers\.0\.mlp\.down_proj\.bits: expected 4 or 16, got 8"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128,
      "extra_config": {"model.layers.0.mlp.down_proj": {"group_size": 32}}},
     r"extra_config\.model\.layers\.0\.mlp\.down_proj\.group_size: expected 128 .*got 32"),
])
def test_unsupported_configs_name_the_field(qc, match):
    with pytest.raises(F.UnsupportedCheckpoint, match=match):
        F.from_quantization_config(qc)


def test_skipped_modules_from_config():
    mods = [("model.layers.0.self_attn.q_proj", torch.nn.Linear), ("model.layers.0.mlp.down_proj", torch.nn.Linear),
            ("lm_head", torch.nn.Linear)]
    ct = {**_ct(), "ignore": ["lm_head", "re:.*down_proj$"]}
    assert F.get("compressed_tensors").skipped_modules(ct, mods) == ["model.layers.0.mlp.down_proj", "lm_head"]
    ar = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "block_name_to_quantize": "model.layers",
          "extra_config": {"model.layers.0.mlp.down_proj": {"bits": 16, "data_type": "fp"}}}
    assert F.get("autoround_gptq").skipped_modules(ar, mods) == ["model.layers.0.mlp.down_proj", "lm_head"]
