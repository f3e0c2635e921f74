"""AWQLinear: constructors from real AutoAWQ tensors, forward, dequantize, bad input."""
import glob
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from awq_inductor import AWQLinear, formats

from helpers import random_canonical

VECTORS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "vectors", "*.safetensors")))


def _vector(path):
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    return load_file(path), meta


def test_vectors_present():
    assert len(VECTORS) >= 15


@pytest.mark.parametrize("path", VECTORS, ids=[os.path.basename(p)[:-12] for p in VECTORS])
def test_from_awq_vectors(path):
    d, meta = _vector(path)
    G = int(meta["group_size"])
    lin = AWQLinear.from_awq(d["qweight"], d["qzeros"], d["scales"], d.get("bias"), group_size=G,
                             format=meta["format"])
    assert (lin.in_features, lin.out_features, lin.group_size) == (int(meta["K"]), int(meta["N"]), G)
    # exact integer truth survives unpack + kernel packing
    q, z, s = lin.canonical()
    assert torch.equal(q, d["q"]) and torch.equal(z, d["z"]) and torch.equal(s, d["s"])
    torch.testing.assert_close(lin.dequantize(), d["w"], rtol=0, atol=0)
    x = torch.randn(3, 2, lin.in_features)
    ref = x @ d["w"].t() + (d["bias"].float() if "bias" in d else 0)
    torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_from_gptq_round_trip(fmt):
    N, K, G = 64, 256, 128
    q, z, s = random_canonical(N, K, G)
    if fmt == "gptq":
        z = z.clamp_min(1)  # GPTQ v1 cannot store z = 0
    qw, qz, sc = formats.pack_gptq(q, z, s, G, format=fmt)
    lin = AWQLinear.from_gptq(qw, qz, sc, group_size=G, format=fmt)
    q2, z2, s2 = lin.canonical()
    assert torch.equal(q2, q) and torch.equal(z2, z) and torch.equal(s2, s.float())


def test_per_channel_group_and_leading_dims():
    N, K = 40, 128
    q, z, s = random_canonical(N, K, K)
    qw, qz, sc = formats.pack_gemm(q, z, s, K)
    lin = AWQLinear.from_awq(qw, qz, sc, group_size=-1, format="gemm")
    assert lin.group_size == K
    w = (q.float() - z.float()) * s.float()
    x = torch.randn(2, 3, 5, K)
    y = lin(x)
    assert y.shape == (2, 3, 5, N)
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-4)
    assert "in_features=128, out_features=40, group_size=128, bias=False" in repr(lin)


def test_bf16_forward_close_to_fp32_reference():
    N, K, G = 96, 256, 64
    q, z, s = random_canonical(N, K, G)
    lin = AWQLinear.from_canonical(q, z, s, torch.randn(N), group_size=G)
    x = torch.randn(7, K)
    ref = lin(x)
    y = lin(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_bad_input_names_tensor():
    N, K, G = 64, 128, 32
    q, z, s = random_canonical(N, K, G)
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    with pytest.raises(ValueError, match=r"x: expected last dim 128 \(in_features\), got 64"):
        lin(torch.randn(2, 64))
    with pytest.raises(ValueError, match=r"bias: expected shape \[64\], got \[3\]"):
        AWQLinear.from_canonical(q, z, s, torch.zeros(3), group_size=G)
    with pytest.raises(ValueError, match=r"group_size"):
        AWQLinear.from_canonical(q, z, s, group_size=48)
    qw, qz, sc = formats.pack_gemm(q, z, s, G)
    with pytest.raises(ValueError, match=r"format"):
        AWQLinear.from_awq(qw, qz, sc, group_size=G, format="marlin")
    with pytest.raises(ValueError, match=r"qzeros"):
        AWQLinear.from_awq(qw, qz.float(), sc, group_size=G, format="gemm")
