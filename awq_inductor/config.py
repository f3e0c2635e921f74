"""Package settings, read when weights are packed or when kernel code is generated.

Nothing here is read inside ``forward``: a compiled graph or a loaded native kernel keeps the
choice that was made when it was built.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

#: Force one micro-kernel ISA instead of the best the CPU offers: ``"amx"``, ``"avx512"``,
#: ``"portable"`` or ``None`` (auto). Used by tests and golden codegen tests.
force_isa: Optional[str] = None

#: Rows of activations from which the AMX bf16 micro-kernel is used instead of the
#: AVX512-BF16 decode kernel (bf16/fp16 activations). Measured with benchmarks/bench_linear.py.
amx_min_m: int = 5

#: Rows of activations from which, without AMX (avx512 ISA, or fp32/fp16 x), the kernel
#: dequantizes each K-chunk x 64-column weight tile once into an fp32 buffer and reuses it for
#: every row (register-blocked 6 x 64 FMA kernel) instead of re-dequantizing per 4 rows.
#: Baked into the generated code. Measured with benchmarks/bench_linear.py.
panel_min_m: int = 8

#: Per-machine kernel choice (awq_inductor/kernels/tuner.py, tuning_cache.py): ``"auto"`` times the candidate kernel
#: paths of a shape the first time it is built or compiled without a cached plan (one log line,
#: seconds; ``python -m awq_inductor tune`` fills the cache ahead of time) and uses the measured
#: thresholds; ``"cached"`` uses a cached plan where there is one and the constants above
#: otherwise (never times); ``"off"`` always uses the constants (tests). The default comes from
#: ``$AWQ_INDUCTOR_TUNE`` when set (read once, at import: the test suite sets it for its subprocesses).
tune: str = os.environ.get("AWQ_INDUCTOR_TUNE") or "auto"

#: Force the kernel plan of every shape (tests, experiments): a dict of some of ``amx_min_m``,
#: ``panel_min_m``, ``bf16_f32_min_m``, ``dense_min_m`` (rows from which each path is taken, see
#: ``kernels.plan.Plan``) and the decode setting's ``decode_prefetch``, ``prefetch_next_tile``,
#: ``decode_int16``, ``decode_prefetch_l2``, ``rows_prefetch``, ``decode_k_streams``, the rest from the constants; e.g. ``{"dense_min_m": 0}`` runs every call as
#: dequantize + dense GEMM. ``None``: the tuned plan (``tune``).
kernel_plan: Optional[dict] = None

#: Render the AMX micro-kernels against a scalar C++ emulator of the tile instructions instead of
#: the ``_tile_*`` intrinsics (``AWQ_TILE_*`` macros in csrc_templates/runtime/amx.h.j2). Read at code-generation
#: time and part of the generated source text. For testing the AMX kernel logic on CPUs (or VMs)
#: without usable AMX: no AMX permission is requested and no ``-mamx-*`` flags are needed. Slow.
amx_emulation: bool = False

#: Put the weights each decoded token streams whole (packed int4 weights, experts, the lm_head
#: table) on transparent huge pages when a model is converted or sharded
#: (:mod:`awq_inductor.kernels.hugepages`; a no-op where THP is off). Read at load time.
huge_pages: bool = True

#: Threads the generated kernels use; ``None`` means ``torch.get_num_threads()`` at codegen time.
num_threads: Optional[int] = None

ISAS = ("amx", "avx512", "portable")


def threads() -> int:
    """The threads our kernels use: ``num_threads``, else ``torch.get_num_threads()`` (read now)."""
    import torch

    return int(num_threads or torch.get_num_threads())
TUNE_MODES = ("auto", "cached", "off")
if tune not in TUNE_MODES:
    raise ValueError(f"AWQ_INDUCTOR_TUNE: expected one of {TUNE_MODES}, got {tune!r}")


@contextlib.contextmanager
def patch(**changes) -> Iterator[None]:
    """Temporarily change settings: ``with config.patch(force_isa="portable"): ...``."""
    g = globals()
    old = {}
    for name, value in changes.items():
        if name not in g or name.startswith("_") or name in ("patch", "threads", "ISAS", "TUNE_MODES"):
            raise ValueError(f"unknown awq_inductor.config setting {name!r}")
        if name == "tune" and value not in TUNE_MODES:
            raise ValueError(f"tune: expected one of {TUNE_MODES}, got {value!r}")
        if name == "force_isa" and value is not None and value not in ISAS:
            raise ValueError(f"force_isa: expected one of {ISAS} or None, got {value!r}")
        old[name] = g[name]
        g[name] = value
    try:
        yield
    finally:
        g.update(old)
