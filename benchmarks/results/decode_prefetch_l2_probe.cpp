// The int16 x decode loop (micro::avx512_int16x<1, 2>) over the real tile layout (K = 4096: tiles of
// 2 panels x 64 KiB, consecutive), 2 OpenMP threads each over a contiguous half of the tiles, against a
// streaming read of the same buffers; prefetch variants: T0 at d0 in-stream, T1 at d1 in-stream, T1 of the
// next tile (nt). g++ -O2 -fopenmp -march=sapphirerapids decode_prefetch_l2_probe.cpp && ./a.out TILES REPS
// (results: decode_prefetch_l2_1205.md)
#include <immintrin.h>
#include <omp.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cstdlib>
#include "decode_int16_loop.h"
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
__attribute__((noinline)) void tile(const uint16_t* x, const uint8_t* qw, int64_t pstride, int64_t kp1, float* out, int64_t d0, int64_t d1, int64_t nt){
  int16_loop(x, qw, pstride, kp1, out, [=](const uint8_t* src, int64_t kp) __attribute__((always_inline)) {
    if(!(kp&1)){ if(d0) _mm_prefetch((const char*)src+d0,_MM_HINT_T0); if(d1) _mm_prefetch((const char*)src+d1,_MM_HINT_T1); if(nt) _mm_prefetch((const char*)src+nt,_MM_HINT_T1);} });
}
__attribute__((noinline)) void probe1(const uint8_t* p, int64_t n, float* out){
  __m512i a0=_mm512_setzero_si512(),a1=a0,a2=a0,a3=a0;
  for(int64_t i=0;i<n;i+=256){a0=_mm512_add_epi32(a0,_mm512_loadu_si512(p+i));a1=_mm512_add_epi32(a1,_mm512_loadu_si512(p+i+64));
    a2=_mm512_add_epi32(a2,_mm512_loadu_si512(p+i+128));a3=_mm512_add_epi32(a3,_mm512_loadu_si512(p+i+192));}
  _mm512_storeu_si512(out,_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)));
}
int main(int argc,char**argv){
  const int64_t K=4096, kp1=K/2, pstride=kp1*32, tbytes=2*pstride; const int64_t ntiles=argc>1?atol(argv[1]):172; // 11008/64
  const int copies=8; const int64_t bytes=ntiles*tbytes;
  std::vector<uint8_t*> qw(copies); for(auto& q:qw){ q=(uint8_t*)aligned_alloc(2<<20,(bytes+(2<<20)-1)/(2<<20)*(2<<20)); memset(q,0x37,bytes);}
  std::vector<uint16_t> x(K,1); float out[2][16];
  struct C{const char* nm; int64_t d0,d1,nt;};
  std::vector<C> cfg={{"T0 1K (no nt)",1024,0,0},{"T0 1K + next tile (shipped)",1024,0,tbytes},{"T0 2K",2048,0,0},{"T0 1K + T1 4K",1024,4096,0},{"T0 1K + T1 8K",1024,8192,0},{"T0 1K + T1 4K + nt",1024,4096,tbytes},{"T0 512 + T1 4K + nt",512,4096,tbytes},{"T0 1K + T1 16K",1024,16384,0}};
  std::vector<std::vector<double>> t(cfg.size()+1);
  int reps=argc>2?atoi(argv[2]):9; int it=0;
  for(int rep=0;rep<reps;rep++){
    for(size_t c=0;c<=cfg.size();c++){ uint8_t* buf=qw[(it++)%copies];
      double t0=now();
      #pragma omp parallel num_threads(2)
      { int th=omp_get_thread_num(); int64_t a=ntiles*th/2, b=ntiles*(th+1)/2;
        if(c==cfg.size()) probe1(buf+a*tbytes,(b-a)*tbytes,out[th]);
        else for(int64_t i=a;i<b;i++) tile(x.data(),buf+i*tbytes,pstride,kp1,out[th],cfg[c].d0,cfg[c].d1,cfg[c].nt); }
      t[c].push_back(bytes/(now()-t0)/1e9);} }
  for(auto& v:t) std::sort(v.begin(),v.end());
  double pr=t[cfg.size()][reps/2];
  for(size_t c=0;c<cfg.size();c++) printf("%-28s %5.1f GB/s  %3.0f%% of the probe %.1f\n",cfg[c].nm,t[c][reps/2],100*t[c][reps/2]/pr,pr);
}
