"""Which micro-kernel family this CPU runs, decided once per process, with one message each for
the cases a user should know about:

* AMX in CPUID but the OS refuses the tile permission (``arch_prctl(ARCH_REQ_XCOMP_PERM)`` fails,
  as in some VMs and containers): the AVX512 kernels, after **one** ``RuntimeWarning``.
* no AVX512-BF16 (e.g. an AVX2-only CPU): the portable C++ kernels, named in **one** log line
  (logger ``awq_inductor.isa``, level WARNING).

Read when a kernel is built or code is generated (never in ``forward``). Tests replace the CPU
probe and the AMX permission request with :func:`fake_cpu`. No torch._inductor imports here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import warnings
from typing import Callable, Iterator, Optional, Union

import torch

log = logging.getLogger(__name__)

_RANK = {"portable": 0, "avx512": 1, "amx": 2}


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


def hardware_isa() -> str:
    """The best of ``amx`` / ``avx512`` / ``portable`` this CPU *and OS* run; decided once per
    process (the messages above are emitted at that moment)."""
    global _decided
    if _decided is not None:
        return _decided
    with _lock:
        if _decided is None:
            _decided = _decide(cpu_features())
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


def lower_of(a: str, b: str) -> str:
    """The less capable of two ISA names."""
    return a if _RANK[a] <= _RANK[b] else b


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
