"""The eager (non-compiled) kernel: render ``eager_int4_mm.cpp.j2``, build it once with g++, call it
through ctypes.

* The ISA is fixed when a kernel is first built (``config.force_isa`` or :func:`codegen.detect_isa`),
  never per call; kernels are cached in-process per (ISA, dtype).
* Shared objects are cached on disk in ``$AWQ_INDUCTOR_CACHE_DIR`` (default
  ``~/.cache/awq_inductor``) under sha256(source + flags), written atomically (temp + os.replace).
* A missing compiler or a failed build raises RuntimeError with the compiler output.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import threading
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import codegen, config

_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-std=c++17", "-fno-strict-aliasing"]
_lock = threading.Lock()
_libs: Dict[str, ctypes.CDLL] = {}  # keep loaded libraries alive
_amx_ready = False


def cache_dir() -> str:
    d = os.environ.get("AWQ_INDUCTOR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "awq_inductor")
    os.makedirs(d, exist_ok=True)
    return d


def _compiler() -> str:
    from .toolchain import require_cxx

    return require_cxx()


def build(source: str, flags: List[str], name: str = "awq_int4_mm", isa: Optional[str] = None) -> str:
    """Compile ``source`` into a shared object (cached on disk); return its path. The file name
    carries ``isa`` and a key over the source, the ISA, every flag and the compiler (path and
    version): :func:`awq_inductor.cache_key.native_key`."""
    from .cache_key import native_key
    from .toolchain import compiler_id

    cxx = _compiler()
    all_flags = _BASE_FLAGS + list(flags)
    key = native_key(source, all_flags, isa, compiler_id(cxx))
    d = cache_dir()
    so = os.path.join(d, f"{name}_{isa or 'any'}_{key}.so")
    if os.path.exists(so):
        return so
    fd, tmp_cpp = tempfile.mkstemp(suffix=".cpp", prefix=f"{name}_{key}_", dir=d)
    tmp_so = tmp_cpp[:-4] + ".so.tmp"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        cmd = [cxx, *all_flags, tmp_cpp, "-o", tmp_so]
        try:
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise RuntimeError(f"awq_inductor: cannot run the C++ compiler {cxx!r}: {e}") from e
        if res.returncode != 0:
            raise RuntimeError(
                f"awq_inductor: compiling the int4 kernel failed (exit {res.returncode}).\n"
                f"command: {' '.join(cmd)}\n{res.stdout}")
        os.replace(tmp_so, so)  # atomic: concurrent builders all produce the same file
    finally:
        for p in (tmp_cpp, tmp_so):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    return so


def _ensure_amx() -> None:
    global _amx_ready
    if not _amx_ready:
        from . import isa

        if not isa.amx_permission():
            raise RuntimeError("awq_inductor: the AMX kernel was selected but the OS refused AMX tile "
                               "permission (torch.cpu._init_amx() returned False); "
                               "set awq_inductor.config.force_isa = 'avx512'")
        _amx_ready = True


# op -> (C entry-point prefix, renderer, library name, weight tensors after x and before bias)
_ENTRIES = {
    "int4_mm": ("awq_int4_mm", "render_eager", "awq_int4_mm", 3),
    "int4_mm_silu_mul": ("awq_int4_mm_silu_mul", "render_eager", "awq_int4_mm", 3),
    "int4_mm_a8": ("awq_int4_mm_a8", "render_eager_a8", "awq_int4_mm_a8", 4),
    "int4_mm_a8_silu_mul": ("awq_int4_mm_a8_silu_mul", "render_eager_a8", "awq_int4_mm_a8", 4),
}
_kernels: Dict[Tuple[str, str, torch.dtype, bool], Callable] = {}


def _load(op: str, isa: str, x_dtype: torch.dtype, amx_emulate: bool):
    entry, renderer, name, n_weights = _ENTRIES[op]
    src = getattr(codegen, renderer)(isa, x_dtype, amx_emulate)
    so = build(src, codegen.compile_flags(isa, amx_emulate), name=name,
               isa=isa + ("-emulated" if amx_emulate else ""))
    lib = _libs.get(so)
    if lib is None:
        lib = ctypes.CDLL(so)
        _libs[so] = lib
    fn = getattr(lib, f"{entry}_{codegen._dtype_name(x_dtype)}")
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    # x, M, weights..., bias, out, N, K, G, threads
    fn.argtypes = [vp, i64] + [vp] * n_weights + [vp, vp, i64, i64, i64, ctypes.c_int]
    fn.restype = None
    return fn


def _get(op: str, x_dtype: torch.dtype, isa: Optional[str]) -> Callable:
    """The eager kernel of ``op`` for activations of ``x_dtype``, built once per
    (op, ISA, dtype, AMX emulation) and cached. The returned callable takes the op's arguments
    ``(x, *weights, bias, group_size, out_features)``, already validated (``ops.check_*_args``),
    ``x`` contiguous."""
    if isa is None:
        isa = codegen.detect_isa()
    # With config.amx_emulation the AMX micro-kernels run on the scalar tile emulator, so neither
    # AMX permission nor -mamx flags are needed.
    emulate = isa == "amx" and codegen.amx_emulated()
    key = (op, isa, x_dtype, emulate)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _lock:
        k = _kernels.get(key)
        if k is not None:
            return k
        # the W4A16 AMX path runs for bf16 only; W4A8 uses AMX int8 tiles for any x dtype
        if isa == "amx" and not emulate and (op.startswith("int4_mm_a8") or x_dtype == torch.bfloat16):
            _ensure_amx()
        fn = _load(op, isa, x_dtype, emulate)
        empty = torch.empty

        def kernel(x, *args):
            *weights, bias, group_size, out_features = args
            M, K = x.shape
            out = empty((M, out_features), dtype=x.dtype)
            if M:
                nt = config.num_threads or torch.get_num_threads()
                fn(x.data_ptr(), M, *(w.data_ptr() for w in weights),
                   bias.data_ptr() if bias is not None else None, out.data_ptr(),
                   out_features, K, group_size, nt)
            return out

        kernel.isa = isa  # type: ignore[attr-defined]
        kernel.amx_emulated = emulate  # type: ignore[attr-defined]
        _kernels[key] = kernel
        return kernel


def get_kernel(x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """``awq::int4_mm``: ``(x, qweight, scales, zeros, bias, group_size, out_features) -> Tensor``."""
    return _get("int4_mm", x_dtype, isa)


def get_silu_mul_kernel(x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """``awq::int4_mm_silu_mul`` (same translation unit as :func:`get_kernel`): ``out_features`` is I,
    the weight holds 2I interleaved gate|up columns."""
    return _get("int4_mm_silu_mul", x_dtype, isa)


def get_a8_kernel(x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """``awq::int4_mm_a8``: ``(x, qweight, scales, zeros, comp, bias, group_size, out_features)``."""
    return _get("int4_mm_a8", x_dtype, isa)


def get_a8_silu_mul_kernel(x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """``awq::int4_mm_a8_silu_mul`` (same translation unit as :func:`get_a8_kernel`): ``out_features``
    is I, the W4A8 weight holds 2I interleaved gate|up columns."""
    return _get("int4_mm_a8_silu_mul", x_dtype, isa)
