"""The dense candidate: the "never slower than dense" kernel path, also what the eager op runs from
``plan.dense_min_m`` rows. Blocks of packed columns are dequantized exactly into x's dtype by our
C++ (``runtime/dense.h.j2``), each followed by the dense GEMM (``F.linear``: oneDNN)."""
from __future__ import annotations

import threading
from typing import Optional

import torch
import torch.nn.functional as F

from ..schemes import Op
from . import native

# ---------------------------------------------------------------------------------------------
# The dense candidate (also what the eager op runs from plan.dense_min_m rows)
#: Bytes of one dequantized weight block of the dense candidate (x's dtype, [columns, K]). Each
#: block costs three OpenMP regions (dequantization, GEMM, copy into the output), and on the shared
#: 2-vCPU Zen 4 VM (load 4-7) every region waits for a preempted thread: bf16, M = 128-512, dense /
#: F.linear of the pre-dequantized weight was 1.07-1.11 (4096 x 4096) with 4 MiB blocks at load 4
#: but 1.8-5.2 with 2-8 MiB blocks at load 7, against 1.06-1.28 for one block (the whole weight).
#: Large blocks keep the region count at 1-6 per call for the Llama-7B shapes; the per-block GEMM
#: itself loses under 2% from 256 columns on (4096 x 4096, M = 128 and 512, idle).
DENSE_BLOCK_BYTES = 32 << 20
_dense_buffers = threading.local()


def dense_block_columns(K: int, itemsize: int, block_bytes: Optional[int] = None) -> int:
    """Packed columns per block: a multiple of 64 (a gate|up block holds whole gate + up panel
    pairs), at least 64."""
    return max(64, (block_bytes or DENSE_BLOCK_BYTES) // (K * itemsize) // 64 * 64)


def _block_buffer(rows: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread [rows, K] buffer, reused across calls (a fresh allocation of many MiB per call is an
    mmap and page faults; concurrent callers on other threads get their own)."""
    bufs = getattr(_dense_buffers, "bufs", None)
    if bufs is None:
        bufs = _dense_buffers.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < rows * K:
        buf = bufs[dtype] = torch.empty(rows * K, dtype=dtype)
    return buf[: rows * K].view(rows, K)


def dense_call(op: Op, x: torch.Tensor, *args, block_bytes: Optional[int] = None) -> torch.Tensor:
    """Blockwise dense: for each block of packed columns, the C++ dequantization
    (``runtime/dense.h.j2``, exact: (q - z) * s rounded once to x's dtype) into a reused buffer,
    then ``F.linear`` in x's dtype (oneDNN) with the block's bias, and for the gate|up op
    ``silu(gate) * up`` of the block's interleaved 32-column panel pairs. Never slower than the
    dense model by more than the dequantization, which runs from cache, not DRAM."""
    *weights, bias, group_size, out_features = args
    qweight, scales, zeros = weights[:3]
    n, cpo = op.columns(out_features), op.spec.columns_per_output
    M, K = x.shape
    deq = native.get_dequant(op.scheme.name, x.dtype)
    nb = min(n, dense_block_columns(K, x.element_size(), block_bytes))
    buf = _block_buffer(nb, K, x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    y = None if nb >= n else torch.empty(M, out_features, dtype=x.dtype)
    for n0 in range(0, n, nb):
        n1 = min(n, n0 + nb)
        yb = F.linear(x, deq(qweight, scales, zeros, n, n0, n1, buf)[: n1 - n0], None if b is None else b[n0:n1])
        if cpo == 2:  # panels alternate gate (32 columns), up (32 columns), from n0 % 64 == 0;
            # SiLU * mul in fp32 and one rounding, as the C++ epilogue (epilogues/silu_mul.h.j2)
            yb = yb.view(M, -1, 2, 32).float()
            yb = (F.silu(yb[:, :, 0]) * yb[:, :, 1]).reshape(M, -1).to(x.dtype)
        if y is None:
            return yb
        y[:, n0 // cpo: n1 // cpo] = yb
    return y


