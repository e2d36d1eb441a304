/* api-greedy.c — greedy answers and the offline path of the multimodal API
 * tests (see api-greedy.h). */
#include "tests/integration/api/api-greedy.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn-cpu.h"
#include "tests/harness/th.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-kv.h"

json_t *api_image_parts(const char *before, const char *const urls[], int n_urls,
                        const char *after) {
  json_t *parts = json_array();
  json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", before));
  for (int i = 0; i < n_urls; i++)
    json_array_append_new(
        parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", urls[i]));
  if (after) json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", after));
  return parts;
}

char *api_greedy_body(json_t *parts, json_t *mm_kwargs, int stream) {
  json_t *b =
      json_pack("{s:[{s:s, s:o}], s:i, s:f, s:b, s:b}", "messages", "role", "user", "content",
                parts, "max_tokens", API_GEN, "temperature", 0.0, "ignore_eos", 1, "logprobs", 1);
  TH_REQUIRE(b != NULL);
  if (mm_kwargs) json_object_set_new(b, "mm_processor_kwargs", mm_kwargs);
  if (stream) json_object_set_new(b, "stream", json_true());
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  TH_REQUIRE(s != NULL);
  return s;
}

void api_parse_answer(const struct as_resp *r, struct api_answer *a) {
  memset(a, 0, sizeof(*a));
  if (r->status != 200) fprintf(stderr, "answer %d: %s\n", r->status, r->body ? r->body : "");
  TH_REQUIRE(r->status == 200);
  json_t *j = as_json(r);
  TH_REQUIRE(j != NULL);
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  const char *c = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
  snprintf(a->text, sizeof(a->text), "%s", c ? c : "");
  json_t *u = json_object_get(j, "usage");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), API_GEN);
  a->prompt_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
  json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "content");
  TH_CHECK_EQ_INT((int)json_array_size(lp), API_GEN);
  for (size_t i = 0; i < json_array_size(lp) && i < API_GEN; i++) {
    json_t *by = json_object_get(json_array_get(lp, i), "bytes");
    for (size_t k = 0; k < json_array_size(by) && k < 63; k++)
      a->tok[i][a->tok_len[i]++] = (char)json_integer_value(json_array_get(by, k));
  }
  json_decref(j);
}

void api_chat(const struct as_server *s, const char *body, struct api_answer *a) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  api_parse_answer(&r, a);
  as_resp_free(&r);
}

int32_t *api_tokenize(const struct as_server *s, const char *body_json, int *n) {
  json_t *b = json_loads(body_json, 0, NULL);
  TH_REQUIRE(b != NULL);
  json_t *t = json_pack("{s:O}", "messages", json_object_get(b, "messages"));
  json_t *kw = json_object_get(b, "mm_processor_kwargs");
  if (kw) json_object_set(t, "mm_processor_kwargs", kw);
  char *body = json_dumps(t, JSON_COMPACT);
  json_decref(t);
  json_decref(b);
  struct as_resp r;
  as_post(s, "/tokenize", body, &r);
  free(body);
  if (r.status != 200) fprintf(stderr, "tokenize %d: %s\n", r.status, r.body ? r.body : "");
  TH_REQUIRE(r.status == 200);
  json_t *j = as_json(&r);
  json_t *ids = json_object_get(j, "tokens");
  *n = (int)json_array_size(ids);
  int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n + API_GEN + 1));
  TH_REQUIRE(v != NULL);
  for (int i = 0; i < *n; i++)
    v[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
  json_decref(j);
  as_resp_free(&r);
  return v;
}

void api_refused(const struct as_server *s, const char *body, const char *param) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  if (r.status != 400)
    fprintf(stderr, "expected a 400 naming %s: %d %.300s\n", param, r.status, r.body ? r.body : "");
  as_check_error(&r, 400, param);
  as_resp_free(&r);
}

void api_check_both(const struct as_server *a, const struct as_server *b, const char *body,
                    const struct api_answer *want) {
  struct api_answer again;
  api_chat(a, body, &again);
  TH_CHECK_EQ_STR(again.text, want->text);
  api_chat(b, body, &again);
  TH_CHECK_EQ_STR(again.text, want->text);
}

void api_check_prompt(const struct as_server *s, const char *text_only, const char *body,
                      int32_t begin, int32_t media, int32_t end, const int *soft, int n_runs,
                      struct api_answer *r) {
  int nt = 0, ni = 0, total = 0;
  int32_t *t_ids = api_tokenize(s, text_only, &nt);
  int32_t *i_ids = api_tokenize(s, body, &ni);
  for (int i = 0; i < n_runs; i++)
    total += soft[i] + 2;
  TH_CHECK_EQ_INT(ni, nt + total);
  /* the runs, in place */
  int k = 0, runs = 0;
  while (k < ni && i_ids[k] != begin)
    k++;
  for (int i = 0; i < n_runs && k < ni; i++) {
    int n = 0;
    TH_CHECK_EQ_INT(i_ids[k], begin);
    k++;
    while (k < ni && i_ids[k] == media)
      k++, n++;
    TH_CHECK_EQ_INT(n, soft[i]);
    TH_CHECK_EQ_INT(i_ids[k], end);
    k++;
    runs++;
  }
  TH_CHECK_EQ_INT(runs, n_runs);
  api_chat(s, body, r);
  TH_CHECK_EQ_INT(r->prompt_tokens, ni);
  free(t_ids);
  free(i_ids);
}

void api_check_deterministic(const struct as_server *a, const struct as_server *b, const char *one,
                             const char *two, const char *two_s, const char *other,
                             struct api_answer *a1, struct api_answer *a2) {
  struct api_answer a1b, b1, b2, o;
  api_chat(a, one, a1);
  api_chat(a, one, &a1b);
  api_chat(b, one, &b1);
  api_chat(a, two, a2);
  api_chat(b, two, &b2);
  TH_CHECK_EQ_STR(a1->text, a1b.text);
  TH_CHECK_EQ_STR(a1->text, b1.text);
  TH_CHECK_EQ_STR(a2->text, b2.text);
  TH_CHECK_EQ_INT(a2->prompt_tokens, b2.prompt_tokens);
  /* the medium is read: another one behind the same words answers otherwise */
  api_chat(a, other, &o);
  TH_CHECK(strcmp(o.text, a1->text) != 0);
  /* streamed on b: the same text */
  struct as_resp r;
  as_post(b, "/v1/chat/completions", two_s, &r);
  TH_REQUIRE(r.status == 200);
  char st[1024];
  TH_CHECK(as_sse_text(r.body, 0, st, sizeof(st), NULL) > 0);
  TH_CHECK_EQ_STR(st, a2->text);
  as_resp_free(&r);
}

void api_offline_open(struct api_offline *o, const char *dir, int max_prompt) {
  char err[512] = "";
  memset(o, 0, sizeof(*o));
  TH_REQUIRE(kn_cpu_backend_create(2, &o->be) == 0 && o->be);
  struct wk_model_opts mo = {.max_batch_tokens = max_prompt + 8, .max_seqs = 1, .quiet = 1};
  if (wk_model_load(dir, o->be, &mo, &o->m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "text model: %s", err);
    th_stop();
  }
}

void api_offline_close(struct api_offline *o) {
  wk_model_free(o->m);
  kn_backend_destroy(o->be);
  memset(o, 0, sizeof(*o));
}

void api_offline_greedy(struct api_offline *o, const int32_t *ids, int n,
                        const struct wk_seq_embed *emb, int n_emb, const int32_t *ranges,
                        int n_ranges, int32_t *out) {
  char err[512] = "";
  int V = wk_model_config(o->m)->vocab;
  const struct wk_kv_spec *kv = wk_model_kv_spec(o->m);
  struct wk_page_alloc pa;
  TH_REQUIRE(wk_page_alloc_init(&pa, wk_model_n_pages(o->m)) == 0);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, n + API_GEN) == 0);
  float *logits = malloc(sizeof(float) * (size_t)V);
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n + API_GEN));
  TH_REQUIRE(logits && seq);
  memcpy(seq, ids, sizeof(int32_t) * (size_t)n);
  for (int k = 0, p0 = 0, len = n; k < API_GEN; k++) {
    struct wk_seq_input s = {.tokens = seq + p0, .n_tokens = len - p0, .pos0 = p0, .n_out = 1};
    if (k == 0) {
      s.embeds = emb, s.n_embeds = n_emb;
      s.bidir = ranges, s.n_bidir = ranges ? n_ranges : 0;
    }
    for (int g = 0; g < kv->n_groups; g++) {
      s.block_tables[g] = blk.table[g];
      s.n_blocks[g] = blk.n[g];
    }
    struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = logits};
    if (wk_model_forward(o->m, &b, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "forward: %s", err);
      th_stop();
    }
    int best = 0;
    for (int t = 1; t < V; t++)
      if (logits[t] > logits[best]) best = t;
    out[k] = best;
    seq[len] = best;
    p0 = len;
    len++;
  }
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
  free(logits);
  free(seq);
}

void api_check_tokens(const char *dir, const int32_t *gen, const struct api_answer *want,
                      const char *what) {
  char err[512], path[400];
  struct tk_tokenizer *tok = NULL;
  snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
  TH_REQUIRE(tk_load(path, &tok, err, sizeof(err)) == 0);
  for (int k = 0; k < API_GEN; k++) {
    char *t = NULL;
    size_t len = 0, cap = 0;
    TH_REQUIRE(tk_decode(tok, &gen[k], 1, 0, &t, &len, &cap) == 0);
    if ((int)len != want->tok_len[k] || memcmp(t, want->tok[k], len) != 0)
      th_fail(__FILE__, __LINE__, "%s, token %d: offline %d '%.*s', served '%.*s'", what, k, gen[k],
              (int)len, t, want->tok_len[k], want->tok[k]);
    free(t);
  }
  tk_free(tok);
}
