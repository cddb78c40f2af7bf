// The value sums' inner loop for 3-bit interleaved blocks (sums_of_levels::<4, 3> on Blocks),
// in C, without the per-tile weight rounding: per 64 channels and pair of quads, 3 plane
// loads, 8 level vectors, 32 vpdpbusd against 4 heads' broadcast i8 weights. Session 10:
// 13.4–14.4 cycles per row, as the Rust loop (4.6 ns/row in L2 with the rounding's ~1.2).
//   gcc -O2 -march=icelake-server sums_mirror.c -o sums_mirror && ./sums_mirror
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
// Mirrors sums_of_levels::<4,3> on interleaved blocks: per half (64 ch) per pair of quads: 3 plane loads, 8 level vectors, 32 dpbusd, 16 weight broadcasts
int main(int argc,char**argv){
  size_t tiles=16; // 1024 rows
  unsigned char* codes=aligned_alloc(64, tiles*64*48+4096);
  for(size_t i=0;i<tiles*64*48;i++) codes[i]=rand();
  signed char* wts=aligned_alloc(64, 4*64);
  for(int i=0;i<256;i++) wts[i]=rand()%100;
  float* acc=aligned_alloc(64, 4*128*4); for(int i=0;i<512;i++) acc[i]=0;
  __m512i m3=_mm512_set1_epi8(3), m7=_mm512_set1_epi8(7);
  long reps=300000; double t=now();
  for(long r=0;r<reps/64;r++){
    for(size_t tl=0;tl<tiles;tl++){
      for(int half=0;half<2;half++){
        __m512i s[4][4]; for(int h=0;h<4;h++) for(int x=0;x<4;x++) s[h][x]=_mm512_setzero_si512();
        for(int p=0;p<8;p++){
          const __m512i* at=(const __m512i*)(codes + tl*64*48 + (p/2)*768 + (p%2)*384 + half*192);
          __m512i lo0=_mm512_load_si512(at), lo1=_mm512_load_si512(at+1), hi=_mm512_load_si512(at+2);
          #pragma GCC unroll 2
          for(int sec=0;sec<2;sec++){
            __m512i low = sec? lo1: lo0; __m512i x[4];
            #pragma GCC unroll 4
            for(int j=0;j<4;j++){
              int t=4*sec+j;
              __m512i pair=_mm512_srli_epi32(low,2*j);
              __m512i hh= t>=2? _mm512_srli_epi32(hi,t-2) : _mm512_slli_epi32(hi,2-t);
              x[j]=_mm512_and_si512(_mm512_ternarylogic_epi32(pair,hh,m3,0xE4),m7);
            }
            int k=2*p+sec;
            #pragma GCC unroll 4
            for(int h=0;h<4;h++){
              __m512i w0=_mm512_set1_epi32(((int*)(wts+h*64))[k]);
              __m512i w1=_mm512_set1_epi32(((int*)(wts+h*64))[k ^ 1]);
              s[h][0]=_mm512_dpbusd_epi32(s[h][0],x[0],w0); s[h][1]=_mm512_dpbusd_epi32(s[h][1],x[1],w0);
              s[h][2]=_mm512_dpbusd_epi32(s[h][2],x[2],w1); s[h][3]=_mm512_dpbusd_epi32(s[h][3],x[3],w1);
            }
          }
        }
        for(int h=0;h<4;h++) for(int x=0;x<4;x++){
          float* a=acc+h*128+half*64+16*x;
          __m512 v=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[h][x],_mm512_set1_epi32(5))),_mm512_set1_ps(0.5f),_mm512_set1_ps(0.1f));
          _mm512_store_ps(a,_mm512_add_ps(_mm512_load_ps(a),v));
        }
      }
    }
  }
  double sec=now()-t; long rows=(reps/64)*tiles*64;
  printf("%.2f cycles/row  %.3f ns/row\n", sec*3.67e9/rows, sec*1e9/rows);
  return acc[3]==1.0f;
}
