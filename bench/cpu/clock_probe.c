// How fast each vCPU computes when 1, 2, ... N of them are busy at once, two ways:
//
// * clock: a chain of dependent 64-bit multiplies (`imul`, 3 cycles each on every x86 core of
//   the last decade), so 3 × multiplies per ns is the clock the thread got (turbo bins, the
//   hypervisor's steal time and all). A chain uses a third of the multiplier, so a sibling
//   hyperthread on the same core does not slow it. (A chain of `add reg, imm` is no clock on
//   the Xeon: Golden Cove and later fold those at rename, and it ran at "14 GHz" there.)
// * port: four independent chains, which keep the multiplier busy every cycle: multiplies per
//   ns equal the clock on a core of one's own, and fall toward half of it where another
//   thread (a sibling hyperthread, another guest's) issues to the same core's ports.
//
// Memory is never touched in the loops, so caches and the mesh do not enter either figure.
//
// Build: cc -O2 -pthread -o clock_probe bench/cpu/clock_probe.c
// Usage: clock_probe N [SECONDS]   threads pinned to CPUs 0..N-1, started together; prints
//        each thread's clock and port figures (GHz, multiplies per ns) with their min /
//        median / max. Each figure is measured for SECONDS (default 1).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_barrier_t start;
static double seconds = 1.0;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// 100 dependent multiplies (by `one`, which the CPU cannot know) on each of `C` chains.
#define CHAINS(C)                                                                        \
  static unsigned long chains##C(unsigned long *x, unsigned long one) {                  \
    unsigned long a = x[0], b = x[1], c = x[2], d = x[3];                                \
    if (C == 1)                                                                          \
      __asm__ volatile(".rept 100\n\timul %1, %0\n\t.endr" : "+r"(a) : "r"(one));        \
    else                                                                                 \
      __asm__ volatile(".rept 100\n\timul %4, %0\n\timul %4, %1\n\timul %4, %2\n\t"      \
                       "imul %4, %3\n\t.endr"                                            \
                       : "+r"(a), "+r"(b), "+r"(c), "+r"(d)                              \
                       : "r"(one));                                                      \
    x[0] = a, x[1] = b, x[2] = c, x[3] = d;                                              \
    return 100 * C;                                                                      \
  }
CHAINS(1)
CHAINS(4)

// Multiplies per ns of `chains` for `seconds`.
static double rate(unsigned long (*chains)(unsigned long *, unsigned long), unsigned long one) {
  unsigned long x[4] = {1, 1, 1, 1}, done = 0;
  double t0 = now(), t;
  do {
    for (int i = 0; i < 10000; i++) done += chains(x, one);
    t = now();
  } while (t - t0 < seconds);
  return done / ((t - t0) * 1e9) + 0 * (double)(x[0] + x[1] + x[2] + x[3]);
}

static void *run(void *arg) {
  long cpu = (long)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  unsigned long one = cpu >= 0;
  double *figures = malloc(2 * sizeof *figures);
  pthread_barrier_wait(&start);
  figures[0] = 3 * rate(chains1, one);
  pthread_barrier_wait(&start);
  figures[1] = rate(chains4, one);
  return figures;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void print(const char *name, double *v, int n) {
  printf("  %s:", name);
  for (int i = 0; i < n; i++) printf(" %.2f", v[i]);
  qsort(v, n, sizeof *v, by_value);
  printf("  | min %.2f median %.2f max %.2f\n", v[0], v[n / 2], v[n - 1]);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 0;
  if (n < 1 || n > 256) {
    fprintf(stderr, "usage: %s THREADS (1-256) [SECONDS]\n", argv[0]);
    return 2;
  }
  if (argc > 2) seconds = atof(argv[2]);
  pthread_t threads[256];
  double clock[256], port[256];
  pthread_barrier_init(&start, NULL, n);
  for (long i = 0; i < n; i++) pthread_create(&threads[i], NULL, run, (void *)i);
  for (int i = 0; i < n; i++) {
    void *r;
    pthread_join(threads[i], &r);
    clock[i] = ((double *)r)[0];
    port[i] = ((double *)r)[1];
    free(r);
  }
  printf("threads %d\n", n);
  print("clock GHz", clock, n);
  print("port imul/ns", port, n);
  return 0;
}
