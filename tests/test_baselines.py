"""The gptqmodel-style baseline computes the same layer as AWQLinear (fp32 activations)."""
import pytest
import torch

from awq_inductor import AWQLinear
from awq_inductor.baselines import Int4PackLinear, to_int4pack

from helpers import random_canonical


def test_int4pack_matches_awq_linear():
    q, z, s = random_canonical(64, 256, 128)
    lin = AWQLinear.from_canonical(q, z, s, torch.randn(64), group_size=128)
    x = torch.randn(2, 3, 256)
    m = to_int4pack(torch.nn.Sequential(lin), torch.float32)
    assert isinstance(m[0], Int4PackLinear)
    torch.testing.assert_close(m(x), lin(x), rtol=1e-5, atol=1e-4)


def test_int4pack_rejects_what_aten_cannot_run():
    q, z, s = random_canonical(40, 128, 128)
    with pytest.raises(ValueError, match="N % 16"):
        Int4PackLinear(q, z, s, None, 128, torch.float32)


def test_baselines_replace_fused_gate_up():
    from awq_inductor import AWQGateUpSiluMul
    from awq_inductor.baselines import GateUpSiluMul, to_dense

    q, z, s = random_canonical(128, 256, 128)
    gate = AWQLinear.from_canonical(q[:64], z[:64], s[:64], torch.randn(64), group_size=128)
    up = AWQLinear.from_canonical(q[64:], z[64:], s[64:], None, group_size=128)
    fused = AWQGateUpSiluMul.from_gate_up(gate, up)
    x = torch.randn(3, 256)
    want = fused(x)
    for conv in (lambda m: to_int4pack(m, torch.float32), lambda m: to_dense(m, torch.float32)):
        m = conv(torch.nn.Sequential(AWQGateUpSiluMul.from_gate_up(gate, up)))
        assert isinstance(m[0], GateUpSiluMul)
        assert not any(isinstance(mod, (AWQGateUpSiluMul, AWQLinear)) for mod in m.modules())
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-4)


def test_woq_kernel_of_names_what_the_code_runs():
    from awq_inductor.baselines import woq_kernel_of

    assert woq_kernel_of("... _tile_dpbf16ps(0, 1, 2) ...") == "inductor_woq_amx"
    assert woq_kernel_of("inline __m128i cpp_micro_gemm_convert_int4_to_int8(") == "inductor_woq_avx512"
    assert woq_kernel_of("buf0 = torch.ops.aten._weight_int4pack_mm_for_cpu.default(x, w, 128, sz)") \
        == "aten_extern"
    assert woq_kernel_of("") == "none"


@pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(), reason="Inductor's WOQ template needs AVX512")
def test_inductor_woq_baseline_reaches_the_template(inductor_clean):
    """The benchmark's inductor_woq column runs Inductor's WOQ int4 template, not aten's kernel."""
    from awq_inductor.baselines import compile_inductor_woq

    q, z, s = random_canonical(128, 256, 128)
    m = Int4PackLinear(q, z, s, None, 128, torch.bfloat16)
    x = torch.randn(8, 256).to(torch.bfloat16)
    fn, kernel = compile_inductor_woq(m, x)
    assert kernel in ("inductor_woq_amx", "inductor_woq_avx512")
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x), rtol=2e-2, atol=2e-2)
