// W4A16 exact decode loops on one core: v4 (shipped int16 x, vpdpwssd on the VNNI-2 nibble layout) against v5 / v6
// (the int16 x split into bytes, xi = 256 xh + xl, on the VNNI-4 nibble layout of W4A8: 4 vpdpbusd per 64 bytes, exact)
// and v3 (the W4A8 loop, 2 vpdpbusd per 64 bytes). g++ -O2 -march=native decode_split_x_probe.cpp && ./a.out [K] (-DPF=2048: prefetch)
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cstdlib>
#include "decode_probe_common.h"
__attribute__((noinline)) void v3(const uint8_t* xb, const uint8_t* qw, int64_t pstride, int64_t K, float* out){
  const __m512i m=_mm512_set1_epi8(0xF);
  __m512i acc[2][2]; for(auto& a:acc)for(auto& b:a)b=_mm512_setzero_si512();
  const uint8_t* w=qw; const uint8_t* ak=xb;
  for(int64_t i=0;i<K/4;i++,w+=64,ak+=4){
    int32_t p0; memcpy(&p0,ak,4); __m512i xa=_mm512_set1_epi32(p0);
    for(int p=0;p<2;p++){ const uint8_t* src=w+p*pstride; if(PF) _mm_prefetch((const char*)src+PF,_MM_HINT_T0);
      __m512i b=_mm512_loadu_si512(src);
      acc[p][0]=_mm512_dpbusd_epi32(acc[p][0],_mm512_and_si512(b,m),xa);
      acc[p][1]=_mm512_dpbusd_epi32(acc[p][1],_mm512_and_si512(_mm512_srli_epi16(b,4),m),xa);}
  }
  __m512i s=_mm512_setzero_si512(); for(auto& a:acc)for(auto& b:a)s=_mm512_add_epi32(s,b); _mm512_storeu_si512(out,s);
}
// xb: per 4 k, 4 bytes xl then 4 bytes xh (8 bytes per 4 k)
__attribute__((noinline)) void v5(const uint8_t* xb, const uint8_t* qw, int64_t pstride, int64_t K, float* out){
  const __m512i m=_mm512_set1_epi8(0xF);
  __m512i al[2][2], ah[2][2]; for(int p=0;p<2;p++)for(int h=0;h<2;h++){al[p][h]=ah[p][h]=_mm512_setzero_si512();}
  const uint8_t* w=qw; const uint8_t* ak=xb;
  for(int64_t i=0;i<K/4;i++,w+=64,ak+=8){
    int32_t l4,h4; memcpy(&l4,ak,4); memcpy(&h4,ak+4,4); const __m512i xl=_mm512_set1_epi32(l4), xh=_mm512_set1_epi32(h4);
    for(int p=0;p<2;p++){ const uint8_t* src=w+p*pstride; if(PF) _mm_prefetch((const char*)src+PF,_MM_HINT_T0);
      __m512i b=_mm512_loadu_si512(src);
      const __m512i lo=_mm512_and_si512(b,m), hi=_mm512_and_si512(_mm512_srli_epi16(b,4),m);
      al[p][0]=_mm512_dpbusd_epi32(al[p][0],xl,lo); ah[p][0]=_mm512_dpbusd_epi32(ah[p][0],lo,xh);
      al[p][1]=_mm512_dpbusd_epi32(al[p][1],xl,hi); ah[p][1]=_mm512_dpbusd_epi32(ah[p][1],hi,xh);}
  }
  __m512i s=_mm512_setzero_si512(); for(int p=0;p<2;p++)for(int h=0;h<2;h++) s=_mm512_add_epi32(s,_mm512_add_epi32(al[p][h],_mm512_slli_epi32(ah[p][h],8))); _mm512_storeu_si512(out,s);
}
// v6: as v5 but hi part accumulates xh*q combined via vpdpbusd into same acc with x scaled? (xh*256 not in s8) -> instead
// sum lo and hi into one acc per column by pre-shifting q: (q<<4)*? no; keep 2 accs. v6 = v5 with 2-step unroll in k.
__attribute__((noinline)) void v6(const uint8_t* xb, const uint8_t* qw, int64_t pstride, int64_t K, float* out){
  const __m512i m=_mm512_set1_epi8(0xF);
  __m512i al[2][2][2], ah[2][2][2]; for(int u=0;u<2;u++)for(int p=0;p<2;p++)for(int h=0;h<2;h++){al[u][p][h]=ah[u][p][h]=_mm512_setzero_si512();}
  const uint8_t* w=qw; const uint8_t* ak=xb;
  auto step=[&](int u)__attribute__((always_inline)){
    int32_t l4,h4; memcpy(&l4,ak,4); memcpy(&h4,ak+4,4); const __m512i xl=_mm512_set1_epi32(l4), xh=_mm512_set1_epi32(h4);
    for(int p=0;p<2;p++){ const uint8_t* src=w+p*pstride; if(PF && u==0) _mm_prefetch((const char*)src+PF,_MM_HINT_T0);
      __m512i b=_mm512_loadu_si512(src);
      const __m512i lo=_mm512_and_si512(b,m), hi=_mm512_and_si512(_mm512_srli_epi16(b,4),m);
      al[u][p][0]=_mm512_dpbusd_epi32(al[u][p][0],xl,lo); ah[u][p][0]=_mm512_dpbusd_epi32(ah[u][p][0],lo,xh);
      al[u][p][1]=_mm512_dpbusd_epi32(al[u][p][1],xl,hi); ah[u][p][1]=_mm512_dpbusd_epi32(ah[u][p][1],hi,xh);}
    w+=64; ak+=8; };
  for(int64_t i=0;i+2<=K/4;i+=2){ step(0); step(1); }
  __m512i s=_mm512_setzero_si512(); for(int u=0;u<2;u++)for(int p=0;p<2;p++)for(int h=0;h<2;h++) s=_mm512_add_epi32(s,_mm512_add_epi32(al[u][p][h],_mm512_slli_epi32(ah[u][p][h],8))); _mm512_storeu_si512(out,s);
}
int main(int argc,char**argv){
  const int64_t K=argc>1?atol(argv[1]):4096, pstride=K*16; std::vector<uint8_t> qw(2*pstride+4096, 0x37); std::vector<uint8_t> x(2*K+64,0x11); float out[16];
  auto run=[&](const char* nm, void(*f)(const uint8_t*,const uint8_t*,int64_t,int64_t,float*)){
    for(int i=0;i<50;i++) f(x.data(),qw.data(),pstride,K,out);
    int R=int(std::max<int64_t>(3,20000*4096/K)); double t=now(); for(int i=0;i<R;i++) f(x.data(),qw.data(),pstride,K,out); double dt=(now()-t)/R;
    printf("%s: %.1f GB/s  ", nm, 2.0*pstride/dt/1e9); };
  for(int r=0;r<3;r++){ run("v3 w4a8", v3); run("v4 int16", v4); run("v5 split", v5); run("v6 split-u2", v6); printf("\n"); }
}
