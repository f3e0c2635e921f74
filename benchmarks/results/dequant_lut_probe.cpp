// Dequantization cost of the AMX W4A16 path per pass over a 4096 x 4096 layer (G 128, 256-k blocks, one thread):
// the shipped fp32-math dequantization into bf16 VNNI B rows vs a per-column lookup table (vpermw over 16
// bf16 values (q - z) * s) into row-major rows, i.e. the weights as the A operand (not shipped: timing only; the
// lane order after the word transpose is not fixed up). benchmarks/results/xeon_kernel_probes_1204.md.
//   g++ -O2 -march=sapphirerapids dequant_lut_probe.cpp -o dequant_lut_probe && ./dequant_lut_probe
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <vector>
#include <algorithm>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
// The shipped dequantization (csrc_templates/micro/amx_bf16.h.j2 amx_dequant_panel, copied at main 8a2c1c2)
inline void amx_dequant_panel(const uint8_t* qw, const float* scales, const uint8_t* zeros, int64_t ldsz,
                              int64_t k0, int64_t k1, int64_t G, uint16_t* buf) {
  const __m512i mask4 = _mm512_set1_epi16(0xF);
  const __m512i rep_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i rep_hi = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  int64_t ks = k0;
  while (ks < k1) {
    const int64_t g = ks / G;
    const int64_t ke = std::min(k1, (g + 1) * G);
    const uint8_t* zp = zeros + g * ldsz;
    const __m512i z32l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)zp));
    const __m512i z32h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(zp + 16)));
    const __m512i zl = _mm512_or_si512(z32l, _mm512_slli_epi32(z32l, 16));
    const __m512i zh = _mm512_or_si512(z32h, _mm512_slli_epi32(z32h, 16));
    const __m512 sa = _mm512_loadu_ps(scales + g * ldsz);       // columns 0..15
    const __m512 sb = _mm512_loadu_ps(scales + g * ldsz + 16);  // columns 16..31
    // scale per lane (2 * col + t) for the four groups of 8 columns
    const __m512 s0 = _mm512_permutexvar_ps(rep_lo, sa), s1 = _mm512_permutexvar_ps(rep_hi, sa);
    const __m512 s2 = _mm512_permutexvar_ps(rep_lo, sb), s3 = _mm512_permutexvar_ps(rep_hi, sb);
    for (int64_t kp = ks / 2; kp < ke / 2; ++kp) {
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(qw + kp * 32)));
      const __m512i lo = _mm512_sub_epi16(_mm512_and_si512(b, mask4), zl);
      const __m512i hi = _mm512_sub_epi16(_mm512_srli_epi16(b, 4), zh);
      const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(lo))), s0);
      const __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(lo, 1))), s1);
      const __m512 f2 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(hi))), s2);
      const __m512 f3 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(hi, 1))), s3);
      uint16_t* dst = buf + (kp - k0 / 2) * 64;
      _mm512_storeu_si512((void*)dst, (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
      _mm512_storeu_si512((void*)(dst + 32), (__m512i)_mm512_cvtne2ps_pbh(f3, f2));
    }
    ks = ke;
  }
}

// LUT variant: weights as A rows: out[col j][k - k0] (32 rows of (k1-k0) bf16), per column a 16-entry table of
// bf16((q - z) * s) (fp32 product, RNE), looked up with vpermw. Transpose of the panel's (kpair x col) words first.
static inline __m512i lut16(int z, float s) {  // bf16 bits of (q - z) * s for q = 0..15 in words 0..15
  const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_set_epi32(15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0), _mm512_set1_epi32(z))), _mm512_set1_ps(s));
  return _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(f));
}
// 16 rows (kpairs) x 16 words (column pairs) -> 16 column pairs x 16 words (kpairs): transpose in registers
static inline void transpose16x16_epi16(const uint8_t* p, __m256i out[16]) {
  __m256i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm256_loadu_si256((const __m256i*)(p + i * 32));
  __m256i t[16], u[16];
  for (int i = 0; i < 16; i += 2) { t[i] = _mm256_unpacklo_epi16(r[i], r[i+1]); t[i+1] = _mm256_unpackhi_epi16(r[i], r[i+1]); }
  for (int i = 0; i < 16; i += 4) { u[i] = _mm256_unpacklo_epi32(t[i], t[i+2]); u[i+1] = _mm256_unpackhi_epi32(t[i], t[i+2]); u[i+2] = _mm256_unpacklo_epi32(t[i+1], t[i+3]); u[i+3] = _mm256_unpackhi_epi32(t[i+1], t[i+3]); }
  for (int i = 0; i < 16; i += 8) for (int a = 0; a < 4; ++a) { t[i+2*a] = _mm256_unpacklo_epi64(u[i+a], u[i+a+4]); t[i+2*a+1] = _mm256_unpackhi_epi64(u[i+a], u[i+a+4]); }
  for (int a = 0; a < 8; ++a) { out[a] = _mm256_permute2x128_si256(t[a], t[a+8], 0x20); out[a+8] = _mm256_permute2x128_si256(t[a], t[a+8], 0x31); }
}
void lut_dequant_panel(const uint8_t* qw, const float* scales, const uint8_t* zeros, int64_t ldsz, int64_t k0, int64_t k1, int64_t G, uint16_t* out /*[32][k1-k0]*/) {
  const int64_t kc = k1 - k0;
  const __m512i m4 = _mm512_set1_epi16(0xF);
  for (int64_t ks = k0; ks < k1; ks += 32) {
    const int64_t g = ks / G;
    __m256i T[16];
    transpose16x16_epi16(qw + (ks / 2) * 32, T);
    for (int j = 0; j < 16; ++j) {
      // (lane order after the transpose is a fixed permutation of kpairs; a real kernel would fix it once; here we just time)
      const __m512i w = _mm512_cvtepu8_epi16(T[j]);
      const __m512i l0 = lut16(zeros[g * ldsz + j], scales[g * ldsz + j]);
      const __m512i l1 = lut16(zeros[g * ldsz + j + 16], scales[g * ldsz + j + 16]);
      _mm512_storeu_si512((void*)(out + j * kc + (ks - k0)), _mm512_permutexvar_epi16(_mm512_and_si512(w, m4), l0));
      _mm512_storeu_si512((void*)(out + (j + 16) * kc + (ks - k0)), _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), l1));
    }
  }
}
// LUT tables built once per group (not per 32 k): variant B
void lut_dequant_panel_b(const uint8_t* qw, const float* scales, const uint8_t* zeros, int64_t ldsz, int64_t k0, int64_t k1, int64_t G, uint16_t* out) {
  const int64_t kc = k1 - k0;
  const __m512i m4 = _mm512_set1_epi16(0xF);
  __m512i L[32];
  for (int64_t ks = k0; ks < k1; ks += 32) {
    const int64_t g = ks / G;
    if (ks == k0 || ks % G == 0) for (int j = 0; j < 32; ++j) L[j] = lut16(zeros[g * ldsz + j], scales[g * ldsz + j]);
    __m256i T[16];
    transpose16x16_epi16(qw + (ks / 2) * 32, T);
    for (int j = 0; j < 16; ++j) {
      const __m512i w = _mm512_cvtepu8_epi16(T[j]);
      _mm512_storeu_si512((void*)(out + j * kc + (ks - k0)), _mm512_permutexvar_epi16(_mm512_and_si512(w, m4), L[j]));
      _mm512_storeu_si512((void*)(out + (j + 16) * kc + (ks - k0)), _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), L[j + 16]));
    }
  }
}
int main() {
  const int64_t K = 4096, G = 128, NP = 128; // 4096 columns
  std::vector<uint8_t> qw(NP * K * 16); for (auto& b : qw) b = rand();
  std::vector<float> s(K / G * NP * 32, 0.01f); std::vector<uint8_t> z(K / G * NP * 32, 7);
  std::vector<uint16_t> buf(256 * 64 * 2);
  const int64_t Kb = 256;
  for (int rep = 0; rep < 3; ++rep) {
    for (int v = 0; v < 3; ++v) {
      double t = now();
      for (int64_t p = 0; p < NP; ++p) for (int64_t kb = 0; kb < K; kb += Kb) {
        if (v == 0) amx_dequant_panel(qw.data() + p * K * 16, s.data() + p * 32, z.data() + p * 32, NP * 32, kb, kb + Kb, G, buf.data());
        else if (v == 1) lut_dequant_panel(qw.data() + p * K * 16, s.data() + p * 32, z.data() + p * 32, NP * 32, kb, kb + Kb, G, buf.data());
        else lut_dequant_panel_b(qw.data() + p * K * 16, s.data() + p * 32, z.data() + p * 32, NP * 32, kb, kb + Kb, G, buf.data());
      }
      double dt = now() - t;
      printf("%s: %.3f ms per pass over 4096x4096 (1 thread), %.2f Gweights/s\n", v == 0 ? "current fp32 math" : v == 1 ? "LUT per 32k" : "LUT per group", dt * 1e3, 4096.0 * 4096 / dt / 1e9);
    }
  }
  asm volatile("" :: "r"(buf.data()) : "memory");
}
