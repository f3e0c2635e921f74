"""``torch.compile`` backend ``"awq_inductor"``: Inductor with our int4 lowering and cache pass.

    torch.compile(model, backend="awq_inductor")              # via the pyproject entry point
    torch.compile(model, backend=awq_inductor_backend)         # or the function itself
    torch.compile(model, backend="awq_inductor", options={...})  # extra Inductor config patches

It is ``compile_fx`` with config patches suited to CPU inference of pre-packed int4 weights:
the weights stay graph inputs (``freezing`` off: they are packed at load time, never baked as
compile-time constants, see design/inductor.md §3), ``cpp.threads`` is left to Inductor
(= ``torch.get_num_threads()``), one-row pointwise kernels stay serial (:data:`MIN_CHUNK_ELEMENTS`), and :func:`awq_inductor.inductor.lowering.cache_pass` is appended to
``post_grad_custom_post_pass`` so the FX graph cache key covers our templates and lowering.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..kernels import native
from . import lowering, register

BACKEND_NAME = "awq_inductor"

#: Inductor's ``cpp.min_chunk_size`` under our backend: a loop nest gets an OpenMP region only with
#: at least this many elements per thread, aten's ``GRAIN_SIZE`` (the rule eager pointwise ops
#: follow) instead of Inductor's 512. Why: at decode every norm / rope / residual kernel works on
#: one row (7168 elements in DeepSeek-V3), which 512 split over 2 threads; on a shared machine
#: each such region waits at its barrier for a thread that another process holds. Measured (2
#: threads, load 5.2, 4000 interleaved calls of a compiled 1 x 7168 RMSNorm + residual): mean
#: 2352 us, p99 35.8 ms with 512 vs 82 us, p99 0.36 ms with 32768 (medians 22.5 / 21.3 us), and
#: a DeepSeek-V3 decode graph (H=7168) had 6 such regions per layer, 1 with 32768 (the attention
#: over 128 heads), besides our 7 kernels. Prefill rows (>= 64 K elements) stay parallel.
MIN_CHUNK_ELEMENTS = 32768


def backend_config_patches(extra: Optional[dict] = None) -> dict:
    """The Inductor config patches the backend applies (``extra`` wins, pass lists are merged)."""
    extra = dict(extra or {})
    ours = lowering.cache_pass()
    user_pass = extra.pop("post_grad_custom_post_pass", lowering.inductor_post_grad_custom_post_pass())
    if user_pass is None:
        post = ours
    else:
        post = [*(user_pass if isinstance(user_pass, (list, tuple)) else [user_pass])]
        if not any(type(p) is type(ours) for p in post):
            post.append(ours)
    patches: dict[str, Any] = {
        "freezing": False,
        "post_grad_custom_post_pass": post,
        "cpp.min_chunk_size": MIN_CHUNK_ELEMENTS,
    }
    patches.update(extra)
    return patches


def awq_inductor_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """Dynamo backend: register the lowering, then ``compile_fx`` with :func:`backend_config_patches`.

    ``options=`` / ``config_patches=`` (a dict of Inductor config) is merged into the patches.
    """
    return _compile(gm, example_inputs, False, kwargs)


def awq_inductor_backend_behind(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """:func:`awq_inductor_backend` whose graphs run eager until their C++ library, built in a
    background thread, is there (``compile_for_generate``; ``graph_library.libraries_behind``)."""
    return _compile(gm, example_inputs, True, kwargs)


def _compile(gm: torch.fx.GraphModule, example_inputs, behind: bool, kwargs: dict):
    extra = {}
    mode = kwargs.pop("mode", None)
    if mode and mode != "default":
        extra.update(lowering.inductor_mode_options(mode))
    for key in ("options", "config_patches"):
        if kwargs.get(key):
            extra.update(kwargs.pop(key))
        else:
            kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"awq_inductor_backend: unexpected arguments {sorted(kwargs)}")
    route_bf16_linears(gm)
    tune_graph(gm)
    build_libraries(gm)
    register()
    return lowering.compile_with_inductor(gm, example_inputs, backend_config_patches(extra), behind)


def route_bf16_linears(gm: torch.fx.GraphModule) -> int:
    """Point the graph's 2-D bf16 ``F.linear`` calls (a MoE router, Qwen2-MoE's shared-expert gate)
    at ``awq::bf16_linear``: our GEMV at one row (decode), ``F.linear`` for more rows, so prefill
    is unchanged. Why: ``aten::mm`` spent 0.176 ms per call on the 128 x 2048 Qwen3-MoE router at
    M=1 (torch.profiler, 4-layer slice; 0.7 ms of a 15 ms decode step), reading 512 KB.
    Only where the GEMV exists (AVX512-BF16), with grad mode off while the graph is compiled
    (the op has no autograd formula; Dynamo guards on grad mode, so a graph traced with grad
    enabled is compiled apart), a contiguous weight (the op would copy it otherwise) and no
    bias or a bf16 one (F.linear rejects any other, and so must the graph). Returns the number
    of calls rerouted."""
    from ..ops import head_bf16 as bf16_head

    if torch.is_grad_enabled() or not bf16_head.gemv_available():
        return 0
    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (torch._C._nn.linear, torch.nn.functional.linear):
            continue
        args = list(node.args) + [node.kwargs.get("bias")] * (3 - len(node.args))
        if len(args) != 3 or set(node.kwargs) - {"bias"}:
            continue
        x, w, b = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a for a in args)
        if not all(isinstance(t, torch.Tensor) for t in (x, w) + (() if b is None else (b,))):
            continue
        if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or x.dim() != 2 or w.dim() != 2:
            continue
        if not w.is_contiguous() or (b is not None and (b.dim() != 1 or b.dtype != torch.bfloat16)):
            continue
        node.target, node.args, node.kwargs = torch.ops.awq.bf16_linear.default, tuple(args), {}
        n += 1
    if n:
        gm.recompile()
    return n


def tune_graph(gm: torch.fx.GraphModule) -> int:
    """Look up (or measure, ``config.tune == "auto"``) the kernel plan of every awq op shape in
    ``gm`` *before* Inductor computes its FX cache key, which covers the tuning cache's content:
    measured here, the first compile is keyed like every later one (measured during lowering,
    the next process would miss the cache once). Returns the number of awq op calls seen."""
    from ..kernels import tuning_cache
    from ..schemes import OPS

    by_target = _by_target(OPS.values())
    seen = 0
    isa = None
    for node in gm.graph.nodes:
        op = by_target.get(node.target) if node.op == "call_function" else None
        # positional (x, *weights, bias, group_size, out_features), as the modules call the ops;
        # another call form is looked up when it is lowered instead
        if op is None or len(node.args) != len(op.scheme.weights) + 4 or node.kwargs:
            continue
        x = _first_arg_value(node)
        if x is None or x.dim() != 2 or not isinstance(x.shape[1], int):
            continue
        isa = isa or lowering.choose_isa()
        tuning_cache.plan_for(op, isa, x.dtype, int(x.shape[1]), int(node.args[-1]), int(node.args[-2]))
        seen += 1
    return seen


def _by_target(ops) -> dict:
    """Each op (``Op`` or ``MoeOp``) under both targets a graph may call it by."""
    return {t: op for op in ops for t in (op.torch_op, op.torch_op.default)}


def _first_arg_value(node: torch.fx.Node):
    """The example value Dynamo (``example_value``) or a traced graph (``val``) recorded for the
    node's first argument (x), or None."""
    meta = getattr(node.args[0], "meta", {})
    return meta.get("example_value", meta.get("val"))


def build_libraries(gm: torch.fx.GraphModule) -> None:
    """Build, where missing, the libraries whose entries the kernels generated from our templates
    call (``native.driver_library``, ``ops.moe.entry_library``). Why here: a graph found in
    Inductor's cache is not lowered again, and its kernels look their library up on their first
    call (a cleared ``~/.cache/awq_inductor`` beside a kept Inductor cache)."""
    from ..ops import moe as moe_kernels
    from ..schemes import MOE_OPS, OPS

    dense, moe = _by_target(OPS.values()), _by_target(MOE_OPS.values())
    for node in gm.graph.nodes:
        target = node.target if node.op == "call_function" else None
        if (target not in dense and target not in moe) or not node.args:
            continue
        x = _first_arg_value(node)
        if x is None or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            continue
        if target in moe:
            moe_kernels.entry_library(moe[target], lowering.choose_isa(), x.dtype)
        else:
            native.driver_library(dense[target].scheme, lowering.choose_isa(), x.dtype)


def _entry_point_installed() -> bool:
    try:
        from importlib.metadata import entry_points

        return BACKEND_NAME in entry_points(group="torch_dynamo_backends").names
    except Exception:  # noqa: BLE001
        return False


def _register_backend_name() -> None:
    # With the package installed, dynamo finds us through the entry point and registers the
    # function itself when it loads it (registering here too would make that a duplicate).
    if _entry_point_installed():
        return
    try:
        torch._dynamo.register_backend(awq_inductor_backend, name=BACKEND_NAME)
    except AssertionError:  # already registered (module re-imported)
        pass


_register_backend_name()
