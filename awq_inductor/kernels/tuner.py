"""Per-machine kernel choice: time the candidate kernel paths of a shape, keep the winners on disk.

The drivers pick a kernel path per call from M and a few row thresholds (``awq::Thresholds`` in
``csrc_templates/runtime/driver.h.j2``): AMX tiles from ``amx_min_m`` rows, the AVX512-BF16 decode
kernel below ``bf16_f32_min_m``, the dequantize-once panel kernels from ``panel_min_m`` (fp32 FMA
on exact weights for fp32 / fp16 x; for bf16 x a bf16 GEMM loop on weights dequantized to bf16
once per M block, the dense candidate's numerics without its DRAM round trip). On top
of them, from ``dense_min_m`` rows a call runs :func:`dense_call`, the "never slower than dense"
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
select that path for every M), for M in :data:`M_BUCKETS`, on column slices of the weight (full
K), each the minimum of a few calls; below ``LARGE_M`` rows the full-N time is predicted from a
per-call part and a per-column part fitted through two slices, from ``LARGE_M`` rows one wider
slice is scaled to N (:func:`kernel_timer`; the dense candidate gets one untimed
call per (M, slice) first: oneDNN JIT-compiles its GEMM per shape on the first call). A candidate more than ``DROP_RATIO``
times slower than the best at two consecutive buckets (from ``DROP_MIN_M`` rows) is not timed for
larger M (the paths' costs grow monotonically in M). The thresholds are then the ones
that minimise the summed time-over-best across the buckets, given the order in which the C++
checks them (:func:`path_for`), after each bucket's two fastest paths are timed again (the
minimum of both timings counts), and a shape whose timings do not repeat (:func:`noisy_buckets`: a busy machine) keeps the constants (cached, marked noisy: the
``tune`` command measures it again).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import tempfile
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import config
from ..schemes import W4A8, Op
from . import cache_key

log = logging.getLogger(__name__)

#: "never": a threshold no M reaches.
NEVER = 1 << 40
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
#: The wide slice of the two-point fit (kernel_timer), full K: 4 tiles of 64 per thread at 2
#: threads. The large-M buckets dominate the tuning time, linearly in this.
TUNE_COLUMNS = 512
#: The narrow slice of the two-point fit (kernel_timer): one 64-column driver tile per thread at 2
#: threads (narrower, the driver would K-slice: another regime).
SMALL_COLUMNS = 128
#: From LARGE_M rows every path is compute-bound and its per-call part (x conversion or packing)
#: is small next to the GEMM, so one slice of LARGE_COLUMNS, scaled to N, predicts the call. The
#: two-point fit multiplies the noise of (wide - narrow) by N / 384 there: on the idle VM it
#: predicted 55.9 ms for both M = 256 and 512 of one path at 4096 x 4096, and 199 / 224 ms for
#: M = 1024 / 2048 of another.
LARGE_M = 128
LARGE_COLUMNS = 1024
#: Timed again, a bucket's fastest path must agree with its first time within this fraction.
NOISE = 0.25
#: A measured plan replaces the constants only if it is this much better in total (summed
#: time-over-best across the buckets): noise alone never moves a threshold.
MIN_GAIN = 1.03
#: A candidate this many times slower than the best at two consecutive buckets from DROP_MIN_M
#: rows on is dropped (below that, timings of a few microseconds on a shared machine are noise).
DROP_RATIO = 2.0
DROP_MIN_M = 32
BF16_F32_MIN_M = 9  # = csrc_templates/runtime/driver.h.j2 Thresholds::bf16_f32_min_m
THRESHOLDS = ("amx_min_m", "panel_min_m", "bf16_f32_min_m", "dense_min_m")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Rows from which each path is taken (see the module docstring); ``source`` says where the
    plan came from (``default`` | ``forced`` | ``cached`` | ``tuned``)."""

    amx_min_m: int
    panel_min_m: int
    bf16_f32_min_m: int
    dense_min_m: int = NEVER
    source: str = "default"

    def cxx_args(self) -> Tuple[int, int, int]:
        """The ``awq::Thresholds`` fields, in order."""
        return (self.amx_min_m, self.panel_min_m, self.bf16_f32_min_m)

    def cxx(self) -> str:
        return ", ".join(str(v) for v in self.cxx_args())

    def thresholds(self) -> Dict[str, int]:
        return {k: getattr(self, k) for k in THRESHOLDS}


def default_plan() -> Plan:
    """The constants (``config.amx_min_m``, ``config.panel_min_m``, bf16 -> fp32 from 9 rows: the
    decode kernel reads the weights once for up to 8 rows, no dense)."""
    return Plan(int(config.amx_min_m), int(config.panel_min_m), BF16_F32_MIN_M)


def forced_plan(values: dict) -> Plan:
    unknown = set(values) - set(THRESHOLDS)
    if unknown:
        raise ValueError(f"config.kernel_plan: expected keys among {THRESHOLDS}, got {sorted(unknown)}")
    return dataclasses.replace(default_plan(), source="forced", **{k: int(v) for k, v in values.items()})


# ---------------------------------------------------------------------------------------------
# Which path a plan takes (mirrors the drivers' checks)
def path_for(plan: Plan, op: Op, isa: str, x_dtype: torch.dtype, M: int) -> str:
    """The kernel path ``plan`` selects for M rows: ``dense``, ``amx``, ``decode_bf16``,
    ``f32_rows``, ``panel`` (W4A16), ``vnni`` (W4A8) or ``portable``."""
    if M >= plan.dense_min_m:
        return "dense"
    if isa == "portable":
        return "portable"
    if op.scheme is W4A8:
        return "amx" if isa == "amx" and M >= plan.amx_min_m else "vnni"
    if x_dtype == torch.bfloat16:
        if isa == "amx" and M >= plan.amx_min_m:
            return "amx"
        if M < plan.bf16_f32_min_m:
            return "decode_bf16"
    return "panel" if M >= plan.panel_min_m else "f32_rows"


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


def choose(op: Op, isa: str, x_dtype: torch.dtype, times: Dict[str, Dict[int, float]]) -> Plan:
    """The thresholds minimising sum over buckets of time(selected path) / time(best path)
    (``times``: path -> {M: seconds}; a path missing at an M counts as 10x the best). Ties go to
    the larger thresholds (the paths for small M); the constants stay unless the best plan beats
    them by ``MIN_GAIN``."""
    ms = sorted({m for t in times.values() for m in t})
    best = {m: min(t[m] for t in times.values() if m in t) for m in ms}

    def cost(plan: Plan) -> float:
        return sum(times.get(path_for(plan, op, isa, x_dtype, m), {}).get(m, 10 * best[m]) / best[m] for m in ms)

    values = sorted(set(ms) | {0, NEVER})
    free = _free_thresholds(op, isa, x_dtype)
    base = dataclasses.replace(default_plan(), source="tuned")
    best_plan, best_cost, best_combo = base, float("inf"), ()
    for combo in itertools.product(values, repeat=len(free)):
        plan = dataclasses.replace(base, **dict(zip(free, combo)))
        c = cost(plan)
        if c < best_cost - 1e-9 or (abs(c - best_cost) <= 1e-9 and combo > best_combo):
            best_plan, best_cost, best_combo = plan, c, combo
    return base if cost(base) <= best_cost * MIN_GAIN else best_plan


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
# The dense candidate (also what the eager op runs from plan.dense_min_m rows)
#: Bytes of one dequantized weight block of the dense candidate (x's dtype, [columns, K]). Each
#: block costs three OpenMP regions (dequantization, GEMM, copy into the output), and on the shared
#: 2-vCPU Zen 4 VM (load 4-7) every region waits for a preempted thread: bf16, M = 128-512, dense /
#: F.linear of the pre-dequantized weight was 1.07-1.11 (4096 x 4096) with 4 MiB blocks at load 4
#: but 1.8-5.2 with 2-8 MiB blocks at load 7, against 1.06-1.28 for one block (the whole weight).
#: Large blocks keep the region count at 1-6 per call for the Llama-7B shapes; the per-block GEMM
#: itself loses under 2% from 256 columns on (4096 x 4096, M = 128 and 512, idle).
DENSE_BLOCK_BYTES = 32 << 20
_dense_buffers = threading.local()


def dense_block_columns(K: int, itemsize: int, block_bytes: Optional[int] = None) -> int:
    """Packed columns per block: a multiple of 64 (a gate|up block holds whole gate + up panel
    pairs), at least 64."""
    return max(64, (block_bytes or DENSE_BLOCK_BYTES) // (K * itemsize) // 64 * 64)


def _block_buffer(rows: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread [rows, K] buffer, reused across calls (a fresh allocation of many MiB per call is an
    mmap and page faults; concurrent callers on other threads get their own)."""
    bufs = getattr(_dense_buffers, "bufs", None)
    if bufs is None:
        bufs = _dense_buffers.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < rows * K:
        buf = bufs[dtype] = torch.empty(rows * K, dtype=dtype)
    return buf[: rows * K].view(rows, K)


def dense_call(op: Op, x: torch.Tensor, *args, block_bytes: Optional[int] = None) -> torch.Tensor:
    """Blockwise dense: for each block of packed columns, the C++ dequantization
    (``runtime/dense.h.j2``, exact: (q - z) * s rounded once to x's dtype) into a reused buffer,
    then ``F.linear`` in x's dtype (oneDNN) with the block's bias, and for the gate|up op
    ``silu(gate) * up`` of the block's interleaved 32-column panel pairs. Never slower than the
    dense model by more than the dequantization, which runs from cache, not DRAM."""
    from . import native

    *weights, bias, group_size, out_features = args
    qweight, scales, zeros = weights[:3]
    n, cpo = op.columns(out_features), op.spec.columns_per_output
    M, K = x.shape
    deq = native.get_dequant(op.scheme.name, x.dtype)
    nb = min(n, dense_block_columns(K, x.element_size(), block_bytes))
    buf = _block_buffer(nb, K, x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    y = None if nb >= n else torch.empty(M, out_features, dtype=x.dtype)
    for n0 in range(0, n, nb):
        n1 = min(n, n0 + nb)
        yb = F.linear(x, deq(qweight, scales, zeros, n, n0, n1, buf)[: n1 - n0], None if b is None else b[n0:n1])
        if cpo == 2:  # panels alternate gate (32 columns), up (32 columns), from n0 % 64 == 0;
            # SiLU * mul in fp32 and one rounding, as the C++ epilogue (epilogues/silu_mul.h.j2)
            yb = yb.view(M, -1, 2, 32).float()
            yb = (F.silu(yb[:, :, 0]) * yb[:, :, 1]).reshape(M, -1).to(x.dtype)
        if y is None:
            return yb
        y[:, n0 // cpo: n1 // cpo] = yb
    return y


# ---------------------------------------------------------------------------------------------
# Measuring
Timer = Callable[[str, Plan, int], float]


def _random_weights(op: Op, K: int, out_features: int, G: int):
    g = torch.Generator().manual_seed(0)
    n = op.columns(out_features)
    q = torch.randint(0, 16, (n, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (n, K // G), dtype=torch.uint8, generator=g)
    s = torch.rand(n, K // G, generator=g) * 0.01 + 0.001
    return op.pack(q, z, s, G, out_features)


def kernel_timer(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> Timer:
    """A timer running the real kernels on column slices of the shape and predicting the seconds of
    one full call: t(n) = a + b * n fitted through a narrow (``SMALL_COLUMNS``) and a wide
    (``TUNE_COLUMNS``) slice. The per-call part ``a`` matters: the fp32 paths convert (and page in)
    an M x K copy of x per call, which a single 256-column slice overweighted 20-40x at N = 11008
    (the slice picked the bf16 decode kernel for M = 2048, 1.2x slower than the panel path at
    full size)."""
    from . import native

    n_full = op.columns(out_features)
    cpo = op.spec.columns_per_output
    wide = min(out_features, max(32, TUNE_COLUMNS // cpo))
    narrow = min(wide, max(32, SMALL_COLUMNS // cpo))
    large = min(out_features, max(32, LARGE_COLUMNS // cpo))
    slices = {n: _random_weights(op, K, n, G) for n in {wide, narrow, large}}
    kern = native.get_kernel(op.name, x_dtype, isa)
    xs: Dict[int, torch.Tensor] = {}

    def run(path: str, plan: Plan, M: int, n: int):
        x = xs[M]
        if path == "dense":
            return dense_call(op, x, *slices[n], None, G, n)
        return kern(x, *slices[n], None, G, n, plan=plan)

    warmed = set()

    def once(path: str, plan: Plan, M: int, n: int) -> float:
        # the minimum of a few calls, at least two (a shared machine preempts in quanta of
        # milliseconds); a first call over 40 ms is its own measurement (the large-M buckets
        # dominate the tuning time)
        if M not in xs:  # made before the clock starts (torch.randn of 2048 x 4096 takes ~30 ms)
            xs[M] = torch.randn(M, K).to(x_dtype)
        if path == "dense" and (M, n) not in warmed:
            # oneDNN creates (JIT-compiles) its GEMM for each new shape on the first call: on the
            # idle Zen 4 VM that first call made dense at K = N = 4096 predict 33.9 ms at M = 128
            # and 129.9 at 512 (40.3 at 1024), while it runs 11-12 and 41
            warmed.add((M, n))
            run(path, plan, M, n)
        best, spent, k = float("inf"), 0.0, 0
        while k < 10 and (k < 2 or spent < 10e-3):
            t0 = time.perf_counter()
            run(path, plan, M, n)
            t = time.perf_counter() - t0
            best, spent, k = min(best, t), spent + t, k + 1
            if k == 1 and t > 40e-3:
                break
        return best

    def timer(path: str, plan: Plan, M: int) -> float:
        if M >= LARGE_M:
            return once(path, plan, M, large) * n_full / (large * cpo)
        t_wide = once(path, plan, M, wide)
        if wide == narrow or wide * cpo >= n_full:
            return t_wide * n_full / (wide * cpo)
        t_narrow = once(path, plan, M, narrow)
        per_col = max(t_wide - t_narrow, 0.0) / ((wide - narrow) * cpo)
        return max(t_narrow - per_col * narrow * cpo, 0.0) + per_col * n_full

    return timer


def measure(cands: Dict[str, Plan], timer: Timer, m_buckets: Iterable[int] = M_BUCKETS) -> Dict[str, Dict[int, float]]:
    """path -> {M: seconds}, dropping a path for larger M once it was DROP_RATIO x slower than the
    best at two consecutive buckets (from DROP_MIN_M rows)."""
    times: Dict[str, Dict[int, float]] = {p: {} for p in cands}
    slow = {p: 0 for p in cands}
    for M in m_buckets:
        live = [p for p in cands if slow[p] < 2]
        for p in live:
            times[p][M] = timer(p, cands[p], M)
        best = min(times[p][M] for p in live)
        for p in live:
            slow[p] = slow[p] + 1 if M >= DROP_MIN_M and times[p][M] > DROP_RATIO * best else 0
    return times


def noisy_buckets(cands: Dict[str, Plan], times: Dict[str, Dict[int, float]], timer: Timer) -> List[int]:
    """The buckets whose choice does not repeat: the fastest and the second-fastest path, timed
    again, and the first now slower than the second by more than ``NOISE`` (a preempted run on a
    loaded machine). The times themselves need not repeat: the two-slice prediction of a full call
    varies by more than 25% between runs on the idle VM (3 of the 4 Llama-7B shapes were flagged
    by a check of the winner's time alone), while the choice it supports did not change.
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
               timer: Optional[Timer] = None, m_buckets: Iterable[int] = M_BUCKETS) -> Tuple[Plan, dict]:
    """(the measured plan, the timings in ms per path and M) for one shape. Where the check of
    :func:`noisy_buckets` fails for more than a quarter of the buckets, the plan is the constants
    (``source="noisy"``; cached as such, so later processes neither pay for measuring again nor
    see their cache keys change: ``python -m awq_inductor tune`` measures those shapes again)."""
    m_buckets = list(m_buckets)
    cands = candidates(op, isa, x_dtype)
    timer = timer or kernel_timer(op, isa, x_dtype, K, out_features, G)
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


# ---------------------------------------------------------------------------------------------
# The on-disk cache and the per-process plans
def shape_key(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> str:
    return f"{op.name}/{isa}/{str(x_dtype).replace('torch.', '')}/K{K}/N{op.columns(out_features)}/G{G}"


def threads() -> int:
    return int(config.num_threads or torch.get_num_threads())


def cache_path(n_threads: Optional[int] = None) -> str:
    """``<cache dir>/tuning/<machine key>.json`` (cache dir: ``$AWQ_INDUCTOR_CACHE_DIR`` or
    ``~/.cache/awq_inductor``)."""
    from .native import cache_dir

    return os.path.join(cache_dir(), "tuning", cache_key.machine_key(n_threads or threads()) + ".json")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {"plans": {}}
    except (OSError, ValueError) as e:
        log.warning("awq_inductor: ignoring the unreadable tuning cache %s (%s); it will be rewritten", path, e)
        return {"plans": {}}
    if not isinstance(data.get("plans"), dict):
        log.warning("awq_inductor: ignoring the tuning cache %s: no 'plans' object", path)
        return {"plans": {}}
    return data


def _write(path: str, data: dict) -> None:
    """Atomically (temp file + os.replace): concurrent readers see the old or the new file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_lock = threading.Lock()
_memo: Dict[Tuple[int, str], Plan] = {}  # (threads, shape key) -> plan


def store(key: str, plan: Plan, times: dict, n_threads: Optional[int] = None) -> None:
    """Add one shape's plan to the cache file (read, merge, atomic write) and to this process."""
    path = cache_path(n_threads)
    with _lock:
        data = _read(path)
        data["machine"] = cache_key.machine(n_threads or threads())
        data["plans"][key] = {**plan.thresholds(), "noisy": plan.source == "noisy", "times_ms": times}
        _write(path, data)
        _memo[(n_threads or threads(), key)] = dataclasses.replace(plan, source="tuned")


def _is_noisy(path: str, key: str) -> bool:
    return bool(_read(path)["plans"].get(key, {}).get("noisy"))


def _cached(path: str, key: str) -> Optional[Plan]:
    entry = _read(path)["plans"].get(key)
    if entry is None:
        return None
    try:
        return Plan(**{k: int(entry[k]) for k in THRESHOLDS}, source="cached")
    except (KeyError, TypeError, ValueError):
        log.warning("awq_inductor: ignoring the malformed tuning entry %s in %s", key, path)
        return None


def plan_for(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> Plan:
    """The plan the kernels of this shape use (see the module docstring); memoised per process."""
    if config.kernel_plan is not None:
        return forced_plan(config.kernel_plan)
    from . import isa as isa_mod

    if config.tune == "off" or isa == "portable" or (isa == "amx" and isa_mod.amx_emulated()):
        return default_plan()
    key = shape_key(op, isa, x_dtype, K, out_features, G)
    plan = _memo.get((threads(), key))
    if plan is not None:
        return plan
    path = cache_path()
    plan = _cached(path, key)
    if plan is None and config.tune == "auto":
        t0 = time.perf_counter()
        plan, times = tune_shape(op, isa, x_dtype, K, out_features, G)
        store(key, plan, times)
        if plan.source != "noisy":  # (tune_shape has said why it kept the constants)
            log.warning("awq_inductor: tuned the kernel choice for %s in %.1f s (%s); cached in %s",
                        key, time.perf_counter() - t0, plan.thresholds(), path)
    if plan is None:
        return default_plan()
    _memo[(threads(), key)] = plan
    return plan


def cache_digest() -> str:
    """sha256 of this machine's tuning cache file ("" without one): part of the FX cache key."""
    import hashlib

    try:
        with open(cache_path(), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def forget() -> None:
    """Drop the per-process plans (tests: the next lookup reads the cache again)."""
    with _lock:
        _memo.clear()
    cache_key.machine_key.cache_clear()


# ---------------------------------------------------------------------------------------------
# Shapes of a model, for ``python -m awq_inductor tune``
@dataclasses.dataclass(frozen=True)
class Shape:
    op: Op
    K: int
    out_features: int
    G: int


def model_shapes(config_json: dict, act_quant: Optional[str] = None) -> List[Shape]:
    """The distinct int4 op shapes of a Llama-style decoder (fused qkv, o, gate|up + SiLU, down; the
    experts' gate|up and down of a Qwen-MoE, whose ``moe_intermediate_size`` and
    ``shared_expert_intermediate_size`` name them; Mixtral's experts have ``intermediate_size``)
    from its ``config.json``; G from ``quantization_config.group_size`` (-1: K)."""
    from ..schemes import GATE_UP_SILU, LINEAR, op_for

    try:
        h, inter = int(config_json["hidden_size"]), int(config_json["intermediate_size"])
        hq = int(config_json["num_attention_heads"])
    except KeyError as e:
        raise ValueError(f"config.json: expected hidden_size, intermediate_size and num_attention_heads, "
                         f"missing {e}") from None
    hkv = int(config_json.get("num_key_value_heads") or hq)
    d = int(config_json.get("head_dim") or h // hq)
    g = int((config_json.get("quantization_config") or {}).get("group_size", 128))
    lin, gu = op_for(act_quant, LINEAR), op_for(act_quant, GATE_UP_SILU)
    dims = [(lin, h, (hq + 2 * hkv) * d), (lin, hq * d, h), (gu, h, inter), (lin, inter, h)]
    # sparse-MoE experts (moe.expert_plans looks up these two dense-op shapes) and a shared expert
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if config_json.get(key):
            dims += [(gu, h, int(config_json[key])), (lin, int(config_json[key]), h)]
    out, seen = [], set()
    for op, K, n in dims:
        s = Shape(op, K, n, K if g == -1 else g)
        if (op.name, K, n, s.G) not in seen:
            seen.add((op.name, K, n, s.G))
            out.append(s)
    return out


def parse_shapes(text: str, G: int, act_quant: Optional[str] = None) -> List[Shape]:
    """``"4096x4096,4096x11008"`` -> linear-op shapes (K x N)."""
    from ..schemes import LINEAR, op_for

    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            K, N = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: expected KxN items like 4096x11008, got {item!r}") from None
        out.append(Shape(op_for(act_quant, LINEAR), K, N, G))
    return out


def tune_shapes(shapes: List[Shape], x_dtype: torch.dtype, isa: Optional[str] = None, show: Optional[bool] = None,
                retune: bool = False) -> List[Tuple[Shape, Plan]]:
    """Fill the cache for ``shapes`` (a progress bar on a terminal); shapes already cached are
    kept unless ``retune``."""
    from ..progress import track
    from . import isa as isa_mod

    isa = isa or isa_mod.select()
    out = []
    for s in track(shapes, "tuning kernels", show=show, unit="shape"):
        key = shape_key(s.op, isa, x_dtype, s.K, s.out_features, s.G)
        plan = None if retune or _is_noisy(cache_path(), key) else _cached(cache_path(), key)
        if plan is None:
            plan, times = tune_shape(s.op, isa, x_dtype, s.K, s.out_features, s.G)
            store(key, plan, times)
        out.append((s, plan))
    return out


# ---------------------------------------------------------------------------------------------
# python -m awq_inductor tune
def main(argv=None) -> int:
    """``python -m awq_inductor tune --model DIR | --shapes KxN,...``: fill the tuning cache."""
    import argparse

    from ..kernels.codegen import dtype_name

    p = argparse.ArgumentParser(prog="python -m awq_inductor tune", description=main.__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="a checkpoint folder (its config.json: Llama-style shapes)")
    src.add_argument("--shapes", metavar="KxN,...", help="linear shapes, e.g. 4096x4096,4096x11008")
    p.add_argument("--group-size", type=int, default=128, help="G for --shapes (default 128)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--act-quant", default=None, choices=["int8"], help="tune the W4A8 ops instead")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--retune", action="store_true", help="measure again shapes that are already cached")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model:
        with open(os.path.join(a.model, "config.json")) as f:
            shapes = model_shapes(json.load(f), a.act_quant)
    else:
        shapes = parse_shapes(a.shapes, a.group_size, a.act_quant)
    dtype = getattr(torch, dtype_name(a.dtype))
    t0 = time.perf_counter()
    done = tune_shapes(shapes, dtype, retune=a.retune)
    print(f"tuned {len(done)} shape(s) in {time.perf_counter() - t0:.1f} s, {threads()} threads -> {cache_path()}")
    for s, plan in done:
        th = ", ".join(f"{k}={'never' if v >= NEVER else v}" for k, v in plan.thresholds().items())
        print(f"  {s.op.name} K={s.K} N={s.out_features} G={s.G}: {th} ({plan.source})")
    return 0
