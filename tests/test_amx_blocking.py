"""The AMX kernels' blocking, checked by instruction counts: nothing here can time AMX, so the tile
emulator (``config.amx_emulation``) counts every ldtilecfg / tileloadd / tilestored / tilezero /
tdp* and the bytes of B the AMX paths dequantize (``native.amx_emulator_counters``), and these tests
assert them against a model of the blocking in ``schemes/w4a16.h.j2`` (``kAmxKb``, ``kAmxMcMax``)
and ``schemes/w4a8.h.j2`` (``kAmxKb8``, ``kMcAmxMax``).

Before the redesign (commit 8916a04's counters; N=512, K=1024, G=128, 2 threads):
  W4A16: tileloadd/tdp 1.125 (M = 64, 128, 512), 1.225 (M=80), 1.164 (M=200); tilestored/tdp 0.125;
         ldtilecfg per call 2 when M % 32 == 0, 64 at M = 80 and 200 (one per strip and K chunk);
         B dequantized once per 128-row M block: 1x N*K*2 bytes at M <= 128, 2x at 200, 4x at 512.
  W4A8:  G=128: tileloadd/tdp 1.5 (1.6 at M=80), tilestored/tdp 0.5, ldtilecfg 2 / 128 (M=80, 200),
         B expanded 1x / 2x / 4x; G=1024 (channelwise): tileloadd/tdp 1.25, tilestored/tdp 0.25.
"""
from __future__ import annotations

import pytest
import torch

from helpers import op_args
from awq_inductor import config, ops
from awq_inductor.ops import oracles
from awq_inductor.kernels import isa as isa_mod
from awq_inductor.kernels import native

pytestmark = pytest.mark.skipif(isa_mod.hardware_isa() not in ("avx512", "amx"),
                                reason="the emulated AMX build needs AVX512-BF16 (dequantization, tails)")

N, K, THREADS = 512, 1024, 2
KB16, MC_MAX = 256, 512      # schemes/w4a16.h.j2: kAmxKb, kAmxMcMax (w4a8: kMcAmxMax)
KB8 = 512                    # schemes/w4a8.h.j2: kAmxKb8


def _strips(rows):
    """(2x2 strips of 32 rows, 1x2 strips of <= 16 rows) of an M block."""
    return rows // 32 + (rows % 32 > 16), int(0 < rows % 32 <= 16)


def _m_blocks(M):
    """Row counts of the M blocks (runtime/driver.h.j2 amx_block_rows; N tiles feed both threads)."""
    strips = -(-M // 32)
    nb = min(max(-(-M // MC_MAX), -(-THREADS // (N // 64))), strips)
    mc = -(-strips // nb) * 32
    return [min(mc, M - m0) for m0 in range(0, M, mc)]


def _expected(M, kb, kstep, groups_per_block_start):
    """Counter totals of one call: per M block, N tile, panel, K block and strip the kernel loads
    its C tiles (or zeroes them at a group's start), runs kb / kstep k steps of 2 A / 2 B loads and
    4 tdp (1 A, 2 B, 2 tdp for a <= 16-row strip) and stores C once."""
    c = dict(tileloadd=0, tilestored=0, tilezero=0, tdp=0)
    steps = kb // kstep
    blocks = K // kb
    for rows in _m_blocks(M):
        full, half = _strips(rows)
        for blk in range(blocks):
            zero = groups_per_block_start(blk)
            for tiles, a_tiles in ((4, 2), (2, 1)):
                n = (full if tiles == 4 else half) * (N // 32)
                c["tileloadd"] += n * ((0 if zero else tiles) + steps * (a_tiles + 2))
                c["tilezero"] += n * (tiles if zero else 0)
                c["tdp"] += n * steps * tiles
                c["tilestored"] += n * tiles
    return c


def _run(name, M, G, seed=0):
    args = op_args(name, N, K, G, seed=seed)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(torch.bfloat16)
    with config.patch(force_isa="amx", amx_emulation=True, num_threads=THREADS):
        k = native.get_kernel(name, torch.bfloat16)
        native.amx_emulator_counters(name, torch.bfloat16)  # reset
        y = k(x, *args)
        c = native.amx_emulator_counters(name, torch.bfloat16)
    ref = oracles.int4_mm(name, x.float(), *args)
    scale = ref.abs().max().item()
    assert (y.float() - ref).abs().max().item() <= 2e-2 * scale
    return c


@pytest.mark.parametrize("M,loads_before", [(64, 1.125), (80, 1.225), (200, 1.1635), (512, 1.125), (600, None)])
def test_w4a16_amx_blocking(M, loads_before):
    c = _run("int4_mm", M, 128)
    # one tile config per thread and call whatever M (was 64 per call at M = 80 and 200)
    assert c["ldtilecfg"] == THREADS and c["release"] == THREADS
    # C resident across each 256-k block: tileloadd per tdp 1 + 32/256 for 32-row strips
    assert {k: c[k] for k in ("tileloadd", "tilestored", "tilezero", "tdp")} == _expected(
        M, KB16, 32, lambda blk: False)
    if loads_before is not None:
        assert c["tileloadd"] / c["tdp"] <= loads_before + 1e-4
    assert c["tilestored"] / c["tdp"] <= 0.125 + 1e-9
    # B dequantized once per N tile and M block of up to 512 rows (was once per 128 rows: 4x at 512)
    assert c["dequant_bytes"] == N * K * 2 * len(_m_blocks(M))
    assert len(_m_blocks(M)) == (1 if M <= 512 else 2)


@pytest.mark.parametrize("M,loads_before", [(64, 1.5), (80, 1.6), (200, 1.5385), (512, 1.5)])
def test_w4a8_amx_int32_tiles_across_the_group(M, loads_before):
    """G=128: the group is the K block: int32 tiles zeroed, 2 k steps of 64, stored once, no C
    loads at all (was: C loaded and stored per 128-k chunk, 1.5 tileloadd per tdp)."""
    c = _run("int4_mm_a8", M, 128)
    assert c["ldtilecfg"] == THREADS
    exp = _expected(M, 128, 64, lambda blk: True)
    assert {k: c[k] for k in ("tileloadd", "tilestored", "tilezero", "tdp")} == exp
    assert c["tileloadd"] / c["tdp"] <= loads_before - 0.45
    if M % 32 == 0:
        assert c["tileloadd"] == c["tdp"]
    assert c["dequant_bytes"] == N * K  # expanded once per call (was 2x at M=200, 4x at 512)


@pytest.mark.parametrize("M", [64, 512])
def test_w4a8_amx_channelwise_k_blocks_of_512(M):
    """G = K (channelwise): 512-k blocks, the int32 tiles zeroed at the first and carried into the
    second: tileloadd/tdp 1.0625, tilestored/tdp 0.125 (was 1.25 / 0.25 with 256-k chunks)."""
    c = _run("int4_mm_a8", M, K)
    assert {k: c[k] for k in ("tileloadd", "tilestored", "tilezero", "tdp")} == _expected(
        M, KB8, 64, lambda blk: blk == 0)
    assert c["tileloadd"] / c["tdp"] == pytest.approx(1.0625)
    assert c["tilestored"] / c["tdp"] == pytest.approx(0.125)
    assert c["ldtilecfg"] == THREADS and c["dequant_bytes"] == N * K
