/* test-tok-tiny.c — the tokenizer on a small hand-made tokenizer.json
 * (tests/fixtures/tokenizer/tiny): BPE merge order, byte fallback, added
 * tokens, the pre-tokenizer split; and refusals of what is not supported,
 * each with a message naming the field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"
#include "tt-util.h"

static struct tk_tokenizer *load_tiny(void) {
  struct tk_tokenizer *tok = NULL;
  char err[256];
  int rc = tk_load(tt_fixture("tiny"), &tok, err, sizeof err); /* a directory */
  if (rc) th_fail(__FILE__, __LINE__, "tiny: %s", err);
  return tok;
}

static size_t enc(struct tk_tokenizer *tok, const char *s, unsigned flags, int32_t *out, size_t max) {
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (tk_encode(tok, NULL, s, strlen(s), flags, &ids, &n, &cap)) n = 0;
  for (size_t i = 0; i < n && i < max; i++) out[i] = ids[i];
  free(ids);
  return n;
}

#define ID(s) tk_find(tok, s, strlen(s))

TH_TEST(tiny_bpe) {
  struct tk_tokenizer *tok = load_tiny();
  TH_REQUIRE(tok);
  int32_t ids[32];
  /* " abc": (a,b) has the lowest rank, then (ab,c); "▁"+"abc" is no merge,
   * so the "▁abc" token is never reached */
  TH_CHECK_EQ_INT(enc(tok, " abc", TK_DEFAULT, ids, 32), 3);
  TH_CHECK(ids[0] == 2 && ids[1] == ID("\xe2\x96\x81") && ids[2] == ID("abc"));
  /* "abcbc": (a,b) ranks before (b,c): ab, then abc, then b c -> bc */
  TH_CHECK_EQ_INT(enc(tok, "abcbc", 0, ids, 32), 2);
  TH_CHECK(ids[0] == ID("abc") && ids[1] == ID("bc"));
  /* leftmost first on equal rank: "aab" -> a, ab */
  TH_CHECK_EQ_INT(enc(tok, "aab", 0, ids, 32), 2);
  TH_CHECK(ids[0] == ID("a") && ids[1] == ID("ab"));
  /* byte fallback: "中" (E4 B8 AD) is not in the vocab */
  TH_CHECK_EQ_INT(enc(tok, "\xe4\xb8\xad", 0, ids, 32), 3);
  TH_CHECK(ids[0] == ID("<0xE4>") && ids[1] == ID("<0xB8>") && ids[2] == ID("<0xAD>"));
  /* added tokens split the text; special ones only with MATCH_SPECIAL */
  TH_CHECK_EQ_INT(enc(tok, "a<eos>b\nc", 0, ids, 32), 9);
  TH_CHECK(ids[1] == ID("<0x3C>") && ids[7] == ID("\n"));
  TH_CHECK_EQ_INT(enc(tok, "a<eos>b\nc", TK_MATCH_SPECIAL, ids, 32), 5);
  TH_CHECK(ids[0] == ID("a") && ids[1] == 1 && ids[2] == ID("b") && ids[3] == ID("\n"));
  /* MergedWithPrevious split on " " happens after " " -> "▁": a no-op, so
   * "▁▁" can merge across what were two spaces */
  TH_CHECK_EQ_INT(enc(tok, "  ", 0, ids, 32), 1);
  TH_CHECK(ids[0] == ID("\xe2\x96\x81\xe2\x96\x81"));
  /* decode: byte runs, invalid runs, skip_special */
  char *out = NULL;
  size_t ol = 0, oc = 0;
  int32_t seq[] = {2, ID("\xe2\x96\x81" "ab"), ID("<0xE4>"), ID("<0xB8>"), ID("<0xAD>"), ID("c"), 1};
  TH_REQUIRE(tk_decode(tok, seq, 7, 1, &out, &ol, &oc) == 0);
  TH_CHECK_EQ_STR(out, " ab\xe4\xb8\xad" "c");
  TH_REQUIRE(tk_decode(tok, seq, 7, 0, &out, &ol, &oc) == 0);
  TH_CHECK_EQ_STR(out, "<bos> ab\xe4\xb8\xad" "c<eos>");
  int32_t badrun[] = {ID("<0xE4>"), ID("<0xB8>"), ID("c"), ID("<0xFF>")};
  TH_REQUIRE(tk_decode(tok, badrun, 4, 0, &out, &ol, &oc) == 0);
  TH_CHECK_EQ_STR(out, "\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd");
  free(out);
  tk_free(tok);
}

/* Writes the tiny tokenizer with one edit applied and tries to load it. */
static int load_edited(const char *from, const char *to, char *err, size_t errlen) {
  size_t len;
  char *src = tt_read_file(tt_fixture("tiny/tokenizer.json"), &len);
  if (!src) return -100;
  const char *at = strstr(src, from);
  if (!at) {
    free(src);
    th_fail(__FILE__, __LINE__, "fixture has no \"%s\"", from);
    return -100;
  }
  char path[] = "/tmp/lmserve-tok-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "wb");
  fwrite(src, 1, (size_t)(at - src), f);
  fputs(to, f);
  fputs(at + strlen(from), f);
  fclose(f);
  free(src);
  struct tk_tokenizer *tok = NULL;
  int rc = tk_load(path, &tok, err, errlen);
  tk_free(tok);
  unlink(path);
  return rc;
}

TH_TEST(tiny_refusals) {
  static const struct {
    const char *from, *to;
    int code;
    const char *names; /* the field the message must name */
  } cases[] = {
      {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", CM_ERR_UNSUPPORTED, "model.type"},
      {"\"dropout\": null", "\"dropout\": 0.1", CM_ERR_UNSUPPORTED, "model.dropout"},
      {"\"type\": \"Replace\",\n  \"pattern\": {\n   \"String\": \" \"",
       "\"type\": \"Replace\",\n  \"pattern\": {\n   \"Regex\": \" \"", CM_ERR_UNSUPPORTED,
       "normalizer.pattern"},
      {"\"type\": \"Split\"", "\"type\": \"Metaspace\"", CM_ERR_UNSUPPORTED, "pre_tokenizer.type"},
      {"\"behavior\": \"MergedWithPrevious\"", "\"behavior\": \"Contiguous\"", CM_ERR_UNSUPPORTED,
       "pre_tokenizer.behavior"},
      {"\"type\": \"TemplateProcessing\"", "\"type\": \"BertProcessing\"", CM_ERR_UNSUPPORTED,
       "post_processor.type"},
      {"\"type\": \"Fuse\"", "\"type\": \"Strip\"", CM_ERR_UNSUPPORTED, "decoder.decoders[2].type"},
      {"\"lstrip\": false", "\"lstrip\": true", CM_ERR_UNSUPPORTED, "added_tokens[0].lstrip"},
      {"\"<unk>\": 3", "\"<unk>\": 2", CM_ERR_PARSE, "model.vocab"},
      /* the message quotes the token (it was read after the scanner's buffer was freed) */
      {"\"<unk>\": 3", "\"<unk>\": 16777216", CM_ERR_RANGE,
       "model.vocab: id 16777216 of \"<unk>\" out of range"},
      {"[\n    \"a\",\n    \"b\"\n   ]", "[\n    \"a\",\n    \"zz\"\n   ]", CM_ERR_PARSE,
       "model.merges[0]"},
      {"\"vocab\": {", "\"vocab\": {,", CM_ERR_PARSE, "model.vocab"},
      {"\"version\"", "\"version\" x", CM_ERR_PARSE, "malformed JSON"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char err[256] = "";
    int rc = load_edited(cases[i].from, cases[i].to, err, sizeof err);
    if (rc != cases[i].code || !strstr(err, cases[i].names))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d (want %d), message \"%s\" (want \"%s\")", i,
              rc, cases[i].code, err, cases[i].names);
  }
  char err[256];
  struct tk_tokenizer *tok = NULL;
  TH_CHECK_EQ_INT(tk_load("/nonexistent/tokenizer.json", &tok, err, sizeof err), CM_ERR_NOENT);
  TH_CHECK(tok == NULL && strstr(err, "/nonexistent") != NULL);
  TH_CHECK_EQ_INT(tk_load(tt_fixture("corpus/empty.txt"), &tok, err, sizeof err), CM_ERR_PARSE);
}
