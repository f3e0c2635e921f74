"""The eager (non-compiled) kernels: render a scheme's ``entry/eager.cpp.j2``, build it once with
g++, call its entry points through ctypes.

* The ISA is fixed when a kernel is first built (``config.force_isa`` or :func:`isa.select`), never
  per call; kernels are cached in-process per (op, ISA, dtype, AMX emulation).
* Shared objects are cached on disk in ``$AWQ_INDUCTOR_CACHE_DIR`` (default
  ``~/.cache/awq_inductor``) under sha256(source + flags), written atomically (temp + os.replace).
* A missing compiler or a failed build raises RuntimeError with the compiler output.
"""
from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import tempfile
from typing import Callable, List, Optional

import torch

from .. import config
from ..schemes import OPS, W4A16, Op
from . import codegen, isa as isa_mod, tuner
from .cache_key import native_key
from .toolchain import compiler_id, require_cxx

_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-std=c++17", "-fno-strict-aliasing"]


#: The AVX512 flags of the standalone kernels (the heads, decode attention) that use AVX512-BF16.
AVX512_BF16_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"]


def c_function(template: str, symbol: str, argtypes: list, restype=None, *, flags: List[str], isa: str,
               **render) -> Callable:
    """A standalone kernel outside the int4 ops (``csrc_templates/head/*``): render ``template`` with
    ``isa`` and ``render``, build it (cached on disk like every kernel: the file name is ``symbol``,
    the ISA and a key over source, flags, ISA and compiler) and return the function ``symbol`` with
    its ctypes signature."""
    src = codegen.env().get_template(template).render(isa=isa, **render)
    fn = getattr(ctypes.CDLL(build(src, flags, name=symbol, isa=isa)), symbol)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def cache_dir() -> str:
    d = os.environ.get("AWQ_INDUCTOR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "awq_inductor")
    os.makedirs(d, exist_ok=True)
    return d


def build(source: str, flags: List[str], name: str = "awq_int4_mm", isa: Optional[str] = None) -> str:
    """Compile ``source`` into a shared object (cached on disk); return its path. The file name
    carries ``isa`` and a key over the source, the ISA, every flag and the compiler (path and
    version): :func:`awq_inductor.kernels.cache_key.native_key`."""
    cxx = require_cxx()
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


@functools.lru_cache(maxsize=None)
def _library(scheme_name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> ctypes.CDLL:
    """The shared object of one scheme (all its ops), loaded once and kept alive."""
    scheme = next(op.scheme for op in OPS.values() if op.scheme.name == scheme_name)
    if isa == "amx" and not emulate and (scheme is not W4A16 or x_dtype == torch.bfloat16):
        # the W4A16 AMX path runs for bf16 only; W4A8 uses AMX int8 tiles for any x dtype
        if not isa_mod.amx_permission():
            raise RuntimeError("awq_inductor: the AMX kernel was selected but the OS refused AMX tile "
                               "permission (torch.cpu._init_amx() returned False); "
                               "set awq_inductor.config.force_isa = 'avx512'")
    src = codegen.render_eager(scheme, isa, x_dtype, emulate)
    so = build(src, isa_mod.compile_flags(isa, emulate), name=f"awq_{scheme.op_prefix}",
               isa=isa + ("-emulated" if emulate else ""))
    return ctypes.CDLL(so)


def _entry(op: Op, isa: str, x_dtype: torch.dtype, emulate: bool):
    fn = getattr(_library(op.scheme.name, isa, x_dtype, emulate), f"{op.c_entry}_{codegen.dtype_name(x_dtype)}")
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    # x, M, weights..., bias, out, N, K, G, threads, awq::Thresholds (amx, panel, bf16 -> f32)
    fn.argtypes = [vp, i64] + [vp] * len(op.scheme.weights) + [vp, vp, i64, i64, i64, ctypes.c_int, i64, i64, i64]
    fn.restype = None
    return fn


@functools.lru_cache(maxsize=None)
def _kernel(name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> Callable:
    fn = _entry(OPS[name], isa, x_dtype, emulate)
    empty = torch.empty

    def kernel(x, *args, plan: Optional[tuner.Plan] = None):
        """``plan``: the thresholds that pick the path (default: the constants)."""
        *weights, bias, group_size, out_features = args
        M, K = x.shape
        out = empty((M, out_features), dtype=x.dtype)
        if M:
            nt = config.num_threads or torch.get_num_threads()
            th = (plan or tuner.default_plan()).cxx_args()
            fn(x.data_ptr(), M, *(w.data_ptr() for w in weights),
               bias.data_ptr() if bias is not None else None, out.data_ptr(), out_features, K, group_size, nt, *th)
        return out

    kernel.isa = isa  # type: ignore[attr-defined]
    kernel.amx_emulated = emulate  # type: ignore[attr-defined]
    return kernel


#: Names of the tile-emulator counters, in the order of ``awq::amx_emu::Counter`` (runtime/amx.h.j2).
AMX_EMU_COUNTERS = ("ldtilecfg", "release", "tileloadd", "tilestored", "tilezero", "tdp", "dequant_bytes")


def amx_emulator_counters(name: str, x_dtype: torch.dtype, reset: bool = True) -> dict:
    """The tile emulator's instruction counters of the emulated AMX library that runs ``awq::<name>``
    for ``x_dtype`` (summed over threads since the last reset), and zero them if ``reset``. Tests use
    them to check a blocking's tile traffic; they exist only in emulated builds
    (``config.amx_emulation``), so anything else raises ``RuntimeError``."""
    lib = _library(OPS[name].scheme.name, "amx", x_dtype, True)
    fn = lib.awq_amx_emu_counters
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    buf = (ctypes.c_uint64 * len(AMX_EMU_COUNTERS))()
    n = fn(ctypes.addressof(buf), len(AMX_EMU_COUNTERS), int(reset))
    if n != len(AMX_EMU_COUNTERS):
        raise RuntimeError(f"awq_amx_emu_counters: expected {len(AMX_EMU_COUNTERS)} counters, the library has {n}")
    return dict(zip(AMX_EMU_COUNTERS, (int(v) for v in buf)))

@functools.lru_cache(maxsize=None)
def _dequant(scheme_name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> Callable:
    scheme = next(op.scheme for op in OPS.values() if op.scheme.name == scheme_name)
    fn = getattr(_library(scheme_name, isa, x_dtype, emulate), f"awq_{scheme.op_prefix}_dequant_{codegen.dtype_name(x_dtype)}")
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    # qweight, scales, zeros, N, K, G, n0, n1, out, threads
    fn.argtypes = [vp, vp, vp, i64, i64, i64, i64, i64, vp, ctypes.c_int]
    fn.restype = None

    def dequant(qweight, scales, zeros, n: int, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
        """Packed columns [n0, n1) of an ``n``-column weight -> ``out[: n1 - n0]`` ([>= n1 - n0, K],
        contiguous, x's dtype): (q - z) * s rounded once to x's dtype. ``n0 % 32 == 0``."""
        K = qweight.shape[1] * scheme.k_per_row
        G = K // scales.shape[0]
        if n0 % 32 or not 0 <= n0 < n1 <= n or out.dtype != x_dtype or not out.is_contiguous() \
                or out.dim() != 2 or out.shape[1] != K or out.shape[0] < n1 - n0:
            raise ValueError(f"dequant: expected 0 <= n0 < n1 <= {n}, n0 % 32 == 0 and a contiguous {x_dtype} "
                             f"out [>= n1 - n0, {K}], got n0={n0}, n1={n1}, out {out.dtype} {list(out.shape)}")
        nt = config.num_threads or torch.get_num_threads()
        fn(qweight.data_ptr(), scales.data_ptr(), zeros.data_ptr(), n, K, G, n0, n1, out.data_ptr(), nt)
        return out

    return dequant


def get_dequant(scheme_name: str, x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """The scheme's dense dequantization (``runtime/dense.h.j2``), from the same shared object as
    its kernels: ``dequant(qweight, scales, zeros, n, n0, n1, out)`` (n: packed columns)."""
    isa = isa_mod.select() if isa is None else isa_mod.check(isa)
    return _dequant(scheme_name, isa, x_dtype, isa == "amx" and isa_mod.amx_emulated())


def forget_kernels() -> None:
    """Drop the kernels and libraries loaded in this process (tests: the next call builds again,
    e.g. under another cache directory or a faked CPU)."""
    _kernel.cache_clear()
    _dequant.cache_clear()
    _library.cache_clear()


def get_kernel(name: str, x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """The eager kernel of ``awq::<name>`` for activations of ``x_dtype``, built once per
    (op, ISA, dtype, AMX emulation) and cached. The returned callable takes the op's arguments
    ``(x, *weights, bias, group_size, out_features)``, already validated (``ops.check_args``),
    ``x`` contiguous, and the keyword ``plan`` (a ``tuner.Plan``: the C++ path thresholds;
    ``plan.dense_min_m`` is the caller's business, see ``ops``)."""
    isa = isa_mod.select() if isa is None else isa_mod.check(isa)
    # With config.amx_emulation the AMX micro-kernels run on the scalar tile emulator, so neither
    # AMX permission nor -mamx flags are needed.
    emulate = isa == "amx" and isa_mod.amx_emulated()
    # threads racing to a first call may both build: the on-disk write is atomic and the loader
    # returns the same library, so no lock is needed
    return _kernel(name, isa, x_dtype, emulate)
