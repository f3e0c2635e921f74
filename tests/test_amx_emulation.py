"""Inductor lowering with the AMX micro-kernel rendered against the tile emulator
(awq_inductor.config.amx_emulation): the AMX template code compiles under Inductor's own flags on a
CPU without AMX (our #pragma GCC target covers AVX512-BF16) and matches the reference."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from helpers import op_args
from awq_inductor import config as awq_config
from awq_inductor.ops import oracles
from awq_inductor import ops

pytestmark = pytest.mark.skipif(
    not (torch.cpu._is_avx512_supported() and torch.cpu._is_avx512_bf16_supported()),
    reason="needs AVX512-BF16")


@pytest.fixture(autouse=True)
def _clean(inductor_clean):
    yield


def _weights(N, K, G, seed):
    return op_args("int4_mm", N, K, G, seed=seed)


def _check(out, ref):
    assert out.dtype == torch.bfloat16
    scale = ref.float().abs().max().item() + 1e-6
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2 * scale


# (600, 1024, 200, 128): two M blocks run M block outer over four N tiles (w4a16 amx_blocking), the
# last tile partial
@pytest.mark.parametrize("M,K,N,G", [(17, 256, 72, 128), (33, 80, 40, 40), (300, 128, 48, 32), (600, 1024, 200, 128)])
def test_inductor_amx_emulated_static(M, K, N, G):
    args = _weights(N, K, G, seed=M)
    x = torch.randn(M, K).to(torch.bfloat16)
    with awq_config.patch(force_isa="amx", amx_emulation=True):
        out, codes = run_and_get_code(torch.compile(lambda t: torch.ops.awq.int4_mm(t, *args), fullgraph=True), x)
    code = "\n".join(codes)
    assert "isa=amx" in code and "_tile_dpbf16ps" not in code
    assert "awq_int4_mm_amx-emulated_" in code  # the driver of the emulated library
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    _check(out, oracles.int4_mm("int4_mm", x.float(), *args))


def test_inductor_amx_emulated_dynamic_m_with_epilogue():
    args = _weights(72, 256, 64, seed=7)
    f = torch.compile(lambda t, r: torch.ops.awq.int4_mm(t, *args) + r, fullgraph=True)
    with awq_config.patch(force_isa="amx", amx_emulation=True):
        for M in (3, 5, 16, 17, 64):
            x = torch.randn(M, 256).to(torch.bfloat16)
            r = torch.randn(M, 72).to(torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(r, 0)
            _check(f(x, r), oracles.int4_mm("int4_mm", x.float(), *args) + r.float())
    assert counters["stats"]["unique_graphs"] == 1
