"""Model families, as data: what the model pass, the transformers loader, tensor parallelism and
the tuner know about architectures. Adding a family is a row of :data:`FAMILIES` (and a tiny
config in :mod:`awq_inductor.testing` to test it); the generic rules below cover every family
whose modules use the usual names.

* :data:`FUSIONS`: projections that share an input and fuse along N (q/k/v, gate/up).
* :data:`GATED_MLP_BODIES`: ``forward`` bodies recognised as a SiLU-gated MLP (checked on the AST
  by the model pass, up to local names), fused into ``awq::int4_mm_silu_mul``.
* :data:`TP_COLUMN` / :data:`TP_ROW`: projections split by output rows / by K for tensor parallelism.
* :class:`Family`: per model type, what structure cannot tell: the per-expert checkpoint names of
  its sparse-MoE experts, checkpoint key renames transformers applies, AWQ activation scales.

Experts modules themselves are recognised by structure, whatever their class is called
(:func:`awq_inductor.experts_structure.silu_gated_experts`): a type without a row gets the
default per-expert names ``gate_proj`` / ``up_proj`` / ``down_proj`` (transformers' own
conversion mapping uses them for DeepSeek-V2/V3, Kimi-K2, GLM-4-MoE, OLMoE, Qwen2/3-MoE and most
others).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

#: (fused attribute, parts in output order)
FUSIONS = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
    # MLA (DeepSeek-V2/V3, Kimi-K2): both low-rank projections of the attention input (7168 -> 1536 and
    # 7168 -> 576 in V3: one call 0.80x the time of two at M = 1, benchmarks/bench_mla_fusion.py)
    ("q_kv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa")),
)

#: Forward bodies recognised as a SiLU-gated MLP: (kind, activation attribute, body), ``x`` the
#: forward's input. "separate": gate_proj and up_proj AWQLinear (Llama, Qwen2, Mistral, ...);
#: "prefused": one gate_up_proj AWQLinear with rows [gate ; up] split by ``chunk(2, dim=-1)`` (Phi-3).
GATED_MLP_BODIES = (
    ("separate", "act_fn", "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n"
                           "return down_proj"),
    ("separate", "act_fn", "return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"),
    ("separate", "act_fn", "down_proj = self.down_proj(self.up_proj(x) * self.act_fn(self.gate_proj(x)))\n"
                           "return down_proj"),
    ("separate", "act_fn", "return self.down_proj(self.up_proj(x) * self.act_fn(self.gate_proj(x)))"),
    ("prefused", "activation_fn", "up_states = self.gate_up_proj(x)\n"
                                  "gate, up_states = up_states.chunk(2, dim=-1)\n"
                                  "up_states = up_states * self.activation_fn(gate)\n"
                                  "return self.down_proj(up_states)"),
)

#: Tensor parallelism: output rows split (column-parallel) / input columns split (row-parallel, all_reduce after).
TP_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
TP_ROW = ("o_proj", "down_proj")

#: Module names of the fused 3-D experts layout (transformers 5's own parameter names, every architecture).
FUSED_EXPERT_NAMES = ("gate_up_proj", "down_proj")
DEFAULT_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")

#: config.json keys naming the number of routed experts (DeepSeek/GLM, Qwen-MoE/OLMoE, Mixtral).
NUM_EXPERTS_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")

#: Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): low-rank q / kv projections. Plain
#: nn.Linear (int4 like any other); tensor parallelism splits the per-head ones (q_b_proj,
#: kv_b_proj) and keeps the low-rank input projections whole (tp/sharding.py _plan_mla).
MLA_PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


@dataclasses.dataclass(frozen=True)
class Family:
    """What one architecture needs beyond the generic rules."""

    model_types: Tuple[str, ...]
    #: per-expert checkpoint names of the (gate, up, down) projections of its experts modules
    #: (transformers 5 fuses them into 3-D gate_up_proj [E, 2I, H] / down_proj [E, H, I])
    expert_names: Tuple[str, str, str] = DEFAULT_EXPERT_NAMES
    #: checkpoint module-name renames transformers applies when loading (old, new)
    key_renames: Tuple[Tuple[str, str], ...] = ()
    #: AWQ's scaled activation: (activation attribute, linear feeding it); the checkpoint stores
    #: ``<mlp>.<act>.scales``
    act_scales: Optional[Tuple[str, str]] = None


FAMILIES = (
    # the MoE block of Mixtral / MiniMax checkpoints is ``block_sparse_moe``, transformers' module ``mlp``
    # (transformers' conversion mapping: WeightRenaming + experts.*.w1/w3/w2 converters)
    Family(("mixtral", "minimax", "minimax_m2"), expert_names=("w1", "w3", "w2"),
           key_renames=((".block_sparse_moe.", ".mlp."),)),
    Family(("starcoder2",), act_scales=("act", "c_fc")),
    Family(("RefinedWebModel", "falcon"), act_scales=("act", "dense_h_to_4h")),
    Family(("mpt",), act_scales=("act", "up_proj")),
    Family(("gptj",), act_scales=("act", "fc_in")),
    Family(("gpt_neox",), act_scales=("act", "dense_h_to_4h")),
    Family(("gpt_bigcode",), act_scales=("act", "c_fc")),
    Family(("bloom",), act_scales=("gelu_impl", "dense_h_to_4h")),
)
_GENERIC = Family(())
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def _req(cfg: dict, *keys: str) -> List[int]:
    try:
        return [int(cfg[k]) for k in keys]
    except KeyError as e:
        raise ValueError(f"config.json: expected {', '.join(keys)}, missing {e}") from None


def _attention_gemms(cfg: dict) -> List[Tuple[str, int, int]]:
    """The attention's int4 GEMMs after the model pass's fusions (:data:`FUSIONS`)."""
    h, hq = _req(cfg, "hidden_size", "num_attention_heads")
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3, Kimi-K2): modeling_deepseek_v3's projections
        rope, nope, v, kv_lora = _req(cfg, "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank")
        q_out = hq * (nope + rope)
        q_lora = int(cfg.get("q_lora_rank") or 0)
        # q_a_proj [H -> q_lora] and kv_a_proj_with_mqa [H -> kv_lora + rope] fuse into q_kv_a_proj;
        # without a q LoRA, q_proj [H -> q_out] stays apart (FUSIONS needs q_a_proj)
        first = ([("linear", h, q_lora + kv_lora + rope), ("linear", q_lora, q_out)] if q_lora
                 else [("linear", h, q_out), ("linear", h, kv_lora + rope)])
        return first + [("linear", kv_lora, hq * (nope + v)), ("linear", hq * v, h)]
    hkv = int(cfg.get("num_key_value_heads") or hq)
    d = int(cfg.get("head_dim") or h // hq)
    return [("linear", h, (hq + 2 * hkv) * d), ("linear", hq * d, h)]


def _sparse_layers(cfg: dict, n_layers: Optional[int]) -> Tuple[bool, bool]:
    """(some layer has a dense MLP, some layer has sparse experts), by the rules of the modeling
    files: DeepSeek/GLM ``first_k_dense_replace`` (and DeepSeek-V2's ``moe_layer_freq``), Qwen-MoE
    ``mlp_only_layers`` / ``decoder_sparse_step``; Mixtral / OLMoE: every layer sparse. Without
    ``num_hidden_layers`` the model is taken as deep enough for every kind its rules allow."""
    if not any(cfg.get(k) for k in NUM_EXPERTS_KEYS + ("moe_intermediate_size",)):
        return True, False
    layers = range(n_layers) if n_layers is not None else None
    if "first_k_dense_replace" in cfg:
        k, freq = int(cfg["first_k_dense_replace"] or 0), int(cfg.get("moe_layer_freq") or 1)
        def sparse(i): return i >= k and i % freq == 0
        deep = k + freq
    elif "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:
        only, step = set(cfg.get("mlp_only_layers") or ()), int(cfg.get("decoder_sparse_step") or 1)
        def sparse(i): return i not in only and (i + 1) % step == 0
        deep = max(only | {0}) + 2 * step
    else:
        return False, True
    kinds = {sparse(i) for i in (layers if layers is not None else range(deep))}
    return False in kinds, True in kinds


def int4_gemms(cfg: dict) -> List[Tuple[str, int, int]]:
    """Every int4 GEMM a decoder described by ``config.json`` runs once loaded, as (kind, K, N):
    ``linear`` (K -> N) or ``mlp`` (K = hidden, N = intermediate: a SiLU-gated MLP, i.e. the fused
    gate|up + SiLU GEMM H -> I and the down GEMM I -> H; sparse experts run the same two shapes).
    Attention (Llama-style fused q|k|v or MLA), the dense MLP layers (``intermediate_size``), the
    routed experts (``moe_intermediate_size``, else ``intermediate_size``) and a shared expert
    (Qwen2-MoE's ``shared_expert_intermediate_size``, DeepSeek/GLM's ``n_shared_experts`` x
    ``moe_intermediate_size``); the routers stay float. Repeats are dropped, order kept."""
    (h,) = _req(cfg, "hidden_size")
    n_layers = int(cfg["num_hidden_layers"]) if cfg.get("num_hidden_layers") else None
    dense, sparse = _sparse_layers(cfg, n_layers)
    moe_inter = int(cfg.get("moe_intermediate_size") or 0)
    out = _attention_gemms(cfg)
    if dense or not moe_inter:  # the dense layers, or experts sized by intermediate_size
        out.append(("mlp", h, _req(cfg, "intermediate_size")[0]))
    if sparse and moe_inter:
        out.append(("mlp", h, moe_inter))
    if sparse:
        shared = int(cfg.get("shared_expert_intermediate_size") or 0) or \
            int(cfg.get("n_shared_experts") or 0) * moe_inter
        if shared:
            out.append(("mlp", h, shared))
    return list(dict.fromkeys(out))


def family(model_type: Optional[str]) -> Family:
    """The row of ``model_type`` (the generic rules for a type without one)."""
    return _BY_TYPE.get(model_type, _GENERIC)


def expert_names(model_type: Optional[str]) -> Tuple[str, str, str]:
    """Per-expert checkpoint names (gate, up, down) of ``model_type``'s experts modules."""
    return family(model_type).expert_names


def rename_key(key: str, model_type: Optional[str]) -> str:
    """A checkpoint key as transformers names the module after its renames."""
    for old, new in family(model_type).key_renames:
        key = key.replace(old, new)
    return key
