"""What a compiled kernel depends on, as one hashable description (no torch._inductor imports).

Every input of code generation must be in the key of every cache that stores generated code,
or a cache hit hands out a kernel built for other settings (another forced ISA, another AMX
threshold, another CPU when a cache directory is shared between machines):

* the package settings: **every** public setting of :mod:`awq_inductor.config`, enumerated, so a
  future tuning choice added there is covered without touching this file;
* the resolved thread count, the ISA the code is generated for, and what the CPU reports;
* the sources that render the code (templates + rendering modules, hashed by the caller).

:func:`fx_key` is the uuid of the Inductor cache pass (inductor/lowering.py), :func:`native_key` names
the eager kernel's shared object on disk (kernels/native.py).
"""
from __future__ import annotations

import functools
import hashlib
import json
import types
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch

from .. import config
from . import isa as _isa


def settings() -> Dict[str, Any]:
    """Every public setting of awq_inductor.config (module-level values that are not functions,
    classes or modules), by name."""
    out = {}
    for name, value in vars(config).items():
        if name.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type)):
            continue
        if callable(value):
            continue
        out[name] = value
    return out


def cpu_fingerprint() -> Dict[str, Any]:
    f = _isa.cpu_features()
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        cap = "unknown"
    return {"capability": cap, "avx512": f.avx512, "avx512_bf16": f.avx512_bf16, "amx_tile": f.amx_tile}


def _cpuinfo() -> Dict[str, str]:
    """``model name`` and ``flags`` of the first CPU in /proc/cpuinfo (empty where there is none)."""
    out: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags") and key not in out:
                    out[key] = value.strip()
                if len(out) == 2:
                    break
    except OSError:
        pass
    return out


#: The measuring method: plans measured by another version of these files are measured again (the
#: hot-slice timing of decode rows once cached a plan 1.3x slower at M = 1 on the AMX Xeon).
TUNER_SOURCES = ("tuner.py", "plan.py", "hugepages.py")


def tuner_hash() -> str:
    h = hashlib.sha256()
    for name in TUNER_SOURCES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


def machine(threads: int, huge_pages: bool = False) -> Dict[str, Any]:
    """What a kernel timing depends on besides the shape: the CPU model and its flags, the thread
    count, torch and this package (version, kernel sources and the tuner's own code), and whether
    the weights sit on huge pages (``kernels.hugepages.in_use()``: the tuner times its cold copies
    on the pages the loaded weights get). The key of the
    tuning cache (kernels/tuning_cache.py): another machine, thread count or build never reads these
    timings."""
    import platform

    from .._version import __version__
    from . import codegen

    info = _cpuinfo()
    flags = " ".join(sorted(info.get("flags", "").split()))
    return {"cpu_model": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16], "cpu": cpu_fingerprint(),
            "threads": int(threads), "torch": torch.__version__, "awq_inductor": __version__,
            "kernel_sources": codegen.templates_hash()[:16], "tuner": tuner_hash(), "huge_pages": bool(huge_pages)}


@functools.lru_cache(maxsize=None)
def machine_key(threads: int, huge_pages: bool = False) -> str:
    """sha256 (32 hex digits) of :func:`machine`: the tuning cache's file name."""
    return _digest(machine(threads, huge_pages))[:32]


def describe(isa: str, sources: str, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The full description hashed by :func:`fx_key` (readable, for debugging a miss)."""
    return {
        "isa": isa,
        "settings": settings(),
        "threads": config.threads(),
        "cpu": cpu_fingerprint(),
        "sources": sources,
        "torch": torch.__version__,
        **(extra or {}),
    }


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def fx_key(isa: str, sources: str, extra: Optional[Dict[str, Any]] = None) -> str:
    """sha256 of :func:`describe`: the FX-graph-cache pass uuid."""
    return _digest(describe(isa, sources, extra))


def native_key(source: str, flags: Iterable[str], isa: Optional[str], compiler: str) -> str:
    """Key of a built eager kernel: its source text, the ISA it was rendered for, every compile
    flag and the compiler (path and version)."""
    return _digest({"source": hashlib.sha256(source.encode()).hexdigest(), "isa": isa,
                    "flags": list(flags), "compiler": compiler})[:32]
