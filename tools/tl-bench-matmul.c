/* tl-bench-matmul.c — `lmserve bench matmul`: the rate of one matmul kernel,
 * out[T, N] = in[T, K] · W[N, K]^T, for a weight format, a shape and a token
 * count, on the backend and kernel set a worker would take (LMSERVE_DEVICE,
 * LMSERVE_KERNELS and --dtype as for `serve`). The figures the model benchmark
 * cannot separate: a format's integer rate from cache (prefill's ceiling), and
 * its stream from memory against a plain read of the same bytes (decode's).
 *
 *   lmserve bench matmul [--weights q8_0] [--rows N] [--cols K] [--tokens 1,256]
 *                        [--dtype auto|float32|bfloat16|q8] [--threads N]
 *                        [--from cache|memory] [--seconds S]
 *
 * The weights are random rows (a Gaussian of deviation 0.02, as a checkpoint's
 * linear layers) rounded to the format by kn_quantize_row (the formats lmserve
 * reads but does not write, Q3_K, IQ4_NL, IQ4_XS and Q2_K: random blocks), then laid out by
 * kn_weights_prepare as a model's are (in huge pages on the CPU, as a worker
 * holds them). --from cache runs one matrix again and
 * again; --from memory runs copies of it in turn, 512 MiB of them at least, so
 * that every call reads its weights from memory, and after each round of copies
 * reads as many bytes with the bandwidth probe (kn_cpu_bw_probe, a buffer of
 * that size of its own): the fraction
 * printed is of the probe's rate within the same seconds. Prints the command
 * line that reproduces the run, the backend, then one line per token count:
 * the median, best, 90th percentile and mean time of a call, and at the
 * median GOP/s (2 T N K a call) and the weights' GB/s (their bytes a call). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-huge.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-quant.h"
#include "kernels/kn-registry.h"
#include "tools/tl-main.h"

#define BM_MAX_CALLS 100000

struct bm_conf {
  enum kn_dtype wdt;
  int N, K, memory;
  double seconds;
};

/* The weight format named s (f32, f16, bf16, q8_0 .. q6_k, q3_k, iq4_nl, iq4_xs, q2_k);
 * KN_DTYPE__COUNT if none. */
static enum kn_dtype bm_weight_dtype(const char *s) {
  for (int d = KN_DTYPE_F32; d < KN_DTYPE__COUNT; d++)
    if (d != KN_DTYPE_F8E4M3 && !kn_dtype_x16((enum kn_dtype)d) &&
        !strcmp(s, kn_dtype_name((enum kn_dtype)d)))
      return (enum kn_dtype)d;
  return KN_DTYPE__COUNT;
}

/* A Gaussian of deviation sd from the 64-bit state *s (Box-Muller over an xorshift). */
static float bm_gauss(uint64_t *s, float sd) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    u[i] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return (float)(sd * sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* The N x K weight of c's format in host memory (row_bytes each), random as above. */
static int bm_weight(const struct bm_conf *c, uint8_t *w, size_t row_bytes) {
  float *row = malloc((size_t)c->K * sizeof(float));
  if (!row) return CM_ERR_NOMEM;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  int rc = 0;
  for (int n = 0; n < c->N && !rc; n++) {
    for (int k = 0; k < c->K; k++)
      row[k] = bm_gauss(&s, 0.02f);
    uint8_t *dst = w + (size_t)n * row_bytes;
    if (kn_dtype_lowbit(c->wdt)) { /* read, not written: random blocks */
      kn_random_blocks(c->wdt, dst, row_bytes / kn_block_bytes(c->wdt), &s);
    } else if (kn_block_elems(c->wdt)) {
      rc = kn_quantize_row(c->wdt, row, dst, (size_t)c->K);
    } else {
      for (int k = 0; k < c->K; k++) {
        if (c->wdt == KN_DTYPE_F32) {
          memcpy(dst + 4 * (size_t)k, &row[k], 4);
        } else {
          uint16_t h = c->wdt == KN_DTYPE_BF16 ? kn_f32_to_bf16(row[k]) : kn_f32_to_f16(row[k]);
          memcpy(dst + 2 * (size_t)k, &h, 2);
        }
      }
    }
  }
  free(row);
  return rc;
}

/* Times T tokens against the n_w prepared copies w[] (laid out as *dt) and
 * prints the line. 0 or a cm_err. */
static int bm_measure(struct kn_backend *be, const struct bm_conf *c, void **w, int n_w,
                      enum kn_dtype dt, size_t w_bytes, int T, struct kn_cpu_bw_probe *probe) {
  size_t in_n = (size_t)T * (size_t)c->K, out_n = (size_t)T * (size_t)c->N;
  float *in = kn_alloc(be, in_n * sizeof(float)), *out = kn_alloc(be, out_n * sizeof(float));
  double *ms = malloc(BM_MAX_CALLS * sizeof(double));
  int rc = in && out && ms ? 0 : CM_ERR_NOMEM;
  if (!rc) {
    float *h = malloc(in_n * sizeof(float));
    if (!h) {
      rc = CM_ERR_NOMEM;
    } else {
      uint64_t s = 0xD1B54A32D192ED03ull + (uint64_t)T;
      for (size_t i = 0; i < in_n; i++)
        h[i] = bm_gauss(&s, 1.0f);
      rc = kn_upload(be, in, h, in_n * sizeof(float));
      free(h);
    }
  }
  /* warm-up: one round of the copies (from cache: a few calls) */
  for (int i = 0; !rc && i < (n_w > 1 ? n_w : 3); i++)
    rc = kn_matmul(be, out, c->N, in, c->K, w[i % n_w], dt, T, c->N, c->K, 0);
  if (!rc) rc = kn_sync(be);
  int calls = 0;
  double t_calls = 0, t_read = 0, read_bytes = 0, t_end = cm_time_s() + c->seconds;
  while (!rc && calls < BM_MAX_CALLS && (calls < 3 || cm_time_s() < t_end)) {
    double t0 = cm_time_s();
    rc = kn_matmul(be, out, c->N, in, c->K, w[calls % n_w], dt, T, c->N, c->K, 0);
    if (!rc) rc = kn_sync(be);
    ms[calls] = (cm_time_s() - t0) * 1e3;
    t_calls += ms[calls++];
    if (probe && calls % n_w == 0) { /* a round of copies, then as many bytes read plainly */
      t_read += kn_cpu_bw_probe_pass(probe);
      read_bytes += (double)kn_cpu_bw_probe_bytes(probe);
    }
  }
  if (!rc && probe && t_read == 0) { /* fewer calls than copies: one read for the rate */
    t_read = kn_cpu_bw_probe_pass(probe);
    read_bytes = (double)kn_cpu_bw_probe_bytes(probe);
  }
  if (!rc) {
    double mean = t_calls / calls;
    qsort(ms, (size_t)calls, sizeof(*ms), tl_cmp_double);
    double med = ms[calls / 2], ops = 2.0 * T * c->N * (double)c->K;
    printf("T %4d  %8.4f ms a call (best %.4f, p90 %.4f, mean %.4f; %d calls)  %8.1f GOP/s  %7.2f "
           "GB/s of weights",
           T, med, ms[0], ms[calls * 9 / 10], mean, calls, ops / (med * 1e6),
           (double)w_bytes / (med * 1e6));
    if (probe && t_read > 0) {
      double bw = read_bytes / t_read / 1e9, got = (double)w_bytes / (mean * 1e6);
      printf("  (mean %.2f GB/s; the probe %.2f GB/s: %.1f%%)", got, bw, 100.0 * got / bw);
    }
    printf("\n");
    fflush(stdout);
  }
  kn_free(be, in);
  kn_free(be, out);
  free(ms);
  return rc;
}

int tl_bench_matmul_main(int argc, char **argv) {
  const char *weights = "q8_0", *dtype = "auto", *from = "cache";
  int64_t rows = 1536, cols = 1152, threads = 0;
  double seconds = 1.0;
  struct cm_strs tokens = {0};
  const struct cm_opt opts[] = {
      {"weights", CM_OPT_STR, &weights, "DT",
       "weight format: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q3_k, "
       "iq4_nl, iq4_xs, q2_k (the last four random blocks: lmserve reads them, does not write "
       "them; default q8_0)"},
      {"rows", CM_OPT_INT, &rows, "N", "output features, the weight's rows (default 1536)", 1,
       1 << 20},
      {"cols", CM_OPT_INT, &cols, "K", "input features, whole blocks of the format (default 1152)",
       1, 1 << 20},
      {"tokens", CM_OPT_STRS, &tokens, "T,...", "token counts, each timed (default 1,256)"},
      {"dtype", CM_OPT_STR, &dtype, "auto|float32|bfloat16|q8", KN_DTYPE_HELP},
      {"threads", CM_OPT_INT, &threads, "N", "threads (default: one per online core)", 0, 4096},
      {"from", CM_OPT_STR, &from, "cache|memory",
       "one matrix again and again, or copies in turn past the caches (default cache)"},
      {"seconds", CM_OPT_DOUBLE, &seconds, "S",
       "timed calls for about S seconds a count (default 1)", 0, 0, 0.01, 600},
      {0},
  };
  int rc = tl_args_parse("lmserve bench matmul",
                         "rate of one matmul kernel: a weight format, a shape, token counts", opts,
                         argc, argv);
  if (rc >= 0) {
    cm_strs_free(&tokens);
    return rc;
  }
  struct bm_conf c = {.wdt = bm_weight_dtype(weights),
                      .N = (int)rows,
                      .K = (int)cols,
                      .memory = !strcmp(from, "memory"),
                      .seconds = seconds};
  int T[CM_STRS_MAX], n_t = 0, bad = 0;
  for (int i = 0; i < tokens.n; i++) {
    char *end = NULL;
    long v = strtol(tokens.v[i], &end, 10);
    if (!*tokens.v[i] || *end || v < 1 || v > 65536) {
      fprintf(stderr, "lmserve bench matmul: --tokens: '%s' is not a count in [1, 65536]\n",
              tokens.v[i]);
      bad = 1;
    }
    T[n_t++] = (int)v;
  }
  cm_strs_free(&tokens);
  if (!n_t) {
    T[n_t++] = 1;
    T[n_t++] = 256;
  }
  if (c.wdt == KN_DTYPE__COUNT) {
    fprintf(stderr, "lmserve bench matmul: --weights: unknown format '%s'\n", weights);
    bad = 1;
  } else if (!kn_row_bytes(c.wdt, (size_t)c.K)) {
    fprintf(stderr, "lmserve bench matmul: --cols %d is not whole blocks of %s (%d elements)\n",
            c.K, weights, kn_block_elems(c.wdt));
    bad = 1;
  }
  if (strcmp(from, "cache") && strcmp(from, "memory")) {
    fprintf(stderr, "lmserve bench matmul: --from: '%s' is neither cache nor memory\n", from);
    bad = 1;
  }
  char err[256] = "";
  int mode = 0;
  if (kn_backend_dtype_parse(dtype, &mode, err, sizeof(err))) {
    fprintf(stderr, "lmserve bench matmul: --dtype: %s\n", err);
    bad = 1;
  }
  if (bad) return 2;

  struct kn_backend_opts o = {.n_threads = (int)threads, .bf16 = mode};
  struct kn_backend *be = NULL;
  if (kn_backend_open(NULL, &o, &be, err, sizeof(err))) {
    fprintf(stderr, "lmserve bench matmul: %s\n", err);
    return 1;
  }
  size_t row_bytes = kn_row_bytes(c.wdt, (size_t)c.K), w_bytes = row_bytes * (size_t)c.N;
  int n_w = c.memory ? (int)CM_MAX((size_t)2, ((size_t)512 << 20) / w_bytes + 1) : 1;
  void **w = calloc((size_t)n_w, sizeof(*w));
  uint8_t *host = malloc(w_bytes);
  enum kn_dtype dt = c.wdt;
  rc = w && host ? bm_weight(&c, host, row_bytes) : CM_ERR_NOMEM;
  /* host memory: the copies in huge pages, as a worker holds its weights */
  const int in_host = kn_backend_has(be, KN_CAP_HOST_MEMORY);
  const size_t stride = (w_bytes + 4095) / 4096 * 4096;
  struct cm_huge huge = {0};
  if (!rc && in_host) rc = cm_huge_map(stride * (size_t)n_w, &huge);
  /* the first copy laid out once, the others copies of its bytes */
  for (int i = 0; !rc && i < n_w; i++) {
    if (!(w[i] = in_host ? (uint8_t *)huge.base + stride * (size_t)i : kn_alloc(be, w_bytes)))
      rc = CM_ERR_NOMEM;
    else if (i)
      rc = kn_copy(be, w[i], w[0], w_bytes);
    else if (!(rc = kn_upload(be, w[0], host, w_bytes)))
      rc = kn_weights_prepare(be, w[0], &dt, c.N, c.K);
  }
  struct kn_cpu_bw_probe *probe = NULL;
  if (!rc && c.memory && kn_backend_has(be, KN_CAP_HOST_MEMORY) &&
      kn_cpu_bw_probe_create(w_bytes * (size_t)n_w, (int)threads, &probe))
    probe = NULL;

  printf("# lmserve bench matmul --weights %s --rows %d --cols %d --tokens", weights, c.N, c.K);
  for (int i = 0; i < n_t; i++)
    printf("%s%d", i ? "," : " ", T[i]);
  printf(" --dtype %s --threads %d --from %s --seconds %g\n", dtype, (int)threads, from, seconds);
  const char *caps = getenv("LMSERVE_KERNELS");
  printf("# %s (matmul inputs %s; laid out as %s), %zu bytes of weights%s%s; %s\n",
         kn_backend_name(be), kn_backend_matmul_inputs(be), kn_dtype_name(dt), w_bytes,
         caps ? ", LMSERVE_KERNELS=" : "", caps ? caps : "",
         c.memory ? "copies in turn from memory" : "one matrix, from cache");
  fflush(stdout);
  for (int i = 0; !rc && i < n_t; i++)
    rc = bm_measure(be, &c, w, n_w, dt, w_bytes, T[i], probe);
  if (rc) fprintf(stderr, "lmserve bench matmul: %s\n", cm_strerror(rc));
  kn_cpu_bw_probe_destroy(probe);
  for (int i = 0; w && !in_host && i < n_w; i++)
    kn_free(be, w[i]);
  cm_huge_unmap(&huge);
  free(w);
  free(host);
  kn_backend_destroy(be);
  return rc ? 1 : 0;
}
