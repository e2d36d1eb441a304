/* bench-kn.c — micro-benchmark of the CPU backend: streaming read bandwidth,
 * bf16/f16/f32 matvec (T = 1) on gemma-3-270m-shaped matrices against it, the
 * matmul at prefill sizes, and decode attention.
 *
 *   bench-kn [threads] [seconds-per-case] [bf16 | q8 [head | stream | formats | kernels]]
 *
 * bf16: the backend in the bf16 mode (matmul inputs rounded to bf16).
 * q8: the q8 mode's matmuls over Q4_0 / Q8_0 weights only (inputs in Q8_0 blocks);
 * q8 head: only the [262144 x 640] head (decode, from memory);
 * q8 stream: a decode step's weight stream in Q4_0 and Q8_0, as the mode lays it out;
 * q8 formats: one token against every block format, 1b-shaped rows (K = 1152 and
 * 6912), from cache (a matrix that fits L2) and from memory;
 * q8 kernels: each block format's kernel alone, 1 and 4 tokens against [256 x
 * 2560] (gemma-3-4b's rows: whole K-quant super-blocks) in L2, the best of many
 * short batches (steady where a shared machine's memory rate is not; run it
 * with 1 thread).
 * Before the cases: the read bandwidth and the vector units' issue rates (FMA,
 * vdpbf16ps, AMX, and vpdpbusd on one thread and on every thread at once).
 *
 * Not part of the test suite (meson `benchmark`); numbers go to stdout. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend.h"
#include "kernels/kn-quant.h"

static double secs_per_case = 0.5;
static double last_cpu_per_call; /* process CPU seconds per call of the last timing */

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *rand_weights(enum kn_dtype dt, size_t n) {
  void *p = malloc(n * kn_dtype_size(dt));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  uint32_t s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    kn_store_f32(p, dt, i, ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f);
  }
  return p;
}

/* N rows of block format dt quantized from wf's rows (src_rows of K, used
 * again from the first past the last). */
static uint8_t *quantized(enum kn_dtype dt, const float *wf, int src_rows, int N, int K) {
  const size_t rb = kn_row_bytes(dt, (size_t)K);
  uint8_t *w = malloc(rb * (size_t)N);
  if (!w) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (int r = 0; r < N; r++)
    kn_quantize_row(dt, wf + (size_t)(r % src_rows) * K, w + (size_t)r * rb, (size_t)K);
  return w;
}

/* Seconds per call of a matmul T x [N, K]. */
static double time_matmul(struct kn_backend *be, enum kn_dtype dt, const void *w, int T, int N,
                          int K, float *in, float *out) {
  int reps = 0;
  (void)kn_matmul(be, out, N, in, K, w, dt, T, N, K, 0); /* warm up */
  double t0 = cm_time_s(), t, c0 = cpu_s();
  do {
    if (kn_matmul(be, out, N, in, K, w, dt, T, N, K, 0)) {
      fprintf(stderr, "matmul failed\n");
      exit(1);
    }
    reps++;
    t = cm_time_s() - t0;
  } while (t < secs_per_case);
  last_cpu_per_call = (cpu_s() - c0) / reps;
  return t / reps;
}

/* Issue rate of one core for 512-bit FMAs (16 multiply-adds each) and
 * vdpbf16ps (32 bf16 products each): 12 independent accumulators, so the
 * rate is bounded by throughput, not latency. Billions per second. */
#define RATE_ITERS 20000000L
/* Keeps the 12 accumulators alive; the rate of t seconds' run. */
__attribute__((target("avx512f"))) static double rate_done(__m512 a[12], double t) {
  for (int i = 1; i < 12; i++)
    a[0] = _mm512_add_ps(a[0], a[i]);
  volatile float sink = _mm512_reduce_add_ps(a[0]);
  (void)sink;
  return 12.0 * RATE_ITERS / t / 1e9;
}
__attribute__((target("avx512f"), noinline)) static double rate_fma(void) {
  __m512 a[12], x = _mm512_set1_ps(1.0f), w = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++)
    a[i] = _mm512_setzero_ps();
  double t0 = cm_time_s();
  for (long k = 0; k < RATE_ITERS; k++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(x, w, a[i]);
    __asm__ volatile("" : "+v"(x));
  }
  return rate_done(a, cm_time_s() - t0);
}
__attribute__((target("avx512f,avx512bf16"), noinline)) static double rate_dpbf16(void) {
  __m512 a[12];
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), w = (__m512bh)_mm512_set1_epi16(0x3400);
  for (int i = 0; i < 12; i++)
    a[i] = _mm512_setzero_ps();
  double t0 = cm_time_s();
  for (long k = 0; k < RATE_ITERS; k++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, w);
    __asm__ volatile("" : "+v"(x));
  }
  return rate_done(a, cm_time_s() - t0);
}

/* vpdpbusd (64 unsigned x signed byte products each, the q8 mode's VNNI
 * kernels' instruction) the same way. */
__attribute__((target("avx512f,avx512vnni"), noinline)) static double rate_dpbusd(void) {
  __m512 a[12];
  __m512i x = _mm512_set1_epi8(3), w = _mm512_set1_epi8(5), acc[12];
  for (int i = 0; i < 12; i++) /* distinct starts, so that no two chains are one */
    acc[i] = _mm512_set1_epi32(i);
  double t0 = cm_time_s();
  for (long k = 0; k < RATE_ITERS; k++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) acc[i] =
        _mm512_dpbusd_epi32(acc[i], x, w);
    __asm__ volatile("" : "+v"(x));
  }
  double t = cm_time_s() - t0;
  for (int i = 0; i < 12; i++)
    a[i] = _mm512_cvtepi32_ps(acc[i]);
  return rate_done(a, t);
}

struct rate_job {
  pthread_t th;
  double rate;
};

static void *rate_dpbusd_job(void *arg) {
  ((struct rate_job *)arg)->rate = rate_dpbusd();
  return NULL;
}

/* The sum of n threads' vpdpbusd rates, run at the same time: n times the one
 * core's when each thread has a core's vector units to itself, less when the
 * threads share them (virtual CPUs on one physical core). */
static double rate_dpbusd_threads(int n) {
  struct rate_job job[64];
  double sum = 0;
  if (n > 64) n = 64;
  for (int i = 0; i < n; i++)
    if (pthread_create(&job[i].th, NULL, rate_dpbusd_job, &job[i])) n = i;
  for (int i = 0; i < n; i++) {
    pthread_join(job[i].th, NULL);
    sum += job[i].rate;
  }
  return sum;
}

/* The q8 mode: Q4_0 and Q8_0 weights of gemma-3-270m's MLP shapes at decode
 * and prefill token counts, as the rows are in a file and as the mode lays
 * them out at load (kn_weights_prepare). */
static void bench_q8(struct kn_backend *be, float *in, float *out, int head_only) {
  static const int NK[][2] = {{2048, 640}, {640, 2048}, {262144, 640}},
                   Ts[] = {1, 4, 8, 12, 16, 64, 256};
  for (int d = 0; d < 2; d++) {
    enum kn_dtype dt = d ? KN_DTYPE_Q8_0 : KN_DTYPE_Q4_0;
    for (int m = head_only ? 2 : 0; m < 3; m++) {
      const int N = NK[m][0], K = NK[m][1];
      float *wf = rand_weights(KN_DTYPE_F32, (size_t)N * K);
      size_t rb = kn_row_bytes(dt, (size_t)K);
      uint8_t *w = quantized(dt, wf, N, N, K);
      /* the rows as the file has them, then as the mode lays them out at load */
      for (enum kn_dtype wdt = dt, was = KN_DTYPE__COUNT; wdt != was;
           was = wdt, kn_weights_prepare(be, w, &wdt, N, K))
        for (size_t i = 0; i < (N > 100000 ? 1 : sizeof(Ts) / sizeof(Ts[0])); i++) {
          double s = time_matmul(be, wdt, w, Ts[i], N, K, in, out);
          printf("q8 mode %-7s [%6d x %4d] T=%3d: %9.1f us  %6.1f G products/s (%6.1f per "
                 "CPU-second)  %5.1f GB/s of weights\n",
                 kn_dtype_name(wdt), N, K, Ts[i], s * 1e6, (double)Ts[i] * N * K / s / 1e9,
                 (double)Ts[i] * N * K / last_cpu_per_call / 1e9, (double)rb * N / s / 1e9);
        }
      free(wf), free(w);
    }
  }
}

/* The block formats, as the q8 cases take them. */
static const enum kn_dtype q8_formats[] = {KN_DTYPE_Q4_0, KN_DTYPE_Q5_0, KN_DTYPE_Q8_0,
                                           KN_DTYPE_Q4_1, KN_DTYPE_Q5_1, KN_DTYPE_Q4_K,
                                           KN_DTYPE_Q5_K, KN_DTYPE_Q6_K};

/* q8 formats: T = 1 against each block format as the mode lays it out, the
 * 1b's rows (K = 1152; 6912 for the K-quants' down projection too), a matrix
 * of 1024 rows (L2 after the first call) and one of 131072 (memory). */
static void bench_formats(struct kn_backend *be, float *in, float *out) {
  static const int NK[][2] = {{1024, 1152}, {131072, 1152}, {256, 6912}, {16384, 6912}};
  float *wf = rand_weights(KN_DTYPE_F32, (size_t)16384 * 6912);
  for (size_t d = 0; d < sizeof(q8_formats) / sizeof(q8_formats[0]); d++)
    for (int m = 0; m < 4; m++) {
      const int N = NK[m][0], K = NK[m][1];
      enum kn_dtype dt = q8_formats[d];
      if (kn_block_elems(dt) > 0 && K % kn_block_elems(dt)) continue;
      const size_t rb = kn_row_bytes(dt, (size_t)K);
      uint8_t *w = quantized(dt, wf, 16384, N, K);
      if (kn_weights_prepare(be, w, &dt, N, K)) exit(1);
      double s = time_matmul(be, dt, w, 1, N, K, in, out);
      printf("q8 mode %-7s [%6d x %4d] T=1 %-6s: %9.1f us  %5.1f GB/s of weights\n",
             kn_dtype_name(dt), N, K, N * rb > (8u << 20) ? "memory" : "cache", s * 1e6,
             (double)rb * N / s / 1e9);
      free(w);
    }
  free(wf);
}

/* q8 kernels: T = 1 and 4 against [256 x 2560] of each block format as the
 * mode lays it out, in L2: the fastest of 200 batches of 20 calls. */
static void bench_kernels(struct kn_backend *be, float *in, float *out) {
  const int N = 256, K = 2560;
  float *wf = rand_weights(KN_DTYPE_F32, (size_t)N * K);
  for (size_t d = 0; d < sizeof(q8_formats) / sizeof(q8_formats[0]); d++) {
    enum kn_dtype dt = q8_formats[d];
    const size_t rb = kn_row_bytes(dt, (size_t)K);
    uint8_t *w = quantized(dt, wf, N, N, K);
    if (kn_weights_prepare(be, w, &dt, N, K)) exit(1);
    for (int T = 1; T <= 4; T += 3) {
      double best = 1e30;
      for (int b = 0; b < 200; b++) {
        const double t0 = cm_time_s();
        for (int i = 0; i < 20; i++)
          (void)kn_matmul(be, out, N, in, K, w, dt, T, N, K, 0);
        const double s = (cm_time_s() - t0) / 20;
        best = s < best ? s : best;
      }
      printf("q8 kernel %-8s [%d x %d] T=%d: %8.2f us  %6.1f GB/s of weights\n",
             kn_dtype_name(dt), N, K, T, best * 1e6, (double)rb * N / best / 1e9);
    }
    free(w);
  }
  free(wf);
}

/* A decode step's weight stream: 18 layers of q,k,v,o,gate,up,down + lm_head
 * (270m-shaped) in dt, each matrix laid out as the backend's mode wants it
 * (kn_weights_prepare), three rounds, each between two bandwidth probes (the
 * machine may be shared). */
static void bench_stream(struct kn_backend *be, enum kn_dtype dt, int threads, float *in,
                         float *out) {
  static const int NK[][2] = {{1024, 640}, {256, 640},  {256, 640}, {640, 1024},
                              {2048, 640}, {2048, 640}, {640, 2048}};
  void *w[18 * 7 + 1];
  enum kn_dtype wdt[18 * 7 + 1];
  double bytes = 0;
  for (int i = 0; i < 18 * 7 + 1; i++) {
    const int N = i < 18 * 7 ? NK[i % 7][0] : 262144, K = i < 18 * 7 ? NK[i % 7][1] : 640;
    size_t rb = kn_row_bytes(dt, (size_t)K);
    if (kn_block_elems(dt) > 1) {
      float *wf = rand_weights(KN_DTYPE_F32, (size_t)N * K);
      w[i] = quantized(dt, wf, N, N, K);
      free(wf);
    } else {
      w[i] = rand_weights(dt, (size_t)N * K);
    }
    wdt[i] = dt;
    (void)kn_weights_prepare(be, w[i], &wdt[i], N, K);
    bytes += (double)rb * N;
  }
  for (int round = 0; round < 3; round++) {
    double bw0 = kn_cpu_measure_bandwidth(0, threads);
    int reps = 0;
    double t0 = cm_time_s(), t;
    do {
      for (int i = 0; i < 18 * 7 + 1; i++) {
        const int N = i < 18 * 7 ? NK[i % 7][0] : 262144, K = i < 18 * 7 ? NK[i % 7][1] : 640;
        kn_matmul(be, out, N, in, K, w[i], wdt[i], 1, N, K, 0);
      }
      reps++;
      t = cm_time_s() - t0;
    } while (t < 2 * secs_per_case);
    double bw1 = kn_cpu_measure_bandwidth(0, threads), s = t / reps;
    printf("decode weight stream (270m-shaped, %s, %.0f MB): %.2f ms/token, %.1f GB/s; "
           "bandwidth before/after %.1f/%.1f GB/s: %.0f%% of their mean\n",
           kn_dtype_name(wdt[0]), bytes / 1e6, s * 1e3, bytes / s / 1e9, bw0, bw1,
           100.0 * bytes / s / 1e9 / ((bw0 + bw1) / 2));
  }
  for (int i = 0; i < 18 * 7 + 1; i++)
    free(w[i]);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 0;
  if (argc > 2) secs_per_case = atof(argv[2]);
  struct kn_backend *be = NULL;
  int bf16 = argc > 3 && !strcmp(argv[3], "bf16") ? 1 : argc > 3 && !strcmp(argv[3], "q8") ? 2 : 0;
  if (kn_cpu_backend_create_mode(threads, KN_CPU_ISA_BEST, bf16, &be)) return 1;
  double bw = kn_cpu_measure_bandwidth(0, threads);
  printf("backend %s, threads %d, matmul inputs %s\n", kn_backend_name(be), threads,
         bf16 == 1 ? "bf16"
         : bf16    ? "q8"
                   : "f32");
  printf("read bandwidth: %.1f GB/s\n", bw);
  if (kn_cpu_isa_detect() >= KN_CPU_ISA_AVX512) {
    double f = rate_fma();
    printf("one core: %.2f G vfmadd zmm/s (%.1f G multiply-adds/s)", f, 16 * f);
    if (kn_cpu_isa_detect() >= KN_CPU_ISA_AVX512BF16) {
      double d = rate_dpbf16();
      printf(", %.2f G vdpbf16ps zmm/s (%.1f G bf16 products/s)", d, 32 * d);
    }
    if (kn_cpu_isa_detect() >= KN_CPU_ISA_AMX) { /* 16 x 16 x 32 products each */
      double a = kn_cpu_amx_dp_rate(RATE_ITERS / 16);
      printf(", %.3f G tdpbf16ps/s (%.1f G bf16 products/s)", a, 8192 * a);
    }
    printf("\n");
    if (__builtin_cpu_supports("avx512vnni")) {
      int n = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
      double d = rate_dpbusd(), all = rate_dpbusd_threads(n);
      printf("int8: one core %.2f G vpdpbusd zmm/s (%.1f G products/s); %d threads at once "
             "%.1f G products/s in all\n",
             d, 64 * d, n, 64 * all);
    }
  }

  /* gemma-3-270m: hidden 640, 4 heads x 256, 1 kv head, intermediate 2048, vocab 262144 */
  static const struct {
    const char *name;
    int N, K;
  } mats[] = {{"q_proj", 1024, 640},    {"k_proj", 256, 640},     {"o_proj", 640, 1024},
              {"gate_proj", 2048, 640}, {"down_proj", 640, 2048}, {"lm_head", 262144, 640}};
  float *in = rand_weights(KN_DTYPE_F32, (size_t)512 * 2048);
  float *out = malloc(sizeof(float) * (size_t)262144 * 64); /* up to 64 vocabulary rows */
  if (!out) return 1;
  if (bf16 == 2) {
    if (argc > 4 && !strcmp(argv[4], "formats")) {
      bench_formats(be, in, out);
    } else if (argc > 4 && !strcmp(argv[4], "kernels")) {
      bench_kernels(be, in, out);
    } else if (argc > 4 && !strcmp(argv[4], "stream")) {
      bench_stream(be, KN_DTYPE_Q4_0, threads, in, out);
      bench_stream(be, KN_DTYPE_Q8_0, threads, in, out);
    } else
      bench_q8(be, in, out, argc > 4 && !strcmp(argv[4], "head"));
    return 0;
  }
  for (int d = 0; d < 3; d++) {
    enum kn_dtype dt = d == 0 ? KN_DTYPE_BF16 : d == 1 ? KN_DTYPE_F16 : KN_DTYPE_F32;
    for (size_t m = 0; m < sizeof(mats) / sizeof(mats[0]); m++) {
      if (dt == KN_DTYPE_F32 && mats[m].N > 100000) continue;
      void *w = rand_weights(dt, (size_t)mats[m].N * mats[m].K);
      double bytes = (double)mats[m].N * mats[m].K * kn_dtype_size(dt);
      double s = time_matmul(be, dt, w, 1, mats[m].N, mats[m].K, in, out);
      printf(
          "matvec %-4s %-9s [%6d x %4d] T=1: %8.1f us  %6.1f GB/s  (%3.0f%% of read bandwidth)\n",
          kn_dtype_name(dt), mats[m].name, mats[m].N, mats[m].K, s * 1e6, bytes / s / 1e9,
          100.0 * bytes / s / 1e9 / bw);
      free(w);
    }
  }
  bench_stream(be, KN_DTYPE_BF16, threads, in, out);
  /* small decode batches over a matrix larger than the last-level cache */
  {
    int N = 65536, K = 640;
    void *w = rand_weights(KN_DTYPE_BF16, (size_t)N * K);
    static const int Ts[] = {1, 2, 3, 4, 6, 7, 8, 10, 12, 16, 24, 32, 48};
    for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); i++) {
      double s = time_matmul(be, KN_DTYPE_BF16, w, Ts[i], N, K, in, out);
      printf("matmul bf16 [%d x %d] T=%2d: %8.1f us  %5.1f GB/s of weights, %.1f GFLOP/s per "
             "CPU-second\n",
             N, K, Ts[i], s * 1e6, (double)N * K * 2 / s / 1e9,
             2.0 * Ts[i] * N * K / last_cpu_per_call / 1e9);
    }
    free(w);
  }
  /* the tiny default model's head: a decode batch of T rows against the tied
   * [262144 x 64] bf16 embedding, then the final softcap and argmax */
  {
    int N = 262144, K = 64;
    void *w = rand_weights(KN_DTYPE_BF16, (size_t)N * K);
    static const int Ts[] = {1, 2, 4, 8, 16, 32};
    int32_t ids[32];
    for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); i++) {
      int T = Ts[i];
      double s = time_matmul(be, KN_DTYPE_BF16, w, T, N, K, in, out);
      double c0 = cm_time_s();
      int reps = 0;
      do {
        kn_matmul_softcap(be, out, N, in, K, w, KN_DTYPE_BF16, T, N, K, 30.0f);
        kn_argmax(be, ids, NULL, out, N, T, N);
        reps++;
      } while (cm_time_s() - c0 < secs_per_case);
      double sa = (cm_time_s() - c0) / reps;
      c0 = cm_time_s();
      reps = 0;
      do { /* the greedy head: kn_matmul_argmax, no logits written */
        kn_matmul_argmax(be, ids, NULL, in, K, w, KN_DTYPE_BF16, T, N, K, 30.0f, out);
        reps++;
      } while (cm_time_s() - c0 < secs_per_case);
      double sg = (cm_time_s() - c0) / reps;
      printf("tiny head bf16 [%d x %d] T=%2d: matmul %7.1f us (%5.1f GMAC/s); with softcap and "
             "argmax %7.1f us, %6.1f us per row; kn_matmul_argmax %7.1f us, %6.1f us per row\n",
             N, K, T, s * 1e6, (double)T * N * K / s / 1e9, sa * 1e6, sa * 1e6 / T, sg * 1e6,
             sg * 1e6 / T);
      /* the greedy head of constrained rows (kn_matmul_argmax_masked), every row
       * masked: as inside a JSON string (all but 1 token in 32 allowed) and at
       * a JSON object's structure (1 in 512, spread over the vocabulary) */
      double plain = 1e30;
      c0 = cm_time_s();
      do {
        double c1 = cm_time_s();
        kn_matmul_argmax(be, ids, NULL, in, K, w, KN_DTYPE_BF16, T, N, K, 30.0f, out);
        c1 = cm_time_s() - c1;
        plain = c1 < plain ? c1 : plain;
      } while (cm_time_s() - c0 < secs_per_case);
      for (int dense = 1; dense >= 0; dense--) {
        size_t words = (size_t)N / 32;
        uint32_t *bits = malloc(words * sizeof(uint32_t) * (size_t)T);
        const uint32_t *allow[32];
        uint32_t r = 777;
        for (size_t b = 0; b < words * (size_t)T; b++) {
          r = r * 1664525u + 1013904223u;
          bits[b] = dense ? ~(1u << (r >> 27)) : (b % 16 == 0 ? 1u << (r >> 27) : 0);
        }
        for (int t = 0; t < T; t++)
          allow[t] = bits + (size_t)t * words;
        double best = 1e30;
        c0 = cm_time_s();
        do { /* the fastest call: the machine may be shared */
          double c1 = cm_time_s();
          kn_matmul_argmax_masked(be, ids, NULL, in, K, w, KN_DTYPE_BF16, T, N, K, 30.0f, allow);
          c1 = cm_time_s() - c1;
          best = c1 < best ? c1 : best;
        } while (cm_time_s() - c0 < secs_per_case);
        printf("tiny head bf16 [%d x %d] T=%2d: kn_matmul_argmax_masked, %s masks: %7.1f us, "
               "%.2fx kn_matmul_argmax (fastest calls)\n",
               N, K, T, dense ? "dense" : "sparse", best * 1e6, best / plain);
        free(bits);
      }
    }
    free(w);
  }
  /* prefill-sized matmuls */
  for (int T = 8; T <= 512; T *= 8) {
    void *w = rand_weights(KN_DTYPE_BF16, (size_t)2048 * 640);
    double s = time_matmul(be, KN_DTYPE_BF16, w, T, 2048, 640, in, out);
    printf("matmul bf16 [2048 x 640] T=%d: %.1f us, %.1f GFLOP/s (%.1f per CPU-second)\n", T,
           s * 1e6, 2.0 * T * 2048 * 640 / s / 1e9, 2.0 * T * 2048 * 640 / last_cpu_per_call / 1e9);
    free(w);
  }
  /* attention, 4 query heads on 1 kv head of 256 dims (270m-shaped), f32 KV:
   * a 512-token prefill chunk, and one decode at 4096 tokens of context */
  {
    int D = 256, H = 4, bt = 16, len = 4096;
    struct kn_kv_view view = {.page_bytes = (size_t)bt * D * 4 * 2,
                              .n_pages = len / bt,
                              .k_off = 0,
                              .v_off = (size_t)bt * D * 4,
                              .block_tokens = bt,
                              .n_kv_heads = 1,
                              .head_dim = D,
                              .dtype = KN_DTYPE_F32};
    view.pool = rand_weights(KN_DTYPE_F32, view.page_bytes / 4 * (size_t)view.n_pages);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)view.n_pages);
    float *q = rand_weights(KN_DTYPE_F32, (size_t)512 * H * D);
    if (!table) return 1;
    for (int i = 0; i < view.n_pages; i++)
      table[i] = i;
    struct kn_attn_seq pre = {
        .q_begin = 0, .n_q = 512, .pos0 = 0, .block_table = table, .n_blocks = view.n_pages};
    struct kn_attn_seq dec = {
        .q_begin = 0, .n_q = 1, .pos0 = len - 1, .block_table = table, .n_blocks = view.n_pages};
    for (int c = 0; c < 2; c++) {
      const struct kn_attn_seq *sq = c ? &dec : &pre;
      int reps = 0;
      double t0 = cm_time_s(), t, c0 = cpu_s();
      do {
        kn_attention(be, out, H * D, q, H * D, &view, sq, 1, H, 0, 0.0625f, 0.0f);
        reps++;
        t = cm_time_s() - t0;
      } while (t < secs_per_case);
      double flops = c ? 4.0 * H * D * len : 4.0 * H * D * 512.0 * 513.0 / 2.0;
      printf("attention %s: %.1f us, %.1f GFLOP/s (%.1f per CPU-second)\n",
             c ? "decode at 4096 keys" : "prefill 512 tokens", t / reps * 1e6,
             flops * reps / t / 1e9, flops * reps / (cpu_s() - c0) / 1e9);
    }
    free(view.pool);
    free(table);
    free(q);
  }
  /* attention of a vision tower's pass (SigLIP-So400m-shaped: 16 heads of 72
   * dims, each its own kv head, bf16 pages), 1024 patches attending to each
   * other both ways: the rows go as tiles (kn_cpu_attn_tile_fn) */
  {
    int D = 72, H = 16, bt = 16, len = 1024;
    struct kn_kv_view view = {.page_bytes = (size_t)bt * H * D * 2 * 2,
                              .n_pages = len / bt,
                              .k_off = 0,
                              .v_off = (size_t)bt * H * D * 2,
                              .block_tokens = bt,
                              .n_kv_heads = H,
                              .head_dim = D,
                              .dtype = KN_DTYPE_BF16};
    view.pool = rand_weights(KN_DTYPE_BF16, view.page_bytes / 2 * (size_t)view.n_pages);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)view.n_pages);
    float *q = rand_weights(KN_DTYPE_F32, (size_t)len * H * D);
    float *o = malloc(sizeof(float) * (size_t)len * H * D);
    if (!table || !o) return 1;
    for (int i = 0; i < view.n_pages; i++)
      table[i] = i;
    int32_t range[2] = {0, len};
    struct kn_attn_seq img = {.q_begin = 0,
                              .n_q = len,
                              .pos0 = 0,
                              .block_table = table,
                              .n_blocks = view.n_pages,
                              .bidir = range,
                              .n_bidir = 1};
    int reps = 0;
    double t0 = cm_time_s(), t, c0 = cpu_s();
    do {
      kn_attention(be, o, H * D, q, H * D, &view, &img, 1, H, 0, 0.1178511f, 0.0f);
      reps++;
      t = cm_time_s() - t0;
    } while (t < secs_per_case);
    double flops = 4.0 * H * D * (double)len * len;
    printf("attention image 1024 patches, 16 x 72 bf16: %.1f us, %.1f GFLOP/s (%.1f per "
           "CPU-second)\n",
           t / reps * 1e6, flops * reps / t / 1e9, flops * reps / (cpu_s() - c0) / 1e9);
    free(view.pool);
    free(table);
    free(q);
    free(o);
  }
  free(in);
  free(out);
  kn_backend_destroy(be);
  return 0;
}
