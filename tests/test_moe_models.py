"""Sparse-MoE models (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral): per-expert AWQ / GPTQ
checkpoints load through patch_transformers into AWQMoEExperts (one awq::int4_moe call per layer),
match the dequantized fp32 reference eager and compiled, and bad checkpoints raise naming tensors."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch._dynamo

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402
from awq_inductor.nn import AWQMoEExperts  # noqa: E402
from awq_inductor.schemes import MOE_OPS  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    awq_hf.patch_transformers()
    yield
    awq_hf.patch_transformers()


def _make(tmp_path, arch, quant_method="awq", fmt="gemm", group_size=32, **kw):
    model = testing.build_float_model(testing.tiny_config(arch))
    skip = kw.pop("modules_to_not_convert", ["shared_expert_gate"] if arch == "qwen2_moe" else None)
    path = str(tmp_path / f"{arch}-{fmt}")
    ref = testing.save_quantized(model, path, quant_method=quant_method, format=fmt, group_size=group_size,
                                 modules_to_not_convert=skip, **kw)
    return path, ref


def _load(path, **kw):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)


def _ids(n=10, seed=1):
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


class MoeCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "awq" and func.__name__.split(".")[0].startswith("int4_moe"):
            self.count += 1
        return func(*args, **(kwargs or {}))


CASES = [("qwen3_moe", "awq", "gemm"), ("qwen3_moe", "gptq", "gptq"), ("qwen2_moe", "awq", "gemm"),
         ("qwen2_moe", "awq", "gemv"), ("mixtral", "awq", "gemm"), ("mixtral", "gptq", "gptq_v2")]
#: compiled once per architecture: a format changes what is loaded (checked eagerly), not the graph
COMPILED_CASES = {next(c for c in CASES if c[0] == arch) for arch in dict.fromkeys(c[0] for c in CASES)}


@pytest.mark.parametrize("arch,qm,fmt", CASES, ids=[f"{a}-{f}" for a, _, f in CASES])
def test_load_matches_reference_eager_and_compiled(tmp_path, arch, qm, fmt):
    path, ref = _make(tmp_path, arch, qm, fmt)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    L = model.config.num_hidden_layers
    experts = [m for m in model.modules() if isinstance(m, AWQMoEExperts)]
    assert len(experts) == L and experts[0].num_experts == 8
    block = model.model.layers[0].mlp
    assert type(block.gate).__name__.endswith("TopKRouter")  # routing stays transformers' own
    if arch == "qwen2_moe":
        assert type(block.shared_expert_gate) is torch.nn.Linear
        assert type(block.shared_expert.gate_up_proj).__name__ == "AWQGateUpSiluMul"
    ids = _ids()
    with torch.no_grad(), MoeCounter() as c:
        logits = model(ids).logits
    assert c.count == L
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(logits, want, atol=2e-3, rtol=2e-3)
    prompt = _ids(6)[:1]
    kw = dict(max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=0)
    exp = ref.generate(prompt, **kw)
    assert torch.equal(model.generate(prompt, **kw), exp)
    if (arch, qm, fmt) not in COMPILED_CASES:
        return
    torch._dynamo.reset()
    # no graph break in a decoder layer with the MoE block
    layer = model.model.layers[0]
    hidden = torch.randn(2, 8, model.config.hidden_size)
    pe = model.model.rotary_emb(hidden, torch.arange(8)[None].expand(2, 8))
    explain = torch._dynamo.explain(layer)(hidden, position_embeddings=pe, attention_mask=None)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="awq_inductor")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, atol=2e-3, rtol=2e-3)
        assert torch.equal(model.generate(prompt, **kw), exp)
    torch._dynamo.reset()


def test_w4a8_and_bf16(tmp_path):
    path, ref = _make(tmp_path, "qwen3_moe")
    awq_hf.patch_transformers(act_quant="int8")
    model = _load(path)
    experts = model.model.layers[0].mlp.experts
    assert experts.act_quant == "int8" and experts.op is MOE_OPS["int4_moe_a8"]
    ids = _ids()
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    # per-token int8 activations: a looser, relative bound
    assert ((got - want).abs().mean() / want.abs().mean()).item() < 0.05
    awq_hf.patch_transformers()
    m16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    with torch.no_grad():
        got = m16(ids).logits.float()
    assert ((got - want).abs().mean() / want.abs().mean()).item() < 0.05


def test_save_pretrained_round_trip(tmp_path):
    path, _ = _make(tmp_path, "mixtral", "gptq", "gptq")
    model = _load(path)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    from safetensors import safe_open

    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.mlp.experts.7.w2.qweight" in keys and "model.layers.0.mlp.experts.0.w3.g_idx" in keys
    assert not any("w13_" in k or "w2_qweight" in k for k in keys)
    again = _load(out)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("arch,skip,float_mod", [
    ("qwen3_moe", ["experts"], "experts"),  # float experts: transformers' own experts module
    ("qwen2_moe", ["shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
                   "shared_expert_gate"], "shared_expert"),  # float shared expert (seen in the wild)
], ids=["float_experts", "float_shared_expert"])
def test_modules_to_not_convert(tmp_path, arch, skip, float_mod):
    path, ref = _make(tmp_path, arch, modules_to_not_convert=skip)
    model = _load(path)
    block = model.model.layers[0].mlp
    if float_mod == "experts":
        assert type(block.experts).__name__ == "Qwen3MoeExperts"
    else:
        assert isinstance(block.experts, AWQMoEExperts)
        assert type(block.shared_expert.gate_proj) is torch.nn.Linear
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


def _drop(key):
    return lambda sd: sd.pop(key)


def _shrink(key):
    return lambda sd: sd.__setitem__(key, sd[key][:, :-1].contiguous())


def _extra_expert(sd):
    for k in [k for k in sd if ".experts.7." in k]:
        sd[k.replace(".experts.7.", ".experts.8.")] = sd[k].clone()


@pytest.mark.parametrize("edit,match", [
    (_drop("model.layers.1.mlp.experts.5.up_proj.scales"), r"model\.layers\.1\.mlp\.experts\.5\.up_proj\.scales: missing"),
    (_shrink("model.layers.0.mlp.experts.3.down_proj.qweight"),
     r"model\.layers\.0\.mlp\.experts\.3\.down_proj\.qweight: expected shape"),
    (_extra_expert, r"model\.layers\.\d\.mlp\.experts\.8\.(gate|up|down)_proj.*experts beyond the config's expert count"),
], ids=["missing_expert_tensor", "wrong_expert_shape", "more_experts_than_config"])
def test_bad_expert_checkpoint_raises_naming_tensor(tmp_path, edit, match):
    path, _ = _make(tmp_path, "qwen3_moe")
    testing.rewrite_checkpoint(path, edit)
    with pytest.raises(awq_hf.CheckpointError, match=match):
        _load(path)


def test_fewer_experts_than_config_raises(tmp_path):
    path, _ = _make(tmp_path, "qwen3_moe")
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["num_local_experts"] = 9  # Qwen3MoeConfig serialises num_experts under this name
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(awq_hf.CheckpointError, match=r"experts\.8\.gate_proj\.qweight: missing"):
        _load(path)


@pytest.mark.parametrize("act_quant", [None, "int8"])
def test_tensor_parallel_experts_split_sums_to_unsharded(tmp_path, act_quant):
    """tp.shard splits every expert over its intermediate dim: the two ranks' local experts (run
    without the all-reduce) sum to the unsharded experts; the shared expert is a split gated MLP.
    (2 real ranks: tests/test_tp.py, qwen3_moe.)"""
    from awq_inductor import convert
    from awq_inductor import tp

    path, _ = _make(tmp_path, "qwen2_moe")
    full = convert(_load(path), act_quant=act_quant).model.layers[1].mlp.experts
    x = torch.randn(5, full.hidden_size)
    ids = torch.randint(0, full.num_experts, (5, 2), generator=torch.Generator().manual_seed(3))
    w = torch.rand(5, 2)
    parts = []
    for rank in range(2):
        model = convert(_load(path), act_quant=act_quant)
        tp.shard(model, rank=rank, world_size=2)
        assert model._awq_tp["moe_layers"] == model.config.num_hidden_layers
        block = model.model.layers[1].mlp
        assert isinstance(block.experts, tp.ParallelMoEExperts)
        assert isinstance(block.shared_expert.down_proj, tp.RowParallelLinear)
        local = block.experts.local
        assert (local.intermediate_size, local.act_quant) == (full.intermediate_size // 2, act_quant)
        gu, dn = local.dequantize(4)
        fgu, fdn = full.dequantize(4)
        i, I = local.intermediate_size, full.intermediate_size
        lo = rank * i
        torch.testing.assert_close(gu, torch.cat([fgu[lo:lo + i], fgu[I + lo:I + lo + i]]), atol=0, rtol=0)
        torch.testing.assert_close(dn, fdn[:, lo:lo + i], atol=0, rtol=0)
        with torch.no_grad():
            parts.append(local(x, ids, w))
    with torch.no_grad():
        want = full(x, ids, w)
    tol = 2e-3 if act_quant is None else 0.05 * float(want.abs().max())
    torch.testing.assert_close(parts[0] + parts[1], want, atol=tol, rtol=2e-3)


def test_tensor_parallel_experts_that_do_not_split_raise(tmp_path):
    from awq_inductor import convert
    from awq_inductor import tp

    path, _ = _make(tmp_path, "mixtral", group_size=64)  # expert intermediate 64: 32 per rank, not a group
    model = convert(_load(path))
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.mlp\.experts: expert intermediate_size / world_size "
                                         r"must be a multiple of 32 .* and of the group size 64 .* got 64 / 2"):
        tp.shard(model, rank=0, world_size=2)
    assert getattr(model, "_awq_tp", None) is None
    assert isinstance(model.model.layers[0].mlp.experts, AWQMoEExperts)


def test_gemv_fast_experts_load(tmp_path):
    path, ref = _make(tmp_path, "qwen3_moe", "awq", "gemv_fast")
    model = _load(path)
    assert isinstance(model.model.layers[1].mlp.experts, AWQMoEExperts)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------------------------
# Fused 3-D expert checkpoints: mlp.experts.gate_up_proj.{qweight,...} [E, ...], down_proj [E, ...]
FUSED_CASES = [("qwen3_moe", "awq", "gemm"), ("mixtral", "gptq", "gptq"), ("qwen2_moe", "awq", "gemv_fast")]


@pytest.mark.parametrize("arch,qm,fmt", FUSED_CASES, ids=[f"{a}-{f}" for a, _, f in FUSED_CASES])
def test_fused_experts_load_match_reference_and_save_back(tmp_path, arch, qm, fmt):
    path, ref = _make(tmp_path, arch, qm, fmt, fused_experts=True)
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.mlp.experts.gate_up_proj.qweight" in keys
    assert not any(".experts.0." in k for k in keys)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    experts = [m for m in model.modules() if isinstance(m, AWQMoEExperts)]
    assert len(experts) == model.config.num_hidden_layers and experts[0].num_experts == 8
    ids = _ids()
    with torch.no_grad():
        logits = model(ids).logits
        torch.testing.assert_close(logits, ref(ids).logits, atol=2e-3, rtol=2e-3)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys() if ".experts." in k}
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for k, v in saved.items():  # the original layout, bit for bit
            assert torch.equal(v, f.get_tensor(k)), k
    assert {k for k in keys if ".experts." in k} == set(saved)
    with torch.no_grad():
        torch.testing.assert_close(_load(out)(ids).logits, logits, atol=0, rtol=0)


def _fewer_fused_experts(sd):
    for k in [k for k in sd if "layers.1.mlp.experts.down_proj" in k]:
        sd[k] = sd[k][:-1].contiguous()


@pytest.mark.parametrize("edit,match", [
    (_drop("model.layers.0.mlp.experts.down_proj.qzeros"), r"model\.layers\.0\.mlp\.experts\.down_proj\.qzeros: missing"),
    (_fewer_fused_experts, r"model\.layers\.1\.mlp\.experts\.down_proj\.qweight: expected shape \[8, "),
], ids=["missing_fused_tensor", "fused_expert_count"])
def test_bad_fused_expert_checkpoint_raises_naming_tensor(tmp_path, edit, match):
    path, _ = _make(tmp_path, "qwen3_moe", fused_experts=True)
    testing.rewrite_checkpoint(path, edit)
    with pytest.raises(awq_hf.CheckpointError, match=match):
        _load(path)


def test_per_rank_loader_refuses_moe_clearly(tmp_path):
    from awq_inductor import tp

    path, _ = _make(tmp_path, "qwen3_moe")
    with pytest.raises(tp.TPError, match=r"load: qwen3_moe is a mixture-of-experts model; .* call tp\.shard"):
        tp.load(path, rank=0, world_size=2)
