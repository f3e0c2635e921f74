"""What every checkpoint format shares: the canonical form, validation, nibble helpers, the record
of where a module came from, and the :class:`CheckpointFormat` contract.

Canonical form (what the rest of the package consumes, whatever the checkpoint stored)::

    q       uint8  [N, K]      values 0..15
    zeros   uint8  [N, K/G]    values 0..15
    scales  [N, K/G]           the checkpoint's dtype (fp16 stays fp16, so no rounding is added)
    W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]

N = out_features, K = in_features, G = group size (-1 means per-channel, G = K).

Implementation notes (why the code looks the way it does):
* Words are split into nibbles through a ``uint8`` view: byte b of a little-endian word holds
  nibbles 2b (low) and 2b+1 (high). This sidesteps int32/int16 sign extension entirely and works
  on 1-byte elements, which keeps a 7B layer (K=4096, N=11008) well under a second on two cores.
* Bad input raises ``ValueError`` naming the tensor, the expected and the actual value, because
  loaders surface these messages to users with mis-labelled checkpoints.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Dict, Mapping, NamedTuple, Optional, Tuple

import torch

if sys.byteorder != "little":  # pragma: no cover - x86 and ARM Linux are little-endian
    raise ImportError("awq_inductor.formats assumes a little-endian host (uint8 views of int words)")

Shape = Tuple[int, ...]


class Canonical(NamedTuple):
    """One int4 linear in canonical form (see the module docstring)."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor


#: One part of a fused module in its checkpoint: (module name, out_features, has bias).
Part = Tuple[str, int, bool]


@dataclasses.dataclass(frozen=True)
class CheckpointSource:
    """Where an int4 module came from, so ``save_pretrained`` writes the checkpoint back as it was:
    the format name, the stored scales / bias dtypes, and for a fused module its parts in output
    order (``None``: the module itself). Experts modules also record their per-expert projection
    names and whether the checkpoint stored them fused 3-D; a tensor-parallel shard records its
    slice (informational)."""

    format: Optional[str] = None
    scales_dtype: Optional[torch.dtype] = None
    bias_dtype: Optional[torch.dtype] = None
    parts: Optional[Tuple[Part, ...]] = None
    expert_names: Optional[Tuple[str, str, str]] = None
    fused_experts: bool = False
    tp_slice: Optional[tuple] = None

    def replace(self, **changes) -> "CheckpointSource":
        return dataclasses.replace(self, **changes)


def source_of(module) -> CheckpointSource:
    """The :class:`CheckpointSource` a module carries (an empty one if it has none)."""
    return getattr(module, "awq_source", None) or CheckpointSource()


# --------------------------------------------------------------------------- validation
def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_tensor(name: str, t: torch.Tensor, dtype, shape) -> None:
    """dtype: a torch.dtype, or "float" for any floating dtype. shape: tuple or None (any 2-D)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype == "float":
        dtype_ok, want_dtype = t.is_floating_point(), "floating"
    else:
        dtype_ok, want_dtype = t.dtype == dtype, dtype_name(dtype)
    if shape is None:
        shape_ok, want_shape = t.dim() == 2, "2-D"
    else:
        shape_ok, want_shape = tuple(t.shape) == tuple(shape), fmt_shape(shape)
    if not (dtype_ok and shape_ok):
        raise ValueError(f"{name}: expected {want_dtype} {want_shape}, got {t.dtype} {fmt_shape(t.shape)}")


def check_divisible(what: str, value: int, divisor: int, why: str) -> None:
    if value % divisor != 0:
        raise ValueError(f"{what}: expected a multiple of {divisor} ({why}), got {value}")


def _check_int4_range(name: str, t: torch.Tensor) -> None:
    # Values >= 16 would silently bleed into the neighbouring nibble when packed.
    if t.numel() and int(t.max()) > 15:
        raise ValueError(f"{name}: expected values 0..15, got max {int(t.max())}")


def resolve_group_size(group_size: int, in_features: int) -> int:
    """-1 (per-channel) -> K; otherwise check 0 < G and K % G == 0. Returns G."""
    group_size = int(group_size)
    if group_size == -1:
        return int(in_features)
    if group_size <= 0:
        raise ValueError(f"group_size: expected -1 or a positive integer, got {group_size}")
    if in_features % group_size != 0:
        raise ValueError(f"group_size: expected a divisor of in_features={in_features}, got {group_size}")
    return group_size


def check_canonical(q, zeros, scales, group_size, *, values: bool = True) -> Tuple[int, int, int]:
    """Validate canonical (q, zeros, scales); return (N, K, G). ``values``: also check that q and
    zeros fit in 4 bits (a full pass over q: the checkpoint packers need it, the kernel packers,
    fed by an unpacker, do not)."""
    check_tensor("q", q, torch.uint8, None)
    N, K = q.shape
    G = resolve_group_size(group_size, K)
    ng = K // G
    check_tensor("zeros", zeros, torch.uint8, (N, ng))
    check_tensor("scales", scales, "float", (N, ng))
    if values:
        _check_int4_range("q", q)
        _check_int4_range("zeros", zeros)
    return N, K, G


class ActOrderError(ValueError, NotImplementedError):
    """A GPTQ ``g_idx`` that is not ``k // G`` (act-order): a bad value and an unsupported feature."""


def check_g_idx(g_idx: Optional[torch.Tensor], K: int, G: int, where: str = "g_idx") -> None:
    """Only g_idx[k] == k // G (desc_act=False) is read as is; anything else needs a K permutation."""
    if g_idx is None:
        return
    if not isinstance(g_idx, torch.Tensor) or tuple(g_idx.shape) != (K,) or g_idx.is_floating_point():
        got = f"{g_idx.dtype} {fmt_shape(g_idx.shape)}" if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ValueError(f"{where}: expected int [{K}], got {got}")
    if not torch.equal(g_idx.to(torch.int64), torch.arange(K, device=g_idx.device) // G):
        raise ActOrderError(f"{where}: expected k // group_size (desc_act=False); an act-order (desc_act=True) "
                            "g_idx is supported for dense linears only (sorted at load), not for MoE experts "
                            "or foreign int4 modules")


def act_order_perm(g_idx: Optional[torch.Tensor], K: int, G: int, where: str = "g_idx") -> Optional[torch.Tensor]:
    """The input permutation of an act-order ``g_idx`` (None when g_idx is None or ``k // G``):
    ``perm = argsort(g_idx, stable)``, so that ``g_idx[perm] == k // G`` (contiguous groups of
    exactly G; anything else is refused). ``W[:, perm]`` is then an ordinary grouped weight and
    ``x @ W.T == x[:, perm] @ W[:, perm].T``; stable keeps each group's original column order."""
    if g_idx is None:
        return None
    if not isinstance(g_idx, torch.Tensor) or tuple(g_idx.shape) != (K,) or g_idx.is_floating_point():
        got = f"{g_idx.dtype} {fmt_shape(g_idx.shape)}" if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ValueError(f"{where}: expected int [{K}], got {got}")
    g = g_idx.to(torch.int64)
    want = torch.arange(K, device=g.device) // G
    if torch.equal(g, want):
        return None
    perm = torch.argsort(g, stable=True)
    if not torch.equal(g[perm], want):
        counts = torch.bincount(g.clamp(min=0), minlength=K // G)
        raise ValueError(f"{where}: expected every group id 0..{K // G - 1} exactly {G} times (act-order), got "
                         f"counts {counts[:8].tolist()}{'...' if counts.numel() > 8 else ''}")
    return perm


def invert_perm(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


# --------------------------------------------------------------------------- nibble helpers
def words_to_nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., 8W] or int16 [..., W] -> uint8 [..., 4W]; nibble i of each
    word lands at position i (sequential, least-significant nibble first)."""
    # Flatten before .view(dtype): a contiguous tensor with a size-1 dim may carry a stride
    # that .view rejects; a 1-D contiguous tensor never does.
    b = words.contiguous().reshape(-1).view(torch.uint8)  # little-endian byte order
    b = b.reshape(*words.shape[:-1], -1)  # [..., W * bytes]
    nib = torch.stack((b & 0xF, b >> 4), dim=-1)  # uint8 >> is logical: no sign issue
    return nib.reshape(*b.shape[:-1], b.shape[-1] * 2)


def nibbles_to_words(nib: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`words_to_nibbles`: uint8 [..., M] (values < 16) -> dtype words."""
    nib = nib.to(torch.uint8)
    b = (nib[..., 0::2] | (nib[..., 1::2] << 4)).contiguous()
    return b.reshape(-1).view(dtype).reshape(*b.shape[:-1], -1)


# --------------------------------------------------------------------------- the contract
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: Index of a stored tensor to read: one slice per leading dim (safetensors get_slice).
Index = Tuple[slice, ...]


class CheckpointFormat:
    """One checkpoint int4 layout: the tensors one linear stores, their shapes and dtypes, and the
    exact unpack (checkpoint -> :class:`Canonical`) / pack (the inverse, bit-identical) pair.

    Subclasses set :attr:`name`, :attr:`quant_method` and implement :meth:`shapes`,
    :meth:`infer_shape`, :meth:`unpack` and :meth:`pack`; :meth:`row_slices` / :meth:`col_slices`
    say which slice of each stored tensor holds a block of output rows / input columns (the
    tensor-parallel per-rank loader), None where the layout has no clean slice."""

    name: str = ""
    quant_method: str = ""
    #: the int4 tensors of one linear, in the order of :meth:`unpack`'s arguments
    tensors: Tuple[str, ...] = ("qweight", "qzeros", "scales")
    #: the format also stores ``g_idx`` [K] (written by :meth:`pack`, checked by :meth:`unpack`)
    has_g_idx: bool = False
    #: the format stores symmetric weights: zeros are exactly 8 (what :mod:`awq_inductor.testing` quantizes for)
    symmetric: bool = False
    #: the stored tensor holding the scales (its dtype is the checkpoint's scales dtype)
    scales_tensor: str = "scales"

    def shapes(self, K: int, N: int, G: int) -> Dict[str, Tuple[Shape, torch.dtype]]:
        raise NotImplementedError

    def dtypes(self) -> Dict[str, Tuple[str, Tuple[torch.dtype, ...]]]:
        """Stored tensor -> (description, accepted dtypes) (checkpoint header checks)."""
        return {"qweight": ("int32", (torch.int32,)), "qzeros": ("int32", (torch.int32,)),
                "scales": ("float16/bfloat16/float32", FLOATS), "bias": ("float16/bfloat16/float32", FLOATS),
                "g_idx": ("an integer dtype", (torch.int32, torch.int64, torch.int16))}

    def infer_shape(self, qweight: torch.Tensor) -> Tuple[int, int]:
        """(in_features, out_features) from a stored qweight alone."""
        raise NotImplementedError

    #: the format's unpack / pack functions (module level, so tests can call them directly)
    unpack_fn = None
    pack_fn = None

    def unpack(self, qweight, qzeros, scales, group_size: int, g_idx=None) -> Canonical:
        return type(self).unpack_fn(qweight, qzeros, scales, group_size)

    def pack(self, q, zeros, scales, group_size: int) -> Dict[str, torch.Tensor]:
        """Canonical -> the stored tensors (``g_idx`` included where the format has one)."""
        return dict(zip(self.tensors, type(self).pack_fn(q, zeros, scales, group_size)))

    def unpack_stored(self, stored: Mapping[str, torch.Tensor], group_size: int) -> Canonical:
        """:meth:`unpack` of a name -> tensor mapping (a module's buffers, a state dict's entries)."""
        return self.unpack(*(stored[t] for t in self.tensors), group_size,
                           g_idx=stored.get("g_idx") if self.has_g_idx else None)

    def quantization_config(self, group_size: int, modules_to_not_convert=None) -> Dict:
        """The ``quantization_config`` of config.json a checkpoint in this format carries."""
        raise NotImplementedError

    def recognizes(self, qc: Mapping) -> bool:
        """Whether a config.json ``quantization_config`` (its ``quant_method`` already matched) is this format."""
        raise NotImplementedError

    def check_config(self, qc: Mapping) -> None:
        """Raise (NotImplementedError naming the field) for a setting of this format we cannot run."""

    def group_size(self, qc: Mapping) -> int:
        """The group size a ``quantization_config`` declares (-1: per channel)."""
        return int(qc.get("group_size", qc.get("q_group_size", -1)))

    def skipped_modules(self, qc: Mapping, modules) -> list:
        """Names among ``modules`` ((name, class) of the model's linears) that the config keeps in
        float (beyond ``modules_to_not_convert``): compressed-tensors ``ignore`` / ``targets``,
        AutoRound ``extra_config`` 16-bit layers and ``block_name_to_quantize``."""
        return []

    def row_slices(self, n0: int, n1: int) -> Optional[Dict[str, Index]]:
        return None

    def col_slices(self, k0: int, k1: int, G: int) -> Optional[Dict[str, Index]]:
        return None

    def __repr__(self) -> str:
        return f"<checkpoint format {self.name!r} ({self.quant_method})>"


#: AWQ ``version`` tags stored on disk -> the format whose tensors they hold (AutoAWQ's exllama /
#: ipex are runtime repacks of GEMM tensors; llm-awq TinyChat is GEMVFast's layout).
AWQ_VERSION_ALIASES = {"exllama": "gemm", "ipex": "gemm", "llm-awq": "gemv_fast"}


def config_text(value) -> str:
    """A config value as lower-case text (str enums such as transformers' QuantizationMethod too)."""
    return str(getattr(value, "value", value)).lower()


def awq_version(version) -> str:
    """An AWQ ``version`` / ``format`` value (an enum or a string, any case) with its aliases resolved."""
    fmt = config_text(version)
    return AWQ_VERSION_ALIASES.get(fmt, fmt)


class AwqFormat(CheckpointFormat):
    """An AutoAWQ ``version`` (``quant_method: awq``); its name is the version tag."""

    quant_method = "awq"

    def recognizes(self, qc):
        return awq_version(qc.get("version", qc.get("format", "gemm"))) == self.name

    def check_config(self, qc):
        if not qc.get("zero_point", True):
            raise NotImplementedError("awq_inductor: AWQ checkpoints without zero_point are not supported")

    def quantization_config(self, group_size, modules_to_not_convert=None):
        # what AutoAWQ writes (awq/models/_config.py::AwqConfig.to_transformers_dict)
        return {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": self.name,
                "modules_to_not_convert": modules_to_not_convert}
