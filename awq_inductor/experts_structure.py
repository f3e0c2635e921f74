"""Which transformers experts modules :class:`~awq_inductor.nn.AWQMoEExperts` replaces, by structure.

A transformers 5 experts module is replaced when it computes exactly what ``awq::int4_moe`` does:
``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``,
``y = sum_k w_k * down_e(SiLU(gate_e x) * up_e x)``, with ``gate_up_proj`` [E, 2I, H] (rows
[gate ; up]) and ``down_proj`` [E, H, I], no biases, nothing else. Class names are never consulted
(transformers 5.24 has 53 such classes: DeepSeek-V2/V3 and Kimi-K2, GLM-4-MoE, OLMoE, Qwen2/3-MoE,
Mixtral, ...); routers, shared experts and correction biases are siblings of the experts module and
stay transformers' own code.

transformers' default experts implementation (``grouped_mm``) never runs the class's ``forward``: it
is driven by the ``@use_experts_implementation`` flags, ``_apply_gate`` and ``act_fn``. So all of
them are checked, and the original ``forward`` (behind the decorator) must be the SiLU-gated loop
every compatible class shares (:data:`CANONICAL_FORWARD`, compared on the AST).

    ok, why = silu_gated_experts(module)   # why: what differs ([] when ok)
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .families import FUSED_EXPERT_NAMES

FORWARD_ARGS = ("self", "hidden_states", "top_k_index", "top_k_weights")

#: The eager forward of the compatible experts classes of transformers 5.24 (shared byte for byte
#: after dropping annotations and the docstring, e.g. ``modeling_deepseek_v3.py``,
#: ``modeling_glm4_moe.py``, ``modeling_olmoe.py``), ``torch.nn.functional.`` spelled ``F.``.
CANONICAL_FORWARD = """
final_hidden_states = torch.zeros_like(hidden_states)
with torch.no_grad():
    expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1)
    expert_mask = expert_mask.permute(2, 1, 0)
    expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
for expert_idx in expert_hit:
    expert_idx = expert_idx[0]
    if expert_idx == self.num_experts:
        continue
    top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
    current_state = hidden_states[token_idx]
    gate, up = F.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
    current_hidden_states = self.act_fn(gate) * up
    current_hidden_states = F.linear(current_hidden_states, self.down_proj[expert_idx])
    current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
    final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
return final_hidden_states
"""

#: ``@use_experts_implementation`` flags (instance attributes) and the values our op computes
DECORATOR_FLAGS = (("has_gate", True, "no gate projection"), ("has_bias", False, "has biases"),
                   ("is_transposed", False, "transposed layout"), ("is_concatenated", True, "interleaved gate/up rows"),
                   ("has_post_expert_norm", False, "a norm after each expert"))


class _Normalise(ast.NodeTransformer):
    """``torch.nn.functional.X`` / ``nn.functional.X`` -> ``F.X``."""

    def visit_Attribute(self, node):
        self.generic_visit(node)
        chain, v = [], node.value
        while isinstance(v, ast.Attribute):
            chain.append(v.attr)
            v = v.value
        if isinstance(v, ast.Name) and ".".join([v.id] + chain[::-1]) in ("torch.nn.functional", "nn.functional"):
            return ast.copy_location(ast.Attribute(value=ast.Name(id="F", ctx=ast.Load()), attr=node.attr,
                                                   ctx=node.ctx), node)
        return node


def _dump(stmts) -> str:
    mod = _Normalise().visit(ast.Module(body=list(stmts), type_ignores=[]))
    return ast.dump(mod, annotate_fields=False, include_attributes=False)


_CANONICAL = _dump(ast.parse(CANONICAL_FORWARD).body)


@functools.lru_cache(maxsize=None)
def _forward_differs(fn) -> str:
    """'' when ``fn`` (the original forward behind transformers' decorator) is the canonical loop,
    else what differs."""
    try:
        f = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))).body[0]
    except (OSError, TypeError, SyntaxError) as e:
        return f"forward source unavailable ({e})"
    args = tuple(a.arg for a in f.args.args)
    if args != FORWARD_ARGS or f.args.vararg or f.args.kwarg or f.args.kwonlyargs:
        return f"forward signature ({', '.join(args)}), expected ({', '.join(FORWARD_ARGS)})"
    body = f.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # docstring
    if _dump(body) != _CANONICAL:
        return "forward body differs from the SiLU-gated experts loop (sum_k w * down(SiLU(gate) * up))"
    return ""


def _default_apply_gate():
    try:
        from transformers.integrations.moe import _default_apply_gate as f
    except ImportError:  # pragma: no cover - transformers < 5
        return None
    return f


def _is_silu(act) -> bool:
    if act is F.silu:
        return True
    try:
        from transformers.activations import SiLUActivation
    except ImportError:  # pragma: no cover
        SiLUActivation = nn.SiLU
    return type(act) in (SiLUActivation, nn.SiLU)  # exact type: a subclass may change forward


def _act_name(act) -> str:
    if act is None:
        return "none"
    return type(act).__name__ if isinstance(act, nn.Module) else getattr(act, "__name__", type(act).__name__)


def looks_like_experts(mod: nn.Module) -> bool:
    """A module holding 3-D ``gate_up_proj`` and ``down_proj`` tensors (a candidate experts module,
    accepted or not by :func:`silu_gated_experts`)."""
    t = [getattr(mod, n, None) for n in FUSED_EXPERT_NAMES]
    return all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in t)


def silu_gated_experts(mod: nn.Module) -> Tuple[bool, List[str]]:
    """(ok, what differs) for ``mod``: ok when ``AWQMoEExperts`` computes the same thing (see module doc)."""
    why: List[str] = []
    params = dict(mod.named_parameters(recurse=False))
    gu, dn = (params.get(n) for n in FUSED_EXPERT_NAMES)
    if not isinstance(gu, nn.Parameter) or not isinstance(dn, nn.Parameter):
        return False, ["no gate_up_proj / down_proj parameters"]
    extra = sorted(set(params) - set(FUSED_EXPERT_NAMES))
    if extra:
        why.append(f"has extra parameters {extra} (biases / norms)")
    bufs = [n for n, _ in mod.named_buffers(recurse=False)]
    if bufs:
        why.append(f"has buffers {bufs}")
    kids = sorted(set(n for n, _ in mod.named_children()) - {"act_fn"})
    if kids:
        why.append(f"has submodules {kids}")
    if sum(1 for _ in mod.parameters()) != len(params):
        why.append("has parameters inside submodules")
    if gu.dim() != 3 or dn.dim() != 3:
        why.append(f"not 3-D: gate_up_proj {list(gu.shape)}, down_proj {list(dn.shape)}")
    else:
        E, two_i, H = gu.shape
        if two_i % 2 or tuple(dn.shape) != (E, H, two_i // 2):
            t = (" (transposed layout [E, H, 2I] / [E, I, H])"
                 if gu.shape[2] == 2 * dn.shape[1] and gu.shape[1] == dn.shape[2] else "")
            why.append(f"layout gate_up_proj {list(gu.shape)}, down_proj {list(dn.shape)}, expected "
                       f"[E, 2I, H] / [E, H, I]{t}")
        elif getattr(mod, "num_experts", E) != E:
            why.append(f"num_experts {mod.num_experts} differs from gate_up_proj.shape[0] {E}")
    if not (gu.is_floating_point() and dn.is_floating_point()):
        why.append("expert weights are not floating point")
    for flag, want, what in DECORATOR_FLAGS:
        if hasattr(mod, flag) and getattr(mod, flag) != want:
            why.append(f"{what} ({flag}={getattr(mod, flag)})")
    ag = getattr(type(mod), "_apply_gate", None)
    if ag is not None and ag is not _default_apply_gate():
        why.append("custom _apply_gate (clamped / interleaved / softcapped gating)")
    act = getattr(mod, "act_fn", None)
    if not _is_silu(act):
        why.append(f"act_fn {_act_name(act)}, expected SiLU")
    fwd = _forward_differs(type(mod).forward)
    if fwd:
        why.append(fwd)
    return not why, why
