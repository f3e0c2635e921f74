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
