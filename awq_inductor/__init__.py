"""awq-inductor: AWQ int4 language models on CPUs through torch.compile.

Public API:
    AWQLinear                    int4 linear layer (from_awq, from_gptq, from_canonical; act_quant="int8")
    AWQGateUpSiluMul             fused gate|up int4 linear with SiLU(gate) * up in the kernel
    convert(model)               the model pass: AWQ linears -> AWQLinear, fused q/k/v and gate/up
    patch_transformers()         make transformers 5.x load AWQ/GPTQ checkpoints onto our op on CPU
    awq_inductor_backend         torch.compile backend (also ``backend="awq_inductor"``)
    config                       package settings (forced ISA, AMX threshold, threads)
    awq_inductor.tp              tensor parallelism over torch.distributed (tp.shard(model, group))
    torch.ops.awq.int4_mm        the custom ops: int4_mm, int4_mm_silu_mul, int4_mm_a8, int4_mm_a8_silu_mul
                                 (awq_inductor.ops)
"""
from __future__ import annotations

from . import config, ops  # noqa: F401  (ops defines torch.ops.awq.int4_mm)
from .modules import AWQGateUpSiluMul, AWQLinear

__version__ = "0.1.0"

__all__ = ["AWQLinear", "AWQGateUpSiluMul", "convert", "patch_transformers", "awq_inductor_backend", "config", "__version__"]


def __getattr__(name):
    # Lazy: the model pass and HF hooks pull in transformers-facing code, the backend pulls in
    # torch._inductor; importing the package for AWQLinear alone stays cheap.
    if name == "convert":
        from .model_pass import convert
        return convert
    if name == "patch_transformers":
        from .hf import patch_transformers
        return patch_transformers
    if name == "awq_inductor_backend":
        from .backend import awq_inductor_backend
        return awq_inductor_backend
    raise AttributeError(f"module 'awq_inductor' has no attribute {name!r}")
