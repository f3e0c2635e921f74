"""Reference paths we compare against (benchmarks and the ``python -m awq_inductor`` report).

``Int4PackLinear`` is what transformers 5 + gptqmodel run for AWQ on CPU
(``TorchAtenAwqLinear``): ``aten._weight_int4pack_mm_for_cpu`` with the float zero
``(8 - z) * s``, since aten computes ``(q - 8) * s + zero``. It needs N % 16 == 0 and
G in {32, 64, 128, 256}.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from .nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts
from .nn.head import Bf16HeadLinear

ATEN_GROUP_SIZES = (32, 64, 128, 256)
log = logging.getLogger(__name__)


class Int4PackLinear(nn.Module):
    """The gptqmodel-style CPU path for one int4 linear layer (a baseline, not our kernel)."""

    def __init__(self, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, bias, group_size: int,
                 dtype: torch.dtype):
        super().__init__()
        N, K = q.shape
        if N % 16 or group_size not in ATEN_GROUP_SIZES:
            raise ValueError(f"Int4PackLinear: aten int4pack needs N % 16 == 0 and G in {ATEN_GROUP_SIZES}, "
                             f"got N={N}, G={group_size}")
        self.in_features, self.out_features, self.group_size = K, N, group_size
        self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        s = scales.t().float()
        zf = (8 - zeros.t().float()) * s
        self.register_buffer("scales_and_zeros", torch.stack([s, zf], dim=-1).to(dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    @classmethod
    def from_awq_linear(cls, lin: AWQLinear, dtype: torch.dtype) -> "Int4PackLinear":
        q, z, s = lin.canonical()
        return cls(q, z, s, lin.bias, lin.group_size, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.scales_and_zeros.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.weight, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features).to(x.dtype)


class GateUpSiluMul(nn.Module):
    """``silu(y[..., :I]) * y[..., I:]`` over one [gate ; up] linear: what a baseline runs in place
    of our fused :class:`AWQGateUpSiluMul` kernel."""

    def __init__(self, gate_up: nn.Module, intermediate_size: int):
        super().__init__()
        self.gate_up = gate_up
        self.intermediate_size = intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gate_up(x)
        return nn.functional.silu(y[..., :self.intermediate_size]) * y[..., self.intermediate_size:]


def _replace(model: nn.Module, linear, gate_up) -> nn.Module:
    """Baselines run what transformers runs: our default bf16 head (Bf16HeadLinear, our GEMV) goes
    back to a plain nn.Linear (F.linear), in place, parameters kept, and the attention back to
    transformers' ``sdpa`` (convert's fp32 decode attention, integrations.attention)."""
    from .integrations.attention import restore_sdpa

    restore_sdpa(model)
    for name, mod in list(model.named_modules()):
        if type(mod) is Bf16HeadLinear:
            mod.__class__ = nn.Linear
        elif isinstance(mod, AWQLinear):
            model.set_submodule(name, linear(mod))
        elif isinstance(mod, AWQGateUpSiluMul):
            model.set_submodule(name, GateUpSiluMul(gate_up(mod), mod.out_features))
    return model


def to_int4pack(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace (in place) every AWQLinear with :class:`Int4PackLinear` and every fused gate|up
    module with the aten int4pack gate|up linear followed by ``silu * mul``."""
    def gate_up(m: AWQGateUpSiluMul):
        q, z, s = m.canonical()
        return Int4PackLinear(q, z, s, m.canonical_bias(), m.group_size, dtype)

    return _replace(model, lambda m: Int4PackLinear.from_awq_linear(m, dtype), gate_up)


def _dense_linear(w: torch.Tensor, bias, dtype: torch.dtype) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w.to(dtype))
        if bias is not None:
            lin.bias.copy_(bias.to(dtype))
    return lin


class DenseMoEExperts(nn.Module):
    """Float experts with transformers' 3-D layout (``gate_up_proj`` [E, 2I, H], ``down_proj``
    [E, H, I]) and the loop of transformers' eager experts forward: the dense baseline of an
    :class:`AWQMoEExperts`."""

    def __init__(self, m: AWQMoEExperts, dtype: torch.dtype):
        super().__init__()
        parts = [m.dequantize(e) for e in range(m.num_experts)]
        self.gate_up_proj = nn.Parameter(torch.stack([p[0] for p in parts]).to(dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.stack([p[1] for p in parts]).to(dtype), requires_grad=False)
        self.intermediate_size = m.intermediate_size

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in top_k_index.unique().tolist():
            tok, slot = torch.where(top_k_index == e)
            gu = nn.functional.linear(hidden_states[tok], self.gate_up_proj[e])
            h = nn.functional.silu(gu[:, :self.intermediate_size]) * gu[:, self.intermediate_size:]
            y = nn.functional.linear(h, self.down_proj[e]) * top_k_weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def fp32_names(model: nn.Module, dtype: torch.dtype) -> set:
    """Names of the float parameters and buffers that transformers keeps in fp32 when it loads
    ``model`` in ``dtype`` (``_keep_in_fp32_modules_strict`` for bf16/fp16, ``_keep_in_fp32_modules``
    for fp16: DeepSeek-V3's and GLM-4-MoE's router ``gate.weight`` and ``e_score_correction_bias``),
    matched by transformers' own dtype plan and glob matcher; empty for any other module."""
    plan = getattr(model, "_get_dtype_plan", None)
    patterns = [k for k, v in (plan(dtype) if plan else {}).items() if v == torch.float32]
    if not patterns:
        return set()
    from transformers.core_model_loading import build_glob_alternation

    rx = build_glob_alternation(patterns)[0]
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    return {n for n, t in tensors if t.is_floating_point() and rx.search(n)}


def cast_like_loading(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast (in place) the float tensors ``from_pretrained(dtype=...)`` would have cast: parameters
    and persistent buffers, except what transformers keeps fp32 (:func:`fp32_names`); non-persistent
    buffers (rotary ``inv_freq``, computed in fp32 at init) keep their dtype. A plain ``.to(bf16)``
    casts DeepSeek-V3's router and the rotary frequencies to bf16: not the model transformers loads."""
    keep = fp32_names(model, dtype)
    for mod_name, mod in model.named_modules():
        prefix = mod_name + "." if mod_name else ""
        for attr, t in list(mod.named_parameters(recurse=False)):
            if t.is_floating_point() and prefix + attr not in keep:
                t.data = t.data.to(dtype)
        for attr, t in list(mod.named_buffers(recurse=False)):
            if t is not None and t.is_floating_point() and prefix + attr not in keep \
                    and attr not in mod._non_persistent_buffers_set:
                setattr(mod, attr, t.to(dtype))  # a registered buffer: assignment keeps it registered
    return model


def to_dense(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace (in place) every int4 module with ``nn.Linear`` on its dequantized weight (in
    ``dtype``; MoE experts: :class:`DenseMoEExperts`): the dense model computing the same function,
    for speed and accuracy baselines."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, AWQMoEExperts):
            model.set_submodule(name, DenseMoEExperts(mod, dtype))
    return _replace(model, lambda m: _dense_linear(m.dequantize(), m.bias, dtype),
                    lambda m: _dense_linear(m.dequantize(), m.canonical_bias(), dtype))


# ---------------------------------------------------------------------------------------------
# Inductor's own WOQ-int4 GEMM template (torch 2.13, torch/_inductor/quantized_lowerings.py and
# codegen/cpp_micro_gemm.py): the lowering of aten._weight_int4pack_mm_for_cpu adds a C++ template
# choice next to the aten kernel when max-autotune is on and the packed weight is a frozen constant
# (freezing=True, eval mode, no grad). Its micro-kernels exist for bf16 x only, G in {32, 64, 128},
# N % 64 == 0: CppMicroGemmWoQInt4Amx (AMX, _tile_dpbf16ps, M >= 5 or dynamic M) and
# CppMicroGemmWoQInt4Avx512 (AVX512 fp32 FMA, e.g. on AMD Zen 4). Without freezing (a module in
# training mode, as this baseline was first compiled) the weight is a graph input and only the
# aten extern kernel runs. With both choices the autotuner keeps the faster one by a single timing,
# which on a loaded machine flips between runs, so the baseline asks for the template alone
# (max_autotune_gemm_backends="CPP") and takes aten's kernel only where no template applies.
WOQ_KERNELS = ("inductor_woq_amx", "inductor_woq_avx512", "aten_extern", "none")


def woq_kernel_of(code: str) -> str:
    """Which kernel Inductor's generated ``code`` runs for the int4 GEMM: the WOQ template's AMX or
    AVX512 micro-kernel, the aten extern call, or ``"none"`` (no compiled code: e.g. a recompile
    limit made Dynamo fall back to eager)."""
    if "CppMicroGemmWoQInt4Amx" in code or "_tile_dpbf16ps" in code:
        return "inductor_woq_amx"
    if "micro_gemm_convert_int4_to_int8" in code:  # the AVX512 micro-kernel's int4 unpacking helper
        return "inductor_woq_avx512"
    if "int4mm_packed_weight_cpu" in code or "aten._weight_int4pack_mm_for_cpu.default(" in code:
        return "aten_extern"
    return "none"


def compile_inductor_woq(module: nn.Module, x: torch.Tensor):
    """``(compiled, kernel)``: ``module`` (calling ``aten._weight_int4pack_mm_for_cpu`` on buffers)
    compiled for ``x``'s static shape with mode="max-autotune" and freezing, so Inductor may pick its
    WOQ template; ``kernel`` (:func:`woq_kernel_of`) says what the generated code runs. The
    compile happens here (first call); later calls with the same shape reuse it."""
    import torch._inductor.config as iconfig  # the config context only: the lowering is Inductor's
    from torch._inductor.utils import run_and_get_code

    for backends in ("CPP", "ATEN,CPP"):
        fn = torch.compile(module.eval(), mode="max-autotune", dynamic=False)
        try:
            with torch.no_grad(), iconfig.patch(freezing=True, max_autotune_gemm_backends=backends):
                _, codes = run_and_get_code(fn, x)
        except Exception as e:  # noqa: BLE001 - no template applies (e.g. fp16 x, G=256): aten's kernel
            log.info("inductor_woq: no WOQ template for x %s %s (%s); using aten's kernel",
                     list(x.shape), x.dtype, type(e).__name__)
            continue
        return fn, woq_kernel_of("\n".join(codes))
    raise RuntimeError(f"inductor_woq: compiling for x {list(x.shape)} {x.dtype} failed with every backend")
