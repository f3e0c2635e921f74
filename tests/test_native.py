"""Eager native kernels (awq_inductor.kernels.native) against the fp32 reference, for every ISA this CPU runs."""
import dataclasses
import os
import random

import pytest
import torch

from helpers import op_args
from awq_inductor import config, ops, packing, schemes
from awq_inductor.ops import oracles
from awq_inductor.kernels import codegen, native, plan as kplan
from awq_inductor.kernels import isa as isa_mod


def _can_run(isa):
    if isa == "portable":
        return True
    avx = torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported()
    if isa == "avx512":
        return avx
    return avx and torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx()


ISAS = [pytest.param(i, marks=pytest.mark.skipif(not _can_run(i), reason=f"CPU cannot run {i}"))
        for i in ("amx", "avx512", "portable")]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _make(M, K, N, G, bias, dtype, seed=0):
    qw, sp, zp, b, _, _ = op_args("int4_mm", N, K, G, bias=bias, seed=seed)  # signed scales
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)  # signed activations
    return x, qw, sp, zp, b


def _check(x, qw, sp, zp, b, G, N):
    y = torch.ops.awq.int4_mm(x, qw, sp, zp, b, G, N)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype
    ref = oracles.int4_mm("int4_mm", x.float(), qw, sp, zp, b, G, N)
    scale = ref.abs().max().item() + 1e-6
    err = (y.float() - ref).abs().max().item()
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[x.dtype]
    assert err <= tol * scale, f"max abs err {err:.3g} vs output scale {scale:.3g} ({x.dtype})"
    assert torch.isfinite(y).all()


def _grid(n, seed):
    rnd = random.Random(seed)
    Ms = [1, 2, 4, 5, 17, 64, 300]
    KNs = [(64, 40), (128, 72), (256, 200), (96, 64), (512, 130), (2048, 96), (160, 33)]
    cases = []
    for i in range(n):
        M = Ms[i % len(Ms)]
        K, N = rnd.choice(KNs)
        G = rnd.choice([g for g in (32, 64, 128, K) if K % g == 0])
        cases.append((M, K, N, G, rnd.random() < 0.5))
    return cases


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_int4_mm_grid(isa, dtype):
    with config.patch(force_isa=isa):
        for i, (M, K, N, G, bias) in enumerate(_grid(14, seed=hash((isa, str(dtype))) % 1000)):
            _check(*_make(M, K, N, G, bias, dtype, seed=i), G, N)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("M,K,N,G", [
    (1, 4096, 40, 128),   # few N tiles: K-slicing + reduction
    (3, 2048, 33, 2048),  # G = K, K-sliced groups
    (7, 80, 72, 40),      # K not a multiple of 32 (AMX K tail), odd group count
    (33, 64, 200, 32),    # AMX M tail (33 = 32 + 1), several N tiles
    (130, 192, 64, 64),   # several AMX M blocks, 16 < tail rows < 32
])
def test_int4_mm_edges(isa, dtype, M, K, N, G):
    with config.patch(force_isa=isa):
        _check(*_make(M, K, N, G, True, dtype, seed=M), G, N)


@pytest.mark.parametrize("isa", ISAS)
def test_threads_agree(isa):
    x, qw, sp, zp, b = _make(9, 512, 200, 64, True, torch.float32)
    with config.patch(force_isa=isa):
        outs = []
        for nt in (1, 2, 3):
            with config.patch(num_threads=nt):
                outs.append(torch.ops.awq.int4_mm(x, qw, sp, zp, b, 64, 200))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
def test_threads_share_tiles_exactly(isa):
    """The driver's units are taken by their thread from the front and by threads that have finished
    theirs from the back (runtime/driver.h.j2 UnitRange): every tile computed exactly once, so the
    output is the same bits at any thread count, also with more threads than cores (3, 5: threads
    preempted mid-call, the others steal), call after call."""
    N = 64 * 37
    for M in (1, 3, 40):
        x, qw, sp, zp, b = _make(M, 256, N, 64, True, torch.bfloat16, seed=M)
        with config.patch(force_isa=isa):
            kern = native.get_kernel("int4_mm", torch.bfloat16)
            with config.patch(num_threads=1):
                want = kern(x, qw, sp, zp, b, 64, N)
            for nt in (2, 3, 5):
                with config.patch(num_threads=nt):
                    for _ in range(10):
                        got = kern(x, qw, sp, zp, b, 64, N)
                        assert torch.equal(got, want), (M, nt, (got != want).nonzero()[:4].tolist())


@pytest.mark.parametrize("isa", ISAS)
def test_amx_multi_row_bf16(isa):
    """Multi-row bf16 (the AMX path where it exists; GCC 12 tile-config pitfall): several configs in a row."""
    with config.patch(force_isa=isa):
        for M in (5, 16, 17, 32, 48, 64):
            _check(*_make(M, 256, 96, 128, False, torch.bfloat16, seed=M), 128, 96)


def test_m_zero():
    x, qw, sp, zp, b = _make(0, 64, 40, 32, True, torch.bfloat16)
    y = torch.ops.awq.int4_mm(x, qw, sp, zp, b, 32, 40)
    assert y.shape == (0, 40) and y.dtype == torch.bfloat16
    y = native.get_kernel("int4_mm", torch.float32, isa="portable")(x.float(), qw, sp, zp, b, 32, 40)
    assert y.shape == (0, 40)


def test_kernel_cache_per_isa():
    avail = [i for i in ("avx512", "portable") if _can_run(i)]
    ks = {}
    for isa in avail:
        with config.patch(force_isa=isa):
            ks[isa] = native.get_kernel("int4_mm", torch.float32)
            assert ks[isa].isa == isa
            assert native.get_kernel("int4_mm", torch.float32) is ks[isa]
    assert len({id(k) for k in ks.values()}) == len(avail)


def test_disk_cache_and_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AWQ_INDUCTOR_CACHE_DIR", str(tmp_path))
    src = 'extern "C" int awq_probe() { return 42; }\n'
    so = native.build(src, [])
    assert os.path.dirname(so) == str(tmp_path) and os.path.exists(so)
    assert native.build(src, []) == so
    assert not [p for p in os.listdir(tmp_path) if p.endswith((".tmp", ".cpp"))]
    with pytest.raises(RuntimeError, match="(?s)compiling the int4 kernel failed.*not_a_type"):
        native.build("not_a_type x;\n", [])


def test_codegen_api():
    assert codegen.TILE_N % 32 == 0 and codegen.TILE_M > 0
    assert len(codegen.templates_hash()) == 64
    for isa in ("amx", "avx512", "portable"):
        for dt in DTYPES:
            h = codegen.render_header(schemes.W4A16, isa, dt)
            assert "int4_mm_driver" in h and "{{" not in h and "{%" not in h
            assert f"#define AWQ_TILE_N {codegen.TILE_N}" in h
            assert ("AWQ_TILE_DPBF16PS(0, 4, 6)" in h) == (isa == "amx" and dt == torch.bfloat16)
            assert ("#define AWQ_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps" in h) == (isa == "amx")
            if isa != "portable":
                assert '#pragma GCC target("' in h and h.count("push_options") == h.count("pop_options")
            e = codegen.render_header(schemes.W4A16, isa, dt, amx_emulate=True)
            assert "amx_emu::dpbf16ps" in e and "_tile_dpbf16ps" not in e
    with config.patch(amx_emulation=True):
        assert "amx_emu::" in codegen.render_header(schemes.W4A16, "amx", torch.bfloat16)
        assert not any(f.startswith("-mamx") for f in isa_mod.compile_flags("amx"))
    assert "-mamx-tile" in isa_mod.compile_flags("amx") and "-mavx512bf16" in isa_mod.compile_flags("avx512")
    assert isa_mod.compile_flags("portable") == []
    assert codegen.dtype_ctype(torch.bfloat16) == "bfloat16" and codegen.dtype_ctype(torch.float16) == "half"
    with config.patch(force_isa="portable"):
        assert isa_mod.select() == "portable"
    with pytest.raises(ValueError):
        codegen.render_header(schemes.W4A16, "sse", torch.float32)


# ------------------------------------------------------------------ AMX micro-kernel, emulated
# config.amx_emulation renders the AWQ_TILE_* macros as a scalar tile emulator: the AMX bf16
# kernel logic (tile config per row count, dequantized VNNI panels, M/K/N tails, driver) runs on
# any AVX512-BF16 CPU. The hardware AMX cases above still run where AMX exists.
_EMU_OK = _can_run("avx512")
emu = pytest.mark.skipif(not _EMU_OK, reason="needs AVX512-BF16 (dequant / tail kernels)")


def _make_canonical(M, K, N, G, bias, seed):
    _, (q, z, s, b) = op_args("int4_mm", N, K, G, bias=bias, seed=seed, canonical=True)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16)
    return x, q, z, s, b


@emu
@pytest.mark.parametrize("M", [5, 16, 17, 33, 64, 300])
@pytest.mark.parametrize("K,N,G", [
    (256, 72, 32),    # K % 32 == 0, N % 32 != 0
    (256, 200, 128),  # several N tiles, last one 8 columns
    (192, 40, 192),   # G = K
    (160, 33, 32),    # K % 64 != 0, one column in the last panel
    (80, 72, 40),     # K % 32 != 0: AMX k-chunks + decode-kernel K tail, G not a power of two
    (112, 130, 112),  # K % 32 != 0, G = K
])
def test_amx_emulated(M, K, N, G):
    """bf16 AMX paths (tile emulator) vs the fp32 reference (bf16 tolerance); with K % 32 == 0 also
    element-wise vs fp32 math on the weights each path multiplies: exact (q - z) * s for amx_groups
    (up to AMX_GROUPS_MAX_M rows), bf16-rounded dequantized weights for amx."""
    x, q, z, s, b = _make_canonical(M, K, N, G, True, seed=M * 1000 + K + N)
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    with config.patch(force_isa="amx", amx_emulation=True):
        k = native.get_kernel("int4_mm", torch.bfloat16)
        assert k.isa == "amx" and k.amx_emulated
        _check(x, qw, sp, zp, b, G, N)
        y = k(x, qw, sp, zp, b, G, N).float()
    if K % 32 == 0:
        wd = ((q.float() - z.float().repeat_interleave(G, 1)) * s.float().repeat_interleave(G, 1))
        if M <= kplan.AMX_GROUPS_MAX_M and G % 32 == 0:
            # amx_groups: exact products x (q - z), scaled per group in fp32: fp32 math on the exact weights
            ref = x.float() @ wd.t() + b
        else:  # amx: the weights dequantized and rounded to bf16 once per M block
            ref = x.float() @ wd.to(torch.bfloat16).float().t() + b
        scale = ref.abs().max().item()
        torch.testing.assert_close(y, ref, rtol=2 ** -7, atol=1e-4 * scale)


AMX_RUNS = [pytest.param(False, marks=emu),
            pytest.param(True, marks=pytest.mark.skipif(not _can_run("amx"), reason="CPU/OS without AMX tiles"))]


@pytest.mark.parametrize("hardware", AMX_RUNS)
@pytest.mark.parametrize("M", [1, 5, 32])
def test_amx_groups_exact_products_with_k_slices_inside_groups(hardware, M):
    """amx_groups (B as bf16(128 + q), zeros and scales folded per group): one 32-column tile on 2
    threads splits K = 768 into two slices of 384, which cut the middle group of 256 (the fold then
    sums x over the segment: 4 segments); element-wise against fp32 math on the exact weights."""
    K, N, G = 768, 32, 256
    x, q, z, s, b = _make_canonical(M, K, N, G, True, seed=M + 7)
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    wd = (q.float() - z.float().repeat_interleave(G, 1)) * s.float().repeat_interleave(G, 1)
    ref = x.float() @ wd.t() + b
    plan = kplan.forced_plan({"amx_min_m": 1})
    assert kplan.path_for(plan, schemes.OPS["int4_mm"], "amx", torch.bfloat16, M) == "amx_groups"
    with config.patch(force_isa="amx", amx_emulation=not hardware, num_threads=2):
        if not hardware:
            native.amx_emulator_counters("int4_mm", torch.bfloat16)  # reset
        y = native.get_kernel("int4_mm", torch.bfloat16)(x, qw, sp, zp, b, G, N, plan=plan).float()
        if not hardware:  # the tiles ran, each segment's sums from tilezero (2 C tiles per 16 rows)
            c = native.amx_emulator_counters("int4_mm", torch.bfloat16)
            assert c["tdp"] > 0 and c["tilezero"] == 4 * 2 * ((M + 15) // 16)
    torch.testing.assert_close(y, ref, rtol=2 ** -7, atol=1e-4 * ref.abs().max().item())


@emu
def test_amx_emulated_differs_from_avx512_and_threads_agree():
    """The emulated run really takes the AMX path (48 rows: bf16-rounded weights, not the exact fp32
    kernel) and is deterministic across thread counts (per-thread tile state)."""
    x, qw, sp, zp, b = _make(48, 256, 96, 64, True, torch.bfloat16, seed=3)
    with config.patch(force_isa="avx512"):
        y_avx = torch.ops.awq.int4_mm(x, qw, sp, zp, b, 64, 96)
    outs = []
    with config.patch(force_isa="amx", amx_emulation=True):
        for nt in (1, 2, 3):
            with config.patch(num_threads=nt):
                outs.append(native.get_kernel("int4_mm", torch.bfloat16)(x, qw, sp, zp, b, 64, 96))
    assert not torch.equal(outs[0], y_avx)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=0)


_EMU_PROBE = r"""
#include <cstdio>
int main(int argc, char** argv) {
  using namespace awq;
  const int mode = argv[1][0] - '0';
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  c.rows[0] = 2; c.colsb[0] = 8;   // C: 2 x 2 fp32
  c.rows[1] = 2; c.colsb[1] = 8;   // A: 2 x (2 pairs) bf16
  c.rows[2] = 2; c.colsb[2] = 8;   // B: 2 k-pairs x 2 columns
  if (mode == 1) c.rows[3] = 17, c.colsb[3] = 64;   // rows > 16
  if (mode == 2) c.rows[2] = 3;                      // A.colsb != 4 * B.rows
  if (mode == 3) c.reserved[0] = 1;
  AWQ_TILE_LOADCONFIG(&c);
  uint16_t a[4], b[4][2];
  const float av[4] = {1, 2, 3, 4}, bv[4][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  for (int i = 0; i < 4; ++i) a[i] = f32_to_bf16(av[i]);
  for (int i = 0; i < 4; ++i) for (int j = 0; j < 2; ++j) b[i][j] = f32_to_bf16(bv[i][j]);
  // A row m = a[0..3] for both rows; B row k (pair k) = {b[2k][0], b[2k+1][0], b[2k][1], b[2k+1][1]}
  uint16_t B[2][4] = {{b[0][0], b[1][0], b[0][1], b[1][1]}, {b[2][0], b[3][0], b[2][1], b[3][1]}};
  float C[2][2] = {{0.5f, 0}, {0, 0}};
  AWQ_TILE_LOADD(0, C, 8);
  AWQ_TILE_LOADD(1, a, 0);
  AWQ_TILE_LOADD(2, B, 8);
  if (mode == 4) AWQ_TILE_LOADD(5, C, 8);  // unconfigured tile
  AWQ_TILE_DPBF16PS(0, 1, 2);
  AWQ_TILE_STORED(0, C, 8);
  AWQ_TILE_RELEASE();
  std::printf("%g %g %g %g\n", C[0][0], C[0][1], C[1][0], C[1][1]);
  return 0;
}
"""


@emu
def test_amx_emulator_semantics_and_misuse(tmp_path):
    """The emulator computes tdpbf16ps like the ISA (pairs along K) and aborts with a message on
    configurations / operands the hardware would fault on."""
    import subprocess

    src = codegen.render_header(schemes.W4A16, "amx", torch.bfloat16, amx_emulate=True) + _EMU_PROBE
    cpp, exe = tmp_path / "probe.cpp", tmp_path / "probe"
    cpp.write_text(src)
    subprocess.run(["g++", "-O1", "-std=c++17", "-fopenmp", *isa_mod.compile_flags("amx", amx_emulate=True),
                    str(cpp), "-o", str(exe)], check=True)
    ok = subprocess.run([str(exe), "0"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # C[m][n] = C0 + sum_k a[k] * b[k][n]: n=0: 1+6+15+28 = 50, n=1: 2+8+18+32 = 60
    assert [float(v) for v in ok.stdout.split()] == [50.5, 60.0, 50.0, 60.0]
    for mode, msg in [(1, "rows > 16"), (2, "A.colsb != 4 \\* B.rows"), (3, "reserved"), (4, "not configured")]:
        r = subprocess.run([str(exe), str(mode)], capture_output=True, text=True)
        assert r.returncode != 0
        assert __import__("re").search(msg, r.stderr), (mode, r.stderr)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op_name", ["int4_mm", "int4_mm_a8", "int4_mm_silu_mul"])
def test_decode_prefetch_settings_leave_outputs_bit_identical(isa, op_name):
    """The decode kernels' prefetches (distance, next N tile into L2) are hints only: every setting of
    the tuner's candidates gives the same bits as none, rows 1-16 (the decode kernels' rows; from 5
    rows with and without the rows' prefetch) and 40 (W4A8's many-row path, whose expansion of the
    weights prefetches with the rows' setting), the last tile's look-ahead past the weight's end
    included (N = 200: a partial last panel)."""
    from awq_inductor.kernels import tuner

    op = schemes.OPS[op_name]
    N = 192 if op.spec.columns_per_output == 2 else 200
    w = op_args(op_name, N, 256, 64, bias=False, seed=3)[:len(op.scheme.weights)]
    kern = native.get_kernel(op_name, torch.bfloat16, isa)
    base = kplan.forced_plan({"bf16_f32_min_m": 17, "panel_min_m": 1 << 40, "amx_min_m": 1 << 40})
    # (two K streams change the order of the groups' fp32 sum: test_two_k_streams_give_the_one_stream_result)
    cands = tuple(pf for pf in tuner.decode_candidates(op.scheme) if pf.k_streams == 1)
    for M in (1, 3, 8, 16, 40):
        x = torch.randn(M, 256, generator=torch.Generator().manual_seed(M)).bfloat16()
        ref = {i: kern(x, *w, None, 64, N, plan=base.with_decode(kplan.DEFAULT_DECODE._replace(int16_x=i)))
               for i in (0, 1)}
        for pf in cands + (tuple(pf._replace(rows_prefetch=0) for pf in cands) if M >= 5 else ()):
            plan = base.with_decode(pf)
            assert torch.equal(kern(x, *w, None, 64, N, plan=plan), ref[pf.int16_x]), (M, pf)


DECODE_ISAS = [p for p in ISAS if p.values[0] != "portable"]  # the int16 kernel is AVX512-VNNI
_DECODE_ROWS = {"bf16_f32_min_m": 16, "panel_min_m": 1 << 40, "amx_min_m": 1 << 40}


def _int16_plans():
    base = kplan.forced_plan(_DECODE_ROWS)
    return base, base.with_decode(kplan.DecodeSetting(512, 1, 1))


@pytest.mark.parametrize("isa", DECODE_ISAS)
@pytest.mark.parametrize("op_name", ["int4_mm", "int4_mm_silu_mul"])
@pytest.mark.parametrize("K,G", [(256, 32), (384, 128), (512, 64), (4096, 4096)])
def test_int16_decode_matches_the_bf16_decode(isa, op_name, K, G):
    """Decode rows on int16 x (Thresholds::decode_int16) against the dpbf16 kernel and the fp32
    oracle: rows 1-12 (one pass up to 8, 4-row blocks above), K slices that start inside a group
    (K = 384, G = 128 on 2 threads), a group of tiny values, an outlier 2^8 above its group, G = K."""
    op = schemes.OPS[op_name]
    N = 96 if op.spec.columns_per_output == 2 else 200
    w = op_args(op_name, N, K, G, bias=False, seed=5)[:len(op.scheme.weights)]
    kern = native.get_kernel(op_name, torch.bfloat16, isa)
    bf16, int16 = _int16_plans()
    for M in (1, 2, 5, 8, 12):
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).bfloat16()
        x[0, :G] *= 1e-30
        x[-1, 1] = 300.0
        ref = oracles.int4_mm(op_name, x.float(), *w, None, G, N)
        y0, y1 = kern(x, *w, None, G, N, plan=bf16), kern(x, *w, None, G, N, plan=int16)
        tol = dict(rtol=1e-2, atol=1e-2 * float(ref.abs().max()))
        torch.testing.assert_close(y1.float(), ref, **tol)
        torch.testing.assert_close(y1.float(), y0.float(), **tol)


@pytest.mark.parametrize("isa", DECODE_ISAS)
@pytest.mark.parametrize("op_name,int16_x", [("int4_mm", 1), ("int4_mm", 0), ("int4_mm_silu_mul", 1), ("int4_mm_a8", 0)])
@pytest.mark.parametrize("K,G", [(256, 64), (384, 128), (512, 32), (1024, 256), (4096, 128), (4096, 4096)])
def test_two_k_streams_give_the_one_stream_result(isa, op_name, int16_x, K, G):
    """One-row calls with two K streams per tile (Thresholds::decode_k_streams = 2: the tile's K range
    as two segments of whole groups read side by side) against one stream and the fp32 oracle, at 1 and
    2 threads: even group counts split (K = 256, 1024, 4096; G = 32 as the int4 head), an odd count
    (K = 384) and one group (G = K) keep the one-stream loop, K slices (2 threads) split where whole
    groups allow; a partial last panel (N = 200); an outlier 2^8 above its group; W4A16 on bf16 and on
    int16 x; W4A8 (the oracle quantizes x as the kernel does). Only the order of the fp32 sums differs,
    so the two agree to one step of the bf16 output."""
    op = schemes.OPS[op_name]
    N = 96 if op.spec.columns_per_output == 2 else 200
    w = op_args(op_name, N, K, G, bias=False, seed=11)[:len(op.scheme.weights)]
    kern = native.get_kernel(op_name, torch.bfloat16, isa)
    one = kplan.forced_plan(_DECODE_ROWS).with_decode(kplan.DecodeSetting(2048, 0, int16_x))
    two = one.with_decode(kplan.DecodeSetting(2048, 0, int16_x, k_streams=2))
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(K)).bfloat16()
    x[0, 1] = 300.0
    ref = oracles.int4_mm(op_name, x.float(), *w, None, G, N, quantize_x=op.scheme.act_quant is not None)
    for threads in (1, 2):
        with config.patch(num_threads=threads):
            y1, y2 = kern(x, *w, None, G, N, plan=one), kern(x, *w, None, G, N, plan=two)
        torch.testing.assert_close(y2.float(), ref, rtol=1e-2, atol=1e-2 * float(ref.abs().max()))
        # one bf16 step at most (the bf16 output of two fp32 sums a few fp32 steps apart can round apart)
        torch.testing.assert_close(y2.float(), y1.float(), rtol=2 ** -7, atol=1e-5 * float(y1.float().abs().max()))


@pytest.mark.parametrize("isa", DECODE_ISAS)
@pytest.mark.parametrize("int16_x", [0, 1])
def test_decode_rows_fold_their_own_group_sums(isa, int16_x):
    """The decode kernels fold each row's sum of x per group, computed once per call (w4a16::group_sums,
    quantize_x_int16's sums of xi) and read by every panel pass: past the first 64-row cache block and
    the first 4-row block each row must get its own. Rows are offset by different constants, so a
    neighbour's sums would be off by (128 + z) * offset * G, far outside the tolerance; K slices that
    start inside a group (K = 384, G = 128, 2 threads) compute their partial sums in the kernel."""
    N = 64
    plan = kplan.forced_plan({"bf16_f32_min_m": 128, "panel_min_m": 1 << 40, "amx_min_m": 1 << 40})
    plan = plan.with_decode(kplan.DEFAULT_DECODE._replace(int16_x=int16_x))
    kern = native.get_kernel("int4_mm", torch.bfloat16, isa)
    for K, G, M in ((512, 64, 70), (384, 128, 13)):
        w = op_args("int4_mm", N, K, G, bias=False, seed=7)[:3]
        g = torch.Generator().manual_seed(K)
        x = (torch.randn(M, K, generator=g) + (torch.arange(M) % 7 - 3).float()[:, None]).bfloat16()
        ref = oracles.int4_mm("int4_mm", x.float(), *w, None, G, N)
        torch.testing.assert_close(kern(x, *w, None, G, N, plan=plan).float(), ref, rtol=1e-2,
                                   atol=1e-2 * float(ref.abs().max()))


@pytest.mark.parametrize("isa", DECODE_ISAS)
def test_int16_decode_runs_where_it_applies_and_nowhere_else(isa):
    """The int16 path is taken (a value 2^-17 of its group's largest rounds to zero on it, where the
    dpbf16 kernel keeps it, up to its fp32 rounding of the 128 + q offset), and not for G > 4096 (int32 sums no longer exact) or NaN/Inf in x (the
    exact fp32 path): there the outputs are the dpbf16 plan's."""
    K, N = 256, 64
    q = torch.full((N, K), 8, dtype=torch.uint8)
    q[:, 1] = 15  # q - z: 0 on every k but k = 1 (7)
    z, s = torch.full((N, K // 32), 8, dtype=torch.uint8), torch.ones(N, K // 32)
    w = schemes.OPS["int4_mm"].pack(q, z, s, 32, N)
    x = torch.zeros(1, K, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 1.0, 2.0 ** -17  # the output: 7 * 2^-17
    kern = native.get_kernel("int4_mm", torch.bfloat16, isa)
    bf16, int16 = _int16_plans()
    torch.testing.assert_close(kern(x, *w, None, 32, N, plan=bf16).float(), torch.full((1, N), 7 * 2.0 ** -17),
                               rtol=0.25, atol=0)
    assert torch.equal(kern(x, *w, None, 32, N, plan=int16), torch.zeros(1, N, dtype=torch.bfloat16))
    big = schemes.OPS["int4_mm"].pack(torch.cat([q] * 32, 1), z[:, :1], s[:, :1], 8192, N)  # G = K = 8192
    xb = torch.cat([x] * 32, 1)
    assert torch.equal(kern(xb, *big, None, 8192, N, plan=int16), kern(xb, *big, None, 8192, N, plan=bf16))
    xi = x.clone()
    xi[0, 5] = float("inf")
    torch.testing.assert_close(kern(xi, *w, None, 32, N, plan=int16), kern(xi, *w, None, 32, N, plan=bf16),
                               rtol=0, atol=0, equal_nan=True)  # inf * (q - z = 0): NaN, as the dense product