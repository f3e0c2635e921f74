"""The kernel plan: the row thresholds that pick a kernel path per call, and which path a plan
takes for M rows (the drivers' checks, mirrored).

The drivers pick a kernel path per call from M and a few row thresholds (``awq::Thresholds`` in
``csrc_templates/runtime/driver.h.j2``, whose defaults are rendered from here): AMX tiles from
``amx_min_m`` rows, the AVX512-BF16 decode kernel below ``bf16_f32_min_m``, the dequantize-once
panel kernels from ``panel_min_m`` (fp32 FMA on exact weights for fp32 / fp16 x; for bf16 x a bf16
GEMM loop on weights dequantized to bf16 once per M block). On top of them, from ``dense_min_m``
rows a call runs the dense candidate (:mod:`awq_inductor.kernels.dense`). A :class:`Plan` is those
four numbers for one (scheme, op, ISA, x dtype, K, N, G) on one machine; the tuner
(:mod:`~awq_inductor.kernels.tuner`) measures it, :mod:`~awq_inductor.kernels.tuning_cache` keeps it.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, NamedTuple, Tuple

import torch

from .. import config
from ..schemes import COMP, W4A8, Op, Tensor

#: "never": a threshold no M reaches.
NEVER = 1 << 40
#: one past the bf16 decode kernel's one-pass rows (schemes/w4a16.h: kDecOnePassM); rendered as the
#: default of ``Thresholds::bf16_f32_min_m`` (runtime/driver.h.j2)
BF16_F32_MIN_M = 9
THRESHOLDS = ("amx_min_m", "panel_min_m", "bf16_f32_min_m", "dense_min_m")
#: The fields of ``awq::Thresholds`` (runtime/driver.h.j2) in order: the eager entry points' trailing
#: arguments and their ctypes signatures (entry/*.cpp.j2, kernels/native.py, ops/moe.py) and the
#: Inductor template's initializer are all made from this list.
#: The Plan fields of the decode setting, in DecodeSetting's order (Plan.with_decode pairs them up).
DECODE_FIELDS = ("decode_prefetch", "prefetch_next_tile", "decode_int16", "decode_prefetch_l2", "rows_prefetch",
                 "decode_k_streams")
CXX_FIELDS = ("amx_min_m", "panel_min_m", "bf16_f32_min_m") + DECODE_FIELDS
#: The bf16 decode kernel's software prefetch distance without a measurement (``config.tune`` off):
#: none, as measured on Zen 4 (a 2 KB-ahead prefetch cost 6-9% there); tuned per machine otherwise.
DEFAULT_DECODE_PREFETCH = 0
#: Whether the decode kernels also prefetch, into L2, the weights of the N tile after the one they
#: stream, at the same offset (a thread's next work unit: the driver hands each thread consecutive
#: tiles): two more streams in flight per core, where the hardware keeps few enough misses
#: outstanding per stream that one core reads below the memory's rate. Off without a measurement;
#: tuned per machine with the distance (kernels/tuner.py tune_decode_setting).
DEFAULT_NEXT_TILE_PREFETCH = 0
#: Whether the decode rows run bf16 x as int16 fixed point on VNNI dot products (micro::avx512_int16x,
#: w4a16 with G <= 4096 and K % G == 0): where vdpbf16ps issues at half the rate of vpdpwssd (the
#: AMX Xeon: the loop 2.1-2.2x from L2, 1.36x cold on one core; the op 79-85% of the read probe against
#: 71-79%, benchmarks/results/decode_int16_1205.md).
#: Off without a measurement (the dpbf16 kernel is what Zen 4 was tuned on); tuned per machine with
#: the prefetch (kernels/tuner.py tune_decode_setting).
DEFAULT_DECODE_INT16 = 0
#: The decode kernels' software prefetch into L2 (bytes ahead in each weight stream, 0: none), beside
#: the L1 distance: more lines in flight per core than the L1 fill buffers allow. On the AMX Xeon
#: (int16 x loop over the real tile layout, 2 threads, cold, interleaved with the probe) 1 KB into L1
#: + 4 KB into L2 + the next tile read 85-98% of the probe where the shipped 1 KB + next tile read
#: 79-87% (4 of 5 runs; at a slower moment 90 against 92%: benchmarks/results/decode_prefetch_l2_1205.md).
#: Off without a measurement; tuned per machine with the rest of the setting.
DEFAULT_DECODE_PREFETCH_L2 = 0
#: Whether calls of ``kRowsPrefetchMinM`` (5) rows or more prefetch with the rows' setting
#: (runtime/driver.h.j2 decode_prefetch_of: the next N tile into L2 where it fits, each stream 512 B
#: ahead into L1 and 4 KB into L2), whatever the M = 1 setting says: their passes compute 5-8 rows per
#: weight byte, so the stream is not what limits them, and without a prefetch each tile's first pass
#: waits on memory. Hot, 2 threads, Zen 4, interleaved with the int8 dot-product peak, W4A8 (whose
#: M = 1 tuning keeps no prefetch) at M = 5 / 8 / 16 / 32: 4096 x 11008 0.90 / 1.44 / 2.45 / 4.34 ms
#: (54 / 55 / 65 / 72 % of the peak) without, 0.67 / 1.03 / 1.97 / 3.88 ms (73 / 77 / 81 / 81 %) with;
#: 11008 x 4096 (tiles too large for the next tile's prefetch) at M = 8 / 16 / 32 1.24 / 2.26 / 4.45 ms
#: (63 / 69 / 72 %) without, 0.97 / 1.97 / 4.10 (82 / 79 / 78 %) with. W4A16, whose M = 1 setting
#: here already prefetches all three, within 1 % (benchmarks/results/rows_prefetch_zen4_1207.md). On
#: unless the machine's measurement says otherwise (kernels/tuner.py tune_decode_setting).
DEFAULT_ROWS_PREFETCH = 1
#: How many K segments a one-row call reads side by side per tile (1 or 2, where the scheme's kernels split:
#: Scheme.two_k_streams; runtime/driver.h.j2 Thresholds::decode_k_streams): 2 keeps four weight streams per core in flight instead of two. 1 without
#: a measurement; per machine, every candidate setting whose one-row kernel splits also runs with 2
#: (kernels/tuner.py decode_candidates).
DEFAULT_DECODE_K_STREAMS = 1
#: W4A16 on AMX: calls of up to this many rows convert the weights to exact bf16(128 + q) per group
#: and fold zeros and scales into each group's tile sums (path ``amx_groups``, where G and K are
#: multiples of 32); more rows dequantize with the scales once per M block (``amx``). 4096 x 11008,
#: hot, 2 threads, on the AMX Xeon (ms, groups / per-block): M = 16 1.56 / 2.83, 32 2.41 / 3.36,
#: 64 4.71 / 4.47, 128 8.13 / 6.57.
AMX_GROUPS_MAX_M = 32


class DecodeSetting(NamedTuple):
    """The decode kernels' setup on one machine: software prefetch (bytes ahead within each weight
    stream, 0: none; whether the next N tile is prefetched into L2 too, 0 / 1), whether bf16 x
    runs as int16 fixed point (0 / 1, :data:`DEFAULT_DECODE_INT16`), the distance of the
    prefetch into L2 within each stream (bytes, 0: none, :data:`DEFAULT_DECODE_PREFETCH_L2`), and
    whether calls of 5 rows or more prefetch with the rows' setting (0 / 1, :data:`DEFAULT_ROWS_PREFETCH`), and
    how many K segments a one-row call streams side by side (1 / 2, :data:`DEFAULT_DECODE_K_STREAMS`)."""

    distance: int
    next_tile: int
    int16_x: int = DEFAULT_DECODE_INT16
    l2_distance: int = DEFAULT_DECODE_PREFETCH_L2
    rows_prefetch: int = DEFAULT_ROWS_PREFETCH
    k_streams: int = DEFAULT_DECODE_K_STREAMS


#: The constants' choice (no prefetch at M = 1, bf16 x, the rows' prefetch from 5 rows).
DEFAULT_DECODE = DecodeSetting(DEFAULT_DECODE_PREFETCH, DEFAULT_NEXT_TILE_PREFETCH, DEFAULT_DECODE_INT16,
                               DEFAULT_DECODE_PREFETCH_L2, DEFAULT_ROWS_PREFETCH, DEFAULT_DECODE_K_STREAMS)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Rows from which each path is taken (see the module docstring) and the decode kernels'
    setting (:class:`DecodeSetting`: prefetch distances, next-tile prefetch, int16 x; measured once per
    machine, not per shape: the hardware prefetchers and issue rates decide it;
    :func:`~awq_inductor.kernels.tuner.tune_decode_setting`); ``source`` says where the
    plan came from (``default`` | ``forced`` | ``cached`` | ``tuned``)."""

    amx_min_m: int
    panel_min_m: int
    bf16_f32_min_m: int
    dense_min_m: int = NEVER
    decode_prefetch: int = DEFAULT_DECODE_PREFETCH
    prefetch_next_tile: int = DEFAULT_NEXT_TILE_PREFETCH
    decode_int16: int = DEFAULT_DECODE_INT16
    decode_prefetch_l2: int = DEFAULT_DECODE_PREFETCH_L2
    rows_prefetch: int = DEFAULT_ROWS_PREFETCH
    decode_k_streams: int = DEFAULT_DECODE_K_STREAMS
    source: str = "default"

    def with_decode(self, setting: DecodeSetting) -> "Plan":
        """This plan with the decode kernels' machine setting."""
        return dataclasses.replace(self, **dict(zip(DECODE_FIELDS, setting)))

    def cxx_args(self) -> Tuple[int, ...]:
        """The ``awq::Thresholds`` fields (:data:`CXX_FIELDS`), in order."""
        return tuple(int(getattr(self, f)) for f in CXX_FIELDS)

    def cxx(self) -> str:
        return ", ".join(str(v) for v in self.cxx_args())

    def thresholds(self) -> Dict[str, int]:
        return {k: getattr(self, k) for k in THRESHOLDS}


def default_plan() -> Plan:
    """The constants (``config.amx_min_m``, ``config.panel_min_m``, bf16 -> fp32 from 9 rows: the
    decode kernel reads the weights once for up to 8 rows, no dense)."""
    return Plan(int(config.amx_min_m), int(config.panel_min_m), BF16_F32_MIN_M)


def forced_plan(values: dict) -> Plan:
    keys = THRESHOLDS + DECODE_FIELDS
    unknown = set(values) - set(keys)
    if unknown:
        raise ValueError(f"config.kernel_plan: expected keys among {keys}, got {sorted(unknown)}")
    return dataclasses.replace(default_plan(), source="forced", **{k: int(v) for k, v in values.items()})


# ---------------------------------------------------------------------------------------------
# Which path a plan takes (mirrors the drivers' checks)
def path_for(plan: Plan, op: Op, isa: str, x_dtype: torch.dtype, M: int) -> str:
    """The kernel path ``plan`` selects for M rows: ``dense``, ``amx``, ``amx_groups`` (W4A16, bf16,
    up to AMX_GROUPS_MAX_M rows), ``decode_bf16``, ``f32_rows``, ``panel`` (W4A16), ``vnni`` (W4A8)
    or ``portable``."""
    if M >= plan.dense_min_m:
        return "dense"
    if isa == "portable":
        return "portable"
    if op.scheme is W4A8:
        return "amx" if isa == "amx" and M >= plan.amx_min_m else "vnni"
    if x_dtype == torch.bfloat16:
        if isa == "amx" and M >= plan.amx_min_m:
            return "amx_groups" if M <= AMX_GROUPS_MAX_M else "amx"
        if M < plan.bf16_f32_min_m:
            return "decode_bf16"
    return "panel" if M >= plan.panel_min_m else "f32_rows"


#: Rows up to which W4A8's ``vnni`` path runs its register decode kernel (``kDecodeM`` in
#: schemes/w4a8.h.j2): it folds the zero point with the activations' group sums, never reading ``comp``.
A8_DECODE_MAX_M = 32


def weights_read(plan: Plan, op: Op, isa: str, x_dtype: torch.dtype, M: int) -> Tuple[Tensor, ...]:
    """The op's weight tensors the path ``plan`` selects for M rows reads (the bytes a bandwidth
    figure counts): all of them but ``comp`` on W4A8's register decode kernel (+5.8 % of the bytes at
    G = 128, which M = 1 shares of the probe had counted)."""
    if op.scheme is W4A8 and M <= A8_DECODE_MAX_M and path_for(plan, op, isa, x_dtype, M) == "vnni":
        return tuple(w for w in op.scheme.weights if w is not COMP)
    return op.scheme.weights


def candidate_of(path: str) -> str:
    """The :func:`candidates` entry whose timings stand for ``path``: one forced plan runs both AMX
    bf16 paths (``amx_groups`` up to AMX_GROUPS_MAX_M rows, ``amx`` above)."""
    return "amx" if path == "amx_groups" else path


def candidates(op: Op, isa: str, x_dtype: torch.dtype) -> Dict[str, Plan]:
    """Path name -> a plan forcing that path for every M (``dense`` always among them)."""
    n = NEVER
    out = {"dense": Plan(n, n, n, 0)}
    if isa == "portable":
        return {"portable": Plan(n, n, n), **out}
    if op.scheme is W4A8:
        out["vnni"] = Plan(n, n, n)
        if isa == "amx":
            out["amx"] = Plan(0, n, n)
        return out
    if x_dtype == torch.bfloat16:
        out["decode_bf16"] = Plan(n, n, n)
        if isa == "amx":
            out["amx"] = Plan(0, n, n)
    out["f32_rows"] = Plan(n, n, 0)
    out["panel"] = Plan(n, 0, 0)
    return out
