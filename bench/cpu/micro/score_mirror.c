// The score kernel's inner work for 3-bit interleaved keys (score_heads::<4, 3> on Blocks), in
// C: per 16-row block of 128 channels, 4 groups of 3 bit-plane loads, 8 cuts and 32 vpdpbusd
// against 4 heads' i8 queries. Mode 0 sums the dots, 1 stores them, 2 adds the epilogue
// (scale, center and minimum terms). Session 10: 10.5 / 11.05 cycles per row (mode 1 / 2)
// against 13.4 for the Rust kernel in L2 (group_kernels).
//   gcc -O2 -march=icelake-server score_mirror.c -o score_mirror && ./score_mirror 2
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
// Mirrors score_heads::<4,3>: per 16-row block of a 128-channel row: 4 groups x (3 plane loads, 8 cuts, 32 dpbusd)
int main(int argc,char**argv){
  int mode=atoi(argv[1]);
  size_t blocks=64; // 1024 rows
  unsigned char* codes=aligned_alloc(64, blocks*4*192);
  for(size_t i=0;i<blocks*4*192;i++) codes[i]=rand();
  int* q[4]; for(int h=0;h<4;h++){ q[h]=aligned_alloc(64, 64*4); for(int i=0;i<64;i++) q[h][i]=rand(); }
  float* out=aligned_alloc(64, 4*blocks*16*4);
  __m512i m3=_mm512_set1_epi8(3), m7=_mm512_set1_epi8(7);
  long reps=200000; double t=now();
  __m512i sink=_mm512_setzero_si512();
  for(long r=0;r<reps/64;r++){
    for(size_t b=0;b<blocks;b++){
      __m512i c0[4]={0},c1[4]={0};
      for(int g=0; g<4; g++){
        const __m512i* p=(const __m512i*)(codes+(b*4+g)*192);
        __m512i lo0=_mm512_load_si512(p), lo1=_mm512_load_si512(p+1), hi=_mm512_load_si512(p+2);
        __m512i lv[8];
        #pragma GCC unroll 8
        for(int k=0;k<8;k++){
          __m512i pair = _mm512_srli_epi32(k<4?lo0:lo1, 2*(k%4));
          __m512i h = (k%8)>=2? _mm512_srli_epi32(hi,(k%8)-2) : _mm512_slli_epi32(hi,2-(k%8));
          __m512i c=_mm512_ternarylogic_epi32(pair,h,m3,0xE4);
          lv[k]=_mm512_and_si512(c,m7);
        }
        #pragma GCC unroll 8
        for(int k=0;k<8;k++){
          __m512i* ch = (k%2)? c1 : c0;
          #pragma GCC unroll 4
          for(int h=0;h<4;h++) ch[h]=_mm512_dpbusd_epi32(ch[h], lv[k], _mm512_set1_epi32(q[h][8*g+k]));
        }
      }
      if(mode==2){
        __m512 scale=_mm512_loadu_ps(out+ (b%4)*16), value=_mm512_loadu_ps(out+64+(b%4)*16);
        for(int h=0;h<4;h++){ __m512 x=_mm512_cvtepi32_ps(_mm512_add_epi32(c0[h],c1[h]));
          x=_mm512_fmsub_ps(x,_mm512_set1_ps(((float*)q[h])[60]),_mm512_set1_ps(3.5f*((float*)q[h])[61]));
          x=_mm512_mul_ps(x,scale); x=_mm512_fmadd_ps(value,_mm512_set1_ps(((float*)q[h])[62]),x);
          _mm512_mask_storeu_ps(out+(h*blocks+b)*16, (__mmask16)(blocks-b>0?0xffff:0), x);} 
      } else if(mode==1){
        for(int h=0;h<4;h++){ __m512 x=_mm512_cvtepi32_ps(_mm512_add_epi32(c0[h],c1[h])); _mm512_store_ps(out+(h*blocks+b)*16, x);} 
      } else {
        for(int h=0;h<4;h++) sink=_mm512_add_epi32(sink,_mm512_add_epi32(c0[h],c1[h]));
      }
    }
  }
  double s=now()-t; long rows=(reps/64)*blocks*16;
  printf("mode %d: %.2f cycles/row  %.3f ns/row\n", mode, s*3.67e9/rows, s*1e9/rows);
  return _mm512_reduce_add_epi32(sink)==1 && out[0]==1.0f;
}
