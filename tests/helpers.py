"""Random int4 weights for tests: the canonical form, and the packed arguments of any op."""
import torch

from awq_inductor.schemes import OPS


def random_canonical(N, K, G, scale_dtype=torch.float16, seed=0, *, scale=0.02, signed=True, generator=None):
    """(q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G]); scales ``scale * randn`` (``signed``)
    or ``scale * rand + 1e-4``, in ``scale_dtype``."""
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = torch.randn(N, K // G, generator=g) * scale if signed else torch.rand(N, K // G, generator=g) * scale + 1e-4
    return q, z, s.to(scale_dtype)


def op_args(name, out_features, K, G, *, bias=True, seed=0, scale=0.02, signed=True, canonical=False):
    """The arguments after x of ``torch.ops.awq.<name>``: ``(*packed, bias or None, G, out_features)``,
    from random canonical weights of the op's packed width (``[gate ; up]`` for the gate|up ops).
    ``canonical``: also return the canonical (q, zeros, scales, bias)."""
    op = OPS[name]
    g = torch.Generator().manual_seed(seed)
    n = op.columns(out_features)
    q, z, s = random_canonical(n, K, G, torch.float32, scale=scale, signed=signed, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    args = (*op.pack(q, z, s, G, out_features), None if b is None else op.pack_bias(b, out_features), G, out_features)
    return (args, (q, z, s, b)) if canonical else args


def random_packed(N, K, G, bias=False, seed=0):
    """W4A16 ``int4_mm`` weights: (qweight, scales, zeros, bias or None)."""
    return op_args("int4_mm", N, K, G, bias=bias, seed=seed)[:4]
