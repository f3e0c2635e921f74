"""Per-machine kernel choice: time the candidate kernel paths of a shape, keep the winners on disk.

The drivers pick a kernel path per call from M and a few row thresholds (``awq::Thresholds`` in
``csrc_templates/runtime/driver.h.j2``): AMX tiles from ``amx_min_m`` rows, the AVX512-BF16 decode
kernel below ``bf16_f32_min_m``, the dequantize-once panel kernels from ``panel_min_m`` (fp32 FMA
on exact weights for fp32 / fp16 x; for bf16 x a bf16 GEMM loop on weights dequantized to bf16
once per M block, the dense candidate's numerics without its DRAM round trip). On top
of them, from ``dense_min_m`` rows a call runs :func:`~awq_inductor.kernels.dense.dense_call`, the "never slower than dense"
candidate: blocks of packed columns dequantized exactly into x's dtype by our C++
(``runtime/dense.h.j2``), each followed by the dense GEMM (``F.linear``: oneDNN). A :class:`Plan` is those four
numbers for one (scheme, op, ISA, x dtype, K, N, G) on one machine (``cache_key.machine``: CPU model
and flags, threads, torch and package version).

:func:`plan_for` (memoised per process) returns, in this order: ``config.kernel_plan`` (forced),
the constants of :mod:`awq_inductor.config` (``config.tune == "off"``, the portable ISA, or AMX
running on the tile emulator), a plan from the on-disk cache, or a plan measured now
(``config.tune == "auto"``, one log line) and written to the cache. The eager op passes the plan's
thresholds to the C++ entry point; the Inductor template renders them into the generated code, and
:func:`cache_digest` (the cache file's content) is part of the FX cache key, so a retune never
reuses code generated for the previous plan.

Measuring (:func:`tune_shape`): every candidate path is forced in turn (a plan whose thresholds
select that path for every M), for M in :data:`M_BUCKETS`, at full size on cold copies of the
weight, each the minimum of a few calls (:func:`kernel_timer`; the dense candidate gets one untimed
call per M first: oneDNN JIT-compiles its GEMM per shape on the first call). A candidate more than
``DROP_RATIO`` times slower than the best at two consecutive buckets (from ``DROP_MIN_M`` rows) is not timed for
larger M (the paths' costs grow monotonically in M). The thresholds are then the ones
that minimise the summed time-over-best across the buckets, given the order in which the C++
checks them (:func:`path_for`), after each bucket's two fastest paths are timed again (the
minimum of both timings counts), and a shape whose timings do not repeat (:func:`noisy_buckets`: a busy machine) keeps the constants (cached, marked noisy: the
``tune`` command measures it again).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import statistics
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch

from .. import config
from ..schemes import LINEAR, W4A8, W4A16, Op, Scheme
from . import background, dense, hugepages, native
from .plan import NEVER, DEFAULT_DECODE, DecodeSetting, Plan, candidate_of, candidates, default_plan, path_for

log = logging.getLogger(__name__)

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
#: Timed again, a bucket's fastest path must agree with its first time within this fraction.
NOISE = 0.25
#: A measured plan replaces the constants only if it is this much better in total (summed
#: time-over-best across the buckets): noise alone never moves a threshold.
MIN_GAIN = 1.03
#: ... or where, at one bucket from DROP_MIN_M rows, the constants' path is this much slower than a plan
#: that keeps their paths below DROP_MIN_M (_large_m_plan). Why: the sum hides one lost bucket among
#: twelve; on the AMX Xeon (2026-12-07) 11008 x 4096 ran 127.1 ms at M = 2048 on the AMX path against
#: 109.5 on the dense one (1.16x), 4096 x 4096 22.2 against 19.9 at M = 1024 (1.12x), and the constants
#: stayed because the plans' sums differed by 1.6 % (12.20 against 12.00):
#: benchmarks/results/tuner_bucket_loss_amx_1207.md.
BUCKET_LOSS = 1.10
#: A candidate this many times slower than the best at two consecutive buckets from DROP_MIN_M
#: rows on is dropped (below that, timings of a few microseconds on a shared machine are noise).
DROP_RATIO = 2.0
DROP_MIN_M = 32
# ---------------------------------------------------------------------------------------------
# Measuring
Timer = Callable[[str, Plan, int], float]


def cold_bytes() -> int:
    """Weight bytes a cold measurement rotates through, so that every call reads from DRAM: 3x the
    last-level caches serving this process's CPUs (Zen 4: one 32 MB L3 -> 96 MB), at least 64 MiB,
    at most 256 MiB (the Xeon VM reports a 480 MB L3 but streams 256 MiB at its DRAM rate); 256 MiB
    where the caches cannot be read. Why not 256 MiB everywhere: making the copies was 1.3 s of the
    demo's 3.3 s cold load on the 2-core Zen 4 VM."""
    l3 = last_level_cache_bytes()
    return 256 << 20 if l3 is None else min(256 << 20, max(64 << 20, 3 * l3))


#: Int4 weight bytes up to which a model's decode reads its weights from the caches (half the
#: last-level caches, at most this): its decode kernels run the constants' setting unless the machine's
#: is already cached (:func:`streams_weights`).
RESIDENT_MAX_BYTES = 16 << 20


def streams_weights(weight_bytes: int) -> bool:
    """Whether a decode step over ``weight_bytes`` of int4 weights reads them from DRAM: more than
    half the last-level caches or :data:`RESIDENT_MAX_BYTES`. Only then does the machine's decode
    setting (software prefetch, int16 x: :func:`tune_decode_setting`) get measured at load. Why:
    measuring it over 256 MiB of cold copies was 1.7-2.3 s of the tiny Llama demo's cold start on
    the 2-vCPU AMX Xeon (2 MB of int4 weights); on those weights, warm, M = 1, the setting measured
    there (2048 + int16) took 86.5 us per layer's four ops against the constants' 89.8 (0.963x, 9
    interleaved rounds, benchmarks/results/resident_decode_1206.py): 1-2 % of the demo's decode."""
    l3 = last_level_cache_bytes()
    return weight_bytes > (RESIDENT_MAX_BYTES if l3 is None else min(RESIDENT_MAX_BYTES, l3 // 2))


def last_level_cache_bytes() -> Optional[int]:
    """The summed size of the distinct level-3 caches (sysfs) of the CPUs this process may run on;
    None where sysfs does not list them."""
    seen: Dict[str, int] = {}
    try:
        for cpu in os.sched_getaffinity(0):
            base = f"/sys/devices/system/cpu/cpu{cpu}/cache"
            for index in os.listdir(base):
                path = os.path.join(base, index)
                if not index.startswith("index") or _read(path, "level") != "3":
                    continue
                size = _read(path, "size")
                scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
                seen[_read(path, "shared_cpu_list")] = int(size.rstrip("KMG")) * scale
    except (OSError, ValueError, AttributeError):
        return None
    return sum(seen.values()) or None


def _read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name)) as f:
        return f.read().strip()


def _random_weights(op: Op, K: int, out_features: int, G: int):
    g = torch.Generator().manual_seed(0)
    n = op.columns(out_features)
    q = torch.randint(0, 16, (n, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (n, K // G), dtype=torch.uint8, generator=g)
    s = torch.rand(n, K // G, generator=g) * 0.01 + 0.001
    return op.pack(q, z, s, G, out_features)


# Why kernel_timer times every bucket at full size over cold copies of the whole weight (cold_bytes()
# of them in rotation: each call reads its weights from DRAM, as decode and prefill do, the other
# layers having evicted them): column slices, scaled or fitted to N, mispredicted at every M:
# - decode (M <= 8): timed hot, the AMX groups path and the decode kernel tied at M = 1 on the AMX
#   Xeon (0.628 / 0.631 ms, 4096 x 11008) and the plan took AMX; cold, the decode kernel was 1.3x
#   faster (1.20 / 1.55 ms). Cold slices predicted no better (the fp32 row kernel 1.33 ms, 2.8 at
#   full size): a 128-column slice is one tile per thread, all prefetch ramp-up.
# - batched decode (M = 16): a two-slice fit gave the bf16 panel 4.40 ms and the decode kernel 4.09
#   (4096 x 11008, Zen 4, 2 threads) and the plan took the panel, which ran 5.9-6.1 ms at full
#   size against the decode kernel's 4.2-4.8 (three thresholds in four tunings on one machine).
# - from M = 128: the fit multiplied the noise of (wide - narrow) by N / 384 (on the idle Zen 4 VM
#   55.9 ms for both M = 256 and 512 of one path at 4096 x 4096); one 1024-column slice scaled to N
#   multiplied the per-call part (packing x into AMX tiles: 4 MiB at M = 512, K = 4096) by N / 1024:
#   on the AMX Xeon it predicted the AMX path at 11.2-12.3 ms for 4096 x 4096, M = 512, against
#   dense (full size) 10.8-11.8, and the plan took dense, where full size, caches flushed and
#   interleaved, the AMX path ran 9.99 ms, dense 13.0 and F.linear of the dequantized weight 10.1
#   (benchmarks/results/amx_large_m_1203.md). The dense candidate was the first timed at full size
#   (a slice's dequantized block stays in cache, the full weight's goes to DRAM and back).
# - per-call parts in general: the fp32 paths convert (and page in) an M x K copy of x per call,
#   which a single 256-column slice overweighted 20-40x at N = 11008 (it picked the bf16 decode
#   kernel for M = 2048, 1.2x slower than the panel path at full size).
# A full-size call costs 0.5-120 ms, and the large-M buckets take one call each (see kernel_timer).


def kernel_timer(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> Timer:
    """A timer running the real kernels at full size, each call on the next of the cold copies of
    the weight (:class:`_ColdWeights`: read from DRAM, as decode and prefill read each layer's
    weights), and returning the seconds of one call (why full size: the comment above)."""
    kern = native.get_kernel(op.name, x_dtype, isa)
    xs: Dict[int, torch.Tensor] = {}
    cold = _ColdWeights(lambda: _random_weights(op, K, out_features, G))

    def run(path: str, plan: Plan, M: int):
        weights = cold.next()  # packed weight, scales, zeros, ...
        if path == "dense":
            return dense.dense_call(op, xs[M], *weights, None, G, out_features)
        return kern(xs[M], *weights, None, G, out_features, plan=plan)

    warmed = set()

    def timer(path: str, plan: Plan, M: int) -> float:
        # the minimum of a few calls, at least two (a shared machine preempts in quanta of
        # milliseconds); a first call over 40 ms is its own measurement (the large-M buckets
        # dominate the tuning time)
        if M not in xs:  # made before the clock starts (torch.randn of 2048 x 4096 takes ~30 ms)
            xs[M] = torch.randn(M, K).to(x_dtype)
        cold.make()  # the copies, once, before the clock
        if path == "dense" and M not in warmed:
            # oneDNN creates (JIT-compiles) its GEMM for each new shape on the first call: on the
            # idle Zen 4 VM that first call made dense at K = N = 4096 predict 33.9 ms at M = 128
            # and 129.9 at 512 (40.3 at 1024), while it runs 11-12 and 41
            warmed.add(M)
            run(path, plan, M)
        best, spent, k = float("inf"), 0.0, 0
        while k < 10 and (k < 2 or spent < 10e-3):
            t0 = time.perf_counter()
            run(path, plan, M)
            t = time.perf_counter() - t0
            best, spent, k = min(best, t), spent + t, k + 1
            if k == 1 and t > 40e-3:
                break
        return best

    return timer


#: Paths timed at every bucket however far behind: ``dense`` is the "never slower than dense"
#: candidate, and its fixed cost (dequantizing the whole weight) shrinks per row as M grows. On the
#: 2-core AMX Xeon (K 11008, N 4096) it took 2.0x / 2.4x the AMX path at M = 32 / 64, was dropped,
#: and never timed where it wins: 0.60x at M = 2048 (benchmarks/results/report_llama7b_amx.md).
NEVER_DROPPED = ("dense",)


class _ColdWeights:
    """Copies of a shape's packed weights (:func:`cold_bytes` of packed weight in all, scales and zeros
    shared), made on first use and handed out in rotation: every call reads a weight evicted since
    its last use, as decode does."""

    def __init__(self, make_weights: Callable[[], tuple]):
        self.make_weights = make_weights
        self.copies: List[tuple] = []
        self.i = 0

    def make(self) -> None:
        """The copies (once; before a clock starts): only tunes with decode buckets pay for them."""
        if not self.copies:
            qw, *rest = self.make_weights()
            count = max(2, cold_bytes() // max(1, qw.nbytes))
            # on the pages the model's weights get at load (hugepages.place_streamed_weights)
            self.copies = [(hugepages.copy_on_huge_pages(qw), *rest) for _ in range(count)]

    def next(self) -> tuple:
        self.make()
        self.i = (self.i + 1) % len(self.copies)
        return self.copies[self.i]


def measure(cands: Dict[str, Plan], timer: Timer, m_buckets: Iterable[int] = M_BUCKETS) -> Dict[str, Dict[int, float]]:
    """path -> {M: seconds}, dropping a path for larger M once it was DROP_RATIO x slower than the
    best at two consecutive buckets (from DROP_MIN_M rows), except :data:`NEVER_DROPPED`."""
    times: Dict[str, Dict[int, float]] = {p: {} for p in cands}
    slow = {p: 0 for p in cands}
    for M in m_buckets:
        live = [p for p in cands if slow[p] < 2]
        for p in live:
            times[p][M] = timer(p, cands[p], M)
        best = min(times[p][M] for p in live)
        for p in live:
            losing = M >= DROP_MIN_M and times[p][M] > DROP_RATIO * best and p not in NEVER_DROPPED
            slow[p] = slow[p] + 1 if losing else 0
    return times


def noisy_buckets(cands: Dict[str, Plan], times: Dict[str, Dict[int, float]], timer: Timer) -> List[int]:
    """The buckets whose choice does not repeat: the fastest and the second-fastest path, timed
    again, and the first now slower than the second by more than ``NOISE`` (a preempted run on a
    loaded machine). The times themselves need not repeat: a machine's bandwidth and the
    two-slice predictions of earlier tuners varied by more than 25% between runs on the idle VM (3
    of the 4 Llama-7B shapes were flagged by a check of the winner's time alone), while the choice
    they supported did not change.
    Both new times also lower ``times`` where smaller (the minimum of two interleaved
    measurements of the two paths that decide the bucket)."""
    out = []
    for m in sorted({m for t in times.values() for m in t}):
        ranked = sorted((q for q in times if m in times[q]), key=lambda q: times[q][m])
        if len(ranked) < 2:
            continue
        first, second = (timer(q, cands[q], m) for q in ranked[:2])
        for q, t in zip(ranked[:2], (first, second)):
            times[q][m] = min(times[q][m], t)
        if first > (1 + NOISE) * second:
            out.append(m)
    return out


def tune_shape(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int,
               timer: Optional[Timer] = None, m_buckets: Iterable[int] = M_BUCKETS,
               decode: DecodeSetting = DEFAULT_DECODE) -> Tuple[Plan, dict]:
    """(the measured plan, the timings in ms per path and M) for one shape, every candidate run with
    the machine's ``decode`` setting (the one its plans will carry: the decode path timed without
    its prefetch and int16 x ran at 49% of the read probe where it runs at 80%, and lost M = 1 of
    4096 x 4096 to the fp32 rows on the AMX Xeon at 38%; the int16 x figures: benchmarks/results/decode_int16_1205.md). Where the check of
    :func:`noisy_buckets` fails for more than a quarter of the buckets, the plan is the constants
    (``source="noisy"``; cached as such, so later processes neither pay for measuring again nor
    see their cache keys change: ``python -m awq_inductor tune`` measures those shapes again)."""
    m_buckets = list(m_buckets)
    cands = {path: plan.with_decode(decode) for path, plan in candidates(op, isa, x_dtype).items()}
    timer = timer or kernel_timer(op, isa, x_dtype, K, out_features, G)
    with background.quiet_for_timing():
        times = measure(cands, timer, m_buckets)
        # the second timing of each bucket's two best paths enters the choice: paths within a few
        # percent of each other (the panel kernel and oneDNN from M = 128 on Zen 4) were otherwise
        # decided by one sample's noise
        noisy = noisy_buckets(cands, times, timer)
    plan = choose(op, isa, x_dtype, times)
    if 4 * len(noisy) > len(m_buckets):
        log.warning("awq_inductor: kernel timings of %s K=%d N=%d are not repeatable (M = %s differ by more "
                    "than %d%% when timed again; load average %.1f): keeping the constant thresholds; "
                    "`python -m awq_inductor tune --retune` on an idle machine measures again",
                    op.name, K, out_features, noisy, NOISE * 100, os.getloadavg()[0])
        plan = dataclasses.replace(default_plan(), source="noisy")
    return plan, {p: {str(m): round(t * 1e3, 4) for m, t in tm.items()} for p, tm in times.items()}


def choose(op: Op, isa: str, x_dtype: torch.dtype, times: Dict[str, Dict[int, float]]) -> Plan:
    """The thresholds minimising sum over buckets of time(selected path) / time(best path)
    (``times``: path -> {M: seconds}; a path missing at an M counts as 10x the best). Ties go to
    the larger thresholds (the paths for small M). The constants stay unless the best plan beats
    them by ``MIN_GAIN`` in total; where it does not, the constants' paths below ``DROP_MIN_M`` rows
    stay and the larger buckets' paths are the best ones given those, if that wins one bucket by
    ``BUCKET_LOSS`` (:func:`_large_m_plan`)."""
    ms = sorted({m for t in times.values() for m in t})
    best = {m: min(t[m] for t in times.values() if m in t) for m in ms}

    def term(plan: Plan, m: int) -> float:
        return times.get(candidate_of(path_for(plan, op, isa, x_dtype, m)), {}).get(m, 10 * best[m]) / best[m]

    base = dataclasses.replace(default_plan(), source="tuned")
    free = _free_thresholds(op, isa, x_dtype)
    best_plan, best_cost = _least_cost(ms, free, base, term)
    if sum(term(base, m) for m in ms) > best_cost * MIN_GAIN:
        return best_plan
    return _large_m_plan(ms, free, base, term, lambda plan, m: path_for(plan, op, isa, x_dtype, m))


def _least_cost(ms: List[int], free: Tuple[str, ...], base: Plan, term: Callable[[Plan, int], float]) -> Tuple[Plan, float]:
    """``base`` with the ``free`` thresholds set to the values (buckets, 0 or NEVER) of least summed
    ``term`` over ``ms`` (ties: the larger thresholds), and that sum."""
    values = sorted(set(ms) | {0, NEVER})
    costs = _combo_costs(ms, values, free, base, term)
    best_cost, best_combo = float("inf"), ()
    for combo, c in zip(itertools.product(values, repeat=len(free)), costs.ravel().tolist()):
        if c < best_cost - 1e-9 or (abs(c - best_cost) <= 1e-9 and combo > best_combo):
            best_cost, best_combo = c, combo
    return dataclasses.replace(base, **dict(zip(free, best_combo))), best_cost


def _large_m_plan(ms: List[int], free: Tuple[str, ...], base: Plan, term: Callable[[Plan, int], float],
                  path: Callable[[Plan, int], str]) -> Plan:
    """Where the constants are within ``MIN_GAIN`` in total: the least-cost plan that runs the constants'
    path at every bucket below ``DROP_MIN_M`` rows, if the constants lose one bucket to it by
    ``BUCKET_LOSS``; else the constants. Why: the sum hides one lost bucket among twelve. Why only from
    DROP_MIN_M rows: below, one sample of a path that is not among a bucket's two fastest is never timed
    again (:func:`noisy_buckets`), and one bucket would move a small-M threshold on one noisy sample (on
    the AMX Xeon, 2026-12-07, 4096 x 4096's decode time at M = 2 came out at 1.9x its M = 1 time)."""
    def pinned(plan: Plan, m: int) -> float:
        return term(plan, m) if m >= DROP_MIN_M or path(plan, m) == path(base, m) else float(NEVER)

    plan, _ = _least_cost(ms, free, base, pinned)
    loses = any(term(base, m) > BUCKET_LOSS * term(plan, m) for m in ms if m >= DROP_MIN_M)
    return plan if loses else base


def _combo_costs(ms: List[int], values: List[int], free: Tuple[str, ...], base: Plan,
                 term: Callable[[Plan, int], float]) -> np.ndarray:
    """The summed ``term`` over ``ms`` of every plan ``base`` with the ``free`` thresholds set to a
    combination of ``values`` (an array indexed like ``itertools.product(values, repeat=len(free))``).
    Why not each plan's terms in turn: on AMX with bf16 x four thresholds over 14 values are 38416
    plans, 0.3 s of Python per shape (a third of the tiny Llama's tuning at load on the AMX Xeon,
    2026-12-06: 0.32 of 0.475 s).
    ``path_for`` compares M with each threshold and nothing else, so at each M the path follows from
    which free thresholds are <= M: one term per M and pattern (a threshold at 0 is <= every M, at
    NEVER none), summed over M in ascending order as ``choose``'s own sum."""
    total = np.zeros((len(values),) * len(free))
    vals = np.array(values)
    for m in ms:
        pattern = np.zeros((len(values),) * len(free), dtype=np.int64)
        for i in range(len(free)):
            shape = [1] * len(free)
            shape[i] = len(values)
            pattern = pattern + ((vals <= m).astype(np.int64) << i).reshape(shape)
        per_pattern = np.array([term(dataclasses.replace(base, **{f: 0 if bits >> i & 1 else NEVER
                                                                  for i, f in enumerate(free)}), m)
                                for bits in range(1 << len(free))])
        total = total + per_pattern[pattern]
    return total


def _free_thresholds(op: Op, isa: str, x_dtype: torch.dtype) -> Tuple[str, ...]:
    """The thresholds that change the path for this scheme, ISA and dtype."""
    if isa == "portable":
        return ("dense_min_m",)
    if op.scheme is W4A8:
        return ("amx_min_m", "dense_min_m") if isa == "amx" else ("dense_min_m",)
    out = ("amx_min_m",) if isa == "amx" and x_dtype == torch.bfloat16 else ()
    out += ("bf16_f32_min_m",) if x_dtype == torch.bfloat16 else ()
    return out + ("panel_min_m", "dense_min_m")


# ---------------------------------------------------------------------------------------------
# The decode kernels' setting: software prefetch and int16 x (per machine)
#: Settings (distance in bytes ahead in each weight stream, next N tile into L2) the bf16 decode
#: kernel is timed with. Cold, M = 1, 2 threads, bench_decode's harness, share of the read probe at
#: 4096 x 4096 / 4096 x 11008 on the 2-core Sapphire-Rapids-class Xeon: none 40% / 45%, 512 B 59 /
#: 64%, 1 KB 61 / 68-70%, 2 KB 58 / 67%, 4 KB 62-64 / 68-70%; on Zen 4 a 2 KB-ahead prefetch cost
#: 6-9% (1 thread), while the next tile's lines (two more streams per core) gave 1.2-1.3x at 1 and 2
#: threads (standalone loop of the kernel, 4096 x 11008-sized panels, interleaved with the probe:
#: 87-93% of it against 70-76%).
#: Each prefetch runs with bf16 x and with int16 x (plan.DEFAULT_DECODE_INT16: the issue rates
#: decide, not the memory). The 512 B and 1 KB distances also run with a second prefetch 4 KB ahead
#: into L2 (plan.DEFAULT_DECODE_PREFETCH_L2): on the AMX Xeon at 33-44 GB/s the int16 loop over the
#: tile layout read 85-98% of the probe with it, 79-87% without (4 KB and 8 KB alike, 16 KB less;
#: benchmarks/results/decode_prefetch_l2_1205.md).
DECODE_L2_DISTANCE = 4096
DECODE_CANDIDATES = tuple(DecodeSetting(d, t, i, l2) for l2 in (0, DECODE_L2_DISTANCE) for i in (0, 1) for t in (0, 1)
                          for d in (0, 512, 1024, 2048) if not (t and d == 2048) and (not l2 or d in (512, 1024)))
DECODE_ROUNDS = 5


def decode_candidates(scheme: Scheme) -> Tuple[DecodeSetting, ...]:
    """The settings of :data:`DECODE_CANDIDATES` that change ``scheme``'s decode kernels (all of them, or
    those with bf16 x where the scheme has no int16 x choice: ``Scheme.int16_x``), then, where the scheme's
    one-row kernels have the K split (``Scheme.two_k_streams``), each of them with two K streams. Why
    candidates and not a race of their own after the choice: the settings lie within a few percent of each other, so a later race
    against the chosen one only met that one's noise (the AMX Xeon's W4A8 kept one stream on a setting
    that ran 1.08x slower than the fastest in the race; two streams gain 0.93-1.10x there, 0.94-1.16x on
    W4A16 int16 x, 0.99-1.17x on bf16 x, per round: benchmarks/results/decode_k_streams_amx_1207.md)."""
    one = tuple(pf for pf in DECODE_CANDIDATES if scheme.int16_x or not pf.int16_x)
    return one + (tuple(pf._replace(k_streams=2) for pf in one) if scheme.two_k_streams else ())


def setting_name(setting: DecodeSetting) -> str:
    """``"1024"``, ``"0+next_tile"``, ``"512+int16"``, ``"1024+l2_4096"``, ``"0+no_rows_prefetch"``,
    ``"2048+int16+k2"``: a setting's key in the cached timings and its name in the log."""
    return (f"{setting.distance}" + ("+next_tile" if setting.next_tile else "") + ("+int16" if setting.int16_x else "")
            + (f"+l2_{setting.l2_distance}" if setting.l2_distance else "")
            + ("" if setting.rows_prefetch else "+no_rows_prefetch")
            + (f"+k{setting.k_streams}" if setting.k_streams != 1 else ""))


def decode_regimes() -> Tuple[int, ...]:
    """The thread counts the decode setting is timed at: the kernels' own (``config.threads()``) and
    one. Why one: a core that streams alone stands for a machine whose memory outruns its cores (this
    host's bandwidth moves between about 30 and 60 GB/s with its neighbours), where the software
    prefetch decides the speed; with memory scarce every setting reads at the memory's rate. Zen 4,
    M = 1, cold, share of the read probe, no prefetch / 512 B + next tile + 4 KB into L2: 11008 x 4096,
    2 threads at a 50-56 GB/s moment 72-74 / 84-87%, 1 thread 71-72 / 80-83%; 4096 x 22016, 1 thread
    69-70 / 78-83%, 2 threads at 33 GB/s 97-99 / 89-95%. Timed at 2 threads only, the tuning there kept
    no prefetch (1 KB + next tile 0.131 against 0.142 ms by median, not faster in most rounds: noisy;
    benchmarks/results/decode_setting_regimes_zen4_1207.md)."""
    own = config.threads()
    return (own, 1) if own > 1 else (own,)


def _regime_cost(times: Dict[DecodeSetting, Dict[int, float]]) -> Dict[DecodeSetting, float]:
    """Per setting, its worst ratio to the fastest setting over the regimes (``times[pf][threads]``)."""
    regimes = next(iter(times.values())).keys()
    fastest = {g: min(t[g] for t in times.values()) for g in regimes}
    return {pf: max(t[g] / fastest[g] for g in regimes) for pf, t in times.items()}


def tune_decode_setting(isa: str, scheme: Scheme = W4A16, timer: Optional[Callable[[DecodeSetting, int], float]] = None,
                        rows_timer: Optional[Callable[[DecodeSetting, int], float]] = None) -> Tuple[DecodeSetting, dict]:
    """(setting, {setting name: ms per call, ``name@Nt`` at N threads, "noisy": bool}) for ``scheme``
    on this machine: its linear op's bf16 decode kernel at M = 1 (4096 x 2048, G = 128), each setting
    of :func:`decode_candidates` timed over cold copies of the weights at each thread count of
    :func:`decode_regimes`, interleaved in :data:`DECODE_ROUNDS` rounds (median per setting and
    regime). The chosen setting is the one whose worst ratio to the fastest, over the regimes, is
    least (:func:`_regime_cost`); with int16 x only where that is ``MIN_GAIN`` faster than the same
    prefetch on bf16 x in every regime (in the compiled 4-layer Llama-7B-shaped decode on Zen 4, 1 KB
    + next tile + 4 KB into L2 gave 0.83-1.06x the step time of no prefetch, median 0.93, and with
    int16 x 0.83-1.20x, median 0.99: benchmarks/results/decode_setting_compiled_ab.py). It replaces the
    constants' (:data:`~awq_inductor.kernels.plan.DEFAULT_DECODE`) only if that cost is ``MIN_GAIN``
    lower and it is lower in most rounds: a busy machine (another
    job on the 2 cores once made every call 20x slower) keeps the constants and is marked noisy.
    Why per scheme: the W4A8 loop issues fewer instructions per weight byte and wants other
    streams in flight (AMX Xeon, M = 1, 2 threads, share of the read probe at 4096 x 11008 / 4096 x
    4096, bench_prefetch.py: W4A16 best 2 KB + int16 x 81 / 79%, next tile 76-78%; W4A8 2 KB 90 /
    84%, 1 KB + next tile 98 / 90%). Then the prefetch choice of calls of 5 rows or more
    (:func:`_rows_prefetch`, timed at :data:`ROWS_TIMED` rows). ``timer`` and ``rows_timer`` (tests):
    (setting, threads) -> seconds per call at M = 1 and at ROWS_TIMED rows (without ``rows_timer``
    where ``timer`` is given: the constant's choice)."""
    if timer is None:
        timer, rows_timer = _cold_decode_timer(isa, scheme), _cold_decode_timer(isa, scheme, ROWS_TIMED)
    settings, regimes = decode_candidates(scheme), decode_regimes()
    rounds: List[Dict[DecodeSetting, Dict[int, float]]] = []
    with background.quiet_for_timing():
        for _ in range(DECODE_ROUNDS):
            rounds.append({pf: {} for pf in settings})
            for g in regimes:
                for pf in settings:
                    rounds[-1][pf][g] = timer(pf, g)
        best, times = _one_row_choice(rounds, regimes)
        if rows_timer is not None:
            if scheme.int16_x:
                best, rows_times = _rows_int16(best, rounds, regimes, rows_timer)
                times.update(rows_times)
            best, rows_times = _rows_prefetch(best, rows_timer)
            times.update(rows_times)
    return best, times


def _medians(rounds: List[Dict[DecodeSetting, Dict[int, float]]], settings,
             regimes: Tuple[int, ...]) -> Dict[DecodeSetting, Dict[int, float]]:
    """Per setting of ``settings`` and regime, its median time over the M = 1 ``rounds``."""
    return {pf: {g: statistics.median(r[pf][g] for r in rounds) for g in regimes} for pf in settings}


def _one_row_choice(rounds: List[Dict[DecodeSetting, Dict[int, float]]], regimes: Tuple[int, ...]) -> Tuple[DecodeSetting, dict]:
    """:func:`tune_decode_setting`'s choice from its M = 1 rounds, and the medians by setting name."""
    settings = tuple(rounds[0])
    med = _medians(rounds, settings, regimes)
    cost = _regime_cost(med)
    best = min(cost, key=cost.get)
    plain = best._replace(int16_x=0)  # int16 x only for a clear gain in every regime: bf16 x keeps exact products
    if best.int16_x and any(med[plain][g] <= med[best][g] * MIN_GAIN for g in regimes):
        best = plain
    wins = sum(c[best] * MIN_GAIN < c[DEFAULT_DECODE] for c in map(_regime_cost, rounds))
    noisy = best != DEFAULT_DECODE and 2 * wins <= DECODE_ROUNDS
    if cost[DEFAULT_DECODE] <= cost[best] * MIN_GAIN or noisy:
        best = DEFAULT_DECODE
    names = {(pf, g): setting_name(pf) + ("" if g == regimes[0] else f"@{g}t") for pf in settings for g in regimes}
    return best, {**{names[pf, g]: round(med[pf][g] * 1e3, 4) for pf in settings for g in regimes}, "noisy": noisy}


#: Rows the prefetch choice of multi-row calls is timed at: one full pass of the decode kernels.
ROWS_TIMED = 8


#: int16 x taken for the rows' sake (:func:`_rows_int16`) where the rows run this much faster with it.
ROWS_INT16_GAIN = 1.25


def _rows_int16(best: DecodeSetting, rounds: List[Dict[DecodeSetting, Dict[int, float]]], regimes: Tuple[int, ...],
                timer: Callable[[DecodeSetting, int], float]) -> Tuple[DecodeSetting, dict]:
    """``best`` (bf16 x at M = 1) with int16 x where the same prefetch on int16 x is no slower at M = 1
    (within ``MIN_GAIN`` by median in every regime) and :data:`ROWS_TIMED` rows run
    :data:`ROWS_INT16_GAIN` faster with it, by median and in most of :data:`DECODE_ROUNDS` interleaved
    rounds at the kernels' threads; and the two rows timings (ms). Why: the M = 1 choice alone kept bf16 x
    on the AMX Xeon (int16 x 3 % faster there, under MIN_GAIN), where vdpbf16ps issues at half the rate of
    vpdpwssd and the 8-row pass took 0.82 ms against 0.37 (4096 x 2048): batched decode and the 2-8 row
    buckets ran at half speed (benchmarks/results/rows_int16_choice_amx_1207.md)."""
    alt = best._replace(int16_x=1)
    if best.int16_x or alt not in rounds[0]:
        return best, {}
    med = _medians(rounds, (best, alt), regimes)
    if any(med[alt][g] > med[best][g] * MIN_GAIN for g in regimes):
        return best, {}
    faster, rmed = _rows_race(timer, best, alt, ROWS_INT16_GAIN)
    return (alt if faster else best), {f"rows{ROWS_TIMED}/bf16_x": round(rmed[best] * 1e3, 4),
                                       f"rows{ROWS_TIMED}/int16_x": round(rmed[alt] * 1e3, 4)}


def _rows_race(timer: Callable[[DecodeSetting, int], float], a: DecodeSetting, b: DecodeSetting,
               gain: float) -> Tuple[bool, Dict[DecodeSetting, float]]:
    """(whether ``b`` runs ``gain`` times faster than ``a`` at :data:`ROWS_TIMED` rows, by median and in
    most of :data:`DECODE_ROUNDS` interleaved rounds at the kernels' threads; the medians in seconds)."""
    threads = config.threads()
    rounds = [{pf: timer(pf, threads) for pf in (a, b)} for _ in range(DECODE_ROUNDS)]
    med = {pf: statistics.median(r[pf] for r in rounds) for pf in (a, b)}
    wins = sum(r[b] * gain < r[a] for r in rounds)
    return med[b] * gain < med[a] and 2 * wins > DECODE_ROUNDS, med


def _rows_prefetch(best: DecodeSetting, timer: Callable[[DecodeSetting, int], float]) -> Tuple[DecodeSetting, dict]:
    """``best`` with the prefetch choice of calls of 5 rows or more (``rows_prefetch``: the rows'
    setting of runtime/driver.h.j2 decode_prefetch_of, or the M = 1 setting), and its timings (ms,
    ``rows8`` / ``rows8+prefetch``): on (:data:`~awq_inductor.kernels.plan.DEFAULT_ROWS_PREFETCH`)
    unless off is ``MIN_GAIN`` faster by median and in most of :data:`DECODE_ROUNDS` interleaved
    rounds, at the kernels' threads (these passes are bound by the dot products, not the stream: the
    one-thread regime says nothing of them)."""
    on, off = best._replace(rows_prefetch=1), best._replace(rows_prefetch=0)
    off_faster, med = _rows_race(timer, on, off, MIN_GAIN)
    times = {f"rows{ROWS_TIMED}": round(med[off] * 1e3, 4), f"rows{ROWS_TIMED}+prefetch": round(med[on] * 1e3, 4)}
    return best._replace(rows_prefetch=0 if off_faster else 1), times


def _cold_decode_timer(isa: str, scheme: Scheme, rows: int = 1) -> Callable[[DecodeSetting, int], float]:
    op, K, n, G = Op(scheme, LINEAR), 4096, 2048, 128
    qw, *rest = _random_weights(op, K, n, G)
    copies = [hugepages.copy_on_huge_pages(qw) for _ in range(max(1, cold_bytes() // qw.nbytes))]
    kern = native.get_kernel(op.name, torch.bfloat16, isa)
    x = torch.randn(rows, K).to(torch.bfloat16)
    base = dataclasses.replace(default_plan(), bf16_f32_min_m=NEVER, amx_min_m=NEVER, panel_min_m=NEVER)
    kern(x, qw, *rest, None, G, n, plan=base)  # built and warm before the clock

    def timer(pf: DecodeSetting, threads: int) -> float:
        plan = base.with_decode(pf)
        with config.patch(num_threads=threads):
            t0 = time.perf_counter()
            for q in copies:
                kern(x, q, *rest, None, G, n, plan=plan)
            return (time.perf_counter() - t0) / len(copies)

    return timer
