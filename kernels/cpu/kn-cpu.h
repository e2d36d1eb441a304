/* kn-cpu.h — the CPU kernel backend: a reference C version of every op, SIMD
 * versions (AVX2 + FMA + F16C, and AVX-512 for the matmuls, softcap and
 * argmax) chosen at run time, multithreaded over output rows with a small
 * persistent thread pool. The AVX2 and AVX-512 tables give the same bits.
 * The bf16 mode (kn_cpu_backend_create_mode) rounds matmul inputs to bf16
 * and adds AVX-512-BF16 dot products, or AMX-BF16 tiles, where the processor
 * has them.
 *
 * LMSERVE_KERNELS=ref (or avx2, avx2vnni, avx512, avx512bf16, amx) in the
 * environment caps the kernel set when a backend is created; ref forces the
 * reference versions. Memory
 * hooks are the identity: any host memory is backend memory. */
#ifndef LMSERVE_KN_CPU_H
#define LMSERVE_KN_CPU_H
#include "kernels/kn-backend.h"

/* What the CPU backend can do (kn-backend.h): its memory is the host's and
 * kn_sample runs in place; the registry's automatic choice takes it last. */
#define KN_CPU_CAPS                                                                                \
  (KN_CAP_HOST_MEMORY | KN_CAP_SAMPLE | KN_CAP_ALLREDUCE | KN_CAP_BLOCK_WEIGHTS |                  \
   KN_CAP_BLOCK_LOWBIT)
#define KN_CPU_PRIORITY 10

enum kn_cpu_isa {
  KN_CPU_ISA_REF = 0,        /* plain C */
  KN_CPU_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
  KN_CPU_ISA_AVX2VNNI = 2,   /* + AVX-VNNI: the q8 mode's dot products in 256-bit vpdpbusd
                                (processors with AVX-VNNI and no AVX-512: Alder Lake on,
                                Xeon 6 with E-cores); the AVX2 table where it is absent */
  KN_CPU_ISA_AVX512 = 3,     /* AVX-512 F/DQ/BW/VL over the AVX2 table */
  KN_CPU_ISA_AVX512BF16 = 4, /* + AVX-512-BF16 dot products (the bf16 mode's matmuls) */
  KN_CPU_ISA_AMX = 5,        /* + AMX-BF16 tiles (the bf16 mode's matmuls and attention) */
  KN_CPU_ISA_BEST = KN_CPU_ISA_AMX,
};

/* Creates a CPU backend with n_threads threads in total (the calling thread
 * counts as one; n_threads <= 0 means one per online core). On success *out
 * owns the backend (kn_backend_destroy). Returns 0, CM_ERR_NOMEM or CM_ERR_INVAL. */
int kn_cpu_backend_create(int n_threads, struct kn_backend **out);

/* Like kn_cpu_backend_create but with an explicit instruction set, capped at
 * what this processor supports (tests use it to compare SIMD and reference). */
int kn_cpu_backend_create_isa(int n_threads, enum kn_cpu_isa isa, struct kn_backend **out);

/* bf16 == 2: the q8 mode instead (--dtype q8): matmuls over block-format
 * weights (every block format) take their inputs rounded to Q8_0 blocks and sum integer products,
 * as llama.cpp's quantized dot products do (kn_cpu_dsp.q8dot); everything
 * else as in the default mode.
 *
 * Like kn_cpu_backend_create_isa, in the bf16 mode when bf16 is 1: every
 * matmul rounds its inputs to bf16 first (to nearest even), products of
 * bf16 by the weights summed in f32, as GPUs and transformers' bf16 mode
 * run: for bf16 weights, AMX-BF16 tiles where the processor has them, else
 * AVX-512-BF16 dot products where it has those; the f32 kernels on the
 * rounded inputs elsewhere. Batch invariant like the default mode, but not
 * its bits: the default keeps the inputs f32. The AVX-512-BF16 and AMX
 * levels are taken only in this mode. */
int kn_cpu_backend_create_mode(int n_threads, enum kn_cpu_isa isa, int bf16,
                               struct kn_backend **out);

/* The bf16 mode on the AMX table with each tile instruction emulated in C,
 * over the best table short of AMX that this processor and LMSERVE_KERNELS
 * allow: the matmul on any, the attention from AVX-512-BF16 (tests: the
 * tiles' layouts, edges and invariance checked without the tiles). Named
 * "cpu-amx-emulated". */
int kn_cpu_backend_create_amx_emulated(int n_threads, struct kn_backend **out);

/* The q8 mode (kn_cpu_backend_create_mode's bf16 2) on the best table this
 * processor and LMSERVE_KERNELS allow, its X16 Q8_0, Q4_0 and Q5_0 matmuls of 16
 * tokens and more on the AMX-INT8 tiles with each tile instruction emulated
 * in C (tests: the tiles' layouts and edges checked without them). Named
 * "cpu-amx-emulated". */
int kn_cpu_backend_create_q8_amx_emulated(int n_threads, struct kn_backend **out);

/* The best instruction set this processor and build support, under the cap
 * LMSERVE_KERNELS sets: everything that picks a version by processor (the
 * backends, the argmax, the all-reduce's sum, the tests' skips) asks this, so
 * that LMSERVE_KERNELS=avx2 runs on any processor as an AVX2-only one would. */
enum kn_cpu_isa kn_cpu_isa_detect(void);
const char *kn_cpu_isa_name(enum kn_cpu_isa isa);

/* One core's AMX tdpbf16ps per second (16 x 16 x 32 bf16 products each), over
 * n rounds of four independent ones; negative where the tiles are not usable. */
double kn_cpu_amx_dp_rate(long n);

/* Memory read bandwidth in GB/s (1e9 bytes/s): a streaming read of a buffer
 * much larger than the caches (bytes; 0 picks 256 MiB) on n_threads threads
 * (<= 0: one per online core), best of a few passes. Negative on failure. */
double kn_cpu_measure_bandwidth(size_t bytes, int n_threads);

/* The same streaming read as a probe to run between other work (a benchmark
 * interleaves its passes with decode steps, so that both see the same
 * machine): a touched buffer of `bytes` (0: 256 MiB; rounded down to 512) read
 * by n_threads threads of the probe's own pool. create returns 0,
 * CM_ERR_INVAL or CM_ERR_NOMEM; pass reads the buffer once and returns the
 * seconds it took. */
struct kn_cpu_bw_probe;
int kn_cpu_bw_probe_create(size_t bytes, int n_threads, struct kn_cpu_bw_probe **out);
size_t kn_cpu_bw_probe_bytes(const struct kn_cpu_bw_probe *p);
double kn_cpu_bw_probe_pass(struct kn_cpu_bw_probe *p);
void kn_cpu_bw_probe_destroy(struct kn_cpu_bw_probe *p);

#endif
