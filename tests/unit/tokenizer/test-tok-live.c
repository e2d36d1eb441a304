/* test-tok-live.c — runs the Node reference (tests/reference/tokenizer/
 * encode-ref.js, @lenml/tokenizers) live and compares: on the committed
 * corpus (which also checks that expected.json is current) and on a
 * corpus generated here from a fixed seed (random mixes of scripts,
 * whitespace runs, special-token spellings, byte-fallback characters and
 * random code points); and the chat templates against @huggingface/jinja
 * (tests/reference/tokenizer/chat-ref.js). Skips loudly when node or the
 * npm packages are missing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-fs.h"
#include "common/cm-hash.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tokenizer/tk-tokenizer.h"
#include "tt-util.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
  return (uint32_t)(cm_xorshift64(&rng_state) >> 11) % n;
}

static size_t put_cp(char *o, uint32_t cp) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
  if (cp < 0x10000)
    return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)),
           o[2] = (char)(0x80 | (cp & 63)), 3;
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 63));
  o[2] = (char)(0x80 | (cp >> 6 & 63));
  o[3] = (char)(0x80 | (cp & 63));
  return 4;
}

static const char *const frags[] = {
    "the", " quick", " brown", " fox", "Hello", ",", ".", " ", "  ", "   ", "\n", "\n\n", "\t",
    "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of", "turn>", "<", ">", "</",
    "<unused7>", "<table>", "日本語", "中文", "한국어", "مرحبا", "Ελληνικά", "ไทย", "e\xcc\x81",
    "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9", "\xf0\x9f\x98\x80", "\xf0\xa0\x80\x80",
    "\xee\x80\x80", "\x01", "\x1b", "{\"a\": [1, 2]}", "def f(x):", "    return", "1234567",
    "\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81", "aaaaaaaaaaaa", "!!!", "...", "—",
};

static void gen_corpus(const char *dir) {
  char path[512], buf[8192];
  for (int d = 0; d < 24; d++) {
    size_t n = 0, target = 200 + rnd(3000);
    while (n < target && n < sizeof buf - 64) {
      if (rnd(5) == 0) {
        uint32_t cp;
        do cp = 1 + rnd(rnd(4) ? 0x3000 : 0x10FFFF);
        while (cp >= 0xD800 && cp <= 0xDFFF);
        n += put_cp(buf + n, cp);
      } else {
        const char *f = frags[rnd(sizeof frags / sizeof frags[0])];
        size_t fl = strlen(f);
        if (n + fl >= sizeof buf - 64) break;
        memcpy(buf + n, f, fl);
        n += fl;
      }
    }
    snprintf(path, sizeof path, "%s/gen-%02d.txt", dir, d);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
  }
}

/* Runs the reference on `dir`; returns its parsed output or NULL. */
static json_t *run_ref(const char *dir) {
  char script[1024];
  snprintf(script, sizeof script, "%s/reference/tokenizer/encode-ref.js", th_tests_dir());
  char *argv[] = {"node", script, (char *)dir, NULL};
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 240000, &out, &err);
  json_t *j = NULL;
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "node reference failed (%d): %s", rc, err ? err : "");
  } else {
    json_error_t je;
    j = json_loads(out, 0, &je);
    if (!j) th_fail(__FILE__, __LINE__, "node reference output: %s", je.text);
  }
  free(out);
  free(err);
  return j;
}

static int same_ids(json_t *arr, const int32_t *ids, size_t n) {
  if (json_array_size(arr) != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (json_integer_value(json_array_get(arr, i)) != ids[i]) return 0;
  return 1;
}

static int compare_dir(const char *dir, json_t *ref) {
  const struct tk_tokenizer *tok = tt_gemma();
  const char *name;
  json_t *exp;
  int docs = 0;
  json_object_foreach(ref, name, exp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len;
    char *text = tt_read_file(path, &len);
    TH_REQUIRE(text);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0, ol = 0, oc = 0;
    char *out = NULL;
    TH_CHECK_EQ_INT(tk_encode(tok, NULL, text, len, TK_DEFAULT, &ids, &n, &cap), 0);
    if (!same_ids(json_object_get(exp, "ids"), ids, n))
      th_fail(__FILE__, __LINE__, "%s: ids differ from the live reference", path);
    TH_CHECK_EQ_INT(tk_decode(tok, ids, n, 0, &out, &ol, &oc), 0);
    const char *want = json_string_value(json_object_get(exp, "decoded"));
    if (!want || strlen(want) != ol || memcmp(want, out, ol))
      th_fail(__FILE__, __LINE__, "%s: decode differs from the live reference", path);
    TH_CHECK_EQ_INT(tk_encode(tok, NULL, text, len, 0, &ids, &n, &cap), 0);
    if (!same_ids(json_object_get(exp, "ids_no_special"), ids, n))
      th_fail(__FILE__, __LINE__, "%s: ids_no_special differ from the live reference", path);
    free(out);
    free(ids);
    free(text);
    docs++;
  }
  return docs;
}

static void need_node(void) {
  char *argv[] = {"node", "--version", NULL};
  if (th_run(argv, NULL, NULL, 0, 20000, NULL, NULL) != 0)
    TH_SKIP("node is not installed: the live reference comparison did not run");
  char nm[1024];
  snprintf(nm, sizeof nm, "%s/../node_modules/@lenml/tokenizers", th_tests_dir());
  if (access(nm, R_OK))
    TH_SKIP("node_modules/@lenml/tokenizers is missing: the live reference comparison did not run");
  tt_gemma();
}

TH_TEST(tok_live_fixture_corpus) {
  need_node();
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", tt_fixture("corpus"));
  json_t *ref = run_ref(dir);
  TH_REQUIRE(ref);
  TH_CHECK(compare_dir(dir, ref) >= 15);
  /* the committed fixture must be what the reference says today */
  json_t *committed = json_load_file(tt_fixture("expected.json"), 0, NULL);
  TH_CHECK(committed && json_equal(committed, ref));
  json_decref(committed);
  json_decref(ref);
}

TH_TEST(tok_live_generated_corpus) {
  need_node();
  char dir[] = "/tmp/lmserve-tokgen-XXXXXX";
  TH_REQUIRE(mkdtemp(dir));
  gen_corpus(dir);
  json_t *ref = run_ref(dir);
  if (ref) TH_CHECK_EQ_INT(compare_dir(dir, ref), 24);
  json_decref(ref);
  TH_CHECK(cm_rmtree(dir) == 0);
}

TH_TEST(chat_live_reference) {
  need_node();
  char *chk[] = {"node", "-e",
                 "const p=require('path');const r=p.resolve(process.argv[1]);"
                 "require.resolve('@huggingface/jinja',{paths:[r,p.join(r,'.cache','node-ref')]})",
                 (char *)th_tests_dir(), NULL};
  char root[1024];
  snprintf(root, sizeof root, "%s/..", th_tests_dir());
  chk[3] = root;
  if (th_run(chk, NULL, NULL, 0, 20000, NULL, NULL) != 0)
    TH_SKIP("@huggingface/jinja is not installed (npm): the live chat template comparison "
            "did not run");
  char script[1024], cases_path[1024];
  snprintf(script, sizeof script, "%s/reference/tokenizer/chat-ref.js", th_tests_dir());
  snprintf(cases_path, sizeof cases_path, "%s", tt_fixture("chat-cases.json"));
  char *argv[] = {"node", script, cases_path, NULL};
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 60000, &out, &err);
  TH_REQUIRE(rc == 0);
  json_t *live = json_loads(out, 0, NULL);
  json_t *cases = json_load_file(cases_path, 0, NULL);
  json_t *committed = json_load_file(tt_fixture("chat-expected.json"), 0, NULL);
  TH_REQUIRE(live && cases && committed);
  TH_CHECK(json_equal(live, committed));
  tt_chat_compare(cases, live);
  json_decref(live);
  json_decref(cases);
  json_decref(committed);
  free(out);
  free(err);
}
