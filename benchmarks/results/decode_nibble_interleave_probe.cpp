// W4A16 M = 1 loop on one core: v4 (shipped int16 x, vpmovzxbw per 32 B of nibbles + and / shift, 2 vpdpwssd) against v7 / v8,
// a byte-interleaved layout of two consecutive 32-byte k-pair chunks (one 64 B load = 2 k-pairs x 32 columns, the 4
// nibbles of each 16-bit word extracted by shift / and: no lane-crossing op; v8 masks before shifting).
// g++ -O2 -march=native decode_nibble_interleave_probe.cpp (decode_probe_common.h) && ./a.out [K] (-DPF=2048: prefetch)
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cstdlib>
#include "decode_probe_common.h"
template<int VAR>
__attribute__((noinline)) void v7(const uint8_t* xb, const uint8_t* qw, int64_t pstride, int64_t K, float* out){
  const uint16_t* x=(const uint16_t*)xb;
  const __m512i m=_mm512_set1_epi16(0xF);
  __m512i a00=_mm512_setzero_si512(),a01=a00,a10=a00,a11=a00,b00=a00,b01=a00,b10=a00,b11=a00;
  const uint8_t* q0=qw; const uint8_t* q1=qw+pstride;
  for(int64_t kp=0;kp<K/2;kp+=2,q0+=64,q1+=64){
    const __m512i x0=_mm512_set1_epi32(*(const int32_t*)(x+2*kp)), x1=_mm512_set1_epi32(*(const int32_t*)(x+2*kp+2));
    if(PF){ _mm_prefetch((const char*)q0+PF,_MM_HINT_T0); _mm_prefetch((const char*)q1+PF,_MM_HINT_T0);}
    const __m512i b=_mm512_loadu_si512(q0), c=_mm512_loadu_si512(q1);
    __asm__("" : : "v"(b), "v"(c));
    if (VAR==0){
      a00=_mm512_dpwssd_epi32(a00,x0,_mm512_and_si512(b,m)); a01=_mm512_dpwssd_epi32(a01,x0,_mm512_and_si512(_mm512_srli_epi16(b,4),m));
      a10=_mm512_dpwssd_epi32(a10,x1,_mm512_and_si512(_mm512_srli_epi16(b,8),m)); a11=_mm512_dpwssd_epi32(a11,x1,_mm512_srli_epi16(b,12));
      b00=_mm512_dpwssd_epi32(b00,x0,_mm512_and_si512(c,m)); b01=_mm512_dpwssd_epi32(b01,x0,_mm512_and_si512(_mm512_srli_epi16(c,4),m));
      b10=_mm512_dpwssd_epi32(b10,x1,_mm512_and_si512(_mm512_srli_epi16(c,8),m)); b11=_mm512_dpwssd_epi32(b11,x1,_mm512_srli_epi16(c,12));
    } else {  // vpternlog: (b >> s) & m as one shift + one ternlog is the same count; try vpsrlvw-free: use 2 masks
      const __m512i bl=_mm512_and_si512(b,_mm512_set1_epi16(0x0F0F)), bh=_mm512_and_si512(_mm512_srli_epi16(b,4),_mm512_set1_epi16(0x0F0F));
      const __m512i cl=_mm512_and_si512(c,_mm512_set1_epi16(0x0F0F)), ch=_mm512_and_si512(_mm512_srli_epi16(c,4),_mm512_set1_epi16(0x0F0F));
      a00=_mm512_dpwssd_epi32(a00,x0,_mm512_and_si512(bl,m)); a01=_mm512_dpwssd_epi32(a01,x0,_mm512_and_si512(bh,m));
      a10=_mm512_dpwssd_epi32(a10,x1,_mm512_srli_epi16(bl,8)); a11=_mm512_dpwssd_epi32(a11,x1,_mm512_srli_epi16(bh,8));
      b00=_mm512_dpwssd_epi32(b00,x0,_mm512_and_si512(cl,m)); b01=_mm512_dpwssd_epi32(b01,x0,_mm512_and_si512(ch,m));
      b10=_mm512_dpwssd_epi32(b10,x1,_mm512_srli_epi16(cl,8)); b11=_mm512_dpwssd_epi32(b11,x1,_mm512_srli_epi16(ch,8));
    }
  }
  __m512i s=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a00,a01),_mm512_add_epi32(a10,a11)),_mm512_add_epi32(_mm512_add_epi32(b00,b01),_mm512_add_epi32(b10,b11)));
  _mm512_storeu_si512(out,s);
}
int main(int argc,char**argv){
  const int64_t K=argc>1?atol(argv[1]):4096, pstride=K*16; std::vector<uint8_t> qw(2*pstride+8192, 0x37); std::vector<uint8_t> x(2*K+64,0x11); float out[16];
  auto run=[&](const char* nm, void(*f)(const uint8_t*,const uint8_t*,int64_t,int64_t,float*)){
    for(int i=0;i<20;i++) f(x.data(),qw.data(),pstride,K,out);
    int R=int(std::max<int64_t>(3,20000*4096/K)); double t=now(); for(int i=0;i<R;i++) f(x.data(),qw.data(),pstride,K,out); double dt=(now()-t)/R;
    printf("%s: %.1f GB/s  ", nm, 2.0*pstride/dt/1e9); };
  for(int r=0;r<3;r++){ run("v4 int16", v4); run("v7 il", v7<0>); run("v8 il-mask", v7<1>); printf("\n"); }
}
