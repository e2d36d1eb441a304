/* kn-registry.h — the kernel backends this build knows, found by name.
 *
 * Every backend registers one entry: a name ("cpu", "cuda"), a probe that
 * says whether it can run here, the capabilities of what it makes
 * (KN_CAP_*, kn-backend.h) and a priority for the automatic choice. Callers
 * pick a backend by name through the registry and then ask capabilities;
 * they never compare names.
 *
 * Entries are listed whether or not this build or machine can run them (a
 * build without CUDA still knows "cuda" and says why it cannot run it), so a
 * mistyped name and an unusable one get different answers.
 *
 *   struct kn_backend *be;
 *   struct kn_backend_opts o = {.n_threads = 0, .local_rank = 0};
 *   if (kn_backend_open(device, &o, &be, err, sizeof(err))) ... report err ...
 *   if (kn_backend_has(be, KN_CAP_HOST_MEMORY)) ... use host buffers in place ... */
#ifndef LMSERVE_KN_REGISTRY_H
#define LMSERVE_KN_REGISTRY_H
#include <stddef.h>

#include "kernels/kn-backend.h"

struct kn_backend_reg; /* one registered backend (body in kn-backend-impl.h) */

/* What a backend is made with; each backend reads the fields it needs. */
struct kn_backend_opts {
  int n_threads;  /* CPU: threads in total, the caller's included (<= 0: one per online core) */
  int local_rank; /* >= 0: this rank's index among the ranks on its host. A
                     device backend runs on device local_rank modulo the
                     devices visible to the process (as torchrun's LOCAL_RANK) */
  int bf16;       /* 1: matmul inputs rounded to bf16 (CPU: kn_cpu_backend_create_mode;
                     CUDA rounds them to bf16 / f16 weights' type in any case); 2: the
                     CPU's q8 mode (kn_backend_dtype_parse) */
};

/* Registered entries, in table order; kn_backend_reg_at is NULL outside [0, count). */
int kn_backend_reg_count(void);
const struct kn_backend_reg *kn_backend_reg_at(int i);
/* The entry named name (exact match), or NULL. */
const struct kn_backend_reg *kn_backend_reg_find(const char *name);

const char *kn_backend_reg_name(const struct kn_backend_reg *r);
const char *kn_backend_reg_summary(const struct kn_backend_reg *r);
/* The KN_CAP_* bits every backend made from r has (KN_CAP_BLOCK_WEIGHTS: unless
 * its check at creation failed, kn-backend.h). */
unsigned kn_backend_reg_caps(const struct kn_backend_reg *r);
/* 0 when r can make a backend here, else a negative cm_err and why. */
int kn_backend_reg_probe(const struct kn_backend_reg *r, char *why, size_t whylen);

/* The entry to use for a device name:
 *   - NULL: $LMSERVE_DEVICE when set and not empty, else the automatic choice;
 *   - "" or "auto": the usable entry of highest priority (CUDA when this build
 *     has it and a device is visible, else the CPU);
 *   - anything else: the entry of that name, which must be usable here.
 * Returns 0 and *out, or CM_ERR_NOENT (no such name) / CM_ERR_UNSUPPORTED
 * (known but unusable here, or nothing usable) with a message in err[errlen]
 * that lists the registered names and says why. */
int kn_backend_choose(const char *name, const struct kn_backend_reg **out, char *err,
                      size_t errlen);

/* Makes a backend from entry r with o (NULL: the defaults, all zero). 0 and
 * *out (destroy with kn_backend_destroy), or a negative cm_err with err. */
int kn_backend_reg_create(const struct kn_backend_reg *r, const struct kn_backend_opts *o,
                          struct kn_backend **out, char *err, size_t errlen);

/* --dtype: "auto", "float32" (or "float", "f32"): the matmuls' inputs stay
 * f32 (CPU) (*bf16 = 0); "bfloat16" (or "bf16"): rounded to bf16 (1); "q8":
 * the inputs of matmuls over block-format weights (GGUF) rounded to Q8_0
 * blocks, integer dot products as llama.cpp's (2; CPU). 0, or CM_ERR_INVAL
 * for anything else, with a message in err[errlen]. */
int kn_backend_dtype_parse(const char *s, int *bf16, char *err, size_t errlen);
#define KN_DTYPE_HELP                                                                              \
  "matmul input precision: auto or float32 (CPU: f32 inputs against the weights, exact to an "     \
  "f32 reference), bfloat16 (rounded to bf16 as GPUs run; CPU: AVX-512-BF16 where present), q8 "   \
  "(CPU: inputs of block-format weights rounded to 8-bit blocks, integer dot products, as "        \
  "llama.cpp)"

/* kn_backend_choose then kn_backend_reg_create. */
int kn_backend_open(const char *name, const struct kn_backend_opts *o, struct kn_backend **out,
                    char *err, size_t errlen);

#endif
