"""Every transformers MoE family by structure: DeepSeek-V3 / Kimi-K2 (MLA attention, grouped
noaux_tc routing with e_score_correction_bias, a shared expert, a first dense layer), GLM-4-MoE and
OLMoE. Tiny AWQ / GPTQ checkpoints with the hub's key layouts (per-expert
``mlp.experts.E.{gate,up,down}_proj.*`` and the fused 3-D layout) load into one AWQMoEExperts per
MoE layer and match the dequantized fp32 reference; an experts module computing something else is
refused by name."""
from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import experts_structure, formats, testing  # noqa: E402
from awq_inductor.integrations import transformers as awq_hf  # noqa: E402
from awq_inductor.nn import AWQGateUpSiluMul, AWQMoEExperts  # noqa: E402
from awq_inductor.schemes import MOE_OPS  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    awq_hf.patch_transformers()
    yield
    awq_hf.patch_transformers()


def _make(tmp_path, arch, quant_method="awq", fmt="gemm", **kw):
    model = testing.build_float_model(testing.tiny_config(arch))
    path = str(tmp_path / f"{arch}-{fmt}")
    ref = testing.save_quantized(model, path, quant_method=quant_method, format=fmt, group_size=32, **kw)
    return path, ref


def _load(path, dtype=torch.float32, **kw):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)


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


def _moe_layers(model):
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


CASES = [("deepseek_v3", "awq", "gemm", False), ("glm4_moe", "gptq", "gptq", False), ("olmoe", "awq", "gemm", True)]


@pytest.mark.parametrize("arch,qm,fmt,fused", CASES,
                         ids=[f"{a}-{f}-{'fused' if u else 'per_expert'}" for a, _, f, u in CASES])
def test_family_loads_and_matches_reference(tmp_path, arch, qm, fmt, fused):
    path, ref = _make(tmp_path, arch, qm, fmt, fused_experts=fused)
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    L = ref.config.num_hidden_layers
    moe = _moe_layers(ref)
    last = moe[-1]
    if fused:
        assert f"model.layers.{last}.mlp.experts.gate_up_proj.qweight" in keys
    else:  # the hub's per-expert layout; the router stays float
        assert f"model.layers.{last}.mlp.experts.15.down_proj.qweight" in keys
    assert f"model.layers.{last}.mlp.gate.weight" in keys and not any(".mlp.gate.q" in k for k in keys)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    experts = [m for m in model.modules() if isinstance(m, AWQMoEExperts)]
    assert len(experts) == len(moe) and experts[0].num_experts == 16
    block = model.model.layers[last].mlp
    assert type(block.gate).__name__.endswith("Router")  # routing stays transformers' own
    if arch != "olmoe":  # DeepSeek / GLM: first layer dense, shared expert fused gated MLP, fp32 correction bias
        assert moe == list(range(1, L))
        assert block.gate.e_score_correction_bias.dtype == torch.float32
        assert isinstance(block.shared_experts.gate_up_proj, AWQGateUpSiluMul)
        assert isinstance(model.model.layers[0].mlp.gate_up_proj, AWQGateUpSiluMul)
    if arch == "deepseek_v3":  # MLA: q_a_proj and kv_a_proj_with_mqa read the same input: one int4 linear
        attn = model.model.layers[last].self_attn
        assert attn.q_kv_a_proj.out_features == attn.config.q_lora_rank + attn.config.kv_lora_rank + 32
    ids = _ids()
    with torch.no_grad(), MoeCounter() as c:
        logits = model(ids).logits
    assert c.count == len(moe)  # one experts op per MoE layer
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(logits, want, atol=2e-3, rtol=2e-3)
    prompt = _ids(6)[:1]
    kw = dict(max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), ref.generate(prompt, **kw))
    # no graph break in an MoE decoder layer (attention, router, experts op, shared expert)
    torch._dynamo.reset()
    layer = model.model.layers[last]
    hidden = torch.randn(2, 8, model.config.hidden_size)
    pe = model.model.rotary_emb(hidden, torch.arange(8)[None].expand(2, 8))
    explain = torch._dynamo.explain(layer)(hidden, position_embeddings=pe, attention_mask=None)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    # compiled bf16 (router weight and correction bias stay fp32: transformers' strict fp32 list)
    m16 = _load(path, dtype=torch.bfloat16)
    if arch != "olmoe":
        assert m16.model.layers[last].mlp.gate.weight.dtype == torch.float32
    with torch.no_grad():
        eager16 = m16(ids).logits.float()
    m16.forward = torch.compile(m16.forward, backend="awq_inductor")
    with torch.no_grad():
        comp16 = m16(ids).logits.float()
    torch._dynamo.reset()
    scale = want.abs().max()
    # token by token: a router's top-k may flip on a near tie between two bf16 runs whose hidden states
    # differ in the last bits (GLM-4-MoE, GPTQ: one token of 20 after the AMX groups path made the eager
    # products exact); every other token within bf16 tolerance, and the whole close to fp32
    close = ((comp16 - eager16).abs() <= 0.02 * scale + 0.02 * eager16.abs()).all(dim=-1)
    assert close.float().mean().item() >= 0.9, close
    assert ((comp16 - want).abs().mean() / want.abs().mean()).item() < 0.05
    assert ((eager16 - want).abs().mean() / want.abs().mean()).item() < 0.05


def _sweep_cases():
    out = []
    for fmt in formats.names():
        f = formats.get(fmt)
        for act in ((None, "per_layer") if f.has_g_idx else (None,)):
            out += [(arch, fmt, fused, act) for arch in testing.MOE_ARCHS for fused in (False, True)]
    return out


def _one_per_format(cases):
    """One case per (format, act-order), the family and layout rotating from one format to the next."""
    groups = {}
    for c in cases:
        groups.setdefault((c[1], c[3]), []).append(c)
    return [g[i % len(g)] for i, g in enumerate(groups.values())]


SWEEP = _sweep_cases()
SWEEP_SAMPLE = _one_per_format(SWEEP)  # what runs without --moe-sweep


def pytest_generate_tests(metafunc):
    if "sweep_case" in metafunc.fixturenames:
        cases = SWEEP if metafunc.config.getoption("--moe-sweep") else SWEEP_SAMPLE
        metafunc.parametrize("sweep_case", cases, ids=[f"{a}-{f}-{'fused' if u else 'per_expert'}"
                                                       f"{'-act_order' if o else ''}" for a, f, u, o in cases])


def test_every_family_format_and_layout_loads(tmp_path, sweep_case):
    """Each MoE family (testing.MOE_ARCHS) in each checkpoint format we load, per-expert and fused 3-D
    experts, formats that store g_idx also act-order: no missing / unexpected / mismatched keys, one experts
    op per MoE layer, logits within 2e-3 of the dequantized fp32 reference (W4A16). 14 cases by default (one
    per format and act-order, the family and layout rotating), all 168 with ``--moe-sweep``."""
    arch, fmt, fused, act = sweep_case
    skip = ["shared_expert_gate"] if arch == "qwen2_moe" else None  # 1 output column: no packed format holds it
    path = str(tmp_path / "ckpt")
    ref = testing.save_quantized(testing.build_float_model(testing.tiny_config(arch)), path,
                                 quant_method=formats.get(fmt).quant_method, format=fmt, group_size=32,
                                 fused_experts=fused, act_order=act, modules_to_not_convert=skip)
    model, info = _load(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = _ids()
    with torch.no_grad(), MoeCounter() as c:
        logits = model(ids).logits
    assert c.count == len(_moe_layers(model)) > 0
    with torch.no_grad():
        torch.testing.assert_close(logits, ref(ids).logits, atol=2e-3, rtol=2e-3)


def test_deepseek_w4a8_fused_layout_and_save_back(tmp_path):
    """W4A8 on DeepSeek-V3 (fused 3-D experts checkpoint), and save_pretrained writes that layout back."""
    path, ref = _make(tmp_path, "deepseek_v3", fused_experts=True)
    ids = _ids()
    with torch.no_grad():
        want = ref(ids).logits
    model = _load(path)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, atol=2e-3, rtol=2e-3)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    from safetensors import safe_open

    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys() if ".experts." in k or "_a_proj" in k}
        saved_keys = set(f.keys())
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert set(f.keys()) == saved_keys  # the fused q_kv_a_proj is split back into its checkpoint names
        for k, v in saved.items():
            assert torch.equal(v, f.get_tensor(k)), k
    awq_hf.patch_transformers(act_quant="int8")
    m8 = _load(path)
    ex = m8.model.layers[1].mlp.experts
    assert ex.act_quant == "int8" and ex.op is MOE_OPS["int4_moe_a8"]
    with torch.no_grad():
        got = m8(ids).logits
    assert ((got - want).abs().mean() / want.abs().mean()).item() < 0.05


def test_mtp_layer_keys_are_ignored_like_transformers(tmp_path):
    """DeepSeek-V3 checkpoints carry a multi-token-prediction layer 61 (int4 too) that transformers
    drops (``_keys_to_ignore_on_load_unexpected``): so do we."""
    q = torch.zeros(128, 16, dtype=torch.int32)
    extra = {f"model.layers.61.mlp.experts.0.gate_proj.{t}": v for t, v in
             (("qweight", q), ("qzeros", torch.zeros(4, 16, dtype=torch.int32)),
              ("scales", torch.ones(4, 128, dtype=torch.float16)))}
    extra["model.layers.61.self_attn.q_a_proj.qweight"] = q.clone()
    path, ref = _make(tmp_path, "deepseek_v3", extra_tensors=extra)
    model = _load(path)
    with torch.no_grad():
        torch.testing.assert_close(model(_ids()).logits, ref(_ids()).logits, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------------------------
# Experts modules that look like ours but compute something else
def _olmoe_module():
    from transformers.models.olmoe import modeling_olmoe

    return modeling_olmoe


def _scaled(base):
    class ScaledExperts(base):
        def forward(self, hidden_states, top_k_index, top_k_weights):
            return 2 * super().forward(hidden_states, top_k_index, top_k_weights)

    return ScaledExperts


def _gelu(base):
    from transformers.activations import ACT2FN

    class GeluExperts(base):
        def __init__(self, config):
            super().__init__(config)
            self.act_fn = ACT2FN["gelu_pytorch_tanh"]

    return GeluExperts


def _biased(base):
    class BiasedExperts(base):
        def __init__(self, config):
            super().__init__(config)
            self.gate_up_proj_bias = torch.nn.Parameter(torch.zeros(self.gate_up_proj.shape[:2]))

    return BiasedExperts


def _transposed(base):
    class TransposedExperts(base):
        def __init__(self, config):
            super().__init__(config)
            self.gate_up_proj = torch.nn.Parameter(self.gate_up_proj.transpose(1, 2).contiguous())
            self.down_proj = torch.nn.Parameter(self.down_proj.transpose(1, 2).contiguous())
            self.is_transposed = True

    return TransposedExperts


@pytest.mark.parametrize("make,cls,why", [
    (_scaled, "ScaledExperts", r"forward body differs"),
    (_gelu, "GeluExperts", r"act_fn GELUTanh\w*, expected SiLU"),
    (_biased, "BiasedExperts", r"has extra parameters \['gate_up_proj_bias'\]"),
    (_transposed, "TransposedExperts", r"transposed layout"),
], ids=["forward", "gelu", "bias", "transposed"])
def test_experts_module_that_differs_is_refused_by_name(tmp_path, monkeypatch, make, cls, why):
    path, _ = _make(tmp_path, "olmoe")
    mod = _olmoe_module()
    monkeypatch.setattr(mod, "OlmoeExperts", make(mod.OlmoeExperts))
    with pytest.raises(awq_hf.CheckpointError,
                       match=rf"model\.layers\.0\.mlp\.experts \({cls}\): the checkpoint stores int4 experts .*{why}"):
        _load(path)


def test_structural_test_on_transformers_classes():
    """The three families (and the known ones) pass; a renamed copy of a class passes too (no names)."""
    for arch in ("deepseek_v3", "glm4_moe", "olmoe", "qwen3_moe", "mixtral"):
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(testing.tiny_config(arch))
        found = [(n, experts_structure.silu_gated_experts(m)) for n, m in model.named_modules()
                 if experts_structure.looks_like_experts(m)]
        assert found and all(ok for _, (ok, _) in found), (arch, found)
    base = _olmoe_module().OlmoeExperts
    Renamed = type("SomethingElse", (base,), {})
    with torch.device("meta"):
        m = Renamed(testing.tiny_config("olmoe"))
    assert experts_structure.silu_gated_experts(m) == (True, [])
    assert not experts_structure.silu_gated_experts(AWQMoEExperts(4, 64, 32, 32))[0]  # never converted twice
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    with torch.device("meta"):
        gpt_oss = GptOssExperts(transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_local_experts=4))
    ok, why = experts_structure.silu_gated_experts(gpt_oss)
    assert experts_structure.looks_like_experts(gpt_oss) and not ok
    text = "; ".join(why)
    for part in ("has biases (has_bias=True)", "transposed layout (is_transposed=True)",
                 "interleaved gate/up rows", "custom _apply_gate", "forward signature"):
        assert part in text, text


# ---------------------------------------------------------------------------------------------
# Tensor parallelism (GLM-4-MoE on 2 real ranks: tests/test_tp.py)
def _extra_mla_projection(model):
    attn = model.model.layers[1].self_attn
    attn.extra_proj = attn.q_b_proj  # an int4 projection of MLA that is neither per head nor low-rank input


REFUSED = [
    ("olmoe", lambda m: setattr(m.model.layers[0].self_attn, "q_norm", torch.nn.LayerNorm(128)),
     r"model\.layers\.0\.self_attn\.q_norm: normalises 128 features \(head_dim 32, projection width 128\); "
     r"expected a per-head norm or an RMSNorm .* over 128 features to split over heads, got LayerNorm"),
    ("olmoe", lambda m: setattr(m.model.layers[0].self_attn, "k_norm", torch.nn.RMSNorm(128, elementwise_affine=False)),
     r"model\.layers\.0\.self_attn\.k_norm: a q/k norm without a weight tensor \(RMSNorm\)"),
    ("deepseek_v3", _extra_mla_projection,
     r"model\.layers\.1\.self_attn: int4 projections \['extra_proj'\] of multi-head latent attention"),
]


@pytest.mark.parametrize("arch,mutate,match", REFUSED, ids=["layer_norm", "weightless_norm", "unknown_mla_projection"])
def test_tensor_parallel_refuses_attention_it_cannot_split(tmp_path, arch, mutate, match):
    """What tp.shard cannot split is refused by name, the model untouched: a norm over the whole q projection
    that is not an RMSNorm (an all-reduce of the mean of squares would not reproduce it), a norm without a
    weight (per head or whole projection cannot be told apart), an MLA int4 projection of unknown role."""
    from awq_inductor import tp

    path, _ = _make(tmp_path, arch)
    model = _load(path)
    mutate(model)
    with pytest.raises(tp.TPError, match=match):
        tp.shard(model, rank=0, world_size=2)
    assert getattr(model, "_awq_tp", None) is None


def test_tensor_parallel_glm_shard_builds(tmp_path):
    """rank 0 of 2: GLM-4-MoE's attention (q/k/v bias), dense first MLP, shared expert and experts split."""
    from awq_inductor import tp

    path, _ = _make(tmp_path, "glm4_moe")
    model = _load(path)
    tp.shard(model, rank=0, world_size=2)
    info = model._awq_tp
    assert (info["attention_layers"], info["moe_layers"], info["mlp_layers"]) == (3, 2, 3)
    assert isinstance(model.model.layers[1].mlp.experts, tp.ParallelMoEExperts)
    assert model.model.layers[1].mlp.experts.local.intermediate_size == 32


def test_tensor_parallel_olmoe_qk_norm_split(tmp_path):
    """rank 1 of 2: OLMoE's q_norm / k_norm over all heads become ParallelRMSNorm on the rank's heads (its
    weight slice, the full width for the mean), and equal the whole norm on one rank's share of the math."""
    from awq_inductor import tp

    path, _ = _make(tmp_path, "olmoe")
    model = _load(path)
    attn = model.model.layers[0].self_attn
    norms = {n: getattr(attn, n) for n in ("q_norm", "k_norm")}
    with torch.no_grad():  # the tiny model's norms are all ones: distinct weights, so a wrong slice shows
        for norm in norms.values():
            norm.weight.copy_(torch.rand(128, generator=torch.Generator().manual_seed(7)) + 0.5)
    tp.shard(model, rank=1, world_size=2)
    for n, whole in norms.items():
        par = getattr(attn, n)
        assert isinstance(par, tp.ParallelRMSNorm) and par.features == 128, n
        assert torch.equal(par.weight, whole.weight.detach()[64:]), n
        x = torch.randn(5, 128)
        one = tp.ParallelRMSNorm(whole.weight.detach(), par.variance_epsilon, 128, None, 1)
        torch.testing.assert_close(one(x), whole(x), rtol=1e-6, atol=1e-6)


def test_tensor_parallel_deepseek_mla_shard_builds(tmp_path):
    """rank 1 of 2: MLA split over heads (q_b_proj / kv_b_proj rows of the rank's heads, o_proj's K slice),
    the fused low-rank q_kv_a_proj and its norms whole; numerics on 2 real ranks: tests/test_tp.py."""
    from awq_inductor import tp

    path, _ = _make(tmp_path, "deepseek_v3")
    model = _load(path)
    attn = model.model.layers[1].self_attn
    q_b, kv_b, q_kv_a = attn.q_b_proj.canonical(), attn.kv_b_proj.canonical(), attn.q_kv_a_proj
    o = attn.o_proj.canonical()
    tp.shard(model, rank=1, world_size=2)
    info = model._awq_tp
    assert (info["attention_layers"], info["moe_layers"], info["mlp_layers"]) == (3, 2, 3)
    assert model.config.num_attention_heads == 2
    assert attn.q_kv_a_proj is q_kv_a  # replicated, untouched
    hq, qk, kvd, v = 2, attn.qk_head_dim, attn.qk_nope_head_dim + attn.v_head_dim, attn.v_head_dim
    assert torch.equal(attn.q_b_proj.canonical()[0], q_b[0][hq * qk:2 * hq * qk])
    assert torch.equal(attn.kv_b_proj.canonical()[0], kv_b[0][hq * kvd:2 * hq * kvd])
    assert isinstance(attn.o_proj, tp.RowParallelLinear)
    assert torch.equal(attn.o_proj.linear.canonical()[0], o[0][:, hq * v:2 * hq * v])


def test_kimi_k2_expert_counts_and_group_size():
    """Kimi-K2 / DeepSeek-V3 routing shapes on the op: 384 and 256 experts, top-8, group size 32 (Kimi-K2's
    int4 checkpoints), against the dequantized fp32 math."""
    H, I, G, T, k = 64, 32, 32, 6, 8
    g = torch.Generator().manual_seed(0)
    for E in (384, 256):
        gu = [testing.quantize_weight(torch.randn(2 * I, H, generator=g) * 0.05, G) for _ in range(E)]
        dn = [testing.quantize_weight(torch.randn(H, I, generator=g) * 0.05, G) for _ in range(E)]
        ex = AWQMoEExperts.from_canonical(gu, dn, group_size=G)
        x = torch.randn(T, H, generator=g)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
        w = torch.rand(T, k, generator=g)
        want = torch.zeros(T, H)
        for t in range(T):
            for j in range(k):
                e = int(ids[t, j])
                wgu, wdn = (testing.dequantize(*c, G) for c in (gu[e], dn[e]))
                h = wgu @ x[t]
                want[t] += w[t, j] * (wdn @ (torch.nn.functional.silu(h[:I]) * h[I:]))
        with torch.no_grad():
            torch.testing.assert_close(ex(x, ids, w), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe", "olmoe"])
def test_dense_baseline_keeps_transformers_fp32_tensors(tmp_path, arch):
    """The bf16 baseline of the report (cli._dequantized_copy) has, for every tensor name it shares
    with the float model as transformers loads it in bf16, that model's dtype: DeepSeek/GLM routers
    (``gate.weight``, ``e_score_correction_bias``: ``_keep_in_fp32_modules_strict``) stay fp32."""
    from awq_inductor import cli

    float_model = testing.build_float_model(testing.tiny_config(arch))
    float_model.save_pretrained(str(tmp_path / "float"))
    want = {n: t.dtype for n, t in _tensors(_load(str(tmp_path / "float"), dtype=torch.bfloat16))}
    testing.save_quantized(float_model, str(tmp_path / "q"), format="gemm", group_size=32)
    dense = cli._dequantized_copy(_load(str(tmp_path / "q"), dtype=torch.bfloat16), torch.bfloat16)
    have = dict((n, t.dtype) for n, t in _tensors(dense))
    common = sorted(set(want) & set(have))
    assert len(common) > 10, common
    wrong = {n: (want[n], have[n]) for n in common if want[n] != have[n]}
    assert not wrong, f"(transformers' dtype, the baseline's dtype) differ: {wrong}"
    router = {n.split(".")[-1]: want[n] for n in common if ".mlp.gate." in n}
    assert router == ({"weight": torch.float32, "e_score_correction_bias": torch.float32} if arch != "olmoe"
                      else {"weight": torch.bfloat16}), router
    assert have["model.embed_tokens.weight"] == torch.bfloat16


def _tensors(model):
    return [(n, t) for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_floating_point()]
