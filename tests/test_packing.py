import time

import pytest
import torch

from helpers import random_canonical
from awq_inductor import packing


_canonical = random_canonical


@pytest.mark.parametrize("N,K,G,sdt", [
    (32, 64, 32, torch.float16),
    (40, 128, 64, torch.bfloat16),    # N not a multiple of 32
    (72, 96, 96, torch.float32),      # G = K
    (200, 256, 128, torch.float16),
    (1, 16, 2, torch.float32),        # tiny
])
def test_round_trip(N, K, G, sdt):
    q, z, s = _canonical(N, K, G, sdt)
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    np_ = -(-N // 32)
    assert qw.shape == (np_, K // 2, 32) and qw.dtype == torch.uint8
    assert sp.shape == (K // G, np_ * 32) and sp.dtype == torch.float32
    assert zp.shape == (K // G, np_ * 32) and zp.dtype == torch.uint8
    q2, z2, s2 = packing.unpack_from_kernel(qw, sp, zp, N)
    assert torch.equal(q2, q)
    assert torch.equal(z2, z)
    assert torch.equal(s2, s.float())
    # padded columns contribute zero
    if np_ * 32 > N:
        assert torch.all(sp[:, N:] == 0) and torch.all(zp[:, N:] == 0)
        q_all = packing.unpack_from_kernel(qw, sp, zp, np_ * 32)[0]
        assert torch.all(q_all[N:] == 0)
    w = packing.dequantize_canonical(*packing.unpack_from_kernel(qw, sp, zp, N), G)
    ref = (q.float() - z.float().repeat_interleave(G, 1)) * s.float().repeat_interleave(G, 1)
    assert torch.equal(w, ref)


def test_byte_layout():
    N, K, G = 64, 8, 8
    q, z, s = _canonical(N, K, G)
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    assert qw[0, 0, 0] == q[0, 0] | (q[16, 0] << 4)
    assert qw[0, 0, 1] == q[0, 1] | (q[16, 1] << 4)
    assert qw[0, 0, 2] == q[1, 0] | (q[17, 0] << 4)
    assert qw[0, 2, 31] == q[15, 5] | (q[31, 5] << 4)
    assert qw[1, 3, 6] == q[32 + 3, 6] | (q[48 + 3, 6] << 4)
    # scales/zeros group-major: [K/G, Npad]
    assert sp[0, 33] == s[33, 0].float() and zp[0, 33] == z[33, 0]
    # exhaustive check of the documented formula on one panel
    for kp in range(K // 2):
        for b in range(32):
            j, t = b // 2, b % 2
            assert qw[1, kp, b] == q[32 + j, 2 * kp + t] | (q[32 + 16 + j, 2 * kp + t] << 4)


def test_bad_inputs():
    q, z, s = _canonical(32, 64, 32)
    with pytest.raises(ValueError, match="q"):
        packing.pack_for_kernel(q.int(), z, s, 32)
    with pytest.raises(ValueError, match="q"):
        packing.pack_for_kernel(q[0], z, s, 32)
    with pytest.raises(ValueError, match="group_size"):
        packing.pack_for_kernel(q, z, s, 48)       # not a divisor of K
    with pytest.raises(ValueError, match="group_size"):
        packing.pack_for_kernel(q, z, s, 0)
    q2, z2, s2 = _canonical(4, 6, 3)
    with pytest.raises(ValueError, match="group_size"):
        packing.pack_for_kernel(q2, z2, s2, 3)     # odd group
    with pytest.raises(ValueError, match="zeros"):
        packing.pack_for_kernel(q, z[:, :1], s, 32)
    with pytest.raises(ValueError, match="zeros"):
        packing.pack_for_kernel(q, z.int(), s, 32)
    with pytest.raises(ValueError, match="scales"):
        packing.pack_for_kernel(q, z, s[:, :1], 32)
    with pytest.raises(ValueError, match="scales"):
        packing.pack_for_kernel(q, z, s.to(torch.int32), 32)


def test_pack_7b_layer_fast():
    N, K, G = 11008, 4096, 128
    q, z, s = _canonical(N, K, G)
    packing.pack_for_kernel(q[:64], z[:64], s[:64], G)  # warm-up
    t = time.perf_counter()
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    dt = time.perf_counter() - t
    assert qw.shape == (N // 32, K // 2, 32)
    assert dt < 1.0, f"packing a 7B MLP layer took {dt:.2f} s"
