"""Eager native kernel (awq_inductor.native) against the fp32 reference, for every ISA this CPU runs."""
import os
import random

import pytest
import torch

from awq_inductor import codegen, config, native, ops, packing


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
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = torch.randn(N, K // G, generator=g) * 0.02  # signed scales
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    b = torch.randn(N, generator=g) if bias else None
    x = torch.randn(M, K, generator=g).to(dtype)  # signed activations
    return x, qw, sp, zp, b


def _check(x, qw, sp, zp, b, G, N):
    y = torch.ops.awq.int4_mm(x, qw, sp, zp, b, G, N)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype
    ref = ops.int4_mm_reference(x.float(), qw, sp, zp, b, G, N)
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
def test_amx_multi_row_bf16(isa):
    """Multi-row bf16 (the AMX path where it exists; GCC 12 tile-config pitfall): several configs in a row."""
    with config.patch(force_isa=isa):
        for M in (5, 16, 17, 32, 48, 64):
            _check(*_make(M, 256, 96, 128, False, torch.bfloat16, seed=M), 128, 96)


def test_m_zero():
    x, qw, sp, zp, b = _make(0, 64, 40, 32, True, torch.bfloat16)
    y = torch.ops.awq.int4_mm(x, qw, sp, zp, b, 32, 40)
    assert y.shape == (0, 40) and y.dtype == torch.bfloat16
    y = native.get_kernel(torch.float32, isa="portable")(x.float(), qw, sp, zp, b, 32, 40)
    assert y.shape == (0, 40)


def test_kernel_cache_per_isa():
    avail = [i for i in ("avx512", "portable") if _can_run(i)]
    ks = {}
    for isa in avail:
        with config.patch(force_isa=isa):
            ks[isa] = native.get_kernel(torch.float32)
            assert ks[isa].isa == isa
            assert native.get_kernel(torch.float32) is ks[isa]
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
            h = codegen.render_header(isa, dt)
            assert "int4_mm_driver" in h and "{{" not in h and "{%" not in h
            assert f"#define AWQ_TILE_N {codegen.TILE_N}" in h
            assert ("_tile_dpbf16ps" in h) == (isa == "amx" and dt == torch.bfloat16)
    assert "-mamx-tile" in codegen.compile_flags("amx") and "-mavx512bf16" in codegen.compile_flags("avx512")
    assert codegen.compile_flags("portable") == []
    assert codegen.dtype_ctype(torch.bfloat16) == "bfloat16" and codegen.dtype_ctype(torch.float16) == "half"
    with config.patch(force_isa="portable"):
        assert codegen.detect_isa() == "portable"
    with pytest.raises(ValueError):
        codegen.render_header("sse", torch.float32)
