"""The bf16 panel path (bf16 x, no AMX, from the plan's panel_min_m rows: schemes/w4a16.h.j2
compute_bf16_panel): each K chunk x 64-column tile dequantized once to bf16 exactly as the dense
candidate does, then a bf16 GEMM loop with fp32 sums. So its output is F.linear's on the dense bf16
weight up to the order of the fp32 sums: checked against an fp32 matmul of that weight, within
one bf16 rounding, over the blocking's edges (partial N tile, K chunk tails, M not a multiple of
the 6-row register block, several M blocks, K slices), G, bias and the gate|up op."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from awq_inductor import packing
from awq_inductor.kernels import native, plan as kplan
from awq_inductor.schemes import OPS

from helpers import op_args

pytestmark = pytest.mark.skipif(
    __import__("awq_inductor.kernels.isa", fromlist=["x"]).hardware_isa() not in ("avx512", "amx"),
    reason="the bf16 panel kernel needs AVX512-BF16")

BF16 = torch.bfloat16


def _dense_weight(canonical, G, op, n):
    """The dense candidate's weight: float(q - z) * s rounded once to bf16, in canonical order."""
    q, z, s, _ = canonical
    return packing.dequantize_canonical(q, z, s, G).to(BF16)


def _panel_plan(op):
    plan = kplan.candidates(op, "avx512", BF16)["panel"]
    assert kplan.path_for(plan, op, "avx512", BF16, 9) == "panel"
    return plan


def _within_one_rounding(got, want32):
    """got (bf16) is want32 (fp32 sums in another order) rounded to bf16: at most one bf16 ulp of
    |want| apart, plus a tiny slack for the sums' order."""
    err = (got.float() - want32).abs()
    bound = want32.abs() * 2.0 ** -7 + 1e-6 * want32.abs().max()
    bad = err > bound
    assert not bad.any(), (int(bad.sum()), float(err.max()), float((err - bound).max()))


@pytest.mark.parametrize("M,K,N,G", [
    (9, 256, 96, 32),      # one row past the decode kernel; a 64 + 32-column tile pair
    (13, 768, 256, 64),    # K = 512 + 256: a chunk tail
    (100, 1024, 160, 128),
    (257, 640, 64, 128),   # M not a multiple of 6; K = 512 + 128
    (600, 256, 128, 32),   # more rows than one M block (kBpMcMax)
    (16, 2048, 32, 128),   # one item for two threads: K-sliced
])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_mm_panel_is_dense_linear(M, K, N, G, bias):
    op = OPS["int4_mm"]
    args, canonical = op_args("int4_mm", N, K, G, bias=bias, seed=M + K, canonical=True)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(BF16)
    kern = native.get_kernel(op.name, BF16, "avx512")
    got = kern(x, *args, plan=_panel_plan(op))
    W = _dense_weight(canonical, G, op, N).float()
    want = x.float() @ W.T
    if bias:
        want = want + canonical[3].float()  # added to the fp32 sums before the one rounding
    assert got.dtype == BF16 and got.shape == (M, N)
    _within_one_rounding(got, want)
    # and it is not the exact path: F.linear on the dense weight agrees to the same bound
    if not bias:
        _within_one_rounding(got, F.linear(x, W.to(BF16)).float())


@pytest.mark.parametrize("threads", [1, 2])
def test_gate_up_panel_is_dense_linear_then_silu_mul(threads):
    op = OPS["int4_mm_silu_mul"]
    M, K, I, G = 45, 768, 96, 64
    args, canonical = op_args(op.name, I, K, G, bias=False, seed=7, canonical=True)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1)).to(BF16)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native.get_kernel(op.name, BF16, "avx512")(x, *args, plan=_panel_plan(op))
    finally:
        torch.set_num_threads(old)
    W = _dense_weight(canonical, G, op, 2 * I).float()  # [gate ; up], canonical order
    h = x.float() @ W.T
    want = F.silu(h[:, :I]) * h[:, I:]
    assert got.shape == (M, I)
    # SiLU * mul in fp32 on sums in another order: allow two roundings
    err = (got.float() - want).abs()
    assert (err <= want.abs() * 2.0 ** -6 + 1e-5 * want.abs().max()).all(), float(err.max())


def test_panel_handles_inf_in_x():
    """Unlike the decode kernel's 128 + q offset, the dense numerics need no finite-x fallback: an
    Inf in x gives the dense +-Inf, not NaN (the weights here are all nonzero)."""
    op = OPS["int4_mm"]
    K, N, G = 256, 64, 64
    q = torch.full((N, K), 9, dtype=torch.uint8)
    z = torch.full((N, K // G), 8, dtype=torch.uint8)
    s = torch.full((N, K // G), 0.5)
    args = (*op.pack(q, z, s, G, N), None, G, N)
    x = torch.ones(12, K, dtype=BF16)
    x[3, 5] = float("inf")
    got = native.get_kernel(op.name, BF16, "avx512")(x, *args, plan=_panel_plan(op))
    assert torch.isinf(got[3]).all() and (got[3] > 0).all()
    assert torch.isfinite(got[torch.arange(12) != 3]).all()
    assert torch.equal(got[0], torch.full((N,), 128.0, dtype=BF16))  # 256 * (9 - 8) * 0.5
