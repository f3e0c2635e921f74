"""The weights every decoded token streams whole, placed on transparent huge pages (2 MiB).

Why: with 4 KiB pages a decode call that streams a 22.5 MB layer walks the page tables about 5,500
times, and a core's cold read slows with it: the bf16 decode kernel at M = 1 (4096 x 11008, cold
copies in rotation, interleaved in one process, 2-vCPU Zen 4 VM) took 0.76x / 0.75x the time on
huge pages at 1 / 2 threads in one pass and 0.83x / 0.91x in another (the VM's bandwidth moved
between them; our streaming-read probe rose alike, 24.6 -> 29.1 and 25.9 -> 33.7 GB/s).

Where the kernel's THP mode is ``madvise`` (the default of many distributions) an allocation gets
huge pages only when asked: :func:`on_huge_pages` copies a tensor into an anonymous mapping
advised ``MADV_HUGEPAGE``, 2 MiB-aligned. Where THP is ``never``, off Linux, or for tensors below
:data:`MIN_BYTES`, the tensor is returned as it is.
"""
from __future__ import annotations

import mmap
from typing import Optional

import torch

from .. import config

#: 2 MiB, the x86-64 huge page
HUGE_PAGE = 2 << 20
#: Smaller tensors stay where they are (no whole huge page in them).
MIN_BYTES = HUGE_PAGE
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_available: Optional[bool] = None


def available() -> bool:
    """Transparent huge pages can be asked for here (Linux, mode ``always`` or ``madvise``)."""
    global _available
    if _available is None:
        try:
            with open(_THP_MODE) as f:
                mode = f.read()
        except OSError:
            mode = ""
        _available = hasattr(mmap, "MADV_HUGEPAGE") and ("[always]" in mode or "[madvise]" in mode)
    return _available


def in_use() -> bool:
    """Streamed weights go on huge pages here: :func:`available` and ``config.huge_pages``."""
    return available() and bool(config.huge_pages)


def huge_empty(nbytes: int) -> torch.Tensor:
    """Uninitialised uint8 memory of ``nbytes`` starting on a 2 MiB boundary, its whole 2 MiB pages
    advised for huge pages before any page is touched (so the first touch maps huge pages; the
    tail stays on small pages: no huge page is mapped past the tensor's end). The tensor keeps the
    mapping alive; it is unmapped when the last view of it goes."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    if nbytes >= HUGE_PAGE:
        region.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return whole[start:start + nbytes]


def is_huge(t: torch.Tensor) -> bool:
    """``t`` sits in memory :func:`on_huge_pages` allocated. The mark names the storage it was made
    for: ``copy.deepcopy`` and ``clone`` copy a tensor's Python attributes onto new, small-page
    memory (a deep copy of a converted model kept the mark on every weight, so ``convert`` of the
    copy moved nothing: its decoder ran on 4 KiB pages)."""
    return getattr(t, "_awq_huge", None) == t.untyped_storage().data_ptr()


def _mark(t: torch.Tensor) -> None:
    t._awq_huge = t.untyped_storage().data_ptr()


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor ``t`` on huge pages (same dtype and shape), or ``t`` itself
    where huge pages are not available (or ``config.huge_pages`` is off), ``t`` is smaller than
    :data:`MIN_BYTES` or already there."""
    if not in_use() or t.device.type != "cpu" or t.nbytes < MIN_BYTES or t.is_sparse or is_huge(t):
        return t
    out = huge_empty(t.nbytes).view(t.dtype).view(t.shape)
    out.copy_(t)
    _mark(out)
    return out


def copy_on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A new copy of ``t``, on huge pages where :func:`on_huge_pages` would put it (cold weight copies
    of the tuner and the benchmarks: timed on the pages a loaded model's weights get)."""
    out = on_huge_pages(t)
    return t.clone() if out is t else out


def place_streamed_weights(model: torch.nn.Module) -> int:
    """Move the tensors each module lists in ``STREAMED_TENSORS`` (the packed int4 weights, the
    experts' weights, the head's table: read whole for every decoded token) onto huge pages, in
    place (``tensor.data``: tied parameters stay tied). Returns the bytes moved."""
    moved = 0
    for module in model.modules():
        for name in getattr(type(module), "STREAMED_TENSORS", ()):
            t = getattr(module, name, None)
            if not isinstance(t, torch.Tensor) or is_huge(t):
                continue
            huge = on_huge_pages(t.detach())
            if huge is not t and huge.data_ptr() != t.data_ptr():
                t.data = huge
                _mark(t)
                moved += t.nbytes
    return moved
