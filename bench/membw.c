/* Read bandwidth of this machine: T threads each sum their share of a large buffer (default
 * 1 GiB). The best of several access patterns is reported, each the best of 5 passes: 1, 2 or
 * 4 sequential streams per thread, with and without software prefetch 2 KiB ahead. One stream
 * alone keeps too few misses in flight on some CPUs (Zen 5: ~40 GB/s with 1 stream, ~49 with
 * 2), and the cpu plugin's kernels do prefetch, so a single plain loop understates the limit.
 * Built by bench/compare-cpu.sh with -O3 -march=native so the loops use the widest loads the
 * CPU has. Prints GB/s (1e9 bytes/s) on stdout; each pattern's figure on stderr.
 * usage: membw [threads] [MiB] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t* buf;
static size_t n_words;
static int n_threads, n_streams, prefetch;
static uint64_t sums[64 * 8];

static void* Worker(void* arg) {
  const size_t t = (size_t)(uintptr_t)arg;
  const size_t b = n_words * t / n_threads, e = n_words * (t + 1) / n_threads;
  const size_t len = (e - b) / n_streams / 8 * 8; /* words per stream, whole lines */
  uint64_t s = 0;
  for (size_t i = 0; i < len; i += 8) {
    for (int k = 0; k < n_streams; ++k) { /* one 64-byte line of each stream per round */
      const uint64_t* p = buf + b + k * len + i;
      if (prefetch) __builtin_prefetch(p + 256, 0, 3);
      for (int j = 0; j < 8; ++j) s += p[j];
    }
  }
  sums[t * 8] += s;
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
  const int stream_counts[] = {1, 2, 4};
  for (int si = 0; si < 3; ++si) {
    for (prefetch = 0; prefetch <= 1; ++prefetch) {
      n_streams = stream_counts[si];
      double pattern_best = 0;
      for (int pass = 0; pass < 5; ++pass) {
        const double t0 = Now();
        for (int t = 0; t < n_threads; ++t)
          pthread_create(&th[t], NULL, Worker, (void*)(uintptr_t)t);
        for (int t = 0; t < n_threads; ++t) pthread_join(th[t], NULL);
        const double bw = n_words * 8.0 / (Now() - t0);
        if (bw > pattern_best) pattern_best = bw;
      }
      fprintf(stderr, "membw: %d stream(s)/thread%s: %.2f GB/s\n", n_streams,
              prefetch ? " + prefetch" : "", pattern_best / 1e9);
      if (pattern_best > best) best = pattern_best;
    }
  }
  uint64_t total = 0;
  for (int t = 0; t < n_threads; ++t) total += sums[t * 8];
  fprintf(stderr, "checksum %llu\n", (unsigned long long)total);
  printf("%.3f\n", best / 1e9);
  return 0;
}
