/* test-md-safetensors.c — the bounded safetensors reader: round trip,
 * hostile headers, shards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "model/md-safetensors.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/unit/model/md-test-util.h"

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
  TH_REQUIRE(th_tmpdir("md", dir, sizeof(dir)) == 0);
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
  cm_rmtree(dir);
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
  TH_REQUIRE(th_tmpdir("md", dir, sizeof(dir)) == 0);
  float v[4] = {1, 2, 3, 4};
  struct md_st_entry a = {.name = "x", .dtype = MD_ST_F32, .ndim = 1, .shape = {2}};
  struct md_st_entry b = {.name = "y", .dtype = MD_ST_F32, .ndim = 1, .shape = {2}};
  write_file(dir, "a.safetensors", &a, 1, v, 8);
  write_file(dir, "b.safetensors", &b, 1, v + 2, 8);
  mdt_write_text(
      dir, "model.safetensors.index.json",
      "{\"metadata\":{},\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}");
  struct md_st *st = NULL;
  char err[256] = "";
  TH_REQUIRE(md_st_open_dir(dir, &st, err, sizeof(err)) == 0);
  TH_CHECK(((const float *)md_st_find(st, "y")->data)[1] == 4.0f);
  TH_CHECK_EQ_STR(md_st_find(st, "y")->file, "b.safetensors");
  md_st_close(st);
  /* an index naming a tensor its shard lacks, and a path escaping the dir */
  mdt_write_text(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}");
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "z") != NULL);
  mdt_write_text(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"x\":\"../a.safetensors\"}}");
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_INVAL);
  cm_rmtree(dir);
  TH_CHECK_EQ_INT(md_st_open_dir(dir, &st, err, sizeof(err)), CM_ERR_NOENT);
}
