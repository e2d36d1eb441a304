/* test-wk-safetensors.c — the bounded safetensors reader (round trip,
 * hostile headers, shards) and the model loader's errors for missing,
 * mis-shaped and wrongly typed tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-safetensors.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model.h"

/* Builds a safetensors image from a header string and n data bytes. */
static unsigned char *image(const char *header, size_t data, size_t *len) {
  size_t h = strlen(header);
  *len = 8 + h + data;
  unsigned char *b = calloc(1, *len);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(b + 8, header, h);
  return b;
}

TH_TEST(st_round_trip) {
  char dir[256];
  TH_REQUIRE(wkt_tmpdir(dir, sizeof(dir)) == 0);
  char path[300];
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  TH_REQUIRE(f);
  struct md_st_entry e[2] = {
      {.name = "b.weight", .dtype = MD_ST_F32, .ndim = 2, .shape = {2, 3}},
      {.name = "a.bias", .dtype = MD_ST_BF16, .ndim = 1, .shape = {5}},
  };
  TH_REQUIRE(md_st_write_header(f, e, 2) == 0);
  float fv[6] = {1, 2, 3, 4, 5, 6};
  uint16_t hv[5] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0};
  fwrite(fv, 4, 6, f);
  fwrite(hv, 2, 5, f);
  fclose(f);
  struct md_st *st = NULL;
  char err[256] = "";
  TH_REQUIRE(md_st_open_dir(dir, &st, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(md_st_count(st), 2);
  const struct md_tensor *t = md_st_find(st, "b.weight");
  TH_REQUIRE(t);
  TH_CHECK_EQ_INT(t->ndim, 2);
  TH_CHECK_EQ_INT(t->shape[1], 3);
  TH_CHECK_EQ_INT(t->dtype, MD_ST_F32);
  TH_CHECK(((const float *)t->data)[5] == 6.0f);
  t = md_st_find(st, "a.bias");
  TH_REQUIRE(t);
  TH_CHECK_EQ_INT(t->nbytes, 10);
  TH_CHECK_EQ_INT(((const uint16_t *)t->data)[4], 0x40a0);
  TH_CHECK(md_st_find(st, "missing") == NULL);
  TH_CHECK_EQ_INT(md_st_data_bytes(st), 34);
  md_st_close(st);
  wkt_rmdir(dir);
}

TH_TEST(st_hostile_headers) {
  struct {
    const char *header;
    size_t data;
    int code;
  } cases[] = {
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, CM_ERR_RANGE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, CM_ERR_SHAPE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, CM_ERR_RANGE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, CM_ERR_RANGE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],"
       "\"data_offsets\":[0,8]}}",
       8, CM_ERR_TOOBIG},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 8, CM_ERR_SHAPE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":\"x\",\"data_offsets\":[0,4]}}", 8, CM_ERR_PARSE},
      {"{\"t\":3}", 8, CM_ERR_PARSE},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 8, CM_ERR_PARSE},
      {"[]", 0, CM_ERR_PARSE},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    size_t len;
    unsigned char *b = image(cases[i].header, cases[i].data, &len);
    struct md_st *st = NULL;
    char err[256] = "";
    int rc = md_st_open_mem(b, len, "x.safetensors", &st, err, sizeof(err));
    if (rc != cases[i].code || !strstr(err, "x.safetensors"))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d (want %d) err \"%s\"", i, rc, cases[i].code,
              err);
    md_st_close(st);
    free(b);
  }
  /* header length past the end, and a short file */
  unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
  struct md_st *st = NULL;
  char err[256];
  TH_CHECK_EQ_INT(md_st_open_mem(big, sizeof(big), "x", &st, err, sizeof(err)), CM_ERR_TOOBIG);
  unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  TH_CHECK_EQ_INT(md_st_open_mem(past, sizeof(past), "x", &st, err, sizeof(err)), CM_ERR_TRUNC);
  TH_CHECK_EQ_INT(md_st_open_mem(past, 4, "x", &st, err, sizeof(err)), CM_ERR_TRUNC);
  /* an unknown dtype is kept (refused only when a model binds it) */
  size_t len;
  unsigned char *b =
      image("{\"t\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, &len);
  TH_CHECK_EQ_INT(md_st_open_mem(b, len, "x", &st, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(md_st_find(st, "t")->dtype, MD_ST_OTHER);
  md_st_close(st);
  free(b);
  /* F8_E4M3 is known: one byte per element, a size that disagrees is refused */
  b = image("{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, &len);
  TH_CHECK_EQ_INT(md_st_open_mem(b, len, "x", &st, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(md_st_find(st, "t")->dtype, MD_ST_F8E4M3);
  md_st_close(st);
  free(b);
  b = image("{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, &len);
  TH_CHECK_EQ_INT(md_st_open_mem(b, len, "x", &st, err, sizeof(err)), CM_ERR_SHAPE);
  free(b);
}

static void write_file(const char *dir, const char *name, const struct md_st_entry *e, int n,
                       const void *data, size_t bytes) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  md_st_write_header(f, e, n);
  fwrite(data, 1, bytes, f);
  fclose(f);
}

TH_TEST(st_sharded_index) {
  char dir[256];
  TH_REQUIRE(wkt_tmpdir(dir, sizeof(dir)) == 0);
  float v[4] = {1, 2, 3, 4};
  struct md_st_entry a = {.name = "x", .dtype = MD_ST_F32, .ndim = 1, .shape = {2}};
  struct md_st_entry b = {.name = "y", .dtype = MD_ST_F32, .ndim = 1, .shape = {2}};
  write_file(dir, "a.safetensors", &a, 1, v, 8);
  write_file(dir, "b.safetensors", &b, 1, v + 2, 8);
  char path[300];
  snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"metadata\":{},\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}");
  fclose(f);
  struct md_st *st = NULL;
  char err[256] = "";
  TH_REQUIRE(md_st_open_dir(dir, &st, err, sizeof(err)) == 0);
  TH_CHECK(((const float *)md_st_find(st, "y")->data)[1] == 4.0f);
  TH_CHECK_EQ_STR(md_st_find(st, "y")->file, "b.safetensors");
  md_st_close(st);
  /* an index naming a tensor its shard lacks, and a path escaping the dir */
  f = fopen(path, "w");
  fprintf(f, "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}");
  fclose(f);
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "z") != NULL);
  f = fopen(path, "w");
  fprintf(f, "{\"weight_map\":{\"x\":\"../a.safetensors\"}}");
  fclose(f);
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_INVAL);
  wkt_rmdir(dir);
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_NOENT);
}

/* Writes a tiny gemma4 with one tensor changed by `mutate`, loads it, and
 * returns the load's error code (err holds the message). */
static int load_mutated(void (*mutate)(struct wk_tiny_spec *), char *err, size_t errlen) {
  char dir[256];
  if (wkt_tmpdir(dir, sizeof(dir))) return -999;
  struct wk_tiny_spec s;
  struct wk_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512};
  char e2[256];
  if (wk_tiny_spec_build(&s, &o, e2, sizeof(e2))) return -998;
  mutate(&s);
  wk_tiny_write(&s, dir, 1, MD_ST_BF16);
  wk_tiny_spec_free(&s);
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

static struct wk_tensor_spec *find_spec(struct wk_tiny_spec *s, const char *name) {
  for (int i = 0; i < s->n_tensors; i++)
    if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
  return NULL;
}

static void rename_up(struct wk_tiny_spec *s) {
  snprintf(find_spec(s, "model.layers.3.mlp.up_proj.weight")->name, 160, "model.layers.3.mlp.upp");
}
static void reshape_q(struct wk_tiny_spec *s) {
  find_spec(s, "model.layers.2.self_attn.q_proj.weight")->e.shape[0] = 96;
}
static void int_norm(struct wk_tiny_spec *s) {
  find_spec(s, "model.norm.weight")->init = WK_INIT_PERMUTATION;
  find_spec(s, "model.norm.weight")->e.dtype = MD_ST_I64;
}
static void nothing(struct wk_tiny_spec *s) {
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
