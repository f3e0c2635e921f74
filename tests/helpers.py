"""Random canonical int4 weights for tests."""
import torch

from awq_inductor import packing


def random_canonical(N, K, G, scale_dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn(N, K // G, generator=g) * 0.02).to(scale_dtype)  # signed scales
    return q, z, s


def random_packed(N, K, G, bias=False, seed=0):
    q, z, s = random_canonical(N, K, G, seed=seed)
    qw, sp, zp = packing.pack_for_kernel(q, z, s, G)
    b = torch.randn(N, generator=torch.Generator().manual_seed(seed + 1)) if bias else None
    return qw, sp, zp, b
