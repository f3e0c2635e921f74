"""Helpers to make real AWQ / GPTQ checkpoints from float models (tests, demo, benchmarks).

No network: models are real transformers classes built from their Config objects with random
weights. :func:`save_quantized` quantizes every ``nn.Linear`` (except the output embedding and
``modules_to_not_convert``) with AutoAWQ's formula, packs it in the requested checkpoint format
with :mod:`awq_inductor.formats`, writes ``model.safetensors`` + ``config.json`` carrying the
real ``quantization_config``, and returns the *reference* float model: the same model with each
quantized weight replaced by its dequantization ``(q - z) * s``.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from . import experts_structure, families, formats, packing
from .progress import track

ARCHS = ("llama", "qwen2", "mistral", "phi3")
#: sparse-MoE architectures (transformers 5 experts modules, recognised by structure:
#: awq_inductor.experts_structure)
MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "glm4_moe", "olmoe")


def quantize_weight(w: torch.Tensor, group_size: int, scales_dtype: torch.dtype = torch.float16
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ ``pseudo_quantize_tensor`` (asymmetric, per group along K) -> canonical
    (q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G] in ``scales_dtype``)."""
    return packing.quantize_canonical(w, formats.resolve_group_size(group_size, w.shape[1]), scales_dtype)


def quantize_weight_sym(w: torch.Tensor, group_size: int, scales_dtype: torch.dtype = torch.float16
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric int4 (compressed-tensors' W4A16 formula, ``s = max|w| / 7.5``; zero exactly 8) ->
    canonical, for the symmetric formats (compressed-tensors sym, AutoRound auto_gptq)."""
    N, K = w.shape
    G = formats.resolve_group_size(group_size, K)
    wg = w.detach().to(torch.float32).reshape(N, K // G, G)
    s = (wg.abs().amax(-1) / 7.5).clamp(min=1e-5).to(scales_dtype).to(torch.float32)
    q = torch.clamp(torch.round(wg / s[..., None]) + 8, 0, 15)
    z = torch.full((N, K // G), 8, dtype=torch.uint8)
    return q.reshape(N, K).to(torch.uint8), z, s.to(scales_dtype)


def _quantize_for(fmt, w, group_size, scales_dtype):
    return (quantize_weight_sym if fmt.symmetric else quantize_weight)(w, group_size, scales_dtype)


def dequantize(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 [N, K] weight of a canonical triple."""
    return packing.dequantize_canonical(q, zeros, scales, formats.resolve_group_size(group_size, q.shape[1]))


def tiny_config(arch: str = "llama", **overrides):
    """A small config of a real transformers architecture (GQA by default)."""
    import transformers

    common = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**{**common, **overrides})
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**{**common, **overrides})
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**{**common, "sliding_window": None, **overrides})
    elif arch == "phi3":
        cfg = transformers.Phi3Config(**{**common, "pad_token_id": 0, **overrides})
    elif arch in MOE_ARCHS:
        cfg = _tiny_moe_config(arch, common, overrides)
    else:
        raise ValueError(f"arch: expected one of {ARCHS + MOE_ARCHS}, got {arch!r}")
    return cfg


def _tiny_moe_config(arch: str, common: dict, overrides: dict):
    """8 experts, top-2, expert intermediate 64 (Qwen2-MoE: a shared expert of 128 with its gate)."""
    import transformers

    if arch == "mixtral":
        kw = dict(common, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=None)
        return transformers.MixtralConfig(**{**kw, **overrides})
    if arch == "deepseek_v3":
        # DeepSeek-V3 / Kimi-K2: MLA with q LoRA (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj), grouped
        # sigmoid routing (n_group / topk_group, e_score_correction_bias), one shared expert, layer 0 dense
        kw = dict(common, num_hidden_layers=3, first_k_dense_replace=1, num_key_value_heads=4,
                  moe_intermediate_size=64, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                  n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=128,
                  kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, hidden_act="silu")
        return transformers.DeepseekV3Config(**{**kw, **overrides})
    if arch == "glm4_moe":
        # GLM-4.5 / 4.6: GQA with q/k/v biases, qk norm, partial rotary, DeepSeek's router (one group),
        # one shared expert, layer 0 dense
        kw = dict(common, num_hidden_layers=3, first_k_dense_replace=1, head_dim=32, attention_bias=True,
                  use_qk_norm=True, partial_rotary_factor=0.5, moe_intermediate_size=64, n_routed_experts=16,
                  num_experts_per_tok=4, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
                  norm_topk_prob=True, hidden_act="silu")
        return transformers.Glm4MoeConfig(**{**kw, **overrides})
    if arch == "olmoe":
        # OLMoE: every layer sparse, the expert size is intermediate_size (no moe_intermediate_size)
        kw = dict(common, intermediate_size=64, num_key_value_heads=4, num_experts=16, num_experts_per_tok=4,
                  norm_topk_prob=False, pad_token_id=1, eos_token_id=2)
        return transformers.OlmoeConfig(**{**kw, **overrides})
    kw = dict(common, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
              norm_topk_prob=True)
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**{**kw, "head_dim": 32, **overrides})
    kw.update(shared_expert_intermediate_size=128, norm_topk_prob=False)
    return transformers.Qwen2MoeConfig(**{**kw, **overrides})


def moe_experts(model: nn.Module, skip: Iterable[str] = ()):
    """(name, module, (gate, up, down) checkpoint names) of every transformers experts module with
    3-D ``gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I] that awq_inductor loads
    (:func:`awq_inductor.experts_structure.silu_gated_experts`; names: :func:`awq_inductor.families.expert_names`)."""
    names = families.expert_names(getattr(getattr(model, "config", None), "model_type", None))
    out = []
    for n, m in model.named_modules():
        if experts_structure.looks_like_experts(m) and experts_structure.silu_gated_experts(m)[0] \
                and _should_quantize(n, skip):
            out.append((n, m, names))
    return out


def _pack_linear(q, z, s, G: int, quant_method: str, format: str) -> Dict[str, torch.Tensor]:
    fmt = formats.get(format)
    if fmt.quant_method != quant_method:
        raise ValueError(f"format: expected a {quant_method} format, got {format!r} ({fmt.quant_method})")
    return fmt.pack(q, z, s, G)


def _quantize_experts(name, mod, names, ref, sd, quant_method, format, group_size, scales_dtype,
                      fused: bool = False) -> None:
    """Checkpoint tensors of one experts module, per expert (``<name>.<e>.<gate|up|down>.*``) or
    fused 3-D (``fused``: ``<name>.gate_up_proj.*`` / ``<name>.down_proj.*`` [E, ...], gate|up
    packed as one linear of 2I outputs); ``ref`` gets the dequantized experts."""
    I = mod.gate_up_proj.shape[1] // 2
    r = ref.get_submodule(name)
    stacked: Dict[str, list] = {}
    for e in range(mod.gate_up_proj.shape[0]):
        w_gu, w_d = mod.gate_up_proj[e], mod.down_proj[e]
        parts = ((("gate_up_proj", w_gu, r.gate_up_proj[e]), ("down_proj", w_d, r.down_proj[e])) if fused else
                 ((f"{e}.{names[0]}", w_gu[:I], r.gate_up_proj[e, :I]), (f"{e}.{names[1]}", w_gu[I:], r.gate_up_proj[e, I:]),
                  (f"{e}.{names[2]}", w_d, r.down_proj[e])))
        for part, w, dst in parts:
            q, z, s = _quantize_for(formats.get(format), w, group_size, scales_dtype)
            G = formats.resolve_group_size(group_size, w.shape[1])
            for t, v in _pack_linear(q, z, s, G, quant_method, format).items():
                stacked.setdefault(f"{name}.{part}.{t}", []).append(v)
            with torch.no_grad():
                dst.copy_(dequantize(q, z, s, G).to(dst.dtype))
    for key, vs in stacked.items():
        sd[key] = torch.stack(vs) if fused else vs[0]


def build_float_model(config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """``AutoModelForCausalLM.from_config`` with seeded random weights, in eval mode. Linear weights
    get a larger std (0.05) so int4 rounding errors are visible but logits stay well-conditioned."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for m in model.modules():
            if experts_structure.looks_like_experts(m):
                m.gate_up_proj.normal_(0, 0.05)
                m.down_proj.normal_(0, 0.05)
            bias = getattr(m, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):  # DeepSeek-V3 / GLM-4-MoE routers: non-zero so that it matters
                bias.normal_(0, 0.1)
            if isinstance(m, nn.Linear):
                m.weight.normal_(0, 0.05)
                if m.bias is not None:
                    m.bias.normal_(0, 0.05)
    return model.eval()


def _should_quantize(name: str, skip: Iterable[str]) -> bool:
    for key in skip:
        if name == key or name.startswith(key + ".") or name.endswith("." + key) or name.endswith(key):
            return False
    return True


def quantization_config(quant_method: str, format: str, group_size: int,
                        modules_to_not_convert: Optional[list] = None, act_order: Optional[str] = None) -> Dict:
    fmt = formats.get(format)
    if fmt.quant_method != quant_method:
        raise ValueError(f"quant_method: expected {fmt.quant_method!r} for format {format!r}, got {quant_method!r}")
    qc = fmt.quantization_config(group_size, modules_to_not_convert)
    if act_order:
        qc["desc_act"] = True
    return qc


ACT_ORDERS = (None, "per_layer", "shared")


def _act_order_perm(name: str, K: int, act_order: Optional[str], seed: int) -> Optional[torch.Tensor]:
    """A random input permutation standing in for GPTQ's Hessian order: one per linear
    (``per_layer``), or one per module input shared by q/k/v and by gate/up (``shared``: what a real
    act-order checkpoint never has, but the fusion path must handle)."""
    if act_order is None:
        return None
    if act_order not in ACT_ORDERS:
        raise ValueError(f"act_order: expected one of {ACT_ORDERS}, got {act_order!r}")
    key = name.rpartition(".")[0] if act_order == "shared" and name.rpartition(".")[2] in (
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj") else name
    g = torch.Generator().manual_seed(seed + sum(ord(c) * (i + 1) for i, c in enumerate(key)))
    return torch.randperm(K, generator=g)


def quantize_to_state_dict(model: nn.Module, *, quant_method: str = "awq", format: str = "gemm",
                           group_size: int = 32, modules_to_not_convert: Optional[list] = None,
                           scales_dtype: torch.dtype = torch.float16, progress: Optional[bool] = None,
                           fused_experts: bool = False, act_order: Optional[str] = None, seed: int = 0):
    """(checkpoint state dict, reference float model). See module doc. ``progress``: a tqdm bar
    (None: on a terminal only). ``fused_experts``: MoE experts as fused 3-D tensors
    (``mlp.experts.gate_up_proj.qweight`` [E, ...]) instead of per-expert keys. ``act_order``
    (GPTQ only): a GPTQ desc_act checkpoint, each linear quantized in a random column order
    (:func:`_act_order_perm`) and stored like AutoGPTQ does (q in the original order, g_idx)."""
    fmt = formats.get(format)
    if act_order is not None and not fmt.has_g_idx:  # the formats with g_idx are GPTQ's, with pack_act_order
        raise ValueError(f"act_order: only formats that store g_idx hold an act-order checkpoint, "
                         f"got format {format!r} (no g_idx)")
    skip = list(modules_to_not_convert or [])
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    ref = copy.deepcopy(model)
    sd: Dict[str, torch.Tensor] = {}
    quantized = set()
    linears = [(n, m) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and m is not out_emb and _should_quantize(n, skip)]
    for name, m, names in moe_experts(model, skip):
        _quantize_experts(name, m, names, ref, sd, quant_method, format, group_size, scales_dtype, fused_experts)
        quantized.add(name)
    for name, m in track(linears, "quantizing", progress):
        perm = _act_order_perm(name, m.in_features, act_order, seed)
        w = m.weight if perm is None else m.weight[:, perm]
        q, z, s = _quantize_for(fmt, w, group_size, scales_dtype)
        G = formats.resolve_group_size(group_size, m.in_features)
        packed = _pack_linear(q, z, s, G, quant_method, format) if perm is None else \
            fmt.pack_act_order(q, z, s, G, perm)
        for t, v in packed.items():
            sd[f"{name}.{t}"] = v
        if m.bias is not None:
            sd[f"{name}.bias"] = m.bias.detach().to(scales_dtype).clone()
        with torch.no_grad():
            r = ref.get_submodule(name)
            wd = dequantize(q, z, s, G)
            if perm is not None:
                wd = wd.index_select(1, formats.base.invert_perm(perm))
            r.weight.copy_(wd.to(r.weight.dtype))
            if r.bias is not None:
                r.bias.copy_(m.bias.detach().to(scales_dtype).to(r.bias.dtype))
        quantized.add(name)
    for k, v in model.state_dict().items():
        mod = k.rpartition(".")[0]
        if mod in quantized:
            continue
        sd[k] = v.detach().clone().contiguous()
    return sd, ref.eval()


def save_quantized(model: nn.Module, path: str, *, quant_method: str = "awq", format: str = "gemm",
                   group_size: int = 32, modules_to_not_convert: Optional[list] = None,
                   scales_dtype: torch.dtype = torch.float16, extra_tensors: Optional[Dict[str, torch.Tensor]] = None,
                   progress: Optional[bool] = None, fused_experts: bool = False, act_order: Optional[str] = None):
    """Quantize ``model`` into a real checkpoint folder at ``path`` (any registered format:
    AWQ, GPTQ, compressed-tensors, AutoRound); return the dequantized float reference model.
    ``extra_tensors`` are added verbatim (error tests). ``act_order``: see :func:`quantize_to_state_dict`."""
    from safetensors.torch import save_file

    sd, ref = quantize_to_state_dict(model, quant_method=quant_method, format=format, group_size=group_size,
                                     modules_to_not_convert=modules_to_not_convert, scales_dtype=scales_dtype,
                                     progress=progress, fused_experts=fused_experts, act_order=act_order)
    if extra_tensors:
        sd.update(extra_tensors)
    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = quantization_config(quant_method, format, group_size, modules_to_not_convert,
                                                     act_order)
    cfg.setdefault("architectures", [type(model).__name__])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, default=str)
    return ref


def publish_demo_checkpoint(ref: nn.Module, tmp: str, path: str) -> str:
    """Finish a demo checkpoint written to ``tmp``: add ``dense.safetensors`` (the dequantized weights
    ``ref`` in bf16, so the dense baseline computes the same model), then rename ``tmp`` to ``path``
    (a reader never sees a half-written folder)."""
    from safetensors.torch import save_file

    save_file({k: v.to(torch.bfloat16).contiguous() if v.is_floating_point() else v.contiguous()
               for k, v in ref.state_dict().items()}, os.path.join(tmp, "dense.safetensors"))
    if os.path.exists(path):
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def rewrite_checkpoint(path: str, edit) -> None:
    """Load ``model.safetensors``, apply ``edit(dict)`` in place, write it back (error tests)."""
    from safetensors.torch import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    edit(sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, f, metadata={"format": "pt"})


class Int4MMCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts int4 GEMM calls (eager): ``with Int4MMCounter() as c: model(x); c.count``.

    Every ``awq::int4_mm*`` op counts (``int4_mm``, ``int4_mm_silu_mul``, ...); ``c.by_op`` maps the
    op name (e.g. ``"int4_mm_silu_mul"``) to its calls."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.by_op: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "awq" and func.__name__.split(".")[0].startswith("int4_mm"):
            self.count += 1
            op = func.__name__.split(".")[0]
            self.by_op[op] = self.by_op.get(op, 0) + 1
        return func(*args, **(kwargs or {}))
