// Throughput of the integer kernels' instruction mix on this core: per 64 codes and 4 query
// heads, 4 vpdpbusd (zmm) after the cut of mode 0: 3-bit bit planes (two shifts, a
// ternary-logic op, a mask), 1: a vpmultishiftqb cut, 2: none, 3: a 4-bit nibble cut.
// Session 10 on the Zen 4 VM: 4.58 / 5.44 / 4.00 / 4.00 cycles.
//   gcc -O2 -march=icelake-server vnni_mix.c -o vnni_mix && for m in 0 1 2 3; do ./vnni_mix $m; done
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
#define DP(c) do{ a0=_mm512_dpbusd_epi32(a0,c,w0); a1=_mm512_dpbusd_epi32(a1,c,w1); a2=_mm512_dpbusd_epi32(a2,c,w2); a3=_mm512_dpbusd_epi32(a3,c,w3);} while(0)
#define DQ(c) do{ b0=_mm512_dpbusd_epi32(b0,c,w0); b1=_mm512_dpbusd_epi32(b1,c,w1); b2=_mm512_dpbusd_epi32(b2,c,w2); b3=_mm512_dpbusd_epi32(b3,c,w3);} while(0)
int main(int argc, char**argv){
  int mode=argv[1][0]-'0';
  __m512i a0=_mm512_set1_epi32(1),a1=a0,a2=a0,a3=a0,b0=a0,b1=a0,b2=a0,b3=a0;
  __m512i w0=_mm512_set1_epi8(3), w1=_mm512_set1_epi8(5), w2=_mm512_set1_epi8(7), w3=_mm512_set1_epi8(9);
  __m512i m3=_mm512_set1_epi8(3), m7=_mm512_set1_epi8(7);
  __m512i x0=_mm512_set1_epi32(11),x1=_mm512_set1_epi32(12),x2=_mm512_set1_epi32(13);
  long n=50000000; double t=now();
  for(long i=0;i<n;i++){
    __asm__ volatile("" : "+v"(x0),"+v"(x1),"+v"(x2));
    if(mode==0){
      #pragma GCC unroll 8
      for(int j=0;j<8;j++){
        __m512i p=_mm512_srlv_epi32(j<4?x0:x1,_mm512_set1_epi32(2*(j%4)));
        __m512i h=j>=2?_mm512_srlv_epi32(x2,_mm512_set1_epi32(j-2)):_mm512_sllv_epi32(x2,_mm512_set1_epi32(2-j));
        __m512i c=_mm512_ternarylogic_epi32(p,h,m3,0xE4); c=_mm512_and_si512(c,m7);
        if(j&1) DQ(c); else DP(c);
      }
    } else if(mode==1){
      __m512i s2=_mm512_shrdi_epi64(x0,x1,48), s5=_mm512_shrdi_epi64(x1,x2,56);
      #pragma GCC unroll 8
      for(int j=0;j<8;j++){
        __m512i src = j<2?x0: j==2?s2: j<5?x1: j==5?s5: x2;
        __m512i c=_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0101010101010101ULL*(j*3)),src); c=_mm512_and_si512(c,m7);
        if(j&1) DQ(c); else DP(c);
      }
    } else if(mode==2){
      #pragma GCC unroll 8
      for(int j=0;j<8;j++){ __m512i c = j%3==0?x0:j%3==1?x1:x2; if(j&1) DQ(c); else DP(c);} 
    } else {
      #pragma GCC unroll 8
      for(int j=0;j<8;j++){ __m512i c=_mm512_and_si512(_mm512_srli_epi16(j%2?x0:x1,4*(j/4)),m7); if(j&1) DQ(c); else DP(c);} 
    }
  }
  double s=now()-t; printf("mode %d: %.3f cycles per 64 codes x 4 heads\n", mode, s*3.67e9/(n*8.0));
  __m512i r=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)),_mm512_add_epi32(_mm512_add_epi32(b0,b1),_mm512_add_epi32(b2,b3)));
  return _mm512_reduce_add_epi32(r)==5;
}
