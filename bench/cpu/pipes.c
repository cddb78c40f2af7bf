// Throughput of the AVX-512 instructions the integer attention kernels use, alone and paired
// with vpdpbusd: which ones compete with it for an execution pipe. Cycles assume the clock
// given as the first argument in GHz (measure it with a dependent add chain, e.g. the
// `freq` case below). Build: gcc -O2 -march=icelake-server pipes.c -o pipes && ./pipes 3.5
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double ghz = 3.5;
static const long N = 100000000;

#define R6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(i) __m512i v##i = _mm512_set1_epi32(i + 1); __m512i w##i = _mm512_set1_epi32(i + 7);
#define SUM(i) s += _mm512_reduce_add_epi32(v##i) + _mm512_reduce_add_epi32(w##i);
// Six independent chains of each of two instructions per iteration: cycles per pair.
#define PAIR(name, OPA, OPB)                                                              \
  {                                                                                       \
    R6(DECL) double t = now();                                                            \
    for (long it = 0; it < N; it++) {                                                     \
      R6(OPA) R6(OPB) __asm__ volatile("" : "+v"(a), "+v"(b), "+r"(mem));                 \
    }                                                                                     \
    double sec = now() - t;                                                               \
    int s = 0;                                                                            \
    R6(SUM) printf("%-24s %.2f cycles per pair (%d)\n", name, sec * ghz * 1e9 / (N * 6.0), s); \
  }

#define NOP(i)
#define DP(i) v##i = _mm512_dpbusd_epi32(v##i, a, b);
#define DP2(i) w##i = _mm512_dpbusd_epi32(w##i, a, b);
#define PT2B(i) w##i = _mm512_permutex2var_epi8(w##i, a, b);
#define PB(i) w##i = _mm512_permutexvar_epi8(a, w##i);
#define MS(i) w##i = _mm512_multishift_epi64_epi8(a, w##i);
#define SRL(i) w##i = _mm512_srli_epi16(w##i, 4);
#define AND(i) w##i = _mm512_and_si512(w##i, a);
#define UNP(i) w##i = _mm512_unpacklo_epi32(w##i, a);
#define SHUF(i) w##i = _mm512_shuffle_i32x4(w##i, a, 0x44);
#define PSHUFB(i) w##i = _mm512_shuffle_epi8(a, w##i);
#define FMA(i) w##i = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(w##i), _mm512_castsi512_ps(a), _mm512_castsi512_ps(b)));
#define MUL(i) w##i = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(w##i), _mm512_castsi512_ps(a)));
#define ADDPS(i) w##i = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(w##i), _mm512_castsi512_ps(a)));
#define CVT(i) w##i = _mm512_castps_si512(_mm512_cvtepi32_ps(w##i));
#define CVTPH(i) w##i = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(w##i)));
#define PMOVDB(i) w##i = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(w##i));
#define BCAST(i) w##i = _mm512_add_epi32(w##i, _mm512_set1_epi32(mem[i + 8]));

int main(int argc, char **argv) {
  if (argc > 1) ghz = atof(argv[1]);
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  int buf[64];
  for (int i = 0; i < 64; i++) buf[i] = i * 77;
  int *mem = buf;
  {
    long x = 0;
    double t = now();
    for (long i = 0; i < 2 * N; i++) __asm__ volatile("add $1, %0" : "+r"(x));
    printf("freq: %.2f GHz if the add chain runs one per cycle\n", 2 * N / (now() - t) / 1e9);
  }
  PAIR("vpdpbusd alone", DP, NOP)
  PAIR("vpdpbusd + vpdpbusd", DP, DP2)
  PAIR("vpdpbusd + vpermt2b", DP, PT2B)
  PAIR("vpdpbusd + vpermb", DP, PB)
  PAIR("vpdpbusd + vpmultishiftqb", DP, MS)
  PAIR("vpdpbusd + vpshufb", DP, PSHUFB)
  PAIR("vpdpbusd + vpsrlw", DP, SRL)
  PAIR("vpdpbusd + vpandd", DP, AND)
  PAIR("vpdpbusd + vpunpckldq", DP, UNP)
  PAIR("vpdpbusd + vshufi32x4", DP, SHUF)
  PAIR("vpdpbusd + vfmadd", DP, FMA)
  PAIR("vpdpbusd + vmulps", DP, MUL)
  PAIR("vpdpbusd + vaddps", DP, ADDPS)
  PAIR("vpdpbusd + vcvtdq2ps", DP, CVT)
  PAIR("vpdpbusd + vcvtph2ps", DP, CVTPH)
  PAIR("vpdpbusd + vpmovdb", DP, PMOVDB)
  PAIR("vpdpbusd + vpbroadcastd", DP, BCAST)
  PAIR("vpermt2b + vpsrlw", PT2B, SRL)
  PAIR("vpmultishiftqb + vpandd", MS, AND)
  return 0;
}
