/* test-wk-load-errors.c — the model loader's errors for missing, mis-shaped
 * and wrongly typed tensors, a folder without a checkpoint and one without
 * config.json: each names what is wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-safetensors.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model.h"

/* Writes a tiny gemma4 with one tensor changed by `mutate`, loads it, and
 * returns the load's error code (err holds the message). */
static int load_mutated(void (*mutate)(struct tl_tiny_spec *), char *err, size_t errlen) {
  char dir[256];
  if (wkt_tmpdir(dir, sizeof(dir))) return -999;
  struct tl_tiny_spec s;
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512};
  char e2[256];
  if (tl_tiny_spec_build(&s, &o, e2, sizeof(e2))) return -998;
  mutate(&s);
  tl_tiny_write(&s, dir, 1, MD_ST_BF16);
  tl_tiny_spec_free(&s);
  struct kn_backend *be = NULL;
  kn_cpu_backend_create(1, &be);
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.quiet = 1, .kv_tokens = 64};
  int rc = wk_model_load(dir, be, &mo, &m, err, errlen);
  wk_model_free(m);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
  return rc;
}

static struct tl_tensor_spec *find_spec(struct tl_tiny_spec *s, const char *name) {
  for (int i = 0; i < s->n_tensors; i++)
    if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
  return NULL;
}

static void rename_up(struct tl_tiny_spec *s) {
  snprintf(find_spec(s, "model.layers.3.mlp.up_proj.weight")->name, 160, "model.layers.3.mlp.upp");
}
static void reshape_q(struct tl_tiny_spec *s) {
  find_spec(s, "model.layers.2.self_attn.q_proj.weight")->e.shape[0] = 96;
}
static void int_norm(struct tl_tiny_spec *s) {
  find_spec(s, "model.norm.weight")->init = TL_INIT_PERMUTATION;
  find_spec(s, "model.norm.weight")->e.dtype = MD_ST_I64;
}
static void nothing(struct tl_tiny_spec *s) {
  (void)s;
}

TH_TEST(model_load_errors_name_the_tensor) {
  char err[512] = "";
  TH_CHECK_EQ_INT(load_mutated(nothing, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(load_mutated(rename_up, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "model.layers.3.mlp.up_proj.weight") && strstr(err, "missing"));
  TH_CHECK_EQ_INT(load_mutated(reshape_q, err, sizeof(err)), CM_ERR_SHAPE);
  TH_CHECK(strstr(err, "model.layers.2.self_attn.q_proj.weight") && strstr(err, "[96, 64]") &&
           strstr(err, "model.safetensors"));
  TH_CHECK_EQ_INT(load_mutated(int_norm, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(err, "model.norm.weight") && strstr(err, "I64"));
  /* a directory without a checkpoint, and one without config.json */
  struct kn_backend *be = NULL;
  kn_cpu_backend_create(1, &be);
  struct wk_model *m = NULL;
  TH_CHECK_EQ_INT(wk_model_load("/nonexistent-lmserve-dir", be, NULL, &m, err, sizeof(err)),
                  CM_ERR_NOENT);
  TH_CHECK(strstr(err, "config.json") != NULL);
  char dir[256];
  TH_REQUIRE(wkt_tmpdir(dir, sizeof(dir)) == 0);
  char path[300];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"model_type\":\"gemma3_text\",\"vocab_size\":10,\"hidden_size\":8,"
             "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":1}");
  fclose(f);
  TH_CHECK_EQ_INT(wk_model_load(dir, be, NULL, &m, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "model.safetensors") != NULL);
  wkt_rmdir(dir);
  kn_backend_destroy(be);
}
