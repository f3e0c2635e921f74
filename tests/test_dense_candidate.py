"""The tuner's dense candidate (kernels/tuner.py dense_call): the C++ dequantization of every
scheme's packed layout (runtime/dense.h.j2) bit-exact against packing.dequantize_canonical, the
blockwise dequantize + F.linear against the ops' reference (bias, gate|up), and a measured plan
that makes dense the winner from some M sending the eager op and the lowering there."""
from __future__ import annotations

import glob
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from awq_inductor import formats, ops, packing
from awq_inductor.ops import oracles
from awq_inductor.kernels import dense, native, tuner, tuning_cache
from awq_inductor.schemes import OPS

from helpers import op_args, random_canonical

VECTORS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "vectors", "*.safetensors")))
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ISAS = ("avx512", "portable")


def _has_avx512() -> bool:
    from awq_inductor.kernels import isa

    return isa.hardware_isa() in ("avx512", "amx")


def _isas():
    return [i for i in ISAS if i == "portable" or _has_avx512()]


def _check_exact(op, q, z, s, G, out_features, dtype, isa, n0=0):
    """Dequantize packed columns [n0, N) and compare every value with the canonical truth (in the
    packed column order: the gate|up op's panels interleaved) rounded to dtype."""
    packed = op.pack(q, z, s, G, out_features)
    n = op.columns(out_features)
    if op.spec.columns_per_output == 2:
        q, z, s = (packing.interleave_gate_up(t, out_features) for t in (q, z, s))
    want = packing.dequantize_canonical(q, z, s, G)[n0:].to(dtype)
    out = torch.full((n - n0, q.shape[1]), float("nan"), dtype=dtype)
    native.get_dequant(op.scheme.name, dtype, isa)(*packed[:3], n, n0, n, out)
    assert torch.equal(out, want), (op.name, dtype, isa, n0, (out.float() - want.float()).abs().max())


@pytest.mark.parametrize("path", VECTORS, ids=[os.path.basename(p)[:-12] for p in VECTORS])
def test_dequant_exact_on_format_vectors(path):
    """Real AutoAWQ tensors (every format), through every op's pack path, every dtype and ISA."""
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    d = load_file(path)
    G = int(meta["group_size"])
    q, z, s = formats.unpack_awq(d["qweight"], d["qzeros"], d["scales"], group_size=G, format=meta["format"])
    N = q.shape[0]
    for op in OPS.values():
        gate_up = op.spec.columns_per_output == 2
        if gate_up and (N // 2) % 32:
            continue
        for dtype in DTYPES:
            for isa in _isas():
                _check_exact(op, q, z, s, G, N // 2 if gate_up else N, dtype, isa)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("K,n,G", [
    (256, 96, 64),    # vpshufb path (G % 64 == 0), 3 panels
    (192, 64, 32),    # G % 32 == 0 only: the vpermw path
    (128, 72, 4),     # G = 4: plain C++; partial last panel
    (512, 64, 512),   # one group
])
def test_dequant_exact_paths(name, K, n, G):
    op = OPS[name]
    if op.spec.columns_per_output == 2 and n % 32:
        n = 64
    q, z, s = random_canonical(op.columns(n), K, G, torch.float32, seed=K + n + G)
    s[0, 0] = 0.0  # a zero scale
    s[-1, -1] = 3.0e-39 if s.shape[0] > 1 else s[-1, -1]  # a denormal product (rounding of tiny values)
    for dtype in DTYPES:
        for isa in _isas():
            for n0 in (0, 32) if op.columns(n) > 32 else (0,):
                if op.spec.columns_per_output == 2 and n0 % 64:
                    continue
                _check_exact(op, q, z, s, G, n, dtype, isa, n0)


def test_dequant_rejects_bad_ranges():
    op = OPS["int4_mm"]
    args = op_args("int4_mm", 64, 128, 64, bias=False)
    deq = native.get_dequant("w4a16", torch.bfloat16)
    with pytest.raises(ValueError, match="n0 % 32 == 0"):
        deq(*args[:3], 64, 16, 64, torch.empty(64, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out \[>= n1 - n0, 128\], got n0=0, n1=64, out torch.float32"):
        deq(*args[:3], 64, 0, 64, torch.empty(64, 128))
    with pytest.raises(ValueError, match="0 <= n0 < n1 <= 64"):
        deq(*args[:3], 64, 0, 96, torch.empty(96, 128, dtype=torch.bfloat16))
    assert op.name == "int4_mm"


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_bytes", [None, 64 * 256 * 2])
def test_dense_call_matches_the_reference(name, dtype, block_bytes):
    """Bias and the gate|up SiLU * mul epilogue, in one block and in several (64 packed columns per
    block at K = 256 in 16-bit: 4 blocks of the 256 packed columns, gate|up panels kept paired)."""
    n = 128
    args = op_args(name, n, 256, 64, bias=True, seed=3)
    x = torch.randn(37, 256).to(dtype)
    got = dense.dense_call(OPS[name], x, *args, block_bytes=block_bytes)
    assert got.dtype == dtype and got.shape == (37, n)
    want = oracles.int4_mm(name, x, *args)
    # 16-bit: F.linear rounds the GEMM to x's dtype before the bias / SiLU * mul (one more rounding
    # than the fp32 reference), so the bound scales with the output
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2 * want.abs().max().item())
    torch.testing.assert_close(got.float(), want.float(), **tol)
    nobias = (*args[:-3], None, *args[-2:])
    want = oracles.int4_mm(name, x, *nobias)
    torch.testing.assert_close(dense.dense_call(OPS[name], x, *nobias, block_bytes=block_bytes).float(),
                               want.float(), **tol)


def test_dense_block_columns():
    assert dense.dense_block_columns(4096, 2) == (dense.DENSE_BLOCK_BYTES // 8192) // 64 * 64
    assert dense.dense_block_columns(11008, 2, 1 << 20) == 64  # at least one gate|up panel pair
    assert dense.dense_block_columns(128, 4, 1 << 20) % 64 == 0


def _dense_from(m0):
    """Fake timings: dense 2x faster than every other path from m0 rows, 2x slower below."""
    def make(op, isa, x_dtype, K, out_features, G):
        def timer(path, plan, M):
            if path == "dense":
                return 1.0 if M >= m0 else 4.0
            return 2.0
        return timer
    return make


def test_measured_dense_winner_drives_the_eager_op(tune_dir, monkeypatch):
    """Timings where dense wins from M = 64: the plan says so, and the eager op runs dense_call from
    64 rows on (and the C++ kernel below), with the right numbers either way."""
    from awq_inductor.kernels import isa as isa_mod

    if isa_mod.select() == "portable" or (isa_mod.select() == "amx" and isa_mod.amx_emulated()):
        pytest.skip("plans are the constants on this ISA (nothing is measured)")
    monkeypatch.setattr(tuner, "kernel_timer", _dense_from(64))
    name, n, K, G = "int4_mm_silu_mul", 64, 256, 64
    args = op_args(name, n, K, G, bias=True, seed=5)
    calls = []
    real = dense.dense_call
    monkeypatch.setattr(dense, "dense_call", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    plan = tuning_cache.plan_for(OPS[name], native.get_kernel(name, torch.bfloat16).isa, torch.bfloat16, K, n, G)
    assert plan.dense_min_m == 64 and plan.source == "tuned"
    for M in (32, 63, 64, 200):
        x = torch.randn(M, K).to(torch.bfloat16)
        got = torch.ops.awq.int4_mm_silu_mul(x, *args)
        want = oracles.int4_mm(name, x, *args).float()
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert calls == [64, 200]


def test_measured_dense_winner_makes_the_lowering_call_the_eager_op(tune_dir, monkeypatch, inductor_clean):
    """The same plan under torch.compile: static M >= dense_min_m and dynamic M become the extern call
    of the eager op (which dispatches on M); static M below it stays our template."""
    from torch._inductor.utils import run_and_get_code
    from awq_inductor.kernels import isa as isa_mod

    if isa_mod.select() == "portable" or (isa_mod.select() == "amx" and isa_mod.amx_emulated()):
        pytest.skip("plans are the constants on this ISA (nothing is measured)")
    monkeypatch.setattr(tuner, "kernel_timer", _dense_from(64))
    name, n, K, G = "int4_mm", 96, 256, 64
    args = op_args(name, n, K, G, bias=True, seed=6)

    def code_for(M, dynamic=False):
        torch._dynamo.reset()
        x = torch.randn(M, K).to(torch.bfloat16)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *args), fullgraph=True)
        out, codes = run_and_get_code(f, x)
        want = oracles.int4_mm(name, x, *args).float()
        torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        return "\n".join(codes)

    small, big, dyn = code_for(8), code_for(128), code_for(80, dynamic=True)
    assert "awq_int4_mm_driver_" in small and "torch.ops.awq.int4_mm.default" not in small
    for code in (big, dyn):
        assert "torch.ops.awq.int4_mm.default" in code and "awq_int4_mm_driver_" not in code
