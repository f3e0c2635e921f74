// The W4A16 decode loop's instruction ceiling on one core (see peers_amx_1203.md): the inner loop of
// micro::avx512_bf16<1, 2> (two panels, k-pair parity accumulators) over L1-resident weights, against
// the same loop with only the vdpbf16ps and the loads (v2), a byte-unpack variant (v1) and the W4A8
// vpdpbusd loop (v3). Build and run: g++ -O2 -march=sapphirerapids decode_loop_ceiling.cpp && ./a.out [K]
// (K 4096: L2-resident; K 4194304: 2 x 64 MiB, cold; -DPF=2048: v0 and v4 with the decode kernel's software prefetch)
// v4: the int16 x loop of micro::avx512_int16x<1, 2> (vpdpwssd of the broadcast int16 x pair with the
// zero-extended nibbles; the decode_int16 setting), the same weights and prefetch as v0.
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cstdlib>
#include "decode_int16_loop.h"
#ifndef PF
#define PF 0
#endif
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
// V0: current kernel inner loop, BM=1 NP=2, U=2
__attribute__((noinline)) void v0(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out){
  const __m512i mask4=_mm512_set1_epi16(0xF), bias=_mm512_set1_epi16(0x4300);
  __m512 acc[2][2][2]; for(auto& a:acc)for(auto& b:a)for(auto&c:b)c=_mm512_setzero_ps();
  auto step=[&](int64_t kp,int u)__attribute__((always_inline)){
    __m512bh w[2][2];
    for(int p=0;p<2;p++){ const uint8_t* src=qw+p*pstride+kp*32; if(PF && !(kp&1)) _mm_prefetch((const char*)src+PF,_MM_HINT_T0);
      __m512i b=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)src));
      w[p][0]=(__m512bh)_mm512_ternarylogic_epi32(b,mask4,bias,0xEA);
      w[p][1]=(__m512bh)_mm512_or_si512(_mm512_srli_epi16(b,4),bias);}
    int32_t pair; memcpy(&pair,x+2*kp,4); __m512bh xa=(__m512bh)_mm512_set1_epi32(pair);
    for(int p=0;p<2;p++){acc[u][p][0]=_mm512_dpbf16_ps(acc[u][p][0],xa,w[p][0]);acc[u][p][1]=_mm512_dpbf16_ps(acc[u][p][1],xa,w[p][1]);}
  };
  for(int64_t kp=0;kp+2<=kp1;kp+=2){step(kp,0);step(kp+1,1);}
  __m512 s=_mm512_setzero_ps(); for(auto& a:acc)for(auto& b:a)for(auto&c:b)s=_mm512_add_ps(s,c); _mm512_storeu_ps(out,s);
}
// V1: 64-byte loads, byte unpack with 0x43 (layout differs; ceiling test)
__attribute__((noinline)) void v1(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out){
  const __m512i m=_mm512_set1_epi8(0xF), h=_mm512_set1_epi8(0x43);
  __m512 acc[2][4]; for(auto& a:acc)for(auto& b:a)b=_mm512_setzero_ps();
  for(int64_t kp=0;kp+2<=kp1;kp+=2){
    // 2 kpairs of one panel = 64 bytes; do for 2 panels
    int32_t p0,p1; memcpy(&p0,x+2*kp,4); memcpy(&p1,x+2*kp+2,4);
    __m512bh xa=(__m512bh)_mm512_set1_epi32(p0), xb=(__m512bh)_mm512_set1_epi32(p1);
    for(int p=0;p<2;p++){ __m512i b=_mm512_loadu_si512(qw+p*pstride+kp*32);
      __m512i lo=_mm512_and_si512(b,m), hi=_mm512_and_si512(_mm512_srli_epi16(b,4),m);
      acc[p][0]=_mm512_dpbf16_ps(acc[p][0],xa,(__m512bh)_mm512_unpacklo_epi8(lo,h));
      acc[p][1]=_mm512_dpbf16_ps(acc[p][1],xa,(__m512bh)_mm512_unpackhi_epi8(lo,h));
      acc[p][2]=_mm512_dpbf16_ps(acc[p][2],xb,(__m512bh)_mm512_unpacklo_epi8(hi,h));
      acc[p][3]=_mm512_dpbf16_ps(acc[p][3],xb,(__m512bh)_mm512_unpackhi_epi8(hi,h));}
  }
  __m512 s=_mm512_setzero_ps(); for(auto& a:acc)for(auto& b:a)s=_mm512_add_ps(s,b); _mm512_storeu_ps(out,s);
}
// V2: only dpbf16 (throughput ceiling): 4 dpbf16 per 32 bytes*2 panels with loads
__attribute__((noinline)) void v2(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out){
  __m512 acc[8]; for(auto& a:acc)a=_mm512_setzero_ps();
  for(int64_t kp=0;kp+2<=kp1;kp+=2){
    int32_t p0; memcpy(&p0,x+2*kp,4); __m512bh xa=(__m512bh)_mm512_set1_epi32(p0);
    for(int p=0;p<2;p++){ __m512i b=_mm512_loadu_si512(qw+p*pstride+kp*32);
      for(int j=0;j<4;j++) acc[p*4+j]=_mm512_dpbf16_ps(acc[p*4+j],xa,(__m512bh)b);}
  }
  __m512 s=_mm512_setzero_ps(); for(auto& a:acc)s=_mm512_add_ps(s,a); _mm512_storeu_ps(out,s);
}
// V3: W4A8-style: vpdpbusd
__attribute__((noinline)) void v3(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out){
  const __m512i m=_mm512_set1_epi8(0xF);
  __m512i acc[2][2]; for(auto& a:acc)for(auto& b:a)b=_mm512_setzero_si512();
  for(int64_t kp=0;kp+2<=kp1;kp+=2){
    int32_t p0; memcpy(&p0,x+kp,4); __m512i xa=_mm512_set1_epi32(p0);
    for(int p=0;p<2;p++){ __m512i b=_mm512_loadu_si512(qw+p*pstride+kp*32);
      acc[p][0]=_mm512_dpbusd_epi32(acc[p][0],_mm512_and_si512(b,m),xa);
      acc[p][1]=_mm512_dpbusd_epi32(acc[p][1],_mm512_and_si512(_mm512_srli_epi16(b,4),m),xa);}
  }
  __m512i s=_mm512_setzero_si512(); for(auto& a:acc)for(auto& b:a)s=_mm512_add_epi32(s,b); _mm512_storeu_si512(out,s);
}
// V4: int16 x (micro::avx512_int16x<1, 2>): vpdpwssd, exact int32 sums
__attribute__((noinline)) void v4(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out){
  int16_loop(x, qw, pstride, kp1, out, [](const uint8_t* src, int64_t kp) __attribute__((always_inline)) {
    if (PF && !(kp & 1)) _mm_prefetch((const char*)src + PF, _MM_HINT_T0); });
}
int main(int argc,char**argv){
  const int64_t K=argc>1?atol(argv[1]):4096, kp1=K/2, pstride=kp1*32; std::vector<uint8_t> qw(2*pstride, 0x37); std::vector<uint16_t> x(K,0x3f80); float out[16];
  auto run=[&](const char* nm, void(*f)(const uint16_t*,const uint8_t*,int64_t,int64_t,float*)){
    for(int i=0;i<200;i++) f(x.data(),qw.data(),pstride,kp1,out);
    int R=int(std::max<int64_t>(3,20000*4096/K)); double t=now(); for(int i=0;i<R;i++) f(x.data(),qw.data(),pstride,kp1,out); double dt=(now()-t)/R;
    printf("%s: %.2f us/call, %.1f GB/s (bytes 2 panels x %ld)\n", nm, dt*1e6, 2.0*pstride/dt/1e9, pstride); };
  run("v0 current", v0); run("v1 byte-unpack", v1); run("v2 dpbf16 only", v2); run("v3 vnni", v3); run("v4 int16 x", v4);
}
