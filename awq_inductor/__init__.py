"""awq-inductor: AWQ int4 language models on CPUs through torch.compile.

Public API (see README.md, "Public API" and "Where things live"):
    AWQLinear, AWQGateUpSiluMul   the int4 modules (awq_inductor.nn)
    convert(model)                the model pass (awq_inductor.transform)
    patch_transformers()          transformers 5.x loading (awq_inductor.integrations.transformers)
    compile_for_generate(model)   torch.compile of model.forward that stays compiled across generate calls
    wait_until_compiled()         wait until the compiled graphs' C++ is built (they run eager until then)
    awq_inductor_backend          torch.compile backend, also ``backend="awq_inductor"`` (awq_inductor.inductor)
    config                        package settings
    awq_inductor.tp               tensor parallelism over torch.distributed (tp.shard(model, group))
    torch.ops.awq.int4_mm*        the custom ops (awq_inductor.ops, from the table in awq_inductor.schemes)
"""
from __future__ import annotations

from . import config, inductor, ops  # noqa: F401  (ops: defines torch.ops.awq.*; inductor: the lowering, registered at first trace)
from ._version import __version__
from .nn import AWQGateUpSiluMul, AWQLinear


__all__ = ["AWQLinear", "AWQGateUpSiluMul", "convert", "patch_transformers", "compile_for_generate",
           "wait_until_compiled", "awq_inductor_backend", "config", "__version__"]


def __getattr__(name):
    # Lazy: the model pass and transformers hooks pull in transformers-facing code, the backend
    # pulls in torch._inductor; importing the package for AWQLinear alone stays cheap.
    if name == "convert":
        from .transform import convert
        return convert
    if name == "patch_transformers":
        from .integrations.transformers import patch_transformers
        return patch_transformers
    if name == "compile_for_generate":
        from .integrations.generation import compile_for_generate
        return compile_for_generate
    if name == "wait_until_compiled":
        from .integrations.generation import wait_until_compiled
        return wait_until_compiled
    if name == "awq_inductor_backend":
        from .inductor.backend import awq_inductor_backend
        return awq_inductor_backend
    raise AttributeError(f"module 'awq_inductor' has no attribute {name!r}")
