/* tk-conf.c — the small sections of tokenizer.json, read with Jansson:
 * normalizer, pre_tokenizer, post_processor, decoder, the model's options
 * and added_tokens; and the tables derived after loading (byte-fallback
 * ids, one-character ids, word-cut points). Everything this tokenizer does
 * not implement is refused here with a message naming the field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hex.h"
#include "tokenizer/tk-load.h"

/* ---- helpers over Jansson sections ---------------------------------------- */

json_t *tk_ld_section(struct tk_ld *l, const char *s, size_t n, const char *name, int *rc) {
  json_error_t je;
  json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!j) *rc = tk_ld_err(l, CM_ERR_PARSE, "%s: %s (line %d)", name, je.text, je.line);
  return j;
}

static const char *jstr(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Accepts a section whose "type" is the one this tokenizer supports there
 * (want); any other is refused naming the section and what it supports. */
static int ld_type(struct tk_ld *l, json_t *o, const char *section, const char *want,
                   const char *supported) {
  const char *type = jstr(o, "type");
  if (type && !strcmp(type, want)) return 0;
  return tk_ld_err(l, CM_ERR_UNSUPPORTED, "%s.type \"%s\" is not supported (%s)", section,
                   type ? type : "?", supported);
}

/* Reads a {"String": "x"} pattern; regex patterns are refused. */
static int ld_pattern(struct tk_ld *l, json_t *o, const char *field, const char **out, size_t *len) {
  json_t *p = json_object_get(o, "pattern");
  json_t *s = json_object_get(p, "String");
  if (!json_is_string(s) || json_string_length(s) == 0)
    return tk_ld_err(l, CM_ERR_UNSUPPORTED, "%s.pattern: only a non-empty {\"String\": ...} is "
                  "supported (Regex patterns are not)", field);
  *out = json_string_value(s);
  *len = json_string_length(s);
  return 0;
}

static int ld_replace(struct tk_ld *l, json_t *o, const char *field, struct tk_replace *r) {
  const char *from;
  size_t nf;
  int rc = ld_pattern(l, o, field, &from, &nf);
  if (rc) return rc;
  json_t *c = json_object_get(o, "content");
  if (!json_is_string(c)) return tk_ld_err(l, CM_ERR_PARSE, "%s.content: missing", field);
  r->from = strndup(from, nf);
  r->to = strndup(json_string_value(c), json_string_length(c));
  if (!r->from || !r->to) return CM_ERR_NOMEM;
  r->from_len = nf;
  r->to_len = json_string_length(c);
  return 0;
}

/* ---- normalizer / pre_tokenizer / post_processor / decoder ---------------- */

int tk_ld_normalizer(struct tk_ld *l, json_t *n) {
  struct tk_tokenizer *tok = l->tok;
  if (json_is_null(n)) return 0;
  const char *type = jstr(n, "type");
  if (type && !strcmp(type, "Replace")) {
    tok->n_norm = 1;
    return ld_replace(l, n, "normalizer", &tok->norm[0]);
  }
  if (type && !strcmp(type, "Sequence")) {
    json_t *arr = json_object_get(n, "normalizers");
    size_t i;
    json_t *e;
    if (!json_is_array(arr)) return tk_ld_err(l, CM_ERR_PARSE, "normalizer.normalizers: missing");
    json_array_foreach(arr, i, e) {
      const char *t = jstr(e, "type");
      if (!t || strcmp(t, "Replace"))
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "normalizer.normalizers[%zu].type \"%s\" is not "
                      "supported (only Replace)", i, t ? t : "?");
      if (tok->n_norm == TK_MAX_REPLACE)
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "normalizer: more than %d steps", TK_MAX_REPLACE);
      int rc = ld_replace(l, e, "normalizer.normalizers[]", &tok->norm[tok->n_norm++]);
      if (rc) return rc;
    }
    return 0;
  }
  return tk_ld_err(l, CM_ERR_UNSUPPORTED, "normalizer.type \"%s\" is not supported (null, Replace "
                "or a Sequence of Replace)", type ? type : "?");
}

int tk_ld_pre_tokenizer(struct tk_ld *l, json_t *p) {
  struct tk_tokenizer *tok = l->tok;
  if (json_is_null(p)) return 0;
  const char *pat;
  size_t n;
  int rc;
  if ((rc = ld_type(l, p, "pre_tokenizer", "Split", "null or Split on a String")) ||
      (rc = ld_pattern(l, p, "pre_tokenizer", &pat, &n)))
    return rc;
  if (json_is_true(json_object_get(p, "invert")))
    return tk_ld_err(l, CM_ERR_UNSUPPORTED, "pre_tokenizer.invert true is not supported");
  const char *b = jstr(p, "behavior");
  if (b && !strcmp(b, "Removed")) tok->split = TK_SPLIT_REMOVED;
  else if (b && !strcmp(b, "Isolated")) tok->split = TK_SPLIT_ISOLATED;
  else if (b && !strcmp(b, "MergedWithPrevious")) tok->split = TK_SPLIT_MERGED_PREV;
  else if (b && !strcmp(b, "MergedWithNext")) tok->split = TK_SPLIT_MERGED_NEXT;
  else
    return tk_ld_err(l, CM_ERR_UNSUPPORTED, "pre_tokenizer.behavior \"%s\" is not supported",
                  b ? b : "?");
  tok->split_pat = strndup(pat, n);
  tok->split_len = n;
  return tok->split_pat ? 0 : CM_ERR_NOMEM;
}

int tk_ld_post_processor(struct tk_ld *l, json_t *p) {
  struct tk_tokenizer *tok = l->tok;
  if (json_is_null(p)) return 0;
  int rc = ld_type(l, p, "post_processor", "TemplateProcessing", "null or TemplateProcessing");
  if (rc) return rc;
  json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
  if (!json_is_array(single))
    return tk_ld_err(l, CM_ERR_PARSE, "post_processor.single: missing");
  int seen_a = 0;
  size_t i;
  json_t *e;
  json_array_foreach(single, i, e) {
    json_t *st = json_object_get(e, "SpecialToken"), *sq = json_object_get(e, "Sequence");
    if (sq) {
      const char *sid = jstr(sq, "id");
      if (seen_a || !sid || strcmp(sid, "A"))
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "post_processor.single[%zu]: only one Sequence A "
                      "is supported", i);
      seen_a = 1;
      continue;
    }
    const char *name = jstr(st, "id");
    json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
    if (!name || !json_is_array(ids))
      return tk_ld_err(l, CM_ERR_PARSE, "post_processor.single[%zu]: unknown special token", i);
    size_t k;
    json_t *idv;
    json_array_foreach(ids, k, idv) {
      json_int_t id = json_integer_value(idv);
      if (!json_is_integer(idv) || id < 0 || id >= tok->n_ids)
        return tk_ld_err(l, CM_ERR_RANGE, "post_processor.special_tokens.%s: bad id", name);
      if ((seen_a ? tok->n_post_suf : tok->n_post_pre) == TK_MAX_POST)
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "post_processor: too many special tokens");
      if (seen_a) tok->post_suf[tok->n_post_suf++] = (int32_t)id;
      else tok->post_pre[tok->n_post_pre++] = (int32_t)id;
    }
  }
  if (!seen_a) return tk_ld_err(l, CM_ERR_PARSE, "post_processor.single: no Sequence A");
  return 0;
}

int tk_ld_decoder(struct tk_ld *l, json_t *d) {
  struct tk_tokenizer *tok = l->tok;
  if (json_is_null(d)) return 0;
  tok->has_decoder = 1;
  const char *type = jstr(d, "type");
  json_t *steps = d;
  int one = 1;
  if (type && !strcmp(type, "Sequence")) {
    steps = json_object_get(d, "decoders");
    if (!json_is_array(steps)) return tk_ld_err(l, CM_ERR_PARSE, "decoder.decoders: missing");
    one = 0;
  }
  size_t n = one ? 1 : json_array_size(steps);
  int fused = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = one ? d : json_array_get(steps, i);
    const char *t = jstr(e, "type");
    /* byte fallback must come after the Replace steps and Fuse last: that
     * is the only order in which per-token text can be streamed */
    if (t && !strcmp(t, "Replace") && !tok->dec_byte_fallback && !fused) {
      if (tok->n_dec == TK_MAX_REPLACE)
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "decoder: more than %d steps", TK_MAX_REPLACE);
      int rc = ld_replace(l, e, "decoder.decoders[]", &tok->dec[tok->n_dec++]);
      if (rc) return rc;
    } else if (t && !strcmp(t, "ByteFallback") && !tok->dec_byte_fallback && !fused) {
      tok->dec_byte_fallback = 1;
    } else if (t && !strcmp(t, "Fuse")) {
      fused = 1;
    } else {
      return tk_ld_err(l, CM_ERR_UNSUPPORTED, "decoder.decoders[%zu].type \"%s\" is not supported "
                    "here (Replace, then ByteFallback, then Fuse)", i, t ? t : "?");
    }
  }
  return 0;
}

int tk_ld_model_opts(struct tk_ld *l, json_t *m) {
  struct tk_tokenizer *tok = l->tok;
  const char *type = jstr(m, "type");
  if (type && strcmp(type, "BPE"))
    return tk_ld_err(l, CM_ERR_UNSUPPORTED, "model.type \"%s\" is not supported (only BPE)", type);
  static const char *const must_null[] = {"dropout", "continuing_subword_prefix",
                                          "end_of_word_suffix"};
  for (size_t i = 0; i < sizeof must_null / sizeof must_null[0]; i++) {
    json_t *v = json_object_get(m, must_null[i]);
    if (v && !json_is_null(v))
      return tk_ld_err(l, CM_ERR_UNSUPPORTED, "model.%s must be null", must_null[i]);
  }
  tok->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
  tok->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
  tok->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
  const char *unk = jstr(m, "unk_token");
  tok->unk = -1;
  if (unk) {
    tok->unk = tk_vocab_get(tok, unk, strlen(unk));
    if (tok->unk < 0) return tk_ld_err(l, CM_ERR_PARSE, "model.unk_token \"%s\" not in vocab", unk);
  }
  return 0;
}

/* ---- added_tokens ---------------------------------------------------------- */

static int trie_add(struct tk_tokenizer *tok, const char *s, size_t n, int32_t id) {
  int32_t node = -1;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    int32_t ch = node < 0 ? tok->trie_root[c] : tok->trie[node].child;
    if (node >= 0)
      while (ch >= 0 && tok->trie[ch].byte != c) ch = tok->trie[ch].sibling;
    if (ch < 0) {
      if (tok->n_trie == tok->cap_trie) {
        int32_t nc = tok->cap_trie ? tok->cap_trie * 2 : 4096;
        struct tk_trie_node *nt = realloc(tok->trie, (size_t)nc * sizeof *nt);
        if (!nt) return CM_ERR_NOMEM;
        tok->trie = nt;
        tok->cap_trie = nc;
      }
      ch = tok->n_trie++;
      tok->trie[ch] = (struct tk_trie_node){.child = -1, .sibling = -1, .id = -1, .byte = c};
      if (node < 0) {
        tok->trie_root[c] = ch;
      } else {
        tok->trie[ch].sibling = tok->trie[node].child;
        tok->trie[node].child = ch;
      }
    }
    node = ch;
  }
  tok->trie[node].id = id;
  return 0;
}

/* First pass: the highest added id, so the id tables can be sized. */
int tk_ld_added_max(struct tk_ld *l, json_t *arr, int32_t *max_id) {
  size_t i;
  json_t *e;
  if (!json_is_array(arr)) return tk_ld_err(l, CM_ERR_PARSE, "added_tokens: not an array");
  json_array_foreach(arr, i, e) {
    json_t *idv = json_object_get(e, "id");
    json_int_t id = json_integer_value(idv);
    if (!json_is_integer(idv) || id < 0 || id >= (1 << 24) || !jstr(e, "content") ||
        !json_string_length(json_object_get(e, "content")))
      return tk_ld_err(l, CM_ERR_PARSE, "added_tokens[%zu]: needs an id and a non-empty content", i);
    if (id > *max_id) *max_id = (int32_t)id;
  }
  return 0;
}

int tk_ld_added(struct tk_ld *l, json_t *arr) {
  struct tk_tokenizer *tok = l->tok;
  size_t i;
  json_t *e;
  static const char *const must_false[] = {"single_word", "lstrip", "rstrip", "normalized"};
  json_array_foreach(arr, i, e) {
    int32_t id = (int32_t)json_integer_value(json_object_get(e, "id"));
    json_t *c = json_object_get(e, "content");
    for (size_t k = 0; k < sizeof must_false / sizeof must_false[0]; k++)
      if (json_is_true(json_object_get(e, must_false[k])))
        return tk_ld_err(l, CM_ERR_UNSUPPORTED, "added_tokens[%zu].%s true is not supported", i,
                      must_false[k]);
    const char *s = json_string_value(c);
    size_t n = json_string_length(c);
    if (!tk_utf8_valid(s, n)) return tk_ld_err(l, CM_ERR_PARSE, "added_tokens[%zu]: bad UTF-8", i);
    if (!(tok->tok_flags[id] & TK_TOKF_PRESENT) || tok->tok_len[id] != n ||
        memcmp(tok->blob + tok->tok_off[id], s, n)) {
      uint32_t off;
      int rc = tk_blob_add(tok, s, n, &off);
      if (rc) return rc;
      tok->tok_off[id] = off;
      tok->tok_len[id] = (uint32_t)n;
    }
    tok->tok_flags[id] |= TK_TOKF_PRESENT | TK_TOKF_ADDED;
    if (json_is_true(json_object_get(e, "special"))) tok->tok_flags[id] |= TK_TOKF_SPECIAL;
    int rc = trie_add(tok, s, n, id);
    if (rc) return rc;
    tok->n_added++;
  }
  return 0;
}

int tk_ld_bytes(struct tk_tokenizer *tok) {
  static const char hex[] = "0123456789ABCDEF";
  tok->bmp_id = malloc(0x10000 * sizeof *tok->bmp_id);
  if (!tok->bmp_id) return CM_ERR_NOMEM;
  memset(tok->bmp_id, 0xff, 0x10000 * sizeof *tok->bmp_id);
  for (int b = 0; b < 256; b++) {
    char s[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
    tok->byte_id[b] = tk_vocab_get(tok, s, 6);
  }
  /* one-character tokens of the BMP, for the BPE's first step */
  for (int32_t id = 0; id < tok->n_ids; id++) {
    const unsigned char *u = (const unsigned char *)tok->blob + tok->tok_off[id];
    uint32_t n = tok->tok_len[id], cp;
    if (n == 1 && u[0] < 0x80) cp = u[0];
    else if (n == 2 && (u[0] & 0xE0) == 0xC0) cp = (u[0] & 0x1Fu) << 6 | (u[1] & 0x3Fu);
    else if (n == 3 && (u[0] & 0xF0) == 0xE0)
      cp = (u[0] & 0x0Fu) << 12 | (u[1] & 0x3Fu) << 6 | (u[2] & 0x3Fu);
    else continue;
    if (tk_vocab_get(tok, (const char *)u, n) == id) tok->bmp_id[cp] = id;
  }
  /* the decoder's rule: any token spelled <0xHH> (either case) is a byte */
  for (int32_t id = 0; id < tok->n_ids; id++) {
    const char *s = tok->blob + tok->tok_off[id];
    if (tok->tok_len[id] != 6 || memcmp(s, "<0x", 3) || s[5] != '>') continue;
    int v = 0, ok = 1;
    for (int k = 3; k < 5; k++) {
      int d = cm_hex_digit((unsigned char)s[k]);
      if (d < 0) ok = 0;
      v = v << 4 | (d < 0 ? 0 : d);
    }
    if (ok) {
      tok->byte_of[id] = (int16_t)v;
      tok->tok_flags[id] |= TK_TOKF_BYTE;
    }
  }
  return 0;
}

/* Finds where pre-tokens may be cut for the word cache (see tk-impl.h). */
void tk_ld_cross(struct tk_tokenizer *tok) {
  tok->marker = NULL;
  if (tok->n_norm != 1 || tok->ignore_merges || tok->norm[0].to_len == 0) return;
  const char *m = tok->norm[0].to;
  size_t ml = tok->norm[0].to_len;
  for (int32_t id = 0; id < tok->n_ids; id++) {
    const char *s = tok->blob + tok->tok_off[id];
    size_t n = tok->tok_len[id];
    for (size_t k = 1; k + ml <= n; k++) {
      if (memcmp(s + k, m, ml)) continue;
      if (k >= ml && !memcmp(s + k - ml, m, ml)) continue; /* inside a run of M */
      if (tok->n_cross == (int)(sizeof tok->cross_id / sizeof tok->cross_id[0])) return;
      tok->cross_id[tok->n_cross] = id;
      tok->cross_off[tok->n_cross++] = (uint32_t)k;
    }
  }
  tok->marker = m;
  tok->marker_len = ml;
}

