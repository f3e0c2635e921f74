"""The model pass: int4 linears -> :class:`AWQLinear`, then q/k/v and gate/up fusion.

:func:`convert` (idempotent, returns the model):

1. **Replacement.** Every int4 linear becomes an :class:`AWQLinear`: the loading placeholders of
   transformers integration (:class:`~awq_inductor.nn.CheckpointInt4Linear`) and foreign modules built
   by gptqmodel / AutoAWQ / llm-awq, recognised by duck typing (``qweight``, ``qzeros``, ``scales``
   tensors plus ``w_bit`` or ``bits`` and ``group_size``) without importing those packages. Each
   new module records where it came from in ``awq_source`` (format, scales/bias dtypes, parts) so
   that :func:`checkpoint_state_dict` can write the original checkpoint format back.

2. **Fusion.** A module whose ``q_proj``/``k_proj``/``v_proj`` (or ``gate_proj``/``up_proj``)
   are all AWQLinear with the same in_features, group size, checkpoint format and scales dtype gets
   one fused AWQLinear (``qkv_proj`` / ``gate_up_proj``) built in canonical form: q, zeros and
   scales concatenated along N, biases concatenated with zeros for the ones that have none. The
   old attributes become :class:`OutputSlice` views (``y[..., a:b]``) of the fused output, with
   explicit GQA bounds [0, Hq*d), [Hq*d, Hq*d + Hkv*d), ... taken from each part's out_features.
   The module's class is swapped for a cached subclass whose ``forward`` runs the fused linear
   once on the input and hands its output to the architecture's own ``forward`` in place of the
   hidden states: the original body then "projects" by slicing. This keeps every detail of the
   architecture's forward (rotary, cache, sliding window, q/k norms, attention interface) and is
   plain tensor code, so it traces under torch.compile without graph breaks and gives the same
   numbers as the unfused model.

   That substitution is only valid when the forward uses its input solely as the argument of
   those projections and for ``.shape``; :func:`_fusable_forward` checks this on the forward's
   AST (Llama, Qwen2, Qwen3, Mistral, Gemma... attention and gated MLPs pass; anything else, e.g.
   a forward that also feeds the input to a residual or a gate, is left unfused: correct, just
   one more int4_mm per projection). Pre-fused checkpoints (Phi-3 ``qkv_proj``, ``gate_up_proj``)
   are single int4 linears already and stay as they are.

3. **Gated MLP epilogue.** Before the fusions above, a module whose forward is exactly a SiLU-gated
   MLP, ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`` (Llama, Qwen2,
   Mistral; checked on the AST by :func:`_gated_mlp_forward`, up to local names) or Phi-3's
   ``gate_up_proj`` + ``chunk(2)`` + ``up * activation_fn(gate)``, with an ``nn.SiLU`` /
   transformers ``SiLUActivation``, AWQLinear projections and I % 32 == 0, gets ``gate_up_proj`` =
   :class:`~awq_inductor.nn.AWQGateUpSiluMul` (``awq::int4_mm_silu_mul``, or with
   act_quant="int8" its W4A8 twin ``awq::int4_mm_a8_silu_mul``: gate and up
   32-column panels interleaved, SiLU(gate) * up computed on the GEMM's fp32 tiles, further
   pointwise epilogues still fuse under Inductor) and a class swap to ``down_proj(gate_up_proj(x))``.
   ``gate_proj`` / ``up_proj`` are removed; ``awq_source.parts`` lets
   :func:`checkpoint_state_dict` write them (or Phi-3's ``gate_up_proj``) back. Other MLPs (other
   activations, I % 32 != 0) keep the plain gate|up fusion, whose SiLU * mul runs as a separate
   Inductor kernel. A later ``convert(model, act_quant=...)`` repacks these modules like every
   AWQLinear (W4A16 <-> W4A8).

With fusion a Llama / Qwen2 / Mistral / Phi-3 decoder layer runs 4 int4 GEMM calls: qkv, o,
gate|up (+ SiLU * mul), down.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import List, Optional, Tuple

import torch
from torch import nn

from .. import formats, packing
from ..families import FUSIONS, GATED_MLP_BODIES
from ..formats import CheckpointSource, source_of
from ..kernels import hugepages, tuning_cache
from ..nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts, CheckpointInt4Linear
from ..nn.checkpoint import to_awq_linear
from ..nn.linear import same_perm
from ..nn.head import LM_HEAD_CHOICES, quantize_lm_head
from ..progress import track
from ..schemes import scheme_for
from . import load_memory, moe as moe_pass


class OutputSlice(nn.Module):
    """Stands in for a projection that was fused: returns ``y[..., start:stop]`` of the fused output."""

    def __init__(self, start: int, stop: int, fused: str):
        super().__init__()
        self.start = start
        self.stop = stop
        self.fused = fused

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y[..., self.start:self.stop]

    def extra_repr(self) -> str:
        return f"{self.fused}[..., {self.start}:{self.stop}]"


def is_foreign_int4_linear(mod: nn.Module) -> bool:
    """gptqmodel / AutoAWQ / llm-awq style int4 linear (duck typed, :mod:`awq_inductor.formats`)."""
    if isinstance(mod, (AWQLinear, CheckpointInt4Linear)):
        return False
    return formats.is_foreign_int4_linear(mod)


# ---------------------------------------------------------------------------------------------
# Fusion
# ---------------------------------------------------------------------------------------------
def _forward_input_name(fn) -> Optional[str]:
    try:
        params = list(inspect.signature(inspect.unwrap(fn)).parameters.values())
    except (TypeError, ValueError):
        return None
    if len(params) < 2 or params[1].kind not in (params[1].POSITIONAL_ONLY, params[1].POSITIONAL_OR_KEYWORD):
        return None
    return params[1].name


@functools.lru_cache(maxsize=None)
def _fusable_forward(cls: type, parts: Tuple[str, ...], absent: Tuple[str, ...] = ()) -> Optional[str]:
    """Name of the forward's input if it is used only as ``self.<part>(x)`` (once per part) and
    ``x.shape``; else None (do not fuse). ``absent``: attributes the module lacks or holds as None: a
    call ``self.<absent>(x)`` sits in a branch this instance never takes (DeepSeek-V3's ``q_proj = None``
    when ``q_lora_rank`` is set; taken, it would raise, never compute on the fused output)."""
    result = None
    try:
        fn = inspect.unwrap(cls.forward)
        arg = _forward_input_name(fn)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        fdef = tree.body[0]
        if arg is not None and isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = {p: 0 for p in parts}
            ok_names = set()
            bad = False
            for node in ast.walk(fdef):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                        and node.func.attr in parts:
                    if len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Name) \
                            and node.args[0].id == arg:
                        calls[node.func.attr] += 1
                        ok_names.add(id(node.args[0]))
                    else:
                        bad = True
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                        and node.func.attr in absent and len(node.args) == 1 and not node.keywords \
                        and isinstance(node.args[0], ast.Name) and node.args[0].id == arg:
                    ok_names.add(id(node.args[0]))
                if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name) \
                        and node.value.id == arg:
                    ok_names.add(id(node.value))
            # every self.<part> must be a call target; every use of the input must be whitelisted
            for node in ast.walk(fdef):
                if isinstance(node, ast.Name) and node.id == arg and id(node) not in ok_names:
                    bad = True
            attr_uses = sum(1 for node in ast.walk(fdef) if isinstance(node, ast.Attribute)
                            and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in parts)
            if not bad and all(c == 1 for c in calls.values()) and attr_uses == len(parts):
                result = arg
    except (OSError, TypeError, SyntaxError, IndexError):
        result = None
    return result


@functools.lru_cache(maxsize=None)
def _fused_class(cls: type, fused_attr: str, arg: str) -> type:
    orig_forward = cls.forward

    def forward(self, *args, **kwargs):
        fused = getattr(self, fused_attr)
        if args:
            args = (fused(args[0]),) + tuple(args[1:])
        else:
            kwargs[arg] = fused(kwargs[arg])
        return orig_forward(self, *args, **kwargs)

    forward.__doc__ = (f"{cls.__name__}.forward with one fused int4 linear ({fused_attr}) whose output "
                       f"slices stand in for the separate projections.")
    new_cls = type(f"AWQFused{cls.__name__}", (cls,), {"forward": forward, "_awq_fused_attr": fused_attr,
                                                        "_awq_base_class": cls})
    new_cls.__module__ = cls.__module__
    return new_cls


def fusion_blocker(mods: List[AWQLinear]) -> Optional[str]:
    """Why these AWQLinear cannot be fused (None if they can)."""
    first = mods[0]
    for m in mods[1:]:
        if m.in_features != first.in_features:
            return "different in_features"
        if m.group_size != first.group_size:
            return "different group sizes"
        sa, sb = source_of(first), source_of(m)
        if sa.format != sb.format:
            return "different checkpoint formats"
        if sa.scales_dtype != sb.scales_dtype:
            return "different scales dtypes"
        if not same_perm(first.perm, m.perm):
            # one gather per distinct permutation: fusing would need a gather per part anyway
            return "different act-order input permutations"
    return None


def fuse_linears(mods: List[AWQLinear], names: List[str]) -> AWQLinear:
    """One AWQLinear computing ``cat([m(x) for m in mods], -1)``, built in canonical form."""
    qs, zs, ss, bs = [], [], [], []
    any_bias = any(m.bias is not None for m in mods)
    for m in mods:
        q, z, s = m.canonical()
        qs.append(q)
        zs.append(z)
        ss.append(s)
        if any_bias:
            bs.append(m.bias.detach() if m.bias is not None else torch.zeros(m.out_features, dtype=torch.float32))
    bias = torch.cat(bs) if any_bias else None
    fused = AWQLinear.from_canonical(torch.cat(qs), torch.cat(zs), torch.cat(ss), bias, group_size=mods[0].group_size,
                                   act_quant=mods[0].act_quant)
    fused.set_input_perm(mods[0].perm)  # fusion_blocker: every part has this one
    fused.awq_source = _fused_source(mods, names)
    return fused


def _fused_source(mods: List[nn.Module], names) -> CheckpointSource:
    """The parts' source as one fused module's: format and scales dtype of the first, the first
    bias dtype any part stored, the parts in output order."""
    bias_dtype = next((source_of(m).bias_dtype for m in mods if source_of(m).bias_dtype is not None), None)
    return source_of(mods[0]).replace(bias_dtype=bias_dtype, parts=tuple(
        (n, m.out_features, m.bias is not None) for n, m in zip(names, mods)))


class _SelfCalls(dict):
    """{class: names of every ``self.<name>(...)`` called in its forward} (computed once per class)."""

    def __missing__(self, cls):
        names = ()
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward))))
            names = tuple(sorted({n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call)
                                  and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                                  and n.func.value.id == "self"}))
        except (OSError, TypeError, SyntaxError):
            pass
        self[cls] = names
        return names


_SELF_CALLS = _SelfCalls()


def _fuse_module(module: nn.Module, fused_attr: str, parts: Tuple[str, ...]) -> bool:
    if hasattr(module, "_awq_fused_attr") or fused_attr in module._modules:
        return False
    mods = [module._modules.get(p) for p in parts]
    if not all(isinstance(m, AWQLinear) for m in mods):
        return False
    if fusion_blocker(mods) is not None:
        return False
    absent = tuple(a for a in _SELF_CALLS[type(module)] if getattr(module, a, None) is None)
    arg = _fusable_forward(type(module), parts, absent)
    if arg is None:
        return False
    fused = fuse_linears(mods, list(parts))
    module.add_module(fused_attr, fused)
    off = 0
    for p, m in zip(parts, mods):
        module._modules[p] = OutputSlice(off, off + m.out_features, fused_attr)
        off += m.out_features
    module.__class__ = _fused_class(type(module), fused_attr, arg)
    return True


# ---------------------------------------------------------------------------------------------
# Gated MLP: SiLU(gate) * up fused into the gate|up int4 GEMM (awq::int4_mm_silu_mul)
# ---------------------------------------------------------------------------------------------
class _Renamer(ast.NodeTransformer):
    """Local names -> ``_0``, ``_1``, ... by first occurrence; ``self`` and the input keep fixed names."""

    def __init__(self, arg: str):
        self.names = {"self": "self", arg: "x"}

    def visit_Name(self, node):
        node.id = self.names.setdefault(node.id, f"_{len(self.names)}")
        return node


def _normalized_body(body: List[ast.stmt], arg: str) -> str:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # docstring
    mod = _Renamer(arg).visit(ast.Module(body=list(body), type_ignores=[]))
    return ast.dump(mod)


@functools.lru_cache(maxsize=None)
def _gated_mlp_forward(cls: type) -> Optional[Tuple[str, str, str]]:
    """(kind, activation attribute, input name) if ``cls.forward(self, x)`` is exactly one of
    :data:`awq_inductor.families.GATED_MLP_BODIES` (up to local names and a docstring); else None."""
    result = None
    try:
        fn = inspect.unwrap(cls.forward)
        arg = _forward_input_name(fn)
        params = list(inspect.signature(fn).parameters.values())
        fdef = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        if arg is not None and len(params) == 2 and isinstance(fdef, ast.FunctionDef) and not fdef.decorator_list:
            got = _normalized_body(fdef.body, arg)
            for kind, act, src in GATED_MLP_BODIES:
                if got == _normalized_body(ast.parse(src).body, "x"):
                    result = (kind, act, arg)
                    break
    except (OSError, TypeError, SyntaxError, IndexError, ValueError):
        result = None
    return result


def _is_silu(mod) -> bool:
    """nn.SiLU or transformers' ACT2FN["silu"] (``transformers.activations.SiLUActivation``)."""
    t = type(mod)
    if t is nn.SiLU:
        return True
    return t.__name__ == "SiLUActivation" and t.__module__.startswith("transformers.")


@functools.lru_cache(maxsize=None)
def _silu_mul_class(cls: type, arg: str) -> type:
    def forward(self, *args, **kwargs):
        x = args[0] if args else kwargs[arg]
        return self.down_proj(self.gate_up_proj(x))

    forward.__doc__ = (f"{cls.__name__}.forward as down_proj(gate_up_proj(x)): gate_up_proj is an "
                       f"AWQGateUpSiluMul computing act(gate) * up inside the int4 GEMM.")
    new_cls = type(f"AWQSiluMul{cls.__name__}", (cls,), {"forward": forward, "_awq_fused_attr": "gate_up_proj",
                                                          "_awq_base_class": cls, "_awq_silu_mul": True})
    new_cls.__module__ = cls.__module__
    return new_cls


def _fuse_gated_mlp(module: nn.Module, act_quant: Optional[str] = None) -> bool:
    """Swap a SiLU-gated MLP (see :data:`awq_inductor.families.GATED_MLP_BODIES`) for ``down_proj(gate_up_proj(x))`` with
    ``gate_up_proj`` an :class:`AWQGateUpSiluMul` packed for ``act_quant``. Needs AWQLinear
    projections, I % 32 == 0 and a SiLU activation; anything else is left to the plain gate|up fusion."""
    if hasattr(module, "_awq_fused_attr"):
        return False
    spec = _gated_mlp_forward(type(module))
    if spec is None:
        return False
    kind, act_attr, arg = spec
    if not _is_silu(module._modules.get(act_attr)) or not isinstance(module._modules.get("down_proj"), nn.Module):
        return False
    if kind == "separate":
        if "gate_up_proj" in module._modules:
            return False
        gate, up = module._modules.get("gate_proj"), module._modules.get("up_proj")
        mods = [gate, up]
        if not all(isinstance(m, AWQLinear) for m in mods):
            return False
        I = gate.out_features
        if fusion_blocker(mods) is not None or up.out_features != I or I % packing.BLOCK_N:
            return False
        fused = AWQGateUpSiluMul.from_gate_up(gate, up, act_quant=act_quant)
        fused.awq_source = _fused_source(mods, ("gate_proj", "up_proj"))
        del module._modules["gate_proj"], module._modules["up_proj"]
        module.add_module("gate_up_proj", fused)
    else:
        gu = module._modules.get("gate_up_proj")
        if not isinstance(gu, AWQLinear) or gu.out_features % 2:
            return False
        I = gu.out_features // 2
        if I % packing.BLOCK_N:
            return False
        q, z, s = gu.canonical()
        fused = AWQGateUpSiluMul.from_canonical(q, z, s, gu.bias, group_size=gu.group_size, intermediate_size=I,
                                                act_quant=act_quant).set_input_perm(gu.perm)
        src = source_of(gu)
        fused.awq_source = src.replace(parts=src.parts or (("gate_up_proj", 2 * I, gu.bias is not None),))
        module._modules["gate_up_proj"] = fused
    module.__class__ = _silu_mul_class(type(module), arg)
    return True


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------
def convert(model: nn.Module, act_quant: Optional[str] = None, *, fuse: bool = True,
            progress: Optional[bool] = None, lm_head: Optional[str] = "bf16",
            fp32_decode_attention: bool = True) -> nn.Module:
    """Replace every int4 linear of ``model`` with :class:`AWQLinear` and fuse q/k/v and gate/up.

    Idempotent; returns ``model``. ``act_quant``: None (W4A16), or "int8" (W4A8: every AWQLinear and
    AWQGateUpSiluMul, including ones converted before, is packed for ``awq::int4_mm_a8`` /
    ``awq::int4_mm_a8_silu_mul``, dynamic per-token int8 activations; a later ``convert(model)``
    packs them back to W4A16).
    ``progress``: a tqdm bar over the replaced modules (None: on a terminal only).
    ``lm_head``: "bf16" (default: a bf16 ``nn.Linear`` head runs our AVX512-BF16 GEMV at one row,
    :class:`~awq_inductor.nn.head.Bf16HeadLinear`, same parameters), None (the head stays as loaded)
    or "int8" (opt-in: the output projection becomes
    an :class:`~awq_inductor.nn.head.Int8HeadLinear`, per-channel symmetric int8 with fp32 scales,
    half the bytes per decoded token; a tied input embedding keeps its own float table) or "int4"
    (opt-in: an :class:`~awq_inductor.nn.head.Int4HeadLinear`, grouped int4 on our W4A16 op).
    ``fp32_decode_attention``: a transformers model on ``sdpa`` attention runs one-row (decode)
    bf16/fp16 attention in fp32 (``integrations.attention``: PyTorch's bf16 CPU flash kernel took
    2.0-2.5 ms per decode call where fp32 takes 0.3).
    """
    scheme_for(act_quant)  # validates the choice
    if lm_head not in LM_HEAD_CHOICES:
        raise ValueError(f"lm_head: expected one of {LM_HEAD_CHOICES}, got {lm_head!r}")
    # Names only: each checkpoint module is dropped as soon as it is replaced, so loading never
    # holds the whole checkpoint and the whole packed model at once (peak load memory).
    # The checkpoint pages a converted module was read from are released (load_memory).
    # per-expert placeholders (CheckpointMoEExperts) -> one AWQMoEExperts per layer, first: their
    # checkpoint tensors go straight to the experts layout, not through one AWQLinear each
    moe_pass.convert_experts(model, act_quant)
    todo = [n for n, m in model.named_modules() if isinstance(m, CheckpointInt4Linear) or is_foreign_int4_linear(m)]
    maps = load_memory.file_mappings() if todo else []
    for name in track(todo, "awq_inductor: converting", progress):
        old = model.get_submodule(name)
        try:
            new = to_awq_linear(old, act_quant)
        except (ValueError, NotImplementedError) as e:
            raise type(e)(f"{name}: {e}") from e
        load_memory.drop_file_pages(list(old.buffers()) + list(old.parameters()), maps)
        model.set_submodule(name, new)
        del new, old
        load_memory.trim_heap()
    if fuse:
        for name, module in list(model.named_modules()):
            if _fuse_gated_mlp(module, act_quant):
                load_memory.trim_heap()
                continue
            for fused_attr, parts in FUSIONS:
                if _fuse_module(module, fused_attr, parts):
                    load_memory.trim_heap()
    for name, mod in list(model.named_modules()):
        if isinstance(mod, (AWQLinear, AWQGateUpSiluMul)) and mod.act_quant != act_quant:
            model.set_submodule(name, mod.with_act_quant(act_quant))
    quantize_lm_head(model, lm_head)
    if fp32_decode_attention:
        from ..integrations.attention import use_fp32_decode_attention

        use_fp32_decode_attention(model)
    model._awq_inductor_converted = True
    hugepages.place_streamed_weights(model)  # before tuning: the kernels are timed as they will run
    tune_model(model, progress=progress)
    return model


def activation_dtype(model: nn.Module) -> Optional[torch.dtype]:
    """The dtype activations will have: the input embedding's (else the first floating parameter
    outside our int4 modules, whose fp32 scales say nothing about x); None if there is none."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if isinstance(getattr(emb, "weight", None), torch.Tensor) and emb.weight.is_floating_point():
        return emb.weight.dtype
    int4 = {id(t) for m in model.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul, AWQMoEExperts))
            for t in m.buffers()}
    return next((p.dtype for p in model.parameters() if p.is_floating_point() and id(p) not in int4), None)


def op_shapes(model: nn.Module) -> List[tuning_cache.Shape]:
    """Every distinct int4 GEMM shape the model's ops run (the experts op runs two: gate|up, down)."""
    shapes = []
    for m in model.modules():
        if isinstance(m, (AWQLinear, AWQGateUpSiluMul)):
            shapes.append(tuning_cache.Shape(m.op, m.in_features, m.out_features, m.group_size))
        elif isinstance(m, AWQMoEExperts):
            H, I, G = m.hidden_size, m.intermediate_size, m.group_size
            shapes += [tuning_cache.Shape(m.op.w13, H, I, G), tuning_cache.Shape(m.op.w2, I, H, G)]
    return list(dict.fromkeys(shapes))


def tune_model(model: nn.Module, x_dtype: Optional[torch.dtype] = None, progress: Optional[bool] = None) -> int:
    """Measure the kernel plans of the model's op shapes now, at load (``config.tune == "auto"``,
    shapes without a cached plan only; one progress bar), so the first compiled call neither tunes
    nor logs inside streamed text. ``convert`` and ``tp.shard`` call it. Returns the shapes measured."""
    x_dtype = x_dtype or activation_dtype(model)
    if x_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return 0
    return tuning_cache.tune_missing(op_shapes(model), x_dtype, show=progress, weight_bytes=int4_weight_bytes(model))


def int4_weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's packed int4 weights, every layer and expert (a decode step reads them all,
    or the routed experts' share: the tuner asks whether they stay in cache)."""
    return sum(getattr(m, name).nbytes for m in model.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul, AWQMoEExperts))
               for name in m.STREAMED_TENSORS)


def count_int4_linears(module: nn.Module) -> int:
    return sum(1 for m in module.modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul)))
