/* kn-cpu-backend.c — the CPU backend's handle: creation, memory hooks (the
 * identity on host memory) and the ops table. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend-impl.h"

struct kn_cpu_ctx {
  int n_threads;
  enum kn_cpu_isa isa;
};

static void cpu_destroy(void *ctx) { free(ctx); }

static void *cpu_alloc(void *ctx, size_t bytes) {
  (void)ctx;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, rounded);
}

static void cpu_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

static int cpu_memcpy(void *ctx, void *dst, const void *src, size_t bytes) {
  (void)ctx;
  memmove(dst, src, bytes);
  return 0;
}

static int cpu_memset(void *ctx, void *dst, int c, size_t bytes) {
  (void)ctx;
  memset(dst, c, bytes);
  return 0;
}

static int cpu_sync(void *ctx) {
  (void)ctx;
  return 0;
}

static const struct kn_backend_ops cpu_ops = {
  .name = "cpu",
  .destroy = cpu_destroy,
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_memcpy,
  .download = cpu_memcpy,
  .copy = cpu_memcpy,
  .memset = cpu_memset,
  .sync = cpu_sync,
};

enum kn_cpu_isa kn_cpu_isa_detect(void) { return KN_CPU_ISA_REF; }

const char *kn_cpu_isa_name(enum kn_cpu_isa isa) {
  switch (isa) {
  case KN_CPU_ISA_REF: return "ref";
  case KN_CPU_ISA_AVX2: return "avx2";
  case KN_CPU_ISA_AVX512: return "avx512";
  }
  return "?";
}

int kn_cpu_backend_create_isa(int n_threads, enum kn_cpu_isa isa, struct kn_backend **out) {
  struct kn_cpu_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return CM_ERR_NOMEM;
  ctx->n_threads = n_threads > 0 ? n_threads : 1;
  ctx->isa = isa;
  *out = kn_backend_wrap(&cpu_ops, ctx);
  if (!*out) {
    free(ctx);
    return CM_ERR_NOMEM;
  }
  return 0;
}

int kn_cpu_backend_create(int n_threads, struct kn_backend **out) {
  return kn_cpu_backend_create_isa(n_threads, kn_cpu_isa_detect(), out);
}

double kn_cpu_measure_bandwidth(size_t bytes, int n_threads) { return -1.0; }
