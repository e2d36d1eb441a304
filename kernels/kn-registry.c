/* kn-registry.c — the table of kernel backends, lookup by name, the
 * automatic choice, and creation through an entry (kn-registry.h).
 *
 * The table lists "cuda" in every build; its entry is defined here, over
 * kn-cuda.h, so that one entry serves builds with and without CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend-impl.h"
#include "lmserve-config.h"

#define TAG "kn"

/* ---- the CUDA entry ---------------------------------------------------------- */

/* One entry for both kinds of build, through kn-cuda.h: where CUDA is not
 * compiled in, its probe says so. */
#if LMSERVE_HAVE_CUDA
#define CUDA_SUMMARY "NVIDIA GPU (cuBLAS and the kernels of kernels/cuda)"

static int cuda_probe(char *why, size_t whylen) {
  if (kn_cuda_device_count() < 1)
    return cm_fail(why, whylen, CM_ERR_UNSUPPORTED, "no CUDA device is visible");
  return 0;
}

static int cuda_create(const struct kn_backend_opts *o, struct kn_backend **out, char *err,
                       size_t errlen) {
  int n = kn_cuda_device_count();
  if (n < 1) return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "no CUDA device is visible");
  int device = kn_cuda_device_for_rank(o->local_rank, n);
  cm_info("cuda", "local rank %d: device %d of %d visible", o->local_rank, device, n);
  int rc = kn_cuda_backend_create(device, out);
  if (rc) return cm_fail(err, errlen, rc, "cannot create the CUDA backend: %s", cm_strerror(rc));
  return 0;
}
#else
#define CUDA_SUMMARY "NVIDIA GPU (not in this build)"

static int cuda_probe(char *why, size_t whylen) {
  return cm_fail(why, whylen, CM_ERR_UNSUPPORTED, "this build has no CUDA support");
}

static int cuda_create(const struct kn_backend_opts *o, struct kn_backend **out, char *err,
                       size_t errlen) {
  (void)o;
  *out = NULL;
  return cuda_probe(err, errlen);
}
#endif

const struct kn_backend_reg kn_cuda_backend_reg = {
    .name = "cuda",
    .summary = CUDA_SUMMARY,
    .priority = KN_CUDA_PRIORITY,
    .caps = KN_CUDA_CAPS,
    .probe = cuda_probe,
    .create = cuda_create,
};

/* ---- the table --------------------------------------------------------------- */

/* Highest priority first; kn_backend_choose_from does not rely on the order. */
static const struct kn_backend_reg *const g_table[] = {
    &kn_cuda_backend_reg,
    &kn_cpu_backend_reg,
};
#define N_TABLE ((int)CM_ARRAY_LEN(g_table))

int kn_backend_reg_count(void) {
  return N_TABLE;
}

const struct kn_backend_reg *kn_backend_reg_at(int i) {
  return i >= 0 && i < N_TABLE ? g_table[i] : NULL;
}

static const struct kn_backend_reg *find_in(const struct kn_backend_reg *const *table, int n,
                                            const char *name) {
  for (int i = 0; name && i < n; i++)
    if (!strcmp(table[i]->name, name)) return table[i];
  return NULL;
}

const struct kn_backend_reg *kn_backend_reg_find(const char *name) {
  return find_in(g_table, N_TABLE, name);
}

const char *kn_backend_reg_name(const struct kn_backend_reg *r) {
  return r ? r->name : "none";
}

const char *kn_backend_reg_summary(const struct kn_backend_reg *r) {
  return r ? r->summary : "";
}

unsigned kn_backend_reg_caps(const struct kn_backend_reg *r) {
  return r ? r->caps : 0;
}

int kn_backend_reg_probe(const struct kn_backend_reg *r, char *why, size_t whylen) {
  if (!r) return cm_fail(why, whylen, CM_ERR_INVAL, "no backend");
  if (why && whylen) why[0] = 0;
  int rc = r->probe(why, whylen);
  if (rc && why && whylen && !why[0]) cm_fail(why, whylen, rc, "%s", cm_strerror(rc));
  return rc > 0 ? CM_ERR_UNSUPPORTED : rc;
}

/* ---- choice ---------------------------------------------------------------- */

/* Writes the table's names to buf[n] as "a, b, c" (only those that can run
 * here when usable_only), truncating silently; "none" when there are none. */
static void list_names(char *buf, size_t n, const struct kn_backend_reg *const *table, int count,
                       int usable_only) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < count && len < n; i++) {
    char why[160];
    if (usable_only && kn_backend_reg_probe(table[i], why, sizeof(why))) continue;
    int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", table[i]->name);
    if (w < 0) break;
    len += (size_t)w;
  }
  if (!buf[0]) snprintf(buf, n, "none");
}

int kn_backend_choose_from(const struct kn_backend_reg *const *table, int n, const char *name,
                           const struct kn_backend_reg **out, char *err, size_t errlen) {
  char names[256], why[256];
  *out = NULL;
  if (!name || !*name || !strcmp(name, "auto")) {
    const struct kn_backend_reg *best = NULL;
    size_t len = 0;
    names[0] = 0;
    for (int i = 0; i < n; i++) {
      int rc = kn_backend_reg_probe(table[i], why, sizeof(why));
      if (!rc) {
        if (!best || table[i]->priority > best->priority) best = table[i];
      } else if (len < sizeof(names)) {
        int w = snprintf(names + len, sizeof(names) - len, "%s%s: %s", len ? "; " : "",
                         table[i]->name, why);
        if (w > 0) len += (size_t)w;
      }
    }
    if (!best)
      return cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "no kernel backend can run here (%s)",
                     names[0] ? names : "none registered");
    *out = best;
    return 0;
  }
  const struct kn_backend_reg *r = find_in(table, n, name);
  if (!r) {
    list_names(names, sizeof(names), table, n, 0);
    return cm_fail(err, errlen, CM_ERR_NOENT, "unknown device '%s' (registered: auto, %s)", name,
                   names);
  }
  int rc = kn_backend_reg_probe(r, why, sizeof(why));
  if (rc) {
    list_names(names, sizeof(names), table, n, 1);
    return cm_fail(err, errlen, rc, "device '%s' cannot run here: %s (usable here: %s)", name, why,
                   names);
  }
  *out = r;
  return 0;
}

int kn_backend_choose(const char *name, const struct kn_backend_reg **out, char *err,
                      size_t errlen) {
  if (!name) {
    const char *env = getenv("LMSERVE_DEVICE");
    if (env && *env) {
      int rc = kn_backend_choose_from(g_table, N_TABLE, env, out, err, errlen);
      if (rc && err && errlen) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", err);
        cm_fail(err, errlen, rc, "LMSERVE_DEVICE: %s", msg);
      }
      return rc;
    }
  }
  return kn_backend_choose_from(g_table, N_TABLE, name, out, err, errlen);
}

/* ---- creation -------------------------------------------------------------- */

int kn_backend_reg_create(const struct kn_backend_reg *r, const struct kn_backend_opts *o,
                          struct kn_backend **out, char *err, size_t errlen) {
  static const struct kn_backend_opts defaults = {0};
  *out = NULL;
  if (!r) return cm_fail(err, errlen, CM_ERR_INVAL, "no backend");
  if (!o) o = &defaults;
  if (o->local_rank < 0)
    return cm_fail(err, errlen, CM_ERR_INVAL, "local rank %d is negative", o->local_rank);
  int rc = r->create(o, out, err, errlen);
  if (rc) {
    *out = NULL;
    return rc > 0 ? CM_ERR_DEVICE : rc;
  }
  /* callers decide from the entry's caps before the backend exists (serve
   * sizes the KV pool by them): the two must agree, except that a backend
   * whose block kernels failed their check at creation lacks
   * KN_CAP_BLOCK_WEIGHTS (the worker asks the backend itself for that one) */
  CM_ASSERT((kn_backend_caps(*out) | KN_CAP_BLOCK_WEIGHTS) == (r->caps | KN_CAP_BLOCK_WEIGHTS));
  CM_ASSERT(!(kn_backend_caps(*out) & ~r->caps));
  cm_debug(TAG, "backend %s (entry '%s')", kn_backend_name(*out), r->name);
  return 0;
}

int kn_backend_open(const char *name, const struct kn_backend_opts *o, struct kn_backend **out,
                    char *err, size_t errlen) {
  const struct kn_backend_reg *r;
  *out = NULL;
  int rc = kn_backend_choose(name, &r, err, errlen);
  return rc ? rc : kn_backend_reg_create(r, o, out, err, errlen);
}

int kn_backend_dtype_parse(const char *s, int *bf16, char *err, size_t errlen) {
  static const char *const f32[] = {"auto", "float32", "float", "f32"};
  static const char *const b16[] = {"bfloat16", "bf16"};
  int found = -1;
  for (size_t i = 0; s && i < sizeof(f32) / sizeof(f32[0]); i++)
    if (!strcmp(s, f32[i])) found = 0;
  for (size_t i = 0; s && i < sizeof(b16) / sizeof(b16[0]); i++)
    if (!strcmp(s, b16[i])) found = 1;
  if (s && !strcmp(s, "q8")) found = 2;
  if (found < 0)
    return cm_fail(err, errlen, CM_ERR_INVAL, "--dtype %s: not one of auto, float32, bfloat16, q8",
                   s ? s : "(none)");
  *bf16 = found;
  return 0;
}
