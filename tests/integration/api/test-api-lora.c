/* test-api-lora.c — LoRA adapters through the OpenAI API (serve --lora-modules) on
 * the tiny Gemma 4, two servers side by side:
 *   A: the checkpoint with two adapters made by tests/reference/make_lora.py (ad1:
 *      every projection of every layer; ad2: q, v and down of layers 0 and 1 in
 *      bf16 with rsLoRA's scale), prompt-token details on;
 *   B: the checkpoint with ad1 merged into its weights by
 *      tests/reference/merge_lora.py (W + scale B A in float64, stored as f32).
 * Checked:
 *   (a) /v1/models lists the adapters after the model, their parent the model and
 *       their root their folder; GET /v1/models/ad1 answers it; an unknown name is
 *       a 404 naming model;
 *   (b) greedy answers of ad1 on A are B's (a token may differ only where A's two
 *       best are within 1e-3 of each other: the merged weights are rounded to f32),
 *       completions and chat, streamed too; ad2's and the model's differ from them;
 *   (c) six requests at once (model, ad1, ad2, twice each) answer what each does
 *       alone;
 *   (d) the prefix cache keeps each adapter's blocks apart: a long prompt asked of
 *       ad1 twice is cached the second time, and then asked of the model and of
 *       ad2 is not;
 *   (e) an adapter folder that is not one, or an adapter above --max-lora-rank, stops
 *       serve with a message naming it (vLLM's --enable-lora is taken);
 *   (f) adapters loaded at run time (A runs with --allow-runtime-lora-updating; B
 *       without, where the routes are a 404): ad1 loaded as rt1 answers as ad1 does
 *       (and so as B), is listed, keeps its prefix-cache blocks apart; names taken,
 *       a folder that is not an adapter, a list adapter unloaded are refused; an
 *       unloaded adapter is a 404 as a model, and its name loaded again with ad2
 *       answers as ad2. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-proc.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

static const char *python;

static void run_py(const char *script, char *const *args) {
  th_reference_at(__FILE__, __LINE__, python, script, args);
}

static void make_ad1(const char *model, const char *out) {
  run_py("make_lora.py", (char *[]){(char *)model, (char *)out, "--rank", "4", "--std-b", "0.05",
                                    "--seed", "1", NULL});
}

static char lora_dir[256]; /* A's adapters: named on its command line before it starts */

static void prepare_a(struct as_server *s) {
  char ad1[400], ad2[400];
  snprintf(ad1, sizeof(ad1), "%s/ad1", lora_dir);
  snprintf(ad2, sizeof(ad2), "%s/ad2", lora_dir);
  make_ad1(s->model, ad1);
  run_py("make_lora.py", (char *[]){s->model, ad2, "--rank", "8", "--alpha", "4", "--rslora",
                                    "--dtype", "bf16", "--targets", "q_proj,v_proj,down_proj",
                                    "--layers", "0,1", "--std-b", "0.1", "--seed", "2", NULL});
}

/* B serves the checkpoint with ad1 merged into it, in place of the one made */
static void prepare_b(struct as_server *s) {
  char ad1[400], merged[400], base[400];
  snprintf(ad1, sizeof(ad1), "%s/ad1", s->dir);
  snprintf(merged, sizeof(merged), "%s/merged", s->dir);
  snprintf(base, sizeof(base), "%s/base", s->dir);
  make_ad1(s->model, ad1);
  run_py("merge_lora.py", (char *[]){s->model, ad1, merged, NULL});
  TH_REQUIRE(rename(s->model, base) == 0 && rename(merged, s->model) == 0);
}

struct answer {
  int n;
  char tok[64][64];  /* the tokens' text (logprobs' tokens) */
  double top[64][2]; /* the two best logprobs at each */
  char text[2048];
};

/* A greedy completion (chat when chat) of `prompt` by `model`, 12 tokens, with the
 * logprobs of the two best at each. */
static void ask(const struct as_server *s, const char *model, const char *prompt, int chat,
                struct answer *a) {
  char body[1024];
  if (chat)
    snprintf(body, sizeof(body),
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
             "\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}",
             model, prompt);
  else
    snprintf(body, sizeof(body),
             "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,"
             "\"logprobs\":2}",
             model, prompt);
  struct as_resp r;
  int st = as_post(s, chat ? "/v1/chat/completions" : "/v1/completions", body, &r);
  if (st != 200) fprintf(stderr, "%s\n", r.body ? r.body : "");
  TH_REQUIRE(st == 200);
  json_t *j = as_json(&r);
  TH_REQUIRE(j);
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  TH_CHECK(!strcmp(json_string_value(json_object_get(j, "model")), model));
  memset(a, 0, sizeof(*a));
  const char *text =
      chat ? json_string_value(json_object_get(json_object_get(c0, "message"), "content"))
           : json_string_value(json_object_get(c0, "text"));
  snprintf(a->text, sizeof(a->text), "%s", text ? text : "");
  json_t *lp = json_object_get(c0, "logprobs");
  if (chat) {
    json_t *content = json_object_get(lp, "content"), *e;
    size_t i;
    json_array_foreach(content, i, e) {
      if (a->n == 64) break;
      snprintf(a->tok[a->n], 64, "%s", json_string_value(json_object_get(e, "token")));
      json_t *tl = json_object_get(e, "top_logprobs");
      for (int k = 0; k < 2; k++)
        a->top[a->n][k] =
            json_real_value(json_object_get(json_array_get(tl, (size_t)k), "logprob"));
      a->n++;
    }
  } else {
    json_t *toks = json_object_get(lp, "tokens"), *tops = json_object_get(lp, "top_logprobs");
    for (size_t i = 0; i < json_array_size(toks) && a->n < 64; i++, a->n++) {
      snprintf(a->tok[a->n], 64, "%s", json_string_value(json_array_get(toks, i)));
      json_t *t = json_array_get(tops, i), *v;
      const char *k;
      int m = 0;
      double best[2] = {-INFINITY, -INFINITY};
      json_object_foreach(t, k, v) {
        double x = json_real_value(v);
        if (x > best[0])
          best[1] = best[0], best[0] = x;
        else if (x > best[1])
          best[1] = x;
        m++;
      }
      (void)m;
      a->top[a->n][0] = best[0];
      a->top[a->n][1] = best[1];
    }
  }
  json_decref(j);
  as_resp_free(&r);
}

/* a's tokens are b's up to a place where a's two best are within 1e-3 (then the
 * rest may differ). Returns the tokens compared equal. */
static int same_greedy(const struct answer *a, const struct answer *b) {
  int i = 0;
  for (; i < a->n && i < b->n; i++) {
    if (strcmp(a->tok[i], b->tok[i])) {
      double gap = a->top[i][0] - a->top[i][1];
      if (!(gap < 1e-3)) {
        th_fail(__FILE__, __LINE__, "token %d: '%s' against '%s' (a gap of %.3g)", i, a->tok[i],
                b->tok[i], gap);
      }
      return i;
    }
  }
  TH_CHECK(a->n == b->n);
  return i;
}

static long long cached(const struct as_server *s, const char *model, const char *prompt) {
  char body[4096];
  snprintf(body, sizeof(body),
           "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":1,\"temperature\":0}", model,
           prompt);
  struct as_resp r;
  TH_REQUIRE(as_post(s, "/v1/completions", body, &r) == 200);
  json_t *j = as_json(&r);
  TH_REQUIRE(j);
  json_t *d = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
  long long n = json_integer_value(json_object_get(d, "cached_tokens"));
  json_decref(j);
  as_resp_free(&r);
  return n;
}

/* (a) */
static void check_models(const struct as_server *s) {
  struct as_resp r;
  TH_REQUIRE(as_get(s, "/v1/models", &r) == 200);
  json_t *j = as_json(&r), *data = json_object_get(j, "data");
  TH_REQUIRE(j && json_array_size(data) == 3);
  const char *ids[3] = {"tiny", "ad1", "ad2"};
  for (size_t i = 0; i < 3; i++) {
    json_t *m = json_array_get(data, i);
    TH_CHECK(!strcmp(json_string_value(json_object_get(m, "id")), ids[i]));
    json_t *parent = json_object_get(m, "parent");
    const char *root = json_string_value(json_object_get(m, "root"));
    if (i == 0) {
      TH_CHECK(json_is_null(parent));
    } else {
      char want[400];
      snprintf(want, sizeof(want), "%s/%s", lora_dir, ids[i]);
      TH_CHECK(parent && !strcmp(json_string_value(parent), "tiny"));
      TH_CHECK(root && !strcmp(root, want));
    }
  }
  json_decref(j);
  as_resp_free(&r);
  TH_CHECK(as_get(s, "/v1/models/ad1", &r) == 200);
  j = as_json(&r);
  TH_CHECK(j && !strcmp(json_string_value(json_object_get(j, "parent")), "tiny"));
  json_decref(j);
  as_resp_free(&r);
  as_post(s, "/v1/completions", "{\"model\":\"ad3\",\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  as_check_error(&r, 404, "model");
  as_resp_free(&r);
}

/* (b) */
static void check_greedy(const struct as_server *a, const struct as_server *b) {
  static const char *prompts[] = {"The quick brown fox", "Once upon a time there was",
                                  "lmserve serves Gemma"};
  for (int chat = 0; chat < 2; chat++)
    for (int i = 0; i < 3; i++) {
      struct answer x, y, z, w;
      ask(a, "ad1", prompts[i], chat, &x);
      ask(b, "tiny", prompts[i], chat, &y);
      int same = same_greedy(&x, &y);
      printf("%s %d: ad1 on A and the merged model on B agree on %d of %d tokens\n",
             chat ? "chat" : "completion", i, same, x.n);
      ask(a, "tiny", prompts[i], chat, &z);
      ask(a, "ad2", prompts[i], chat, &w);
      TH_CHECK(strcmp(x.text, z.text) != 0); /* the adapter is seen */
      TH_CHECK(strcmp(w.text, z.text) != 0);
      TH_CHECK(strcmp(w.text, x.text) != 0);
    }
  /* streamed: the text of the whole answer */
  struct answer x;
  ask(a, "ad1", "The quick brown fox", 0, &x);
  struct as_resp r;
  TH_REQUIRE(as_post(a, "/v1/completions",
                     "{\"model\":\"ad1\",\"prompt\":\"The quick brown fox\",\"max_tokens\":12,"
                     "\"temperature\":0,\"stream\":true}",
                     &r) == 200);
  char text[2048];
  TH_CHECK(as_sse_text(r.body, 0, text, sizeof(text), NULL) > 0);
  TH_CHECK(!strcmp(text, x.text));
  as_resp_free(&r);
}

/* (c) */
static void check_concurrent(const struct as_server *s) {
  static const char *models[6] = {"tiny", "ad1", "ad2", "ad2", "ad1", "tiny"};
  char bodies[6][300];
  const char *paths[6], *bp[6];
  struct answer alone[6];
  for (int i = 0; i < 6; i++) {
    const char *prompt = i % 2 ? "Once upon a time there was" : "The quick brown fox";
    snprintf(bodies[i], sizeof(bodies[i]),
             "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0}", models[i],
             prompt);
    paths[i] = "/v1/completions";
    bp[i] = bodies[i];
    ask(s, models[i], prompt, 0, &alone[i]);
  }
  struct as_resp out[6];
  TH_CHECK(as_post_many(s, 6, paths, bp, out) == 6);
  for (int i = 0; i < 6; i++) {
    json_t *j = as_json(&out[i]);
    TH_CHECK(out[i].status == 200 && j);
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    TH_CHECK(t && !strcmp(t, alone[i].text));
    json_decref(j);
    as_resp_free(&out[i]);
  }
}

/* (d) */
static void check_cache(const struct as_server *s) {
  char prompt[2048] = "";
  for (int i = 0; i < 40; i++)
    strcat(prompt, i % 3 ? "river stone " : "lantern ");
  long long first = cached(s, "ad1", prompt), again = cached(s, "ad1", prompt);
  long long base = cached(s, "tiny", prompt), other = cached(s, "ad2", prompt);
  long long base_again = cached(s, "tiny", prompt);
  printf("cached prompt tokens: ad1 %lld then %lld, the model %lld then %lld, ad2 %lld\n", first,
         again, base, base_again, other);
  TH_CHECK(first == 0 && again >= 32);
  TH_CHECK(base == 0 && other == 0);
  TH_CHECK(base_again >= 32);
}

/* (f) POSTs body to path: the status, the body's text into out. */
static int post_text(const struct as_server *s, const char *path, const char *body, char *out,
                     size_t n) {
  struct as_resp r;
  int st = as_post(s, path, body, &r);
  snprintf(out, n, "%s", r.body ? r.body : "");
  as_resp_free(&r);
  return st;
}

static void check_runtime(const struct as_server *a, const struct as_server *b) {
  char body[1200], text[2048];
  snprintf(body, sizeof(body), "{\"lora_name\":\"rt1\",\"lora_path\":\"%s/ad1\"}", lora_dir);
  TH_CHECK_EQ_INT(post_text(b, "/v1/load_lora_adapter", body, text, sizeof(text)), 404);
  TH_CHECK_EQ_INT(post_text(a, "/v1/load_lora_adapter", body, text, sizeof(text)), 200);
  TH_CHECK_EQ_STR(text, "Success: LoRA adapter 'rt1' added successfully.");
  /* listed after the list's, as vLLM lists it */
  struct as_resp r;
  TH_REQUIRE(as_get(a, "/v1/models", &r) == 200);
  json_t *j = as_json(&r), *m = json_array_get(json_object_get(j, "data"), 3);
  char want[400];
  snprintf(want, sizeof(want), "%s/ad1", lora_dir);
  TH_CHECK(m && !strcmp(json_string_value(json_object_get(m, "id")), "rt1"));
  TH_CHECK(m && !strcmp(json_string_value(json_object_get(m, "root")), want));
  TH_CHECK(m && !strcmp(json_string_value(json_object_get(m, "parent")), "tiny"));
  json_decref(j);
  as_resp_free(&r);
  /* ad1's answers, to the bit on this machine, so the merged model's on B */
  static const char *prompts[] = {"The quick brown fox", "lmserve serves Gemma"};
  for (int chat = 0; chat < 2; chat++)
    for (int i = 0; i < 2; i++) {
      struct answer x, y, z;
      ask(a, "rt1", prompts[i], chat, &x);
      ask(a, "ad1", prompts[i], chat, &y);
      ask(b, "tiny", prompts[i], chat, &z);
      TH_CHECK_EQ_STR(x.text, y.text);
      same_greedy(&x, &z);
    }
  /* its blocks are its own: ad1's cached prompt is not rt1's */
  char prompt[2048] = "";
  for (int i = 0; i < 40; i++)
    strcat(prompt, i % 3 ? "field stone " : "harbour ");
  long long ad1_first = cached(a, "ad1", prompt), rt1_first = cached(a, "rt1", prompt),
            rt1_again = cached(a, "rt1", prompt);
  TH_CHECK(ad1_first == 0 && rt1_first == 0 && rt1_again >= 32);
  /* refused: names taken, no path, a folder that is not an adapter */
  static const char *const taken[] = {"rt1", "ad1", "tiny"};
  for (int i = 0; i < 3; i++) {
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\",\"lora_path\":\"%s/ad2\"}", taken[i],
             lora_dir);
    TH_CHECK_EQ_INT(post_text(a, "/v1/load_lora_adapter", body, text, sizeof(text)), 400);
    TH_CHECK(strstr(text, "has already been loaded") != NULL);
  }
  TH_CHECK_EQ_INT(
      post_text(a, "/v1/load_lora_adapter", "{\"lora_name\":\"x\"}", text, sizeof(text)), 400);
  TH_CHECK(strstr(text, "Both 'lora_name' and 'lora_path' must be provided.") != NULL);
  snprintf(body, sizeof(body), "{\"lora_name\":\"broken\",\"lora_path\":\"%s\"}", lora_dir);
  int st = post_text(a, "/v1/load_lora_adapter", body, text, sizeof(text));
  TH_CHECK(st == 400 || st == 404);
  TH_CHECK(strstr(text, "adapter_config.json") != NULL);
  as_post(a, "/v1/completions", "{\"model\":\"broken\",\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  as_check_error(&r, 404, "model");
  as_resp_free(&r);
  /* unloaded: gone as a model; the list's stay; its name again, with ad2 */
  TH_CHECK_EQ_INT(
      post_text(a, "/v1/unload_lora_adapter", "{\"lora_name\":\"rt1\"}", text, sizeof(text)), 200);
  TH_CHECK_EQ_STR(text, "Success: LoRA adapter 'rt1' removed successfully.");
  as_post(a, "/v1/completions", "{\"model\":\"rt1\",\"prompt\":\"hi\",\"max_tokens\":2}", &r);
  as_check_error(&r, 404, "model");
  as_resp_free(&r);
  TH_CHECK_EQ_INT(
      post_text(a, "/v1/unload_lora_adapter", "{\"lora_name\":\"rt1\"}", text, sizeof(text)), 404);
  TH_CHECK_EQ_INT(
      post_text(a, "/v1/unload_lora_adapter", "{\"lora_name\":\"ad1\"}", text, sizeof(text)), 400);
  snprintf(body, sizeof(body), "{\"lora_name\":\"rt1\",\"lora_path\":\"%s/ad2\"}", lora_dir);
  TH_CHECK_EQ_INT(post_text(a, "/v1/load_lora_adapter", body, text, sizeof(text)), 200);
  for (int i = 0; i < 2; i++) {
    struct answer x, y;
    ask(a, "rt1", prompts[i], 0, &x);
    ask(a, "ad2", prompts[i], 0, &y);
    TH_CHECK_EQ_STR(x.text, y.text);
  }
  /* the cache: the reloaded rt1 is another adapter */
  TH_CHECK_EQ_INT(cached(a, "rt1", prompt), 0);
  /* more adapters than the 62 slots after the list's (m0 .. m63, each ad1 under a path of
   * its own): the slot used longest ago that no request holds makes way for each load
   * past them: rt1's, then m0's and m1's; a request naming an adapter that went loads it
   * again, in the slot of the next one used longest ago */
  struct answer as_ad1, as_ad2;
  ask(a, "ad1", prompts[0], 0, &as_ad1);
  ask(a, "ad2", prompts[0], 0, &as_ad2);
  for (int i = 0; i < 64; i++) {
    char link[400], target[400];
    snprintf(link, sizeof(link), "%s/m%d", lora_dir, i);
    snprintf(target, sizeof(target), "%s/ad1", lora_dir);
    TH_REQUIRE(symlink(target, link) == 0);
    snprintf(body, sizeof(body), "{\"lora_name\":\"m%d\",\"lora_path\":\"%s\"}", i, link);
    TH_CHECK_EQ_INT(post_text(a, "/v1/load_lora_adapter", body, text, sizeof(text)), 200);
  }
  static const char *const again[3] = {"m0", "m1", "rt1"};
  for (int i = 0; i < 3; i++) {
    struct answer x;
    ask(a, again[i], prompts[0], 0, &x);
    TH_CHECK_EQ_STR(x.text, i == 2 ? as_ad2.text : as_ad1.text);
  }
  static const char *const way[][2] = {{"ad2", "m61"}, {"m0", "m62"}, {"m1", "m63"},
                                       {"m2", "m0"},   {"m3", "m1"},  {"m4", "ad2"}};
  FILE *f = fopen(a->log, "r");
  TH_REQUIRE(f != NULL);
  char line[1024];
  int k = 0;
  while (fgets(line, sizeof(line), f)) {
    const char *at = strstr(line, " makes way for ");
    if (!at) continue;
    char want_old[400], want_new[400];
    snprintf(want_old, sizeof(want_old), "%s/%s makes way for ", lora_dir, k < 6 ? way[k][0] : "");
    snprintf(want_new, sizeof(want_new), "for %s/%s\n", lora_dir, k < 6 ? way[k][1] : "");
    if (k >= 6 || !strstr(line, want_old) || !strstr(line, want_new))
      th_fail(__FILE__, __LINE__, "eviction %d: %s", k, line);
    k++;
  }
  fclose(f);
  TH_CHECK_EQ_INT(k, 6);
  for (int i = 0; i < 64; i++) {
    snprintf(body, sizeof(body), "{\"lora_name\":\"m%d\"}", i);
    TH_CHECK_EQ_INT(post_text(a, "/v1/unload_lora_adapter", body, text, sizeof(text)), 200);
  }
}

/* (e) */
static void check_bad_adapter(const char *model) {
  char mods[600];
  snprintf(mods, sizeof(mods), "broken=%s", lora_dir); /* a folder without adapter_config.json */
  struct th_out o = {0};
  char port[16];
  snprintf(port, sizeof(port), "%d", th_free_port());
  int rc = th_lmserve(&o, 120000, "serve", "--model", model, "--port", port, "--lora-modules", mods,
                      NULL);
  TH_CHECK(rc != 0);
  if (!o.err || !strstr(o.err, "LoRA adapter broken")) fprintf(stderr, "%s\n", o.err);
  TH_CHECK(o.err && strstr(o.err, "LoRA adapter broken") && strstr(o.err, "adapter_config.json"));
  /* vLLM's --max-lora-rank: ad1 has rank 4 */
  snprintf(mods, sizeof(mods), "ad1=%s/ad1", lora_dir);
  rc = th_lmserve(&o, 120000, "serve", "--model", model, "--port", port, "--lora-modules", mods,
                  "--max-lora-rank", "2", NULL);
  TH_CHECK(rc != 0);
  TH_CHECK(o.err && strstr(o.err, "LoRA adapter ad1 has rank 4, above --max-lora-rank 2"));
  th_out_free(&o);
}

TH_TEST(api_lora) {
  python = th_require_numpy("LoRA adapters through the API", "make_lora.py");
  TH_REQUIRE(th_tmpdir("lora", lora_dir, sizeof(lora_dir)) == 0);
  struct as_server a = {.prepare = prepare_a}, b = {.prepare = prepare_b};
  char mods[700];
  snprintf(mods, sizeof(mods), "ad1=%s/ad1,ad2=%s/ad2", lora_dir, lora_dir);
  as_start(&b, 0, (char *[]){"--served-model-name", "tiny", NULL});
  as_start(&a, 0,
           (char *[]){"--served-model-name", "tiny", "--enable-lora", "--lora-modules", mods,
                      "--max-lora-rank", "8", "--enable-prompt-tokens-details",
                      "--allow-runtime-lora-updating", NULL});
  check_models(&a);
  check_greedy(&a, &b);
  check_concurrent(&a);
  check_cache(&a);
  check_runtime(&a, &b);
  as_stop(&a);
  as_stop(&b);
  check_bad_adapter(a.model);
}
