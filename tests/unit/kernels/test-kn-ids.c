/* test-kn-ids.c — ids that stay on the backend (kn-backend.h): every sampling call
 * keeps its ids (kn_kept_ids), kn_ids_take mixes host ids with kept ones, and
 * kn_embed_dev looks them up, zero rows for ids outside the table — on every CPU
 * kernel table (and each mode's), against plain loops over the table, and with
 * bad maps refused before anything is written. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/kernels/kn-test-util.h"

#define V 300 /* vocabulary: more than one chunk of kn_embed_dev's host path is 256 ids */
#define H 40
#define T 280

static uint32_t rng = 99;
static float uniform(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

/* What each sampling call keeps: its rows' ids, and nothing after a failed call or
 * one of more than KN_KEPT_IDS_MAX rows. */
static void kept_ids_follow_each_call(struct kn_backend *be) {
  float *logits = malloc(sizeof(float) * 4 * V);
  int32_t ids[4];
  TH_REQUIRE(logits);
  for (int i = 0; i < 4 * V; i++)
    logits[i] = uniform();
  const int32_t *kept = NULL;
  TH_CHECK_EQ_INT(kn_kept_ids(be, &kept), 0); /* none made yet */
  TH_CHECK(kept != NULL);
  TH_CHECK_EQ_INT(kn_argmax(be, ids, NULL, logits, V, 3, V), 0);
  const int32_t *again = NULL;
  TH_CHECK_EQ_INT(kn_kept_ids(be, &again), 3);
  TH_CHECK(again == kept); /* the buffer never moves */
  for (int t = 0; t < 3; t++)
    TH_CHECK_EQ_INT(kept[t], ids[t]);
  struct kn_sample_params p[4];
  struct kn_sample_out out[4];
  for (int t = 0; t < 4; t++) {
    kn_sample_params_default(&p[t]);
    p[t].seed = 7;
    p[t].counter = (uint64_t)t;
  }
  TH_CHECK_EQ_INT(kn_sample(be, out, logits, V, 4, V, p), 0);
  TH_CHECK_EQ_INT(kn_kept_ids(be, &kept), 4);
  for (int t = 0; t < 4; t++)
    TH_CHECK_EQ_INT(kept[t], out[t].token);
  p[1].top_p = 2.0f; /* refused: nothing kept */
  TH_CHECK(kn_sample(be, out, logits, V, 4, V, p) != 0);
  TH_CHECK_EQ_INT(kn_kept_ids(be, &kept), 0);
  free(logits);
}

/* kn_ids_take then kn_embed_dev against the table's rows looked up by hand. */
static void take_and_embed(struct kn_backend *be, enum kn_dtype tdt) {
  size_t esz = kn_dtype_size(tdt);
  float *table32 = malloc(sizeof(float) * V * H);
  void *table = malloc(esz * V * H);
  float *out = malloc(sizeof(float) * T * (H + 3)), *want = malloc(sizeof(float) * T * (H + 3));
  int32_t *ids = malloc(sizeof(int32_t) * T), *map = malloc(sizeof(int32_t) * T);
  int32_t *dst = kn_alloc(be, sizeof(int32_t) * T);
  TH_REQUIRE(table32 && table && out && want && ids && map && dst);
  for (int i = 0; i < V * H; i++)
    table32[i] = uniform();
  for (size_t i = 0; i < (size_t)V * H; i++) { /* the rows as the table holds them */
    kn_store_f32(table, tdt, i, table32[i]);
    table32[i] = kn_load_f32(table, tdt, i);
  }
  /* three rows kept by an argmax: ids 5, V - 1, 17 */
  float logits[3 * V];
  memset(logits, 0, sizeof(logits));
  logits[5] = logits[V + V - 1] = logits[2 * V + 17] = 1.0f;
  int32_t got[3];
  TH_REQUIRE(kn_argmax(be, got, NULL, logits, V, 3, V) == 0);
  const int32_t *kept = NULL;
  TH_REQUIRE(kn_kept_ids(be, &kept) == 3);
  int32_t want_id[T];
  for (int t = 0; t < T; t++) {
    ids[t] = t % 11 == 3 ? V + t : t % 13 == 4 ? -1 : (int32_t)((t * 37) % V); /* some bad */
    map[t] = t % 5 == 0 ? (t / 5) % 3 : -1;
    want_id[t] = map[t] >= 0 ? got[map[t]] : ids[t];
  }
  TH_CHECK_EQ_INT(kn_ids_take(be, dst, ids, kept, 3, map, T), 0);
  int32_t dst_host[T];
  TH_REQUIRE(kn_download(be, dst_host, dst, sizeof(dst_host)) == 0);
  TH_CHECK(memcmp(dst_host, want_id, sizeof(want_id)) == 0);
  const float scale = 1.5f;
  for (int i = 0; i < T * (H + 3); i++)
    out[i] = want[i] = NAN; /* the stride's gap stays as it was */
  for (int t = 0; t < T; t++)
    for (int j = 0; j < H; j++) {
      int32_t id = want_id[t];
      want[(size_t)t * (H + 3) + j] = id >= 0 && id < V ? table32[(size_t)id * H + j] * scale : 0;
    }
  TH_CHECK_EQ_INT(kn_embed_dev(be, out, H + 3, table, tdt, V, H, dst, T, scale), 0);
  TH_CHECK(memcmp(out, want, sizeof(float) * T * (H + 3)) == 0);
  /* a map past the kept rows, or into no buffer: refused, nothing written */
  int32_t before[T];
  memcpy(before, dst_host, sizeof(before));
  map[7] = 3;
  TH_CHECK_EQ_INT(kn_ids_take(be, dst, ids, kept, 3, map, T), CM_ERR_RANGE);
  map[7] = 0;
  TH_CHECK_EQ_INT(kn_ids_take(be, dst, ids, NULL, 3, map, T), CM_ERR_RANGE);
  TH_REQUIRE(kn_download(be, dst_host, dst, sizeof(dst_host)) == 0);
  TH_CHECK(memcmp(dst_host, before, sizeof(before)) == 0);
  TH_CHECK_EQ_INT(kn_ids_take(be, dst, ids, kept, 3, map, 0), 0);
  TH_CHECK_EQ_INT(kn_ids_take(be, NULL, ids, kept, 3, map, T), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_embed_dev(be, out, H - 1, table, tdt, V, H, dst, T, scale), CM_ERR_INVAL);
  kn_free(be, dst);
  free(table32);
  free(table);
  free(out);
  free(want);
  free(ids);
  free(map);
}

static void table_checks(enum kn_cpu_isa isa, int bf16) {
  struct kn_backend *be = kt_isa_backend_mode(isa, 2, bf16);
  kept_ids_follow_each_call(be);
  take_and_embed(be, KN_DTYPE_F32);
  take_and_embed(be, KN_DTYPE_BF16);
  take_and_embed(be, KN_DTYPE_F16);
  kn_backend_destroy(be);
}

TH_TEST(ids_ref) {
  table_checks(KN_CPU_ISA_REF, 0);
}
TH_TEST(ids_avx2) {
  table_checks(KN_CPU_ISA_AVX2, 0);
}
TH_TEST(ids_avx512) {
  table_checks(KN_CPU_ISA_AVX512, 0);
}
TH_TEST(ids_bf16_mode_avx512bf16) {
  table_checks(KN_CPU_ISA_AVX512BF16, 1);
}
TH_TEST(ids_bf16_mode_amx) {
  table_checks(KN_CPU_ISA_AMX, 1);
}
