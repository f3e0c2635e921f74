// W4A16 decode (M <= 16) on AMX tiles, a prototype for timing only (benchmarks/results/xeon_kernel_probes_1204.md):
// B as exact bf16(128 + q) converted 32 k at a time, D steps ahead of the tiles (a ring of RING steps), C tiles
// double-buffered per group and each group's fold (s * (sum - (128 + z) * sum x)) one group late; checked against a
// scalar reference. Args: M K panels [prefetch bytes].
//   g++ -O2 -march=sapphirerapids -DD=2 amx_decode_prototype.cpp -o amx_decode_prototype
//   ./amx_decode_prototype 1 4096 2          # hot (128 KiB of weights)
//   ./amx_decode_prototype 1 4096 4096 2048  # cold (268 MB), 2 KB prefetch
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <algorithm>
#include <unistd.h>
#include <sys/syscall.h>
#ifndef D
#define D 2
#endif
#ifndef RING
#define RING 8
#endif
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
struct Cfg { uint8_t palette=1, start=0; uint8_t res[14]={0}; uint16_t colsb[16]={0}; uint8_t rows[16]={0}; };
static inline void convert_step(const uint8_t* qw, uint16_t* buf, int64_t pf) {  // 16 rows of 32 bytes -> 16 x 64 words
  const __m512i mask4 = _mm512_set1_epi16(0xF), bias = _mm512_set1_epi16(0x4300);
  if (pf) { _mm_prefetch((const char*)qw + pf, _MM_HINT_T0); _mm_prefetch((const char*)qw + pf + 64, _MM_HINT_T0);
            _mm_prefetch((const char*)qw + pf + 128, _MM_HINT_T0); _mm_prefetch((const char*)qw + pf + 192, _MM_HINT_T0);
            _mm_prefetch((const char*)qw + pf + 256, _MM_HINT_T0); _mm_prefetch((const char*)qw + pf + 320, _MM_HINT_T0);
            _mm_prefetch((const char*)qw + pf + 384, _MM_HINT_T0); _mm_prefetch((const char*)qw + pf + 448, _MM_HINT_T0); }
  for (int r = 0; r < 16; ++r) {
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(qw + r * 32)));
    _mm512_store_si512((void*)(buf + r * 64), _mm512_ternarylogic_epi32(b, mask4, bias, 0xEA));
    _mm512_store_si512((void*)(buf + r * 64 + 32), _mm512_or_si512(_mm512_srli_epi16(b, 4), bias));
  }
}
struct Ctx { const uint16_t* xp; const float* xs; int M; const uint8_t* qw; const float* s; const uint8_t* z; int64_t ld, K, G, NP, pstride; float* C; uint16_t* ring; float* Cg; int64_t pf; };
static inline void fold(const Ctx& c, int64_t p, int64_t g, const float* cg) {
  const int64_t ng = c.K / c.G;
  const __m512 c128 = _mm512_set1_ps(128.f);
  const float* s = c.s + p * 32; const uint8_t* z = c.z + p * 32;
  const __m512 s0 = _mm512_loadu_ps(s + g * c.ld), s1 = _mm512_loadu_ps(s + g * c.ld + 16);
  const __m512 z0 = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(z + g * c.ld)))), c128);
  const __m512 z1 = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(z + g * c.ld + 16)))), c128);
  for (int m = 0; m < c.M; ++m) {
    const __m512 xv = _mm512_set1_ps(c.xs[m * ng + g]);
    float* cc = c.C + m * 32 * c.NP + p * 32;
    _mm512_storeu_ps(cc, _mm512_fmadd_ps(s0, _mm512_fnmadd_ps(z0, xv, _mm512_loadu_ps(cg + m * 32)), _mm512_loadu_ps(cc)));
    _mm512_storeu_ps(cc + 16, _mm512_fmadd_ps(s1, _mm512_fnmadd_ps(z1, xv, _mm512_loadu_ps(cg + m * 32 + 16)), _mm512_loadu_ps(cc + 16)));
  }
}
__attribute__((noinline)) void run(const Ctx& c) {
  const int64_t spp = c.K / 32, spg = c.G / 32, total = c.NP * spp, ng = c.K / c.G;
  for (int i = 0; i < c.M * 32 * c.NP; ++i) c.C[i] = 0.f;
  auto src = [&](int64_t u) { return c.qw + (u / spp) * c.pstride + (u % spp) * 512; };
  for (int64_t u = 0; u < std::min<int64_t>(D, total); ++u) convert_step(src(u), c.ring + (u % RING) * 1024, c.pf);
  // groups are flat too: group index q = u / spg, panel = q / ng, g = q % ng
  int64_t pending = -1;  // flat group index whose Cg awaits its fold
  auto step = [&](int64_t u) __attribute__((always_inline)) {
    if (u + D < total) convert_step(src(u + D), c.ring + ((u + D) % RING) * 1024, c.pf);
  };
#define STEP(T0, T1) { step(u); const uint16_t* b = c.ring + (u % RING) * 1024; \
    _tile_loadd(4, c.xp + (u % spp) * 512, 64); _tile_loadd(6, b, 128); _tile_loadd(7, b + 32, 128); \
    _tile_dpbf16ps(T0, 4, 6); _tile_dpbf16ps(T1, 4, 7); ++u; }
#define GROUPQ(T0, T1, SET) { _tile_zero(T0); _tile_zero(T1); for (int i = 0; i < spg; ++i) STEP(T0, T1); \
    _tile_stored(T0, c.Cg + (SET) * 512, 128); _tile_stored(T1, c.Cg + (SET) * 512 + 16, 128); \
    if (pending >= 0) fold(c, pending / ng, pending % ng, c.Cg + (1 - (SET)) * 512); pending = q; ++q; }
  int64_t u = 0, q = 0; const int64_t nq = total / spg;
  for (; q + 2 <= nq;) { GROUPQ(0, 1, 0); GROUPQ(2, 3, 1); }
  if (q < nq) { GROUPQ(0, 1, 0); fold(c, pending / ng, pending % ng, c.Cg); }
  else fold(c, pending / ng, pending % ng, c.Cg + 512);
}
int main(int argc, char** argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { perror("prctl"); return 1; }
  const int M = argc > 1 ? atoi(argv[1]) : 1;
  const int64_t K = argc > 2 ? atol(argv[2]) : 4096, G = 128, ng = K / G;
  const int64_t NP = argc > 3 ? atol(argv[3]) : 2;
  const int64_t pf = argc > 4 ? atol(argv[4]) : 0;
  std::vector<uint8_t> qw(NP * K * 16); for (auto& b : qw) b = rand();
  std::vector<float> s(ng * 32 * NP); for (auto& v : s) v = (rand() % 100) / 1000.f + 0.01f;
  std::vector<uint8_t> z(ng * 32 * NP); for (auto& v : z) v = rand() % 16;
  std::vector<float> xf(M * K); for (auto& v : xf) { v = (rand() % 2000 - 1000) / 500.f; uint32_t uu; memcpy(&uu, &v, 4); uu &= 0xFFFF0000; memcpy(&v, &uu, 4); }
  uint16_t* xp = (uint16_t*)aligned_alloc(64, (K / 32) * 1024); memset(xp, 0, (K / 32) * 1024);
  for (int m = 0; m < M; ++m) for (int64_t k = 0; k < K; ++k) { uint32_t uu; memcpy(&uu, &xf[m * K + k], 4); xp[(k / 32) * 512 + m * 32 + k % 32] = uu >> 16; }
  std::vector<float> xs(M * ng, 0.f); for (int m = 0; m < M; ++m) for (int64_t k = 0; k < K; ++k) xs[m * ng + k / G] += xf[m * K + k];
  uint16_t* ring = (uint16_t*)aligned_alloc(64, RING * 2048); float* Cg = (float*)aligned_alloc(64, 2 * 512 * 4);
  std::vector<float> C(M * 32 * NP);
  Cfg cf; for (int t = 0; t < 4; ++t) { cf.rows[t] = M; cf.colsb[t] = 64; }
  cf.rows[4] = M; cf.colsb[4] = 64; cf.rows[6] = cf.rows[7] = 16; cf.colsb[6] = cf.colsb[7] = 64;
  _tile_loadconfig(&cf);
  Ctx c{xp, xs.data(), M, qw.data(), s.data(), z.data(), 32 * NP, K, G, NP, K * 16, C.data(), ring, Cg, pf};
  run(c);
  double maxerr = 0; int64_t P = NP - 1;
  for (int m = 0; m < M; ++m) for (int j = 0; j < 32; ++j) { double acc = 0; for (int64_t k = 0; k < K; ++k) {
      uint8_t b = qw[P * K * 16 + (k / 2) * 32 + 2 * (j & 15) + (k & 1)]; int qq = j < 16 ? (b & 15) : (b >> 4);
      int64_t g = k / G; acc += xf[m * K + k] * (qq - z[g * 32 * NP + P * 32 + j]) * s[g * 32 * NP + P * 32 + j]; }
      maxerr = std::max(maxerr, std::abs(acc - C[m * 32 * NP + P * 32 + j])); }
  printf("D=%d RING=%d M=%d K=%ld NP=%ld (%.1f MB) pf=%ld max err %.2e:", D, RING, M, K, NP, NP * K * 16 / 1e6, pf, maxerr);
  for (int rep = 0; rep < 4; ++rep) {
    int R = std::max<int64_t>(3, 20000000 / (NP * K * 16));
    double t = now(); for (int r = 0; r < R; ++r) run(c); double dt = (now() - t) / R;
    printf(" %.1f", NP * K * 16 / dt / 1e9);
  }
  printf(" GB/s\n");
}
