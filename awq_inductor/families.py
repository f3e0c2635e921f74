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
from typing import Optional, Tuple

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

#: config.json keys naming the intermediate sizes of sparse-MoE experts and of a shared expert.
MOE_INTERMEDIATE_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")

#: Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): low-rank q / kv projections. Plain
#: nn.Linear (int4 like any other), but not split by tensor parallelism.
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
