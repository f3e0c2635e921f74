// The W4A16 decode loop (M = 1, int16 x: micro::avx512_int16x<1, 2>) over other weight layouts, cold,
// against the shipped eager kernel (dlopened) and a streaming read, interleaved in one process.
// Question: does a layout with fewer streams per thread read closer to the probe? (see
// decode_int16_1205.md). Build and run, with the eager library of this machine's cache:
//   g++ -O2 -march=sapphirerapids -fopenmp decode_layout_probe.cpp -o probe -ldl
//   AWQ_LIB=~/.cache/awq_inductor/awq_int4_mm_amx_<hash>.so ./probe K N THREADS PF [REPS]
// Layouts (one N tile = two 32-column panels, G = 128; the loop, its prefetch and epilogue as shipped):
//   cur         qweight [Np][K/2][32] (each panel one stream), scales f32 / zeros u8 [K/G][Npad]
//   cur_hotsz   as cur, but every tile reads the same scales / zeros (a bound: no strided stream;
//               their bytes still counted)
//   il          the two panels interleaved per k-pair (one 64-byte line per step: one stream)
//   cur_tilesz  as cur, scales / zeros tile-major [N/64][K/G][64] (a sequential stream per tile)
//   real        the shipped awq_int4_mm_bfloat16 (decode rows, PF, int16 x) on the cur copies
// Each call reads another copy (1 GiB of copies in rotation); GB/s count every byte of the op.
#include <immintrin.h>
#include <omp.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef void (*RealFn)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, void*,
                       int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
enum Layout { kCur, kCurHotSz, kInterleaved, kCurTileSz };
struct W { uint8_t* q; float* s; uint8_t* z; };

static int64_t K, N, G = 128, PF;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static void* huge_alloc(size_t n) {
  n = (n + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  void* p = aligned_alloc(2 << 20, n);
  madvise(p, n, MADV_HUGEPAGE);
  memset(p, 0x37, n);
  return p;
}

// One N tile t, all of K, one row of int16 x with its per-group power-of-two scales.
template <int L>
__attribute__((noinline)) void tile(const W& w, int64_t t, const int16_t* x, const float* xsc, float* out) {
  const __m512i mask4 = _mm512_set1_epi16(0xF);
  const int64_t ng = K / G, pstride = (K / 2) * 32;
  __m512 c[4];
  for (auto& v : c) v = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const bool il = L == kInterleaved;
    const uint8_t* q0 = il ? w.q + t * (K / 2) * 64 + g * (G / 2) * 64 : w.q + 2 * t * pstride + g * (G / 2) * 32;
    const uint8_t* q1 = il ? q0 + 32 : q0 + pstride;
    const int64_t step = il ? 64 : 32;
    const float* s = L == kCurHotSz ? w.s + g * 64 : L == kCurTileSz ? w.s + (t * ng + g) * 64 : w.s + g * N + t * 64;
    const uint8_t* z = L == kCurHotSz ? w.z + g * 64 : L == kCurTileSz ? w.z + (t * ng + g) * 64 : w.z + g * N + t * 64;
    if ((L == kCur || L == kInterleaved) && g + 2 < ng) {  // the shipped kernel's strided prefetch
      for (int i = 0; i < 4; ++i) _mm_prefetch((const char*)(s + 2 * N + 16 * i), _MM_HINT_T0);
      _mm_prefetch((const char*)(z + 2 * N), _MM_HINT_T0);
    }
    __m512i a = _mm512_setzero_si512();
    for (int64_t k = g * G; k < (g + 1) * G; k += 32) a = _mm512_dpwssd_epi32(a, _mm512_loadu_si512(x + k), _mm512_set1_epi16(1));
    const int32_t xs = _mm512_reduce_add_epi32(a);
    __m512i acc[2][2][2];
    for (auto& u : acc) for (auto& p : u) for (auto& v : p) v = _mm512_setzero_si512();
    const int16_t* xg = x + g * G;
    auto kstep = [&](int64_t j, int u) __attribute__((always_inline)) {
      const uint8_t* src[2] = {q0 + j * step, q1 + j * step};
      __m512i wv[2][2];
      for (int p = 0; p < 2; ++p) {
        if (PF > 0 && (il ? p == 0 : (j & 1) == 0)) _mm_prefetch((const char*)(src[p] + PF), _MM_HINT_T0);
        const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)src[p]));
        wv[p][0] = _mm512_and_si512(b, mask4);
        wv[p][1] = _mm512_srli_epi16(b, 4);
      }
      int32_t pair;
      memcpy(&pair, xg + 2 * j, 4);
      const __m512i xa = _mm512_set1_epi32(pair);
      for (int p = 0; p < 2; ++p) {
        acc[u][p][0] = _mm512_dpwssd_epi32(acc[u][p][0], xa, wv[p][0]);
        acc[u][p][1] = _mm512_dpwssd_epi32(acc[u][p][1], xa, wv[p][1]);
      }
    };
    for (int64_t j = 0; j < G / 2; j += 2) { kstep(j, 0); kstep(j + 1, 1); }
    const __m512 sx = _mm512_set1_ps(xsc[g]);
    const __m512i xr = _mm512_set1_epi32(xs);
    for (int p = 0; p < 2; ++p) {
      const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(z + p * 32)));
      const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(z + p * 32 + 16)));
      const __m512 s0 = _mm512_loadu_ps(s + p * 32), s1 = _mm512_loadu_ps(s + p * 32 + 16);
      const __m512i a0 = _mm512_add_epi32(acc[0][p][0], acc[1][p][0]), a1 = _mm512_add_epi32(acc[0][p][1], acc[1][p][1]);
      c[2 * p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a0, _mm512_mullo_epi32(z0, xr))), _mm512_mul_ps(s0, sx), c[2 * p]);
      c[2 * p + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a1, _mm512_mullo_epi32(z1, xr))), _mm512_mul_ps(s1, sx), c[2 * p + 1]);
    }
  }
  for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + t * 64 + 16 * i, c[i]);
}

typedef void (*TileFn)(const W&, int64_t, const int16_t*, const float*, float*);
static void run_op(TileFn f, const W& w, const int16_t* x, const float* xsc, float* out, int nt) {
  const int64_t tiles = N / 64;
#pragma omp parallel num_threads(nt)
  {  // contiguous tiles per thread, as the driver's schedule
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    for (int64_t t = tiles * tid / nth; t < tiles * (tid + 1) / nth; ++t) f(w, t, x, xsc, out);
  }
}

static double probe_gbps(const uint8_t* buf, size_t n, int nt) {
  const double t = now();
  long long total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    const size_t a = n * tid / nth / 256 * 256, b = n * (tid + 1) / nth / 256 * 256;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = a; i + 256 <= b; i += 256) {
      s0 = _mm512_add_epi64(s0, _mm512_load_si512(buf + i));
      s1 = _mm512_add_epi64(s1, _mm512_load_si512(buf + i + 64));
      s2 = _mm512_add_epi64(s2, _mm512_load_si512(buf + i + 128));
      s3 = _mm512_add_epi64(s3, _mm512_load_si512(buf + i + 192));
    }
    total += _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
  }
  const double dt = now() - t;
  volatile long long sink = total;
  (void)sink;
  return n / dt / 1e9;
}

int main(int argc, char** argv) {
  if (argc < 5) { fprintf(stderr, "usage: AWQ_LIB=<eager .so> %s K N THREADS PF [REPS]\n", argv[0]); return 2; }
  K = atol(argv[1]); N = atol(argv[2]);
  const int nt = atoi(argv[3]);
  PF = atol(argv[4]);
  const int reps = argc > 5 ? atoi(argv[5]) : 10;
  void* lib = dlopen(getenv("AWQ_LIB") ? getenv("AWQ_LIB") : "", RTLD_NOW);
  RealFn real = lib ? (RealFn)dlsym(lib, "awq_int4_mm_bfloat16") : nullptr;
  if (!real) { fprintf(stderr, "AWQ_LIB: no awq_int4_mm_bfloat16 in %s\n", getenv("AWQ_LIB")); return 2; }
  const int64_t ng = K / G;
  const size_t bytes = size_t(N) * K / 2 + size_t(ng) * N * 5;  // int4 + f32 scales + u8 zeros
  const int ncopies = int(std::max<size_t>(2, (size_t(1) << 30) / bytes));
  std::vector<W> cur(ncopies), il(ncopies), tsz(ncopies);
  for (int i = 0; i < ncopies; ++i) {
    for (W* w : {&cur[i], &il[i], &tsz[i]}) {
      w->q = (uint8_t*)huge_alloc(size_t(N) * K / 2);
      w->s = (float*)huge_alloc(ng * N * 4);
      w->z = (uint8_t*)huge_alloc(ng * N);
      for (int64_t j = 0; j < ng * N; ++j) { w->s[j] = 1e-3f; w->z[j] = 8; }
    }
  }
  float* hot_s = (float*)huge_alloc(ng * 64 * 4);
  uint8_t* hot_z = (uint8_t*)huge_alloc(ng * 64);
  for (int64_t j = 0; j < ng * 64; ++j) { hot_s[j] = 1e-3f; hot_z[j] = 8; }
  const size_t pbytes = size_t(512) << 20;
  const uint8_t* pb = (const uint8_t*)huge_alloc(pbytes);
  std::vector<int16_t> x(K, 100);
  std::vector<uint16_t> xb(K, 0x3f80), yb(N);
  std::vector<float> xsc(ng, 1.0f / 1024), out(N);
  const char* names[] = {"cur", "cur_hotsz", "il", "cur_tilesz", "real"};
  const int nv = 5;
  std::vector<std::vector<double>> gb(nv + 1);
  int ci = 0;
  for (int r = 0; r < reps; ++r) {
    gb[nv].push_back(probe_gbps(pb, pbytes, nt));
    for (int v0 = 0; v0 < nv; ++v0) {
      const int v = (r & 1) ? nv - 1 - v0 : v0;  // alternating order
      const int calls = 8;
      const double t = now();
      for (int c = 0; c < calls; ++c) {
        const int i = (ci++) % ncopies;
        switch (v) {
          case 0: run_op(tile<kCur>, cur[i], x.data(), xsc.data(), out.data(), nt); break;
          case 1: run_op(tile<kCurHotSz>, W{cur[i].q, hot_s, hot_z}, x.data(), xsc.data(), out.data(), nt); break;
          case 2: run_op(tile<kInterleaved>, il[i], x.data(), xsc.data(), out.data(), nt); break;
          case 3: run_op(tile<kCurTileSz>, tsz[i], x.data(), xsc.data(), out.data(), nt); break;
          default:  // plan: decode rows only (amx 8, panel / f32 never), PF, no next tile, int16 x
            real(xb.data(), 1, cur[i].q, cur[i].s, cur[i].z, nullptr, yb.data(), N, K, G, nt, 8, 1LL << 40, 1LL << 40, PF, 0, 1);
        }
      }
      gb[v].push_back(bytes / ((now() - t) / calls) / 1e9);
    }
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const double pm = med(gb[nv]);
  printf("K=%ld N=%ld threads=%d pf=%ld copies=%d  probe %.1f GB/s (median)\n", K, N, nt, PF, ncopies, pm);
  for (int v = 0; v < nv; ++v) printf("  %-10s %5.1f GB/s  %3.0f%%\n", names[v], med(gb[v]), 100 * med(gb[v]) / pm);
  return 0;
}
