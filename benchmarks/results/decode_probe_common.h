// Shared by the standalone M = 1 loop probes (decode_split_x_probe.cpp, decode_nibble_interleave_probe.cpp): the
// timer, the prefetch distance PF (bytes; -DPF=2048 at compile time, 0: none) and v4, the shipped W4A16 int16 loop.
#pragma once
#include <chrono>
#include "decode_int16_loop.h"
#ifndef PF
#define PF 0
#endif
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__attribute__((noinline)) void v4(const uint8_t* xb, const uint8_t* qw, int64_t pstride, int64_t K, float* out) {
  int16_loop((const uint16_t*)xb, qw, pstride, K / 2, out, [](const uint8_t* src, int64_t kp) __attribute__((always_inline)) {
    if (PF && !(kp & 1)) _mm_prefetch((const char*)src + PF, _MM_HINT_T0);
  });
}
