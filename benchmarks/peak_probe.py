"""The machine's dot-product peak, measured by our own probe: the yardstick of the compute-bound
rows (M = 16 and more) as ``bw_probe`` is of the memory-bound ones.

    python benchmarks/peak_probe.py               # bf16 (vdpbf16ps) and int8 (vpdpbusd), 1 and 2 threads

``peak_calls(threads, kind)``: a callable running one pass of the probe on exactly ``threads``
OpenMP threads and the floating-point (bf16) or integer (int8) operations it does, for timing the
peak interleaved with kernels in the same reps. ``peak_tflops(threads, kind)``: best of
``repeats`` passes, in T(FL)OP/s.

The C loop keeps 16 independent accumulators in registers (no memory operand at all, so L1 is the
limit it never reaches) and issues 16 ``vdpbf16ps`` (kind ``bf16``: 16 lanes x 2 products x 2
operations = 64 per instruction) or ``vpdpbusd`` (kind ``int8``: 16 lanes x 4 products x 2 = 128)
per iteration: the instruction our decode and panel kernels spend their time in. On the 2-vCPU
Zen 4 VM here (2026-12-02): 3.3-3.5 G instructions/s per core, 212-226 GFLOP/s bf16 and
430-450 GOP/s int8 per core, the same with two processes at once (two real cores). Built through
:mod:`awq_inductor.kernels.native` with the AVX512 flags; a CPU without AVX512-BF16/VNNI has no
such peak (``ValueError``).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import os
import sys
from typing import Callable, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bw_probe, when loaded by path (tests)
import bw_probe  # noqa: E402
from awq_inductor.kernels import isa as isa_mod  # noqa: E402
from awq_inductor.kernels import native  # noqa: E402

#: operations one instruction of each kind does (16 fp32 / int32 lanes)
OPS_PER_INSTR = {"bf16": 16 * 2 * 2, "int8": 16 * 4 * 2}
KINDS = tuple(OPS_PER_INSTR)
UNROLL = 16  # independent accumulators (instructions per iteration)

_SRC = r"""
#include <cstdint>
#include <omp.h>
#include <immintrin.h>

// `iters` iterations of 16 independent dot-product instructions per thread, on exactly `threads`
// threads; kind 0: vdpbf16ps, 1: vpdpbusd. Returns a value depending on every accumulator.
extern "C" double awq_dot_peak(int kind, int64_t iters, int threads, int* ran) {
  double total = 0;
  int team = 0;
  omp_set_dynamic(0);
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#pragma omp single
    team = omp_get_num_threads();
    __m512 f[16];
    __m512i n[16];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80), b = (__m512bh)_mm512_set1_epi16(0x3C00);
    __m512i u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(-1);
    for (int i = 0; i < 16; ++i) { f[i] = _mm512_set1_ps(float(i)); n[i] = _mm512_set1_epi32(i); }
    if (kind == 0) {
      for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) f[i] = _mm512_dpbf16_ps(f[i], a, b);
        asm volatile("" : "+v"(a));  // the compiler may not fold the loop
      }
    } else {
      for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) n[i] = _mm512_dpbusd_epi32(n[i], u, s);
        asm volatile("" : "+v"(u));
      }
    }
    for (int i = 0; i < 16; ++i) total += _mm512_reduce_add_ps(f[i]) + _mm512_reduce_add_epi32(n[i]);
  }
  *ran = team;
  return total;
}
"""


@functools.lru_cache(maxsize=None)
def _kernel() -> Callable:
    if isa_mod.hardware_isa().rank < isa_mod.get("avx512").rank:
        raise ValueError(f"peak_probe: needs AVX512-BF16 and VNNI, this CPU's ISA is {isa_mod.hardware_isa().name}")
    lib = native.library(_SRC, isa_mod.compile_flags("avx512"), name="awq_dot_peak", isa="avx512")
    return native.bind(lib, "awq_dot_peak", [native.INT, native.I64, native.INT, ctypes.c_void_p], ctypes.c_double)


def peak_calls(threads: int, kind: str, iters: int = 1 << 17) -> Tuple[Callable, int]:
    """(one pass of the probe on ``threads`` threads, operations per pass in all threads)."""
    if kind not in OPS_PER_INSTR:
        raise ValueError(f"peak_probe: expected kind in {KINDS}, got {kind!r}")
    if threads < 1:
        raise ValueError(f"peak_probe: expected threads >= 1, got {threads}")
    fn, ran = _kernel(), ctypes.c_int(0)

    def call(_x=None):
        out = fn(KINDS.index(kind), iters, threads, ctypes.byref(ran))
        if ran.value != threads:
            raise RuntimeError(f"peak_probe: asked for {threads} OpenMP threads, the team had {ran.value}")
        return out
    return call, iters * UNROLL * OPS_PER_INSTR[kind] * threads


def peak_tflops(threads: int, kind: str, repeats: int = 5) -> float:
    """Best of ``repeats`` passes, in T(FL)OP/s: the peak, what a compute-bound kernel's share is of."""
    call, ops = peak_calls(threads, kind)
    call()  # built and warm
    return ops / bw_probe.best_seconds(call, repeats) / 1e12


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for kind in KINDS:
        for t in a.threads:
            print(f"  {kind:4s} threads {t}: {peak_tflops(t, kind, a.repeats):.3f} T{'FL' if kind == 'bf16' else ''}OP/s")


if __name__ == "__main__":
    main()
