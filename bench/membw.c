/* Read bandwidth of this machine: T threads each sum their share of a large buffer (default
 * 1 GiB), best of 7 passes. Built by bench/compare-cpu.sh with -O3 -march=native so the loop
 * uses the widest loads the CPU has. Prints GB/s (1e9 bytes/s) on stdout.
 * usage: membw [threads] [MiB] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t* buf;
static size_t n_words;
static int n_threads;
static uint64_t sums[64 * 8];

static void* Worker(void* arg) {
  const size_t t = (size_t)(uintptr_t)arg;
  const size_t b = n_words * t / n_threads, e = n_words * (t + 1) / n_threads;
  uint64_t s = 0;
  for (size_t i = b; i < e; ++i) s += buf[i];
  sums[t * 8] = s;
  return NULL;
}

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  n_threads = argc > 1 ? atoi(argv[1]) : 1;
  const size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
  if (n_threads < 1 || n_threads > 64) return 2;
  n_words = (mib << 20) / 8;
  buf = aligned_alloc(64, n_words * 8);
  if (!buf) return 1;
  for (size_t i = 0; i < n_words; ++i) buf[i] = i;
  double best = 0;
  pthread_t th[64];
  for (int pass = 0; pass < 7; ++pass) {
    const double t0 = Now();
    for (int t = 0; t < n_threads; ++t) pthread_create(&th[t], NULL, Worker, (void*)(uintptr_t)t);
    for (int t = 0; t < n_threads; ++t) pthread_join(th[t], NULL);
    const double bw = n_words * 8.0 / (Now() - t0);
    if (bw > best) best = bw;
  }
  uint64_t total = 0;
  for (int t = 0; t < n_threads; ++t) total += sums[t * 8];
  fprintf(stderr, "checksum %llu\n", (unsigned long long)total);
  printf("%.3f\n", best / 1e9);
  return 0;
}
