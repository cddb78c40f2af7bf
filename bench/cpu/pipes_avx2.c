// Throughput of the AVX2 instructions the integer attention kernels lean on (AVX2-only x86
// such as AMD Zen 3), each in 12 independent chains, and vpmaddubsw paired with the vpaddw
// that adds its result up as the kernels do. Prints the clock it measured (a dependent add
// chain) and cycles per instruction. Build: gcc -O2 pipes_avx2.c -o pipes_avx2 && ./pipes_avx2
#include <stdio.h>
#include <time.h>

static const long N = 20000000;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// One instruction `op src, acc, acc` on 12 accumulators (ymm0..ymm11), ymm15 the source.
#define R12(op)                                                                           \
  op " %%ymm15, %%ymm0, %%ymm0\n\t" op " %%ymm15, %%ymm1, %%ymm1\n\t"                      \
  op " %%ymm15, %%ymm2, %%ymm2\n\t" op " %%ymm15, %%ymm3, %%ymm3\n\t"                      \
  op " %%ymm15, %%ymm4, %%ymm4\n\t" op " %%ymm15, %%ymm5, %%ymm5\n\t"                      \
  op " %%ymm15, %%ymm6, %%ymm6\n\t" op " %%ymm15, %%ymm7, %%ymm7\n\t"                      \
  op " %%ymm15, %%ymm8, %%ymm8\n\t" op " %%ymm15, %%ymm9, %%ymm9\n\t"                      \
  op " %%ymm15, %%ymm10, %%ymm10\n\t" op " %%ymm15, %%ymm11, %%ymm11\n\t"
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
                "xmm9", "xmm10", "xmm11", "xmm12", "xmm13"
#define LOOP(name, body)                                                                  \
  static void name(long n) {                                                               \
    for (long i = 0; i < n; i++) __asm__ volatile(body ::: CLOBBER);                       \
  }

// 12 dependent adds: 12 cycles an iteration.
static void adds(long n) {
  for (long i = 0; i < n; i++)
    __asm__ volatile("add $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax\n\t"
                     "add $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax\n\t"
                     "add $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax\n\tadd $1, %%rax" ::: "rax");
}
LOOP(maddubs, R12("vpmaddubsw"))
LOOP(maddwd, R12("vpmaddwd"))
LOOP(paddw, R12("vpaddw"))
LOOP(pshufb, R12("vpshufb"))
LOOP(pand, R12("vpand"))
// As the kernels: 6 products into temporaries, each added into its own accumulator.
LOOP(pairs, "vpmaddubsw %%ymm15, %%ymm14, %%ymm12\n\tvpaddw %%ymm12, %%ymm0, %%ymm0\n\t"
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm13\n\tvpaddw %%ymm13, %%ymm1, %%ymm1\n\t"
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm12\n\tvpaddw %%ymm12, %%ymm2, %%ymm2\n\t"
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm13\n\tvpaddw %%ymm13, %%ymm3, %%ymm3\n\t"
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm12\n\tvpaddw %%ymm12, %%ymm4, %%ymm4\n\t"
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm13\n\tvpaddw %%ymm13, %%ymm5, %%ymm5\n\t")

// Best of 5 runs, in seconds.
static double best(void (*f)(long)) {
  double b = 1e9;
  for (int r = 0; r < 5; r++) {
    double t = now();
    f(N);
    t = now() - t;
    b = t < b ? t : b;
  }
  return b;
}

int main(void) {
  double ghz = 12.0 * N / best(adds) / 1e9;
  printf("clock %.2f GHz (dependent adds)\n", ghz);
  struct { const char *name; void (*f)(long); int per_iteration; } cases[] = {
      {"vpmaddubsw", maddubs, 12}, {"vpmaddwd", maddwd, 12}, {"vpaddw", paddw, 12},
      {"vpshufb", pshufb, 12},     {"vpand", pand, 12},      {"vpmaddubsw+vpaddw", pairs, 6},
  };
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double cycles = best(cases[i].f) * ghz * 1e9 / ((double)N * cases[i].per_iteration);
    printf("%-20s %.3f cycles each\n", cases[i].name, cycles);
  }
  return 0;
}
