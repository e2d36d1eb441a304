/* kn-cpu-backend.c — the CPU backend's handle: creation (instruction set
 * choice, thread pool), memory hooks (the identity on host memory), scratch
 * buffers and the registry entry "cpu". The ops are in kn-cpu-ops.c. */
#include <pthread.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "kernels/cpu/kn-cpu-sample.h"
#include "kernels/cpu/kn-cpu-shm.h"
#include "kernels/kn-backend-impl.h"

/* ---- memory hooks ------------------------------------------------------- */

static void cpu_destroy(void *p) {
  struct kn_cpu_ctx *ctx = p;
  if (!ctx) return;
  kn_shm_comm_destroy(ctx->comm);
  kn_cpu_pool_destroy(ctx->pool);
  for (int i = 0; i < KN_CPU_MAX_THREADS; i++)
    free(ctx->scratch[i]);
  free(ctx->xt);
  free(ctx->xb);
  free(ctx->xr);
  free(ctx->xq);
  free(ctx->xs);
  free(ctx->xo);
  free(ctx->xd);
  free(ctx->xp);
  free(ctx->best);
  free(ctx->seq_items);
  free(ctx->attn_st);
  for (int i = 0; i < KN_CPU_MAX_THREADS; i++)
    kn_cpu_sampler_destroy(ctx->samplers[i]);
  for (int i = 0; i < 2; i++) {
    free(ctx->rope[i].pos);
    free(ctx->rope[i].cs);
  }
  free(ctx);
}

static void *cpu_alloc(void *ctx, size_t bytes) {
  (void)ctx;
  if (bytes > SIZE_MAX - 63) return NULL;
  return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
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

int kn_cpu_ctx_scratch(struct kn_cpu_ctx *ctx, size_t n) {
  if (n <= ctx->scratch_floats) return 0;
  n = n + n / 4 + 64;
  for (int i = 0; i < ctx->n_threads; i++) {
    float *p = cpu_alloc(NULL, n * sizeof(float));
    if (!p) return CM_ERR_NOMEM;
    free(ctx->scratch[i]);
    ctx->scratch[i] = p;
  }
  ctx->scratch_floats = n;
  return 0;
}

/* ---- instruction sets --------------------------------------------------- */

int kn_cpu_has_avx2(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  /* F16C is read from CPUID leaf 1 (ECX bit 29): clang 14's
   * __builtin_cpu_supports does not know the "f16c" name. */
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

int kn_cpu_has_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  /* libgcc's check includes the OS saving the zmm state (XCR0) */
  if (!kn_cpu_has_avx2()) return 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return 0;
#endif
}

int kn_cpu_has_avx512vnni(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  return kn_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
  return 0;
#endif
}

/* CPUID leaf 7 subleaf 1's EAX (0 where the processor has no such subleaf:
 * subleaf 0's EAX says whether it exists). gcc 12's __builtin_cpu_supports
 * has no names for its bits. */
static unsigned cpuid_7_1_eax(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) ? a : 0;
#else
  return 0;
#endif
}

int kn_cpu_has_avxvnni(void) {
  /* bit 4: the VEX-encoded vpdpbusd; the OS's saving of the ymm state is the AVX2 check's */
  return kn_cpu_has_avx2() && (cpuid_7_1_eax() >> 4 & 1);
}

int kn_cpu_is_amd(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  /* the vendor string "AuthenticAMD" in EBX, EDX, ECX */
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#else
  return 0;
#endif
}

int kn_cpu_has_avx512bf16(void) {
  return kn_cpu_has_avx512() && (cpuid_7_1_eax() >> 5 & 1); /* bit 5 */
}

/* The best instruction set short of AMX (whose check asks the kernel for
 * the tile state and runs the tiles: only for a backend that would use them). */
static enum kn_cpu_isa detect_vector(void) {
  if (kn_cpu_has_avx512bf16()) return KN_CPU_ISA_AVX512BF16;
  if (kn_cpu_has_avx512()) return KN_CPU_ISA_AVX512;
  if (kn_cpu_has_avxvnni()) return KN_CPU_ISA_AVX2VNNI;
  return kn_cpu_has_avx2() ? KN_CPU_ISA_AVX2 : KN_CPU_ISA_REF;
}

const char *kn_cpu_isa_name(enum kn_cpu_isa isa) {
  switch (isa) {
  case KN_CPU_ISA_REF: return "ref";
  case KN_CPU_ISA_AVX2: return "avx2";
  case KN_CPU_ISA_AVX2VNNI: return "avx2vnni";
  case KN_CPU_ISA_AVX512: return "avx512";
  case KN_CPU_ISA_AVX512BF16: return "avx512bf16";
  case KN_CPU_ISA_AMX: return "amx";
  }
  return "?";
}

/* LMSERVE_KERNELS=ref|avx2|avx2vnni|avx512|avx512bf16|amx: the highest instruction
 * set allowed (KN_CPU_ISA_BEST when unset); an unknown name is warned about
 * once and ignored. */
static enum kn_cpu_isa env_cap(void) {
  const char *s = getenv("LMSERVE_KERNELS");
  if (!s || !*s) return KN_CPU_ISA_BEST;
  for (int i = KN_CPU_ISA_REF; i <= KN_CPU_ISA_BEST; i++)
    if (!strcasecmp(s, kn_cpu_isa_name((enum kn_cpu_isa)i))) return (enum kn_cpu_isa)i;
  static int warned;
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    cm_warn("kn",
            "LMSERVE_KERNELS=%s is not one of ref, avx2, avx2vnni, avx512, avx512bf16, amx: "
            "ignored",
            s);
  return KN_CPU_ISA_BEST;
}

static enum kn_cpu_isa isa_from_env(enum kn_cpu_isa isa) {
  const enum kn_cpu_isa cap = env_cap();
  return cap < isa ? cap : isa;
}

/* What the processor has, under the cap: a capped run believes it is the
 * smaller processor throughout (backends, the argmax and all-reduce
 * versions, and the tests' skips), so that what only a smaller processor
 * would show shows on any. The tiles are probed only when the cap allows them. */
enum kn_cpu_isa kn_cpu_isa_detect(void) {
  const enum kn_cpu_isa cap = env_cap();
  const enum kn_cpu_isa have =
      cap >= KN_CPU_ISA_AMX && kn_cpu_has_amx() ? KN_CPU_ISA_AMX : detect_vector();
  /* capped at AVX-VNNI, AVX-512 without it (Ice Lake, Zen 4) is the AVX2 table */
  if (cap == KN_CPU_ISA_AVX2VNNI && have > cap && !kn_cpu_has_avxvnni()) return KN_CPU_ISA_AVX2;
  return cap < have ? cap : have;
}

/* ---- creation ----------------------------------------------------------- */

static struct kn_backend_ops cpu_ops;
static const char *const cpu_names[] = {"cpu-ref",         "cpu-avx2",       "cpu-avx2vnni",
                                        "cpu-avx512",      "cpu-avx512bf16", "cpu-amx",
                                        "cpu-amx-emulated"};
#define EMULATED_AMX (KN_CPU_ISA_BEST + 1) /* cpu_names' index of the emulated table */
_Static_assert(sizeof(cpu_names) / sizeof(cpu_names[0]) == EMULATED_AMX + 1,
               "a name for every table and the emulated one");
#define N_ISA ((int)(sizeof(cpu_names) / sizeof(cpu_names[0])))
static struct kn_backend_ops cpu_ops_isa[N_ISA];

static const char *cpu_matmul_inputs(void *ctx) {
  const struct kn_cpu_ctx *c = ctx;
  return c->bf16 ? "bf16"
         : c->q8 && c->dsp.q8tiles[KN_DTYPE_Q4_0_X16]
             ? "q8 (block-format weights, AMX-INT8 tiles from 16 tokens; f32 elsewhere)"
         : c->q8 ? "q8 (block-format weights; f32 elsewhere)"
                 : "f32";
}

static void fill_ops_once(void) {
  cpu_ops.caps = KN_CPU_CAPS;
  cpu_ops.destroy = cpu_destroy;
  cpu_ops.matmul_inputs = cpu_matmul_inputs;
  cpu_ops.alloc = cpu_alloc;
  cpu_ops.free = cpu_free;
  cpu_ops.upload = cpu_memcpy;
  cpu_ops.download = cpu_memcpy;
  cpu_ops.copy = cpu_memcpy;
  cpu_ops.memset = cpu_memset;
  cpu_ops.sync = cpu_sync;
  kn_cpu_ops_fill(&cpu_ops);
  kn_cpu_comm_fill(&cpu_ops);
  for (int i = 0; i < N_ISA; i++) {
    cpu_ops_isa[i] = cpu_ops;
    cpu_ops_isa[i].name = cpu_names[i];
  }
}

/* emulate: the AMX table's kernels emulated over the table of isa (bf16 set). */
static int create(int n_threads, enum kn_cpu_isa isa, int bf16, int emulate,
                  struct kn_backend **out) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  *out = NULL;
  if (isa < KN_CPU_ISA_REF || isa > KN_CPU_ISA_BEST) return CM_ERR_INVAL;
  pthread_once(&once, fill_ops_once);
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  if (n_threads > KN_CPU_MAX_THREADS) n_threads = KN_CPU_MAX_THREADS;

  /* the bf16 dot products and the tiles serve only the bf16 mode; the tiles
   * are checked (kn_cpu_has_amx) only when everything else would take them */
  const enum kn_cpu_isa want = isa_from_env(isa);
  const enum kn_cpu_isa have = detect_vector();
  isa = want < have ? want : have;
  if (bf16 != 1 && isa > KN_CPU_ISA_AVX512) isa = KN_CPU_ISA_AVX512;
  /* asked for exactly the AVX-VNNI table (a cap) where AVX-512 stands without it */
  if (isa == KN_CPU_ISA_AVX2VNNI && !kn_cpu_has_avxvnni()) isa = KN_CPU_ISA_AVX2;
  if (bf16 == 1 && !emulate && want == KN_CPU_ISA_AMX && isa == KN_CPU_ISA_AVX512BF16 &&
      kn_cpu_has_amx())
    isa = KN_CPU_ISA_AMX;
  /* the q8 mode's X16 matmuls of 16 tokens and more: AMX-INT8 tiles over the
   * AVX-512 table, where the cap allows the tiles and they pass their check */
  const int q8_tiles = bf16 == 2 && !emulate && want == KN_CPU_ISA_AMX &&
                       isa == KN_CPU_ISA_AVX512 && kn_cpu_has_amx_int8();

  struct kn_cpu_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return CM_ERR_NOMEM;
  ctx->n_threads = n_threads;
  ctx->bf16 = bf16 == 1;
  ctx->q8 = bf16 == 2;
  kn_cpu_dsp_init_ref(&ctx->dsp);
  kn_cpu_dsp_init_q8_ref(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX2) kn_cpu_dsp_init_avx2(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX2) kn_cpu_dsp_init_quant_avx2(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX2) kn_cpu_dsp_init_q8_avx2(&ctx->dsp);
  if (isa == KN_CPU_ISA_AVX2VNNI) kn_cpu_dsp_init_q8_avxvnni(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX512) kn_cpu_dsp_init_avx512(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX512) kn_cpu_dsp_init_quant_avx512(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX512 && kn_cpu_has_avx512vnni()) kn_cpu_dsp_init_q8_vnni(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AVX512BF16) kn_cpu_dsp_init_avx512bf16(&ctx->dsp);
  if (isa >= KN_CPU_ISA_AMX) kn_cpu_dsp_init_amx(&ctx->dsp);
  if (q8_tiles) kn_cpu_amx_q8_init(&ctx->dsp);
  if (emulate && bf16 == 2)
    kn_cpu_amx_q8_init_emu(&ctx->dsp);
  else if (emulate)
    kn_cpu_dsp_init_amx_emulated(&ctx->dsp);
  int err = kn_cpu_pool_create(n_threads, &ctx->pool);
  if (err) goto fail;
  *out = kn_backend_wrap(&cpu_ops_isa[emulate ? EMULATED_AMX : (int)ctx->dsp.isa], ctx);
  if (!*out) {
    err = CM_ERR_NOMEM;
    goto fail;
  }
  cm_debug("kn", "cpu backend: %s kernels, %s matmul inputs, %d threads",
           kn_cpu_isa_name(ctx->dsp.isa), cpu_matmul_inputs(ctx), n_threads);
  return 0;
fail:
  cpu_destroy(ctx);
  return err;
}

int kn_cpu_backend_create_mode(int n_threads, enum kn_cpu_isa isa, int bf16,
                               struct kn_backend **out) {
  return create(n_threads, isa, bf16, 0, out);
}

int kn_cpu_backend_create_amx_emulated(int n_threads, struct kn_backend **out) {
  return create(n_threads, KN_CPU_ISA_AVX512BF16, 1, 1, out);
}

int kn_cpu_backend_create_q8_amx_emulated(int n_threads, struct kn_backend **out) {
  return create(n_threads, KN_CPU_ISA_BEST, 2, 1, out);
}

int kn_cpu_backend_create_isa(int n_threads, enum kn_cpu_isa isa, struct kn_backend **out) {
  return kn_cpu_backend_create_mode(n_threads, isa, 0, out);
}

int kn_cpu_backend_create(int n_threads, struct kn_backend **out) {
  return kn_cpu_backend_create_mode(n_threads, KN_CPU_ISA_BEST, 0, out);
}

/* ---- registry entry ------------------------------------------------------- */

static int cpu_reg_probe(char *why, size_t whylen) {
  (void)why;
  (void)whylen;
  return 0; /* the reference kernels run everywhere */
}

static int cpu_reg_create(const struct kn_backend_opts *o, struct kn_backend **out, char *err,
                          size_t errlen) {
  int rc = kn_cpu_backend_create_mode(o->n_threads, KN_CPU_ISA_BEST, o->bf16, out);
  if (rc) return cm_fail(err, errlen, rc, "cannot create the CPU backend: %s", cm_strerror(rc));
  return 0;
}

const struct kn_backend_reg kn_cpu_backend_reg = {
    .name = "cpu",
    .summary = "host processor (reference kernels, AVX2 / AVX-512 / AMX where present)",
    .priority = KN_CPU_PRIORITY,
    .caps = KN_CPU_CAPS,
    .probe = cpu_reg_probe,
    .create = cpu_reg_create,
};
