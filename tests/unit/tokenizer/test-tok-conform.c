/* test-tok-conform.c — the real Gemma tokenizer against the committed
 * reference ids (tests/fixtures/tokenizer/expected.json, made by
 * tests/reference/tokenizer/encode-ref.js with @lenml/tokenizers): exact
 * ids on every corpus document, with and without special tokens, and
 * decode round trips. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"
#include "tt-util.h"

static int ids_equal(json_t *arr, const int32_t *ids, size_t n, size_t *first_diff) {
  size_t m = json_array_size(arr);
  for (size_t i = 0; i < n && i < m; i++)
    if (json_integer_value(json_array_get(arr, i)) != ids[i]) {
      *first_diff = i;
      return 0;
    }
  *first_diff = n < m ? n : m;
  return n == m;
}

static void check_doc(const struct tk_tokenizer *tok, struct tk_state *st, const char *name,
                      json_t *exp) {
  char rel[512];
  snprintf(rel, sizeof rel, "corpus/%s", name);
  size_t len;
  char *text = tt_read_file(tt_fixture(rel), &len);
  TH_REQUIRE(text != NULL);
  int32_t *ids = NULL;
  size_t n = 0, cap = 0, diff;
  /* default: BOS + special tokens matched */
  TH_CHECK_EQ_INT(tk_encode(tok, st, text, len, TK_DEFAULT, &ids, &n, &cap), 0);
  if (!ids_equal(json_object_get(exp, "ids"), ids, n, &diff))
    th_fail(__FILE__, __LINE__, "%s: ids differ at %zu (got %zu ids, want %zu)", name, diff, n,
            json_array_size(json_object_get(exp, "ids")));
  /* the same without a state (no cache) */
  int32_t *ids2 = NULL;
  size_t n2 = 0, cap2 = 0;
  TH_CHECK_EQ_INT(tk_encode(tok, NULL, text, len, TK_DEFAULT, &ids2, &n2, &cap2), 0);
  TH_CHECK(n2 == n && (n == 0 || !memcmp(ids, ids2, n * sizeof *ids)));
  /* decode: reference text, and the input back after "<bos>" */
  char *out = NULL;
  size_t out_len = 0, out_cap = 0;
  TH_CHECK_EQ_INT(tk_decode(tok, ids, n, 0, &out, &out_len, &out_cap), 0);
  const char *want = json_string_value(json_object_get(exp, "decoded"));
  if (!want || strlen(want) != out_len || memcmp(want, out, out_len))
    th_fail(__FILE__, __LINE__, "%s: decode differs from the reference", name);
  /* the input comes back after "<bos>", unless it holds "▁" itself (which
   * the decoder turns into " ", as Hugging Face's does) */
  const int has_marker = memmem(text, len, "\xe2\x96\x81", 3) != NULL;
  TH_CHECK(has_marker ||
           (out_len == len + 5 && !memcmp(out, "<bos>", 5) && !memcmp(out + 5, text, len)));
  /* no special tokens: no BOS, "<bos>" text is plain text */
  TH_CHECK_EQ_INT(tk_encode(tok, st, text, len, 0, &ids, &n, &cap), 0);
  if (!ids_equal(json_object_get(exp, "ids_no_special"), ids, n, &diff))
    th_fail(__FILE__, __LINE__, "%s: ids_no_special differ at %zu", name, diff);
  TH_CHECK_EQ_INT(tk_decode(tok, ids, n, 1, &out, &out_len, &out_cap), 0);
  TH_CHECK(has_marker || (out_len == len && !memcmp(out, text, len)));
  free(out);
  free(ids);
  free(ids2);
  free(text);
}

TH_TEST(tok_conformance_fixtures) {
  const struct tk_tokenizer *tok = tt_gemma();
  json_error_t je;
  json_t *all = json_load_file(tt_fixture("expected.json"), 0, &je);
  TH_REQUIRE(json_is_object(all));
  TH_CHECK(json_object_size(all) >= 16);
  struct tk_state *st;
  TH_REQUIRE(tk_state_create(tok, &st) == 0);
  const char *name;
  json_t *exp;
  /* twice: the second pass runs from the word cache */
  for (int pass = 0; pass < 2; pass++) json_object_foreach(all, name, exp) check_doc(tok, st, name, exp);
  tk_state_free(st);
  json_decref(all);
}

TH_TEST(tok_gemma_facts) {
  const struct tk_tokenizer *tok = tt_gemma();
  TH_CHECK_EQ_INT(tk_n_vocab(tok), 262145);
  TH_CHECK_EQ_INT(tk_pad(tok), 0);
  TH_CHECK_EQ_INT(tk_eos(tok), 1);
  TH_CHECK_EQ_INT(tk_bos(tok), 2);
  TH_CHECK_EQ_INT(tk_unk(tok), 3);
  TH_CHECK_EQ_INT(tk_find(tok, "<start_of_turn>", 15), 105);
  TH_CHECK_EQ_INT(tk_find(tok, "<end_of_turn>", 13), 106);
  TH_CHECK_EQ_INT(tk_find(tok, "<image_soft_token>", 18), 262144);
  TH_CHECK_EQ_INT(tk_find(tok, "no such token!", 14), -1);
  TH_CHECK(tk_is_special(tok, 106));
  TH_CHECK(!tk_is_special(tok, 107)); /* "\n" is added but not special */
  int32_t b = tk_find(tok, "<0x0A>", 6);
  TH_CHECK(b >= 0 && tk_byte_value(tok, b) == 10);
  TH_CHECK_EQ_INT(tk_byte_value(tok, 2), -1);
  size_t len;
  const char *s = tk_token_str(tok, 9259, &len);
  TH_CHECK(s && len == 5 && !memcmp(s, "Hello", 5));
  TH_CHECK(tk_token_str(tok, -1, &len) == NULL);
  TH_CHECK(tk_token_str(tok, 262145, &len) == NULL);
  char piece[64];
  int32_t sp = tk_find(tok, "\xe2\x96\x81world", 8);
  TH_REQUIRE(sp >= 0);
  TH_CHECK_EQ_INT(tk_token_to_piece(tok, sp, piece, sizeof piece, &len), 0);
  TH_CHECK_EQ_STR(piece, " world");
  TH_CHECK_EQ_INT(tk_token_to_piece(tok, sp, piece, 3, &len), CM_ERR_TOOBIG);
}

TH_TEST(tok_gemma_hello) {
  const struct tk_tokenizer *tok = tt_gemma();
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  const char *t = "Hello, my dog is cute";
  TH_REQUIRE(tk_encode(tok, NULL, t, strlen(t), TK_DEFAULT, &ids, &n, &cap) == 0);
  const int32_t want[] = {2, 9259, 236764, 1041, 4799, 563, 12864};
  TH_CHECK_EQ_INT(n, 7);
  TH_CHECK(n == 7 && !memcmp(ids, want, sizeof want));
  /* invalid UTF-8 is refused */
  const char bad[][6] = {"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    TH_CHECK_EQ_INT(tk_encode(tok, NULL, bad[i], strlen(bad[i]), TK_DEFAULT, &ids, &n, &cap),
                    CM_ERR_INVAL);
  /* out-of-range ids are refused by decode */
  char *out = NULL;
  size_t ol = 0, oc = 0;
  int32_t badid[] = {2, 262145};
  TH_CHECK_EQ_INT(tk_decode(tok, badid, 2, 0, &out, &ol, &oc), CM_ERR_RANGE);
  int32_t neg[] = {-1};
  TH_CHECK_EQ_INT(tk_decode(tok, neg, 1, 0, &out, &ol, &oc), CM_ERR_RANGE);
  free(out);
  free(ids);
}
