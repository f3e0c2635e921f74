"""The micro-kernel ISAs: names, compiler flags, and the one place that picks one.

``amx``      AMX tiles (bf16 and int8) for many rows, AVX512 kernels otherwise
``avx512``   AVX512F/BW/VL/DQ + AVX512-BF16 + AVX512-VNNI kernels
``portable`` plain C++ (any CPU the compiler targets)

:func:`hardware_isa` is what this CPU *and OS* run, decided once per process, with one message
each for the cases a user should know about:

* AMX in CPUID but the OS refuses the tile permission (``arch_prctl(ARCH_REQ_XCOMP_PERM)`` fails,
  as in some VMs and containers): the AVX512 kernels, after **one** ``RuntimeWarning``.
* no AVX512-BF16 (e.g. an AVX2-only CPU): the portable C++ kernels, named in **one** log line
  (logger ``awq_inductor.kernels.isa``, level WARNING).

:func:`select` is what code is generated for: ``config.force_isa``, else :func:`hardware_isa`, capped
by what the target compiles for (the Inductor lowering hands in Inductor's ``pick_vec_isa()``).
Read when a kernel is built or code is generated (never in ``forward``). Tests replace the CPU
probe and the AMX permission request with :func:`fake_cpu`. No torch._inductor imports here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from .. import config

log = logging.getLogger(__name__)

class Isa(str):
    """A micro-kernel ISA: its name (the ``str`` value itself, so it keys caches and compares with
    ``config.force_isa``) plus what code generation asks of it: rank (capability order), g++ flags,
    the ``#pragma GCC target`` string, capabilities, and Inductor's matching vector ISA class."""

    def __new__(cls, name: str, *, rank: int, flags: Tuple[str, ...], gcc_target: str, avx512_bf16: bool,
                amx: bool, inductor_vec_isa: Optional[str], micro: Dict[str, Tuple[str, ...]]):
        self = super().__new__(cls, name)
        self.name, self.rank, self.flags, self.gcc_target = name, rank, tuple(flags), gcc_target
        self.avx512_bf16, self.amx, self.inductor_vec_isa = avx512_bf16, amx, inductor_vec_isa
        self.micro = dict(micro)  # scheme name -> the csrc_templates/micro/ kernels it renders for this ISA
        return self

    def __reduce__(self):  # pickles (and copies) as its name: the registry holds the one record
        return (get, (str(self),))


_AVX512_FLAGS = ("-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx512bf16", "-mavx512vnni",
                 "-mfma", "-mf16c")
_AMX_FLAGS = ("-mamx-tile", "-mamx-bf16", "-mamx-int8")
# ``#pragma GCC target`` around our AVX512 / AMX code so the inlined header compiles under any
# flag set (Inductor's AVX512 flags lack -mavx512bf16 and, without AMX on the build host, -mamx-*).
_AVX512_TARGET = "avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,avx512vnni,fma,f16c"
_AMX_TARGET = "amx-tile,amx-bf16,amx-int8"

#: The ISAs, least capable first. ``avx512_bf16``: the AVX512-BF16 / VNNI kernels (and the heads'
#: GEMVs, the attention kernels) compile and run; ``amx``: the AMX tile micro-kernels; ``micro``: the
#: micro-kernel templates each scheme renders for the ISA (Inductor's register_micro_gemm, as data).
REGISTRY: Dict[str, Isa] = {i.name: i for i in (
    Isa("portable", rank=0, flags=(), gcc_target="", avx512_bf16=False, amx=False, inductor_vec_isa=None,
        micro={"w4a16": ("micro/portable.h.j2",), "w4a8": ()}),
    Isa("avx512", rank=1, flags=_AVX512_FLAGS, gcc_target=_AVX512_TARGET, avx512_bf16=True, amx=False,
        inductor_vec_isa="VecAVX512", micro={"w4a16": ("micro/avx512.h.j2",), "w4a8": ("micro/vnni_int8.h.j2",)}),
    Isa("amx", rank=2, flags=_AVX512_FLAGS + _AMX_FLAGS, gcc_target=_AVX512_TARGET + "," + _AMX_TARGET,
        avx512_bf16=True, amx=True, inductor_vec_isa="VecAMX",
        micro={"w4a16": ("micro/avx512.h.j2", "micro/amx_bf16.h.j2"),
               "w4a8": ("micro/vnni_int8.h.j2", "micro/amx_int8.h.j2")}),
)}
ISAS = tuple(REGISTRY)
assert set(ISAS) == set(config.ISAS), "config.ISAS names the registered ISAs (config.force_isa choices)"


def get(name: str) -> Isa:
    """The record of ISA ``name``; ValueError naming the ISAs otherwise."""
    isa = REGISTRY.get(str(name))
    if isa is None:
        raise ValueError(f"isa: expected one of {ISAS}, got {name!r}")
    return isa


@dataclasses.dataclass(frozen=True)
class CpuFeatures:
    """What CPUID says (via torch.cpu): AVX512F, AVX512-BF16, AMX tiles."""

    avx512: bool
    avx512_bf16: bool
    amx_tile: bool


def _cpu_has(name: str) -> bool:
    fn = getattr(torch.cpu, name, None) or getattr(torch._C._cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:  # noqa: BLE001
        return False


def _probe_cpu() -> CpuFeatures:
    return CpuFeatures(avx512=_cpu_has("_is_avx512_supported"),
                       avx512_bf16=_cpu_has("_is_avx512_bf16_supported"),
                       amx_tile=_cpu_has("_is_amx_tile_supported"))


def _request_amx_permission() -> bool:
    """``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` through torch (process-wide)."""
    try:
        return bool(torch.cpu._init_amx())
    except Exception:  # noqa: BLE001
        return False


_lock = threading.Lock()
_cpu_probe: Callable[[], CpuFeatures] = _probe_cpu
_amx_probe: Callable[[], bool] = _request_amx_permission
_decided: Optional[str] = None
_amx_ok: Optional[bool] = None


def cpu_features() -> CpuFeatures:
    return _cpu_probe()


def amx_permission() -> bool:
    """True once the OS granted AMX tile state to this process (asked once, then remembered)."""
    global _amx_ok
    if _amx_ok is None:
        _amx_ok = bool(_amx_probe())
    return _amx_ok


def hardware_isa() -> Isa:
    """The best of ``amx`` / ``avx512`` / ``portable`` this CPU *and OS* run; decided once per
    process (the messages above are emitted at that moment)."""
    global _decided
    if _decided is not None:
        return _decided
    with _lock:
        if _decided is None:
            _decided = get(_decide(cpu_features()))
    return _decided


def _decide(f: CpuFeatures) -> str:
    if not (f.avx512 and f.avx512_bf16):
        missing = [n for n, ok in (("AVX512F", f.avx512), ("AVX512-BF16", f.avx512_bf16)) if not ok]
        log.warning("awq_inductor: this CPU has no %s; using the portable C++ int4 kernels "
                    "(correct but several times slower than the AVX512/AMX ones)", " / ".join(missing))
        return "portable"
    if f.amx_tile:
        if amx_permission():
            return "amx"
        warnings.warn(
            "awq_inductor: the CPU reports AMX but the OS refused the AMX tile permission "
            "(arch_prctl(ARCH_REQ_XCOMP_PERM) failed, as in some VMs and containers); "
            "using the AVX512 kernels instead", RuntimeWarning, stacklevel=4)
        return "avx512"
    return "avx512"


def lower_of(a: str, b: str) -> Isa:
    """The less capable of two ISAs."""
    a, b = get(a), get(b)
    return a if a.rank <= b.rank else b


@contextlib.contextmanager
def fake_cpu(features: Optional[CpuFeatures] = None,
             amx_permission: Union[None, bool, Callable[[], bool]] = None) -> Iterator[None]:
    """Tests: pretend the CPU has ``features`` and/or that the AMX permission request returns
    ``amx_permission`` (a bool, or a callable doing the request); the per-process decision is
    redone inside and after the block."""
    global _cpu_probe, _amx_probe, _decided, _amx_ok
    with _lock:
        saved = (_cpu_probe, _amx_probe, _decided, _amx_ok)
        if features is not None:
            _cpu_probe = lambda: features  # noqa: E731
        if amx_permission is not None:
            _amx_probe = amx_permission if callable(amx_permission) else (lambda: amx_permission)  # noqa: E731
        _decided = _amx_ok = None
    try:
        yield
    finally:
        with _lock:
            _cpu_probe, _amx_probe = saved[0], saved[1]
            _decided = _amx_ok = None


def check(isa: str) -> Isa:
    return get(isa)


def amx_emulated(amx_emulate: Optional[bool] = None) -> bool:
    """``amx_emulate`` if given, else ``config.amx_emulation``."""
    return bool(config.amx_emulation if amx_emulate is None else amx_emulate)


def select(target: Optional[Callable[[], str]] = None) -> Isa:
    """The ISA to generate code for: ``config.force_isa`` if set (asking for the AMX permission
    when that is ``amx`` on an AMX CPU), else :func:`hardware_isa`, capped by ``target()`` (the ISA
    the compiler target supports, e.g. Inductor's) when given."""
    forced = config.force_isa
    if forced is not None:
        if check(forced).amx and cpu_features().amx_tile:
            amx_permission()
        return get(forced)
    return hardware_isa() if target is None else lower_of(hardware_isa(), target())


def gcc_target(isa: str, amx_emulate: Optional[bool] = None) -> str:
    """Target string of the ``#pragma GCC target`` wrapping the rendered code ("" for portable); the
    AMX part is left out when the tile instructions are emulated."""
    isa = get(isa)
    return REGISTRY["avx512"].gcc_target if isa.amx and amx_emulated(amx_emulate) else isa.gcc_target


def compile_flags(isa: str, amx_emulate: Optional[bool] = None) -> List[str]:
    """ISA flags (g++) the rendered code for ``isa`` needs (on top of -O3 -fopenmp etc.); no AMX
    flags when the tile instructions are emulated (``amx_emulate``, default ``config.amx_emulation``)."""
    isa = get(isa)
    return list(REGISTRY["avx512"].flags if isa.amx and amx_emulated(amx_emulate) else isa.flags)
