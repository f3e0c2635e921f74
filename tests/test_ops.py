"""awq::int4_mm: schema, fake impl (symbolic M), opcheck, eager numerics, bad input."""
import pytest
import torch
import torch._dynamo.testing

import awq_inductor  # noqa: F401
from awq_inductor import ops
from awq_inductor.kernels.plan import NEVER
from awq_inductor.ops import oracles

from helpers import random_packed

OP = torch.ops.awq.int4_mm.default


def test_schema_uses_plain_int():
    s = str(OP._schema)
    assert "int group_size" in s and "int out_features" in s and "SymInt" not in s
    assert "Tensor? bias" in s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,K,N,G,bias", [
    (1, 64, 32, 32, False), (3, 128, 40, 64, True), (17, 256, 96, 256, True), (0, 64, 64, 32, False),
])
def test_opcheck(dtype, M, K, N, G, bias):
    qw, s, z, b = random_packed(N, K, G, bias=bias)
    x = torch.randn(M, K, dtype=dtype)
    torch.library.opcheck(OP, (x, qw, s, z, b, G, N))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("M", [0, 1, 4, 5, 33])
def test_eager_matches_reference(dtype, tol, M):
    K, N, G = 256, 72, 64
    qw, s, z, b = random_packed(N, K, G, bias=True, seed=M)
    x = torch.randn(M, K, dtype=dtype)
    y = OP(x, qw, s, z, b, G, N)
    assert y.shape == (M, N) and y.dtype == dtype
    ref = oracles.int4_mm("int4_mm", x.float(), qw, s, z, b, G, N)
    scale = ref.abs().max().clamp_min(1e-6) if M else 1.0
    torch.testing.assert_close(y.float() / scale, ref / scale, rtol=0, atol=tol)


def test_fake_impl_symbolic_m():
    K, N, G = 128, 64, 32
    qw, s, z, _ = random_packed(N, K, G)

    def f(x, qw, s, z):
        return OP(x, qw, s, z, None, G, N)

    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(5, K), qw, s, z)
    nodes = [n for n in gm.graph.nodes if n.target is OP]
    assert len(nodes) == 1
    val = nodes[0].meta["val"]
    assert isinstance(val.shape[0], torch.SymInt) and val.shape[1] == N


def test_dynamic_m_traces_once():
    K, N, G = 128, 64, 32
    qw, s, z, _ = random_packed(N, K, G)
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    f = torch.compile(lambda x: OP(x, qw, s, z, None, G, N), backend=cnt, dynamic=True, fullgraph=True)
    for M in (3, 7, 20):
        x = torch.randn(M, K)
        torch.testing.assert_close(f(x), oracles.int4_mm("int4_mm", x, qw, s, z, None, G, N), rtol=1e-5, atol=1e-5)
    assert cnt.frame_count == 1


def _args(**over):
    K, N, G = 128, 64, 32
    qw, s, z, b = random_packed(N, K, G, bias=True)
    a = dict(x=torch.randn(2, K), qweight=qw, scales=s, zeros=z, bias=b, group_size=G, out_features=N)
    a.update(over)
    return a


@pytest.mark.parametrize("over,match", [
    (dict(x=torch.randn(2, 128, dtype=torch.float64)), r"x: expected dtype .* got torch.float64"),
    (dict(x=torch.randn(2, 100)), r"x: expected last dim K=128 .* got 100"),
    (dict(x=torch.randn(2, 1, 128)), r"x: expected a 2-D"),
    (dict(qweight=torch.zeros(2, 64, 32, dtype=torch.int32)), r"qweight: expected uint8"),
    (dict(scales=torch.zeros(4, 64, dtype=torch.float16)), r"scales: expected float32 \[4, 64\], got torch.float16"),
    (dict(zeros=torch.zeros(2, 64, dtype=torch.uint8)), r"zeros: expected uint8 \[4, 64\], got torch.uint8 \[2, 64\]"),
    (dict(bias=torch.zeros(63)), r"bias: expected float32 \[64\]"),
    (dict(group_size=48), r"group_size: expected an even divisor of K=128, got 48"),
    (dict(out_features=100), r"out_features: expected a value in \(32, 64\]"),
])
def test_bad_input(over, match):
    a = _args(**over)
    with pytest.raises(ValueError, match=match):
        OP(a["x"], a["qweight"], a["scales"], a["zeros"], a["bias"], a["group_size"], a["out_features"])


@pytest.mark.parametrize("M", range(1, 9))
@pytest.mark.parametrize("K,N,G", [(512, 200, 128), (384, 96, 384), (256, 64, 32)])
def test_decode_rows_bf16(M, K, N, G):
    """bf16 M = 1..8 (the one-pass decode kernel; N = 200 leaves a 1-panel last tile, G = K one
    group): each row within bf16 output rounding of the fp32 reference. The plan keeps AMX off, so
    an AMX host runs the decode kernel too (its tiles take bf16-rounded weights from 5 rows: the
    dense numerics, tested in test_native.py)."""
    qw, s, z, b = random_packed(N, K, G, bias=True, seed=M * 7 + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(torch.bfloat16)
    with awq_inductor.config.patch(kernel_plan={"amx_min_m": NEVER}):
        y = OP(x, qw, s, z, b, G, N).float()
    ref = oracles.int4_mm("int4_mm", x.float(), qw, s, z, b, G, N)
    scale = ref.abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(y / scale, ref / scale, rtol=0, atol=4e-3)
