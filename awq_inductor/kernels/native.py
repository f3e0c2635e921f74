"""The eager (non-compiled) kernels: render C++ from our templates, build it once with g++, bind
its entry points through ctypes. One helper for each step, used by every op:

* :func:`build` compiles a source into a shared object cached on disk in ``$AWQ_INDUCTOR_CACHE_DIR``
  (default ``~/.cache/awq_inductor``) under a key over source, flags, ISA and compiler, written
  atomically (temp + os.replace); a missing compiler or a failed build raises with the output.
* :func:`library` loads (once per process) the library of a source; :func:`bind` gives one symbol
  its signature, written as data next to each kernel (``INT4_MM_ARGS`` here, the others in their op
  module); :func:`c_function` renders, builds and binds a standalone kernel in one call.
* The int4 GEMM kernels of a scheme: :func:`get_kernel` (per op, ISA, dtype and AMX emulation, fixed
  when first built, never per call) and :func:`get_dequant` (the dense candidate's dequantization).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import subprocess
import tempfile
import threading
from typing import Callable, List, Optional, Sequence

import torch

from .. import config
from ..schemes import OPS, SCHEMES, Op, Scheme
from . import codegen, isa as isa_mod
from .cache_key import native_key
from .plan import CXX_FIELDS, Plan, default_plan
from .toolchain import compiler_id, require_cxx

_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-std=c++17", "-fno-strict-aliasing"]
VP, I64, INT, FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
#: the g++ flag sets of the libraries built or found built in this process (built_flag_sets)
_BUILT_FLAGS: set = set()


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
    with _build_lock(so):  # a second thread asking for the same file waits for it, not builds it again
        if not os.path.exists(so):
            with _in_flight(frozenset(all_flags)):
                _compile(cxx, all_flags, source, so, name, key, d)
                _BUILT_FLAGS.add(frozenset(all_flags))  # before the waiters of flags_proven wake
    _BUILT_FLAGS.add(frozenset(all_flags))  # (also where the file was found built)
    return so


def built_flag_sets() -> list:
    """The g++ flag sets of the libraries built (or found built, the key covering flags and
    compiler) in this process: evidence that this compiler accepts them
    (``inductor.lowering._intrinsic_checks``)."""
    return list(_BUILT_FLAGS)


def flags_proven(flags: frozenset) -> bool:
    """Whether a library of ours built with a superset of ``flags`` in this process, where none
    has yet waiting for the builds of such a library running now (another thread) to end: evidence
    that this compiler accepts ``flags`` (``inductor.lowering.infer_subset_isa_checks``)."""
    if any(flags <= built for built in _BUILT_FLAGS):
        return True
    with _FLIGHT_GUARD:
        running = [done for built, done in _FLIGHT if flags <= built]
    for done in running:
        done.wait()
    return any(flags <= built for built in _BUILT_FLAGS)


_FLIGHT: list = []  # (flag set, threading.Event set when its g++ run ends) of the builds running now
_FLIGHT_GUARD = threading.Lock()


@contextlib.contextmanager
def _in_flight(flags: frozenset):
    entry = (flags, threading.Event())
    with _FLIGHT_GUARD:
        _FLIGHT.append(entry)
    try:
        yield
    finally:
        with _FLIGHT_GUARD:
            _FLIGHT.remove(entry)
        entry[1].set()


_BUILD_LOCKS: dict = {}
_BUILD_LOCKS_GUARD = threading.Lock()


def _build_lock(path: str) -> threading.Lock:
    with _BUILD_LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(path, threading.Lock())


def _compile(cxx: str, all_flags: List[str], source: str, so: str, name: str, key: str, d: str) -> None:
    """Compile ``source`` to ``so`` through a temporary file (atomic rename: concurrent processes
    all produce the same file)."""
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


@functools.lru_cache(maxsize=None)
def _load(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


def library(source: str, flags: List[str], name: str, isa: Optional[str] = None) -> ctypes.CDLL:
    """The loaded library of ``source`` (built on first use, see :func:`build`; loaded once)."""
    return _load(build(source, flags, name=name, isa=isa))


def bind(lib: ctypes.CDLL, symbol: str, argtypes: Sequence, restype=None) -> Callable:
    """``lib.symbol`` with its ctypes signature (argument types as data, ``restype`` None: void)."""
    fn = getattr(lib, symbol)
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn


def c_function(template: str, symbol: str, argtypes: Sequence, restype=None, *, flags: List[str], isa: str,
               **render) -> Callable:
    """A standalone kernel outside the int4 ops (``csrc_templates/head/*``, ``csrc_templates/attention/*``): render ``template`` with
    ``isa`` and ``render``, build it (the file name is ``symbol`` and the ISA) and bind ``symbol``."""
    src = codegen.env().get_template(template).render(isa=isa_mod.get(isa), **render)
    return bind(library(src, flags, name=symbol, isa=isa), symbol, argtypes, restype)


def require_amx_permission(isa: str, emulate: bool, uses_tiles: bool) -> None:
    """The AMX kernels were selected: the OS must have granted the tile permission (asked once)."""
    if isa_mod.get(isa).amx and uses_tiles and not emulate and not isa_mod.amx_permission():
        raise RuntimeError("awq_inductor: the AMX kernel was selected but the OS refused AMX tile permission "
                           "(torch.cpu._init_amx() returned False); set awq_inductor.config.force_isa = 'avx512'")


def uses_amx_tiles(scheme: Scheme, x_dtype: torch.dtype) -> bool:
    """Whether a scheme's AMX kernels run tiles for this activation dtype (W4A16: bf16 only; W4A8: any)."""
    return scheme.act_quant is not None or x_dtype == torch.bfloat16


def emulated(isa: str) -> bool:
    """AMX running on the scalar tile emulator (``config.amx_emulation``): no permission or -mamx flags."""
    return isa_mod.get(isa).amx and isa_mod.amx_emulated()


def isa_tag(isa: str, emulate: bool) -> str:
    return isa + ("-emulated" if emulate else "")


# ---------------------------------------------------------------------------------------------
# The int4 GEMM kernels of a scheme (entry/eager.cpp.j2)
def int4_mm_args(n_weights: int) -> list:
    """x, M, weights..., bias, out, N, K, G, threads, the awq::Thresholds fields (plan.CXX_FIELDS)."""
    return [VP, I64] + [VP] * n_weights + [VP, VP, I64, I64, I64, INT] + [I64] * len(CXX_FIELDS)


#: qweight, scales, zeros, n, K, G, n0, n1, out, threads
DEQUANT_ARGS = [VP, VP, VP, I64, I64, I64, I64, I64, VP, INT]


def _scheme(scheme_name: str) -> Scheme:
    return next(s for s in SCHEMES.values() if s.name == scheme_name)


@functools.lru_cache(maxsize=None)
def _library_path(scheme_name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> str:
    """The shared object of one scheme (all its ops and its driver entry), built, not loaded."""
    scheme = _scheme(scheme_name)
    src = codegen.render_eager(scheme, isa, x_dtype, emulate)
    return build(src, isa_mod.compile_flags(isa, emulate), name=f"awq_{scheme.op_prefix}", isa=isa_tag(isa, emulate))


@functools.lru_cache(maxsize=None)
def _library(scheme_name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> ctypes.CDLL:
    """The shared object of one scheme, loaded once and kept alive."""
    require_amx_permission(isa, emulate, uses_amx_tiles(_scheme(scheme_name), x_dtype))
    return _load(_library_path(scheme_name, isa, x_dtype, emulate))


def driver_symbol(scheme: Scheme, x_dtype: torch.dtype) -> str:
    """The extern "C" driver entry of ``scheme`` for ``x_dtype`` in its library (entry/eager.cpp.j2)."""
    return f"awq_{scheme.op_prefix}_driver_{codegen.dtype_name(x_dtype)}"


def driver_library(scheme: Scheme, isa: str, x_dtype: torch.dtype) -> str:
    """Path of the library (built here if missing, not loaded: the generated kernel dlopens it on
    its first call) whose :func:`driver_symbol` the Inductor template calls, for the emulation
    setting of ``config.amx_emulation`` (as the template's header)."""
    return _library_path(scheme.name, isa, x_dtype, emulated(isa))


@functools.lru_cache(maxsize=None)
def _kernel(name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> Callable:
    op = OPS[name]
    lib = _library(op.scheme.name, isa, x_dtype, emulate)
    fn = bind(lib, f"{op.c_entry}_{codegen.dtype_name(x_dtype)}", int4_mm_args(len(op.scheme.weights)))
    empty = torch.empty

    def kernel(x, *args, plan: Optional[Plan] = None):
        """``plan``: the thresholds that pick the path (default: the constants)."""
        *weights, bias, group_size, out_features = args
        M, K = x.shape
        out = empty((M, out_features), dtype=x.dtype)
        if M:
            th = (plan or default_plan()).cxx_args()
            fn(x.data_ptr(), M, *(w.data_ptr() for w in weights),
               bias.data_ptr() if bias is not None else None, out.data_ptr(), out_features, K, group_size,
               config.threads(), *th)
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
    fn = bind(_library(OPS[name].scheme.name, "amx", x_dtype, True), "awq_amx_emu_counters", [VP, INT, INT], INT)
    buf = (ctypes.c_uint64 * len(AMX_EMU_COUNTERS))()
    n = fn(ctypes.addressof(buf), len(AMX_EMU_COUNTERS), int(reset))
    if n != len(AMX_EMU_COUNTERS):
        raise RuntimeError(f"awq_amx_emu_counters: expected {len(AMX_EMU_COUNTERS)} counters, the library has {n}")
    return dict(zip(AMX_EMU_COUNTERS, (int(v) for v in buf)))


@functools.lru_cache(maxsize=None)
def _dequant(scheme_name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> Callable:
    scheme = next(s for s in SCHEMES.values() if s.name == scheme_name)
    fn = bind(_library(scheme_name, isa, x_dtype, emulate),
              f"awq_{scheme.op_prefix}_dequant_{codegen.dtype_name(x_dtype)}", DEQUANT_ARGS)

    def dequant(qweight, scales, zeros, n: int, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
        """Packed columns [n0, n1) of an ``n``-column weight -> ``out[: n1 - n0]`` ([>= n1 - n0, K],
        contiguous, x's dtype): (q - z) * s rounded once to x's dtype. ``n0 % 32 == 0``."""
        K = qweight.shape[1] * scheme.k_per_row
        G = K // scales.shape[0]
        if n0 % 32 or not 0 <= n0 < n1 <= n or out.dtype != x_dtype or not out.is_contiguous() \
                or out.dim() != 2 or out.shape[1] != K or out.shape[0] < n1 - n0:
            raise ValueError(f"dequant: expected 0 <= n0 < n1 <= {n}, n0 % 32 == 0 and a contiguous {x_dtype} "
                             f"out [>= n1 - n0, {K}], got n0={n0}, n1={n1}, out {out.dtype} {list(out.shape)}")
        fn(qweight.data_ptr(), scales.data_ptr(), zeros.data_ptr(), n, K, G, n0, n1, out.data_ptr(), config.threads())
        return out

    return dequant


def get_dequant(scheme_name: str, x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """The scheme's dense dequantization (``runtime/dense.h.j2``), from the same shared object as
    its kernels: ``dequant(qweight, scales, zeros, n, n0, n1, out)`` (n: packed columns)."""
    isa = isa_mod.select() if isa is None else isa_mod.check(isa)
    return _dequant(scheme_name, isa, x_dtype, emulated(isa))


def forget_kernels() -> None:
    """Drop the kernels and libraries loaded in this process (tests: the next call builds again,
    e.g. under another cache directory or a faked CPU)."""
    _kernel.cache_clear()
    _dequant.cache_clear()
    _library.cache_clear()
    _library_path.cache_clear()
    _load.cache_clear()


def get_kernel(name: str, x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """The eager kernel of ``awq::<name>`` for activations of ``x_dtype``, built once per
    (op, ISA, dtype, AMX emulation) and cached. The returned callable takes the op's arguments
    ``(x, *weights, bias, group_size, out_features)``, already validated (``ops.int4_mm.check_args``),
    ``x`` contiguous, and the keyword ``plan`` (a ``plan.Plan``: the C++ path thresholds;
    ``plan.dense_min_m`` is the caller's business, see ``ops.int4_mm``)."""
    isa = isa_mod.select() if isa is None else isa_mod.check(isa)
    # threads racing to a first call may both build: the on-disk write is atomic and the loader
    # returns the same library, so no lock is needed
    return _kernel(name, isa, x_dtype, emulated(isa))
