// The inner loop of micro::avx512_int16x<1, 2> (vpdpwssd of the broadcast int16 x pair with the
// zero-extended nibbles of two 32-column panels, two accumulator sets), for the standalone harnesses
// decode_loop_ceiling.cpp (v4) and decode_prefetch_l2_probe.cpp; prefetch(src, kp) is called per
// panel and step before the load, so each harness places its own prefetches.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>
template <typename Prefetch>
inline void int16_loop(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out, Prefetch prefetch) {
  const __m512i mask4=_mm512_set1_epi16(0xF);
  __m512i acc[2][2][2]; for(auto& a:acc)for(auto& b:a)for(auto&c:b)c=_mm512_setzero_si512();
  auto step=[&](int64_t kp,int u)__attribute__((always_inline)){
    __m512i w[2][2];
    for(int p=0;p<2;p++){ const uint8_t* src=qw+p*pstride+kp*32; prefetch(src, kp);
      __m512i b=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)src));
      w[p][0]=_mm512_and_si512(b,mask4); w[p][1]=_mm512_srli_epi16(b,4);}
    int32_t pair; memcpy(&pair,x+2*kp,4); __m512i xa=_mm512_set1_epi32(pair);
    for(int p=0;p<2;p++){acc[u][p][0]=_mm512_dpwssd_epi32(acc[u][p][0],xa,w[p][0]);acc[u][p][1]=_mm512_dpwssd_epi32(acc[u][p][1],xa,w[p][1]);}
  };
  for(int64_t kp=0;kp+2<=kp1;kp+=2){step(kp,0);step(kp+1,1);}
  __m512i s=_mm512_setzero_si512(); for(auto& a:acc)for(auto& b:a)for(auto&c:b)s=_mm512_add_epi32(s,c); _mm512_storeu_si512(out,s);
}
