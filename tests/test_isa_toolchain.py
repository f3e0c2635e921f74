"""Missing pieces get one clear message, decided when a kernel is built or code is generated:
no C++ compiler, AMX in CPUID but the tile permission refused, a CPU without AVX512-BF16."""
from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch

from awq_inductor import AWQLinear
from awq_inductor.kernels import isa, native, toolchain
from helpers import random_canonical

AMX_CPU = isa.CpuFeatures(avx512=True, avx512_bf16=True, amx_tile=True)
AVX2_CPU = isa.CpuFeatures(avx512=False, avx512_bf16=False, amx_tile=False)


def _layer(N=64, K=128, G=32):
    q, z, s = random_canonical(N, K, G, seed=3)
    return AWQLinear.from_canonical(q, z, s, group_size=G)


def _fresh_native(monkeypatch, tmp_path):
    """No kernel built in this process nor on disk."""
    native.forget_kernels()
    monkeypatch.setenv("AWQ_INDUCTOR_CACHE_DIR", str(tmp_path / "awq"))


def test_no_compiler_clear_error_at_first_use(monkeypatch, tmp_path):
    _fresh_native(monkeypatch, tmp_path)
    monkeypatch.delenv("CXX", raising=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    lin = _layer()
    with pytest.raises(toolchain.CompilerNotFoundError) as e:
        lin(torch.randn(2, 128))
    msg = str(e.value)
    assert "$CXX is unset and there is no g++ on PATH" in msg and "apt-get install g++" in msg, msg
    assert "Inductor" in msg
    # torch.compile with our backend: the same message, before Inductor starts compiling
    import awq_inductor.inductor.backend  # noqa: F401

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"no C\+\+ compiler found"):
        torch.compile(lin, backend="awq_inductor")(torch.randn(2, 128))
    torch._dynamo.reset()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(toolchain.CompilerNotFoundError, match=r"\$CXX='.*no-such-g\+\+' is not an executable"):
        lin(torch.randn(2, 128))


def test_amx_permission_refused_falls_back_to_avx512_with_one_warning(monkeypatch, tmp_path):
    if isa.select() == "portable":
        pytest.skip("needs AVX512-BF16 to run the AVX512 fallback")
    _fresh_native(monkeypatch, tmp_path)
    asked = []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with isa.fake_cpu(AMX_CPU, amx_permission=lambda: asked.append(1) or False):
            assert isa.select() == "avx512"
            assert isa.select() == "avx512"  # decided once
            lin = _layer()
            x = torch.randn(7, 128, dtype=torch.bfloat16)
            y = lin(x)
            assert native.get_kernel("int4_mm", torch.bfloat16).isa == "avx512"
            from awq_inductor.inductor import lowering

            assert lowering.choose_isa() == "avx512"
    msgs = [str(w.message) for w in rec if "AMX" in str(w.message)]
    assert len(msgs) == 1 and "refused the AMX tile permission" in msgs[0] and "AVX512" in msgs[0], msgs
    assert asked == [1]  # the permission was requested once
    ref = (x.float() @ lin.dequantize().t()).to(torch.bfloat16)
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)


def test_amx_permission_granted_picks_amx():
    with isa.fake_cpu(AMX_CPU, amx_permission=True):
        assert isa.hardware_isa() == "amx"


def test_avx2_only_cpu_runs_portable_named_in_one_log_line(monkeypatch, tmp_path, caplog, inductor_clean):
    _fresh_native(monkeypatch, tmp_path)
    from torch._inductor.utils import run_and_get_code

    caplog.set_level(logging.INFO, logger="awq_inductor")
    with isa.fake_cpu(AVX2_CPU):
        assert isa.select() == "portable"
        lin = _layer()
        x = torch.randn(5, 128)
        y = lin(x)
        assert native.get_kernel("int4_mm", torch.float32).isa == "portable"
        yc, codes = run_and_get_code(torch.compile(lin), x)
        assert re.findall(r"awq::int4_mm\s+isa=(\w+)", "\n".join(codes)) == ["portable"]
    lines = [r for r in caplog.records if r.name.startswith("awq_inductor") and "portable" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "no AVX512F / AVX512-BF16" in lines[0].getMessage() and lines[0].levelno == logging.WARNING
    ref = x @ lin.dequantize().t()
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(yc, ref, atol=1e-4, rtol=1e-4)
