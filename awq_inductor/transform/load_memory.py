"""Keep peak memory low while a loaded checkpoint is converted (used by model_pass.convert).

Two things inflate the resident set of a load well beyond the packed model:

* transformers hands over the safetensors tensors as views of one read-only ``mmap`` of the file;
  the fp16 embeddings stay such views, so the mapping lives on and every checkpoint page read
  during conversion stays resident (file-backed RSS ~ the int4 part of the checkpoint).
  :func:`drop_file_pages` tells the kernel (``madvise(MADV_DONTNEED)``) that the pages lying
  entirely inside a converted module's checkpoint tensors are no longer needed. Only ranges
  inside a *file-backed* mapping (``/proc/self/maps``) are touched, and only while the tensors are
  still referenced (so the mapping cannot have been replaced); clean private file pages are
  simply re-read from the file if anyone touched them again.
* glibc keeps freed heap memory of the unpack/pack temporaries; :func:`trim_heap` returns it
  (``malloc_trim(0)``).

Both are best effort: on other platforms/libcs they do nothing.
"""
from __future__ import annotations

import ctypes
import mmap
import os
from typing import Iterable, List, Optional, Tuple

import torch

_MADV_DONTNEED = 4
_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    return _libc or None


def file_mappings() -> List[Tuple[int, int]]:
    """[(start, end)] of this process's file-backed mappings of ``*.safetensors`` files."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5].endswith(".safetensors"):
                    a, b = parts[0].split("-")
                    out.append((int(a, 16), int(b, 16)))
    except OSError:
        pass
    return out


def drop_file_pages(tensors: Iterable[Optional[torch.Tensor]], mappings: List[Tuple[int, int]]) -> int:
    """madvise(DONTNEED) the whole pages of each tensor's bytes that lie in one of ``mappings``;
    return the bytes advised. The caller must still hold the tensors."""
    lib = _lib()
    if lib is None or not mappings or not hasattr(lib, "madvise"):
        return 0
    page = mmap.PAGESIZE
    done = 0
    for t in tensors:
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            continue
        a = t.data_ptr()
        b = a + t.numel() * t.element_size()
        if not any(lo <= a and b <= hi for lo, hi in mappings):
            continue
        a2 = -(-a // page) * page
        b2 = b // page * page
        if b2 > a2 and lib.madvise(ctypes.c_void_p(a2), ctypes.c_size_t(b2 - a2), _MADV_DONTNEED) == 0:
            done += b2 - a2
    return done


def trim_heap() -> None:
    lib = _lib()
    fn = getattr(lib, "malloc_trim", None) if lib is not None else None
    if fn is not None and os.name == "posix":
        fn(0)
