"""The machine's streaming-read bandwidth, measured by our own probe: the yardstick every benchmark
here divides its GB/s by ("share of the read bandwidth").

    python benchmarks/bw_probe.py                 # 1 and 2 threads, 1 GiB, best of 7
    python benchmarks/bw_probe.py --threads 1 --mib 256 --streams 1 2 4

``read_gbps(threads)``: best-of-``repeats`` GB/s of one read-only pass over one buffer (default
1 GiB, far larger than any L3 here), run by exactly ``threads`` OpenMP threads (dynamic teams off;
the C code reports how many ran and we check), each reading its own contiguous share.
``stream_calls(threads, nbytes)``: the same pass as a callable, for timing the probe interleaved
with kernels, so that a shared machine's load hits both alike.

The C kernel is built through :mod:`awq_inductor.kernels.native` (``build`` / ``library`` /
``bind``, cached on disk) with the flags of the ISA :func:`awq_inductor.kernels.isa.hardware_isa`
picks: AVX512 64-byte aligned loads (``_mm512_load_si512``) into four accumulators, or, on a CPU
without AVX512, a portable loop of 64-bit loads with the same structure.

Each thread reads its share as ``streams`` concurrent sequential streams (its ``streams`` equal
parts, one 64-byte line of each per step). The default is 4, as bench_decode's earlier probe had:
there one stream per thread measured 10-20% below the decode kernel's two weight-panel streams on
one core. On the Zen 4/5 VM here 1, 2 and 4 streams were within noise of each other (1 GiB, best of
7, three interleaved rounds, load 2.2-2.7: 1 thread 35.0-37.7 / 33.7-36.6 / 32.2-36.2 GB/s,
2 threads 32.8-34.2 / 32.5-39.0 / 28.7-33.6), and of ``torch.sum`` (31.7-38.5); measure yours
with ``--streams 1 2 4``.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import math
import os
import sys
import time
from typing import Callable, List, Optional, Tuple

import torch

from awq_inductor.kernels import isa as isa_mod
from awq_inductor.kernels import hugepages, native

LINE = 64  # bytes per cache line / per AVX512 load

_SRC = r"""
#include <cstdint>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// One read-only pass over n bytes at p (64-byte aligned, n % (64 * streams * 4) == 0) by exactly
// `threads` threads: thread t reads lines [l0, l1) of the buffer as `streams` contiguous parts, one
// line of each part per step, summed into four accumulators (independent dependency chains, so the
// adds never limit the loads). Returns the sum of all 64-bit words (so nothing is optimized away);
// *ran: the number of threads the team really had.
extern "C" uint64_t awq_bw_read(const uint8_t* p, int64_t n, int threads, int streams, int* ran) {
  omp_set_dynamic(0);
  uint64_t total = 0;
  int team = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (t == 0) team = nt;
    const int64_t step = (int64_t)streams * 4;  // lines per step of all streams
    const int64_t units = n / 64 / step;
    const int64_t l0 = units * t / nt * step, l1 = units * (t + 1) / nt * step;
    const int64_t part = (l1 - l0) / streams;  // lines per stream, a multiple of 4
#if defined(__AVX512F__)
    const __m512i* base = (const __m512i*)p + l0;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < part; i += 4 / (streams < 4 ? streams : 4)) {
      for (int s = 0; s < streams; s += 4) {
        // four lines per step: from four streams, or consecutive lines of fewer streams
        const int k = streams - s < 4 ? streams - s : 4;
        const __m512i* q = base + (int64_t)s * part + i;
        if (k == 4) {
          a0 = _mm512_add_epi64(a0, _mm512_load_si512(q));
          a1 = _mm512_add_epi64(a1, _mm512_load_si512(q + part));
          a2 = _mm512_add_epi64(a2, _mm512_load_si512(q + 2 * part));
          a3 = _mm512_add_epi64(a3, _mm512_load_si512(q + 3 * part));
        } else if (k == 2) {
          a0 = _mm512_add_epi64(a0, _mm512_load_si512(q));
          a1 = _mm512_add_epi64(a1, _mm512_load_si512(q + part));
          a2 = _mm512_add_epi64(a2, _mm512_load_si512(q + 1));
          a3 = _mm512_add_epi64(a3, _mm512_load_si512(q + part + 1));
        } else {
          a0 = _mm512_add_epi64(a0, _mm512_load_si512(q));
          a1 = _mm512_add_epi64(a1, _mm512_load_si512(q + 1));
          a2 = _mm512_add_epi64(a2, _mm512_load_si512(q + 2));
          a3 = _mm512_add_epi64(a3, _mm512_load_si512(q + 3));
        }
      }
    }
    total += _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#else
    // portable: the same lines, 64-bit loads (8 per line), four accumulators
    const uint64_t* w = (const uint64_t*)p + l0 * 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int64_t i = 0; i < part * 8; i += 4) {
      for (int s = 0; s < streams; ++s) {
        const uint64_t* q = w + (int64_t)s * part * 8 + i;
        a0 += q[0]; a1 += q[1]; a2 += q[2]; a3 += q[3];
      }
    }
    total += a0 + a1 + a2 + a3;
#endif
  }
  *ran = team;
  return total;
}
"""


def probe_isa() -> str:
    """``avx512`` when this CPU runs our AVX512 (or AMX) kernels, else ``portable``: the probe's loop."""
    return "avx512" if isa_mod.hardware_isa().rank >= isa_mod.get("avx512").rank else "portable"


@functools.lru_cache(maxsize=None)
def _kernel(isa: str) -> Callable:
    """The probe built with ``isa``'s flags (the AVX512 loop needs ``__AVX512F__``), bound."""
    lib = native.library(_SRC, isa_mod.compile_flags(isa), name="awq_bw_probe", isa=isa)
    return native.bind(lib, "awq_bw_read", [native.VP, native.I64, native.INT, native.INT, ctypes.c_void_p],
                       ctypes.c_uint64)


def _check(threads: int, streams: int) -> None:
    if threads < 1:
        raise ValueError(f"bw_probe: expected threads >= 1, got {threads}")
    if streams not in (1, 2, 4, 8):
        raise ValueError(f"bw_probe: expected streams in (1, 2, 4, 8), got {streams}")


def _buffer(nbytes: int, streams: int, threads: int) -> Tuple[torch.Tensor, int]:
    """A touched (pages mapped), 64-byte aligned int64 buffer of ``nbytes`` rounded down to whole
    steps of every thread; returns it and the bytes a pass reads."""
    unit = LINE * 4 * max(streams, 1) * threads
    n = nbytes // unit * unit
    if n <= 0:
        raise ValueError(f"bw_probe: nbytes={nbytes} is below one step ({unit} bytes for "
                         f"{threads} threads x {streams} streams)")
    # on huge pages where available (config.huge_pages), as a loaded model's streamed weights are
    buf = hugepages.on_huge_pages(torch.ones(n // 8, dtype=torch.int64))
    if buf.data_ptr() % LINE:
        raise RuntimeError(f"bw_probe: the buffer at {buf.data_ptr():#x} is not {LINE}-byte aligned")
    return buf, n


def stream_calls(threads: int, nbytes: int, copies: int = 1, streams: int = 4,
                 isa: Optional[str] = None) -> Tuple[List[Callable], int]:
    """``copies`` callables, each one pass over its own ``nbytes`` buffer (any argument ignored), and
    the bytes one pass reads: the probe as one more "method" in an interleaved timing loop.
    ``isa``: ``avx512`` or ``portable`` (default :func:`probe_isa`)."""
    _check(threads, streams)
    fn = _kernel(isa or probe_isa())
    ran = ctypes.c_int(0)
    calls, n = [], 0
    for _ in range(copies):
        buf, n = _buffer(nbytes, streams, threads)

        def call(_x=None, b=buf, n=n):
            out = fn(b.data_ptr(), n, threads, streams, ctypes.byref(ran))
            if ran.value != threads:
                raise RuntimeError(f"bw_probe: asked for {threads} OpenMP threads, the team had {ran.value}")
            return out
        calls.append(call)
    return calls, n


def read_gbps(threads: int, nbytes: int = 1 << 30, repeats: int = 7, streams: int = 4,
              isa: Optional[str] = None) -> float:
    """Best-of-``repeats`` GB/s (1e9 bytes/s) of one streaming read over ``nbytes`` by ``threads``
    threads. The best, not the median: it is the machine's limit, what a kernel's share is of."""
    (call,), n = stream_calls(threads, nbytes, 1, streams, isa)
    words = n // 8
    if call() != words:  # the buffer is all ones: the sum checks every line was read once
        raise RuntimeError(f"bw_probe: the pass over {n} bytes summed to {call()}, expected {words}")
    return n / best_seconds(call, repeats) / 1e9


def best_seconds(call: Callable, repeats: int) -> float:
    """The shortest of ``repeats`` (at least 1) timed calls of ``call``, in seconds."""
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--streams", type=int, nargs="*", default=[4])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3, help="all settings interleaved, this many times")
    a = p.parse_args(argv)
    res = {(t, s): [] for t in a.threads for s in a.streams}
    for _ in range(a.rounds):
        for t, s in res:
            res[(t, s)].append(read_gbps(t, a.mib << 20, a.repeats, s))
    print(f"probe isa {probe_isa()}, {a.mib} MiB, best of {a.repeats}; load average {os.getloadavg()[0]:.2f}")
    for (t, s), v in res.items():
        print(f"  threads {t} streams {s}: {max(v):6.1f} GB/s (rounds: {', '.join(f'{x:.1f}' for x in v)})")
    return {f"threads={t} streams={s}": max(v) for (t, s), v in res.items()}


if __name__ == "__main__":
    sys.exit(main() and 0)
