"""Tensor parallelism over ``torch.distributed``: one process per socket / NUMA node.

    torchrun --nproc-per-node 2 -m awq_inductor --tp 2            # the demo, sharded

    import torch.distributed as dist, awq_inductor
    from awq_inductor import tp
    dist.init_process_group("gloo")
    model = AutoModelForCausalLM.from_pretrained(awq_dir)            # patch_transformers() + convert
    tp.shard(model)                                                   # group=None: the WORLD group
    model.forward = torch.compile(model.forward, backend="awq_inductor")

:func:`shard` rewrites a *converted* model (:func:`awq_inductor.convert`) in place, Megatron /
gpt-fast style, on every rank of ``group`` (all ranks must hold the same full model):

- **attention**: the fused ``qkv_proj`` (or separate q/k/v) is column-parallel by heads: rank r
  keeps query heads ``[r*Hq/W, (r+1)*Hq/W)`` and whole KV heads ``[r*Hkv/W, (r+1)*Hkv/W)`` (GQA
  groups stay on one rank, so ``num_key_value_groups`` is unchanged); the ``OutputSlice`` bounds
  are rewritten for the local widths. ``o_proj`` is row-parallel: its K (= Hq*d) is split on the
  same head boundaries, which must fall on group boundaries (``(Hq/W)*d % G == 0``).
  ``model.config.num_attention_heads`` / ``num_key_value_heads`` become the per-rank counts
  (``head_dim`` is written explicitly first), so caches built from the config are per rank; the
  attention forward itself views with ``-1`` heads. q/k norms over the whole projection (OLMoE's
  one RMSNorm over all heads) become :class:`ParallelRMSNorm` on the rank's heads: the mean of
  squares from a small all-reduce ([tokens, 1]) of the ranks' sums; per-head norms stay whole.
- **multi-head latent attention** (DeepSeek-V2/V3, Kimi-K2): ``q_b_proj`` (or ``q_proj``) and
  ``kv_b_proj`` are column-parallel by heads, ``o_proj`` row-parallel; the low-rank input
  projections (the fused ``q_kv_a_proj``), their norms and the compressed latent cache (one head,
  expanded through ``kv_b_proj`` per call) stay whole on every rank.
- **gated MLP**: gate|up is column-parallel, both halves split alike (rank r keeps gate and up rows
  ``[r*I/W, (r+1)*I/W)``, split in the canonical [gate ; up] order and interleaved per rank for
  :class:`~awq_inductor.nn.AWQGateUpSiluMul`); ``down_proj`` is row-parallel over K = I.
- **row-parallel layers** become :class:`RowParallelLinear`: the local int4 GEMM (no bias), then
  ``torch.distributed._functional_collectives.all_reduce(y, "sum", group)`` (a graph op, so
  ``torch.compile`` keeps it in the graph, no graph break), then the bias, added once.
- **MoE experts** (:class:`~awq_inductor.nn.AWQMoEExperts`) are split like a gated MLP inside
  every expert: rank r keeps gate and up rows and down columns ``[r*I/W, (r+1)*I/W)`` of each
  expert (:class:`ParallelMoEExperts`: the experts op on the local slices, then one all-reduce).
  The router (and Qwen2-MoE's shared-expert gate) is replicated, so every rank routes alike and
  reads 1/W of each selected expert; a shared expert is a gated MLP, split as above.
- a dense ``lm_head`` is split over the vocabulary (:class:`VocabParallelLMHead`: local rows, then
  ``all_gather_single`` of the logits along the last dim), so each rank reads 1/W of it per token
  (``vocab_parallel=False`` replicates it); embedding and norms are replicated.

Weights are split in the canonical form (q uint8 [N, K], zeros / scales [N, K/G]) and packed again
per rank, so every checkpoint format and both schemes (W4A16, W4A8 ``act_quant="int8"``) shard
alike. Everything is checked before the model is modified: a layout that cannot be split raises
:class:`TPError` naming the layer, the expected and the actual value.

Loading: :func:`load` builds this rank's shard straight from the safetensors files (the same model
as ``shard(from_pretrained(...))``), reading only the slices of the int4 tensors the rank keeps
(``safe_open(...).get_slice``); layouts without a clean slice are read whole and sliced in canonical
form (see :func:`_read_int4`). ``shard`` remains for a model that is already loaded.

:func:`rank_cores` / :func:`pin_rank` give each local rank its own cores (from the NUMA layout in
``/sys/devices/system/node`` when it splits evenly, else an even split of the affinity mask).
"""
from __future__ import annotations

from .launch import env_rank, exit_rank, init_from_env, numa_nodes, parse_cpulist, pin_rank, rank_cores, shutdown
from .layers import ParallelMoEExperts, ParallelRMSNorm, RowParallelLinear, TPError, VocabParallelLMHead
from .loading import is_moe, load
from .sharding import shard

__all__ = ["ParallelMoEExperts", "ParallelRMSNorm", "RowParallelLinear", "TPError", "VocabParallelLMHead", "env_rank", "exit_rank",
           "init_from_env", "shutdown", "is_moe", "load", "numa_nodes", "parse_cpulist", "pin_rank", "rank_cores", "shard"]
