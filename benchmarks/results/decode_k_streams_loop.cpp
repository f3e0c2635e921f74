// The M = 1 int16-x decode loop standalone (G = 128, tiles of two 32-column panels, 4096 x 16384 cold copies),
// each tile's K range read as S segments side by side (2 S weight streams per core), S = 1 as shipped before.
//   g++ -O3 -march=native -fopenmp -o /tmp/ks benchmarks/results/decode_k_streams_loop.cpp && /tmp/ks 2 && /tmp/ks 1
// (decode_k_streams_amx_1207.md). Prints GB/s of the weight bytes (scales and zeros counted as 7.8 %).
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <omp.h>
// M=1 int16 x, G=128. Tile = 2 panels (64 cols). S K-segments streamed at once. scales/zeros cold per copy.
template <int S>
__attribute__((noinline)) void kern(const int16_t* x, const int32_t* xs_g, const float* xscale, const uint8_t* qw, int64_t pstride,
  const float* scales, const uint8_t* zeros, int64_t ldsz, int64_t K, int64_t G, float* C, int t0, int t1, int64_t pf) {
  const __m512i mask4 = _mm512_set1_epi16(0xF);
  const int64_t ng = K / G, gps = ng / S;  // groups per segment
  for (int t = t0; t < t1; ++t) {
    const uint8_t* q = qw + 2 * t * pstride;
    const float* sc = scales + t * 64; const uint8_t* ze = zeros + t * 64;
    __m512 cv[2][2];
    for (int p = 0; p < 2; ++p) cv[p][0] = cv[p][1] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < gps; ++gi) {
      if (gi + 2 < gps) for (int s = 0; s < S; ++s) { int64_t g = s * gps + gi + 2; for (int p = 0; p < 2; ++p) {
        _mm_prefetch((const char*)(sc + g * ldsz + p * 32), _MM_HINT_T0); _mm_prefetch((const char*)(sc + g * ldsz + p * 32 + 16), _MM_HINT_T0);
        _mm_prefetch((const char*)(ze + g * ldsz + p * 32), _MM_HINT_T0); } }
      __m512i a[S][2][2];
      for (int s = 0; s < S; ++s) for (int p = 0; p < 2; ++p) a[s][p][0] = a[s][p][1] = _mm512_setzero_si512();
      for (int64_t j = 0; j < G / 2; ++j) {
        for (int s = 0; s < S; ++s) {
          const int64_t kp = (s * gps + gi) * G / 2 + j;
          int32_t pair; std::memcpy(&pair, x + 2 * kp, 4);
          const __m512i xa = _mm512_set1_epi32(pair);
          for (int p = 0; p < 2; ++p) {
            const uint8_t* src = q + p * pstride + kp * 32;
            if (pf && (j & 1) == 0) _mm_prefetch((const char*)(src + pf), _MM_HINT_T0);
            const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)src));
            a[s][p][0] = _mm512_dpwssd_epi32(a[s][p][0], xa, _mm512_and_si512(b, mask4));
            a[s][p][1] = _mm512_dpwssd_epi32(a[s][p][1], xa, _mm512_srli_epi16(b, 4));
          }
        }
      }
      for (int s = 0; s < S; ++s) {
        const int64_t g = s * gps + gi;
        const __m512i xr = _mm512_set1_epi32(xs_g[g]); const __m512 sx = _mm512_set1_ps(xscale[g]);
        for (int p = 0; p < 2; ++p) for (int h = 0; h < 2; ++h) {
          const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(ze + g * ldsz + p * 32 + 16 * h)));
          cv[p][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[s][p][h], _mm512_mullo_epi32(z, xr))),
                                     _mm512_mul_ps(_mm512_loadu_ps(sc + g * ldsz + p * 32 + 16 * h), sx), cv[p][h]);
        }
      }
    }
    for (int p = 0; p < 2; ++p) for (int h = 0; h < 2; ++h) _mm512_storeu_ps(C + t * 64 + p * 32 + h * 16, cv[p][h]);
  }
}
int main(int argc, char** argv) {
  int64_t K = 4096, G = 128; int NT = 256;  // tiles of 64 cols: 4096 x 16384 per copy
  int copies = 8; int64_t pstride = K * 16; int th = atoi(argv[1]);
  struct Cp { std::vector<uint8_t> q, z; std::vector<float> s; };
  std::vector<Cp> cps(copies);
  for (auto& c : cps) { c.q.resize(pstride * 2 * NT); for (auto& v : c.q) v = rand(); c.z.assign(K / G * NT * 64, 8); c.s.assign(K / G * NT * 64, 0.01f); }
  std::vector<int16_t> x(K); for (auto& v : x) v = (rand() % 65281) - 32640;
  std::vector<int32_t> xs(K / G, 0); for (int g = 0; g < K / G; ++g) for (int k = 0; k < G; ++k) xs[g] += x[g * G + k];
  std::vector<float> xscale(K / G, 1.f/1024);
  std::vector<float> C(NT * 64), Cref(NT * 64);
  auto run = [&](int S, int64_t pf, int c, float* out) {
    #pragma omp parallel num_threads(th)
    {
      int t = omp_get_thread_num(); int per = NT / th; int a = t * per, b = a + per;
      auto f = S == 1 ? kern<1> : S == 2 ? kern<2> : S == 4 ? kern<4> : kern<8>;
      f(x.data(), xs.data(), xscale.data(), cps[c].q.data(), pstride, cps[c].s.data(), cps[c].z.data(), NT * 64, K, G, out, a, b, pf);
    }
  };
  run(1, 0, 0, Cref.data());
  for (int S : {2, 4, 8}) { run(S, 0, 0, C.data()); double md = 0; for (int i = 0; i < NT * 64; ++i) md = std::max(md, (double)std::abs(C[i] - Cref[i]) / (1e-3 + std::abs(Cref[i]))); printf("S%d maxrel %.2e\n", S, md); }
  int cfg[][2] = {{1, 2048}, {2, 2048}, {4, 1024}, {4, 2048}, {8, 1024}, {8, 512}};
  int c = 0;
  for (int rep = 0; rep < 5; ++rep) {
    for (auto& cf : cfg) {
      double tot = 0;
      for (int i = 0; i < 4; ++i) { c = (c + 1) % copies; auto t0 = std::chrono::steady_clock::now(); run(cf[0], cf[1], c, C.data());
        tot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
      printf("S%d pf%d %.1f  ", cf[0], cf[1], 4.0 * (cps[0].q.size() * 1.078) / tot / 1e9);
    }
    printf("\n");
  }
}
