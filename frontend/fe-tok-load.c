/* fe-tok-load.c — builds a struct fe_tok from a Hugging Face tokenizer.json.
 *
 * The file is read whole and scanned in place (fe-tok-json.h): the model's
 * vocab and merges stream straight into hash tables; the small sections
 * (normalizer, pre_tokenizer, post_processor, decoder, added_tokens) go
 * through Jansson. Anything this tokenizer does not implement is refused
 * with a message naming the field (see fe-tokenizer.h for what is
 * supported). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "frontend/fe-tok-impl.h"
#include "frontend/fe-tok-json.h"

struct ld {
  struct fe_tok *tok;
  char *err;
  size_t errlen;
  /* vocab entries as read, before the id arrays are sized */
  uint32_t *v_off, *v_len;
  int32_t *v_id;
  size_t n_v, cap_v;
};

__attribute__((format(printf, 3, 4))) static int ld_err(struct ld *l, int code, const char *fmt,
                                                        ...) {
  if (l->err && l->errlen) {
    int n = snprintf(l->err, l->errlen, "tokenizer.json: ");
    if (n > 0 && (size_t)n < l->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(l->err + n, l->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return code;
}

static int blob_add(struct fe_tok *tok, const char *s, size_t len, uint32_t *off) {
  if (tok->blob_len + len + 1 > UINT32_MAX) return CM_ERR_TOOBIG;
  if (tok->blob_len + len + 1 > tok->blob_cap) {
    size_t nc = tok->blob_cap ? tok->blob_cap * 2 : 1 << 20;
    while (nc < tok->blob_len + len + 1) nc *= 2;
    char *nb = realloc(tok->blob, nc);
    if (!nb) return CM_ERR_NOMEM;
    tok->blob = nb;
    tok->blob_cap = nc;
  }
  memcpy(tok->blob + tok->blob_len, s, len);
  tok->blob[tok->blob_len + len] = 0;
  *off = (uint32_t)tok->blob_len;
  tok->blob_len += len + 1;
  return 0;
}

/* ---- model.vocab ---------------------------------------------------------- */

static int ld_vocab(struct ld *l, const char *text, size_t len) {
  struct fe_tok *tok = l->tok;
  struct fe_tj t;
  int rc;
  fe_tj_init(&t, text, len);
  if ((rc = fe_tj_expect(&t, '{'))) goto parse;
  if (fe_tj_peek(&t) == '}') {
    fe_tj_free(&t);
    return ld_err(l, CM_ERR_PARSE, "model.vocab is empty");
  }
  do {
    const char *s;
    size_t n;
    int64_t id;
    if ((rc = fe_tj_string(&t, &s, &n)) || (rc = fe_tj_expect(&t, ':')) ||
        (rc = fe_tj_int(&t, &id)))
      goto parse;
    if (id < 0 || id >= (1 << 24)) {
      fe_tj_free(&t);
      return ld_err(l, CM_ERR_RANGE, "model.vocab: id %lld of \"%.40s\" out of range",
                    (long long)id, s);
    }
    if (l->n_v == l->cap_v) {
      size_t nc = l->cap_v ? l->cap_v * 2 : 65536;
      uint32_t *a = realloc(l->v_off, nc * sizeof *a);
      if (a) l->v_off = a;
      uint32_t *b = realloc(l->v_len, nc * sizeof *b);
      if (b) l->v_len = b;
      int32_t *c = realloc(l->v_id, nc * sizeof *c);
      if (c) l->v_id = c;
      if (!a || !b || !c) {
        fe_tj_free(&t);
        return CM_ERR_NOMEM;
      }
      l->cap_v = nc;
    }
    uint32_t off;
    if ((rc = blob_add(tok, s, n, &off))) {
      fe_tj_free(&t);
      return rc;
    }
    l->v_off[l->n_v] = off;
    l->v_len[l->n_v] = (uint32_t)n;
    l->v_id[l->n_v] = (int32_t)id;
    l->n_v++;
  } while ((rc = fe_tj_more(&t, '}')) == 1);
  if (rc < 0) goto parse;
  fe_tj_free(&t);
  return 0;
parse:
  fe_tj_free(&t);
  if (rc == CM_ERR_NOMEM) return rc;
  return ld_err(l, CM_ERR_PARSE, "model.vocab: malformed JSON near byte %zu of the section",
                t.err_off);
}

/* Sizes the id tables for ids [0, n_ids) and fills in the model vocab. */
static int ld_ids(struct ld *l, int32_t n_ids) {
  struct fe_tok *tok = l->tok;
  tok->n_ids = n_ids;
  tok->tok_off = calloc((size_t)n_ids, sizeof *tok->tok_off);
  tok->tok_len = calloc((size_t)n_ids, sizeof *tok->tok_len);
  tok->tok_flags = calloc((size_t)n_ids, 1);
  tok->byte_of = malloc((size_t)n_ids * sizeof *tok->byte_of);
  uint32_t hsize = 1024;
  while (hsize < l->n_v * 2) hsize *= 2;
  tok->vhash = malloc(hsize * sizeof *tok->vhash);
  if (!tok->tok_off || !tok->tok_len || !tok->tok_flags || !tok->byte_of || !tok->vhash)
    return CM_ERR_NOMEM;
  tok->vmask = hsize - 1;
  memset(tok->vhash, 0, hsize * sizeof *tok->vhash);
  for (int32_t i = 0; i < n_ids; i++) tok->byte_of[i] = -1;
  for (size_t i = 0; i < l->n_v; i++) {
    int32_t id = l->v_id[i];
    if (tok->tok_flags[id] & FE_TOKF_PRESENT)
      return ld_err(l, CM_ERR_PARSE, "model.vocab: id %d appears twice", id);
    tok->tok_off[id] = l->v_off[i];
    tok->tok_len[id] = l->v_len[i];
    tok->tok_flags[id] = FE_TOKF_PRESENT;
    const char *s = tok->blob + l->v_off[i];
    uint64_t hash = fe_tok_hash(s, l->v_len[i]);
    uint32_t h = (uint32_t)hash & tok->vmask;
    while (tok->vhash[h]) {
      uint64_t e = tok->vhash[h];
      int32_t o = (int32_t)(uint32_t)e - 1;
      if ((uint32_t)(e >> 32) == fe_tok_vtag(hash, l->v_len[i]) && tok->tok_len[o] == l->v_len[i] &&
          !memcmp(tok->blob + tok->tok_off[o], s, l->v_len[i]))
        return ld_err(l, CM_ERR_PARSE, "model.vocab: \"%.40s\" appears twice", s);
      h = (h + 1) & tok->vmask;
    }
    tok->vhash[h] = (uint64_t)fe_tok_vtag(hash, l->v_len[i]) << 32 | (uint32_t)(id + 1);
  }
  tok->n_model = (int32_t)l->n_v;
  return 0;
}

/* ---- model.merges --------------------------------------------------------- */

static int ld_merge_add(struct ld *l, int32_t rank, const char *a, size_t na, const char *b,
                        size_t nb, char **cat, size_t *catcap) {
  struct fe_tok *tok = l->tok;
  int32_t ia = fe_tok_vocab_get(tok, a, na), ib = fe_tok_vocab_get(tok, b, nb);
  if (ia < 0 || ib < 0)
    return ld_err(l, CM_ERR_PARSE, "model.merges[%d]: \"%.*s\" is not in the vocab", rank,
                  (int)(ia < 0 ? (na < 40 ? na : 40) : (nb < 40 ? nb : 40)), ia < 0 ? a : b);
  if (na + nb > *catcap) {
    size_t nc = (na + nb) * 2;
    char *c = realloc(*cat, nc);
    if (!c) return CM_ERR_NOMEM;
    *cat = c;
    *catcap = nc;
  }
  memcpy(*cat, a, na);
  memcpy(*cat + na, b, nb);
  int32_t r = fe_tok_vocab_get(tok, *cat, na + nb);
  if (r < 0)
    return ld_err(l, CM_ERR_PARSE, "model.merges[%d]: the merged token is not in the vocab",
                  rank);
  uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
  uint64_t h = fe_tok_hash((const char *)&key, sizeof key) & tok->mmask;
  while (tok->mhash[h].key != UINT64_MAX && tok->mhash[h].key != key) h = (h + 1) & tok->mmask;
  tok->mhash[h].key = key; /* a repeated pair keeps the later rank, as HF's map does */
  tok->mhash[h].rank = rank;
  tok->mhash[h].result = r;
  return 0;
}

static int ld_merges(struct ld *l, const char *text, size_t len) {
  struct fe_tok *tok = l->tok;
  struct fe_tj t;
  char *cat = NULL, *first = NULL;
  size_t catcap = 0, firstcap = 0;
  int rc;
  /* size the table from the commas: one per entry ("a b" strings) or two
   * ([a, b] pairs) */
  size_t est = 1;
  for (size_t i = 0; i < len; i++) est += text[i] == ',';
  const char *first_el = text + 1;
  while (first_el < text + len && (*first_el == ' ' || *first_el == '\n')) first_el++;
  if (first_el < text + len && *first_el == '[') est = est / 2 + 1;
  uint64_t hsize = 1024;
  while (hsize < est * 2) hsize *= 2;
  tok->mhash = malloc(hsize * sizeof *tok->mhash);
  if (!tok->mhash) return CM_ERR_NOMEM;
  tok->mmask = hsize - 1;
  for (uint64_t i = 0; i < hsize; i++) tok->mhash[i].key = UINT64_MAX;
  fe_tj_init(&t, text, len);
  if ((rc = fe_tj_expect(&t, '['))) goto parse;
  int32_t rank = 0;
  if (fe_tj_peek(&t) == ']') goto done;
  do {
    const char *s;
    size_t n;
    if (fe_tj_peek(&t) == '"') {
      if ((rc = fe_tj_string(&t, &s, &n))) goto parse;
      const char *sp = memchr(s, ' ', n);
      if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) {
        rc = ld_err(l, CM_ERR_PARSE, "model.merges[%d]: \"%.40s\" is not two tokens", rank, s);
        goto out;
      }
      rc = ld_merge_add(l, rank, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp - s) - 1, &cat,
                        &catcap);
    } else {
      size_t n1;
      if ((rc = fe_tj_expect(&t, '[')) || (rc = fe_tj_string(&t, &s, &n1))) goto parse;
      if (n1 + 1 > firstcap) {
        char *f = realloc(first, n1 + 64);
        if (!f) {
          rc = CM_ERR_NOMEM;
          goto out;
        }
        first = f;
        firstcap = n1 + 64;
      }
      memcpy(first, s, n1);
      if ((rc = fe_tj_expect(&t, ',')) || (rc = fe_tj_string(&t, &s, &n)) ||
          (rc = fe_tj_expect(&t, ']')))
        goto parse;
      rc = ld_merge_add(l, rank, first, n1, s, n, &cat, &catcap);
    }
    if (rc) goto out;
    rank++;
  } while ((rc = fe_tj_more(&t, ']')) == 1);
  if (rc < 0) goto parse;
done:
  tok->n_merges = rank;
  rc = 0;
  goto out;
parse:
  if (rc != CM_ERR_NOMEM)
    rc = ld_err(l, CM_ERR_PARSE, "model.merges: malformed JSON near byte %zu of the section",
                t.err_off);
out:
  fe_tj_free(&t);
  free(cat);
  free(first);
  return rc;
}

/* ---- helpers over Jansson sections ---------------------------------------- */

static json_t *ld_section(struct ld *l, const char *s, size_t n, const char *name, int *rc) {
  json_error_t je;
  json_t *j = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!j) *rc = ld_err(l, CM_ERR_PARSE, "%s: %s (line %d)", name, je.text, je.line);
  return j;
}

static const char *jstr(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Reads a {"String": "x"} pattern; regex patterns are refused. */
static int ld_pattern(struct ld *l, json_t *o, const char *field, const char **out, size_t *len) {
  json_t *p = json_object_get(o, "pattern");
  json_t *s = json_object_get(p, "String");
  if (!json_is_string(s) || json_string_length(s) == 0)
    return ld_err(l, CM_ERR_UNSUPPORTED, "%s.pattern: only a non-empty {\"String\": ...} is "
                  "supported (Regex patterns are not)", field);
  *out = json_string_value(s);
  *len = json_string_length(s);
  return 0;
}

static int ld_replace(struct ld *l, json_t *o, const char *field, struct fe_tok_replace *r) {
  const char *from;
  size_t nf;
  int rc = ld_pattern(l, o, field, &from, &nf);
  if (rc) return rc;
  json_t *c = json_object_get(o, "content");
  if (!json_is_string(c)) return ld_err(l, CM_ERR_PARSE, "%s.content: missing", field);
  r->from = strndup(from, nf);
  r->to = strndup(json_string_value(c), json_string_length(c));
  if (!r->from || !r->to) return CM_ERR_NOMEM;
  r->from_len = nf;
  r->to_len = json_string_length(c);
  return 0;
}

/* ---- normalizer / pre_tokenizer / post_processor / decoder ---------------- */

static int ld_normalizer(struct ld *l, json_t *n) {
  struct fe_tok *tok = l->tok;
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
    if (!json_is_array(arr)) return ld_err(l, CM_ERR_PARSE, "normalizer.normalizers: missing");
    json_array_foreach(arr, i, e) {
      const char *t = jstr(e, "type");
      if (!t || strcmp(t, "Replace"))
        return ld_err(l, CM_ERR_UNSUPPORTED, "normalizer.normalizers[%zu].type \"%s\" is not "
                      "supported (only Replace)", i, t ? t : "?");
      if (tok->n_norm == FE_TOK_MAX_REPLACE)
        return ld_err(l, CM_ERR_UNSUPPORTED, "normalizer: more than %d steps", FE_TOK_MAX_REPLACE);
      int rc = ld_replace(l, e, "normalizer.normalizers[]", &tok->norm[tok->n_norm++]);
      if (rc) return rc;
    }
    return 0;
  }
  return ld_err(l, CM_ERR_UNSUPPORTED, "normalizer.type \"%s\" is not supported (null, Replace "
                "or a Sequence of Replace)", type ? type : "?");
}

static int ld_pre_tokenizer(struct ld *l, json_t *p) {
  struct fe_tok *tok = l->tok;
  if (json_is_null(p)) return 0;
  const char *type = jstr(p, "type");
  if (!type || strcmp(type, "Split"))
    return ld_err(l, CM_ERR_UNSUPPORTED, "pre_tokenizer.type \"%s\" is not supported (null or "
                  "Split on a String)", type ? type : "?");
  const char *pat;
  size_t n;
  int rc = ld_pattern(l, p, "pre_tokenizer", &pat, &n);
  if (rc) return rc;
  if (json_is_true(json_object_get(p, "invert")))
    return ld_err(l, CM_ERR_UNSUPPORTED, "pre_tokenizer.invert true is not supported");
  const char *b = jstr(p, "behavior");
  if (b && !strcmp(b, "Removed")) tok->split = FE_SPLIT_REMOVED;
  else if (b && !strcmp(b, "Isolated")) tok->split = FE_SPLIT_ISOLATED;
  else if (b && !strcmp(b, "MergedWithPrevious")) tok->split = FE_SPLIT_MERGED_PREV;
  else if (b && !strcmp(b, "MergedWithNext")) tok->split = FE_SPLIT_MERGED_NEXT;
  else
    return ld_err(l, CM_ERR_UNSUPPORTED, "pre_tokenizer.behavior \"%s\" is not supported",
                  b ? b : "?");
  tok->split_pat = strndup(pat, n);
  tok->split_len = n;
  return tok->split_pat ? 0 : CM_ERR_NOMEM;
}

static int ld_post_processor(struct ld *l, json_t *p) {
  struct fe_tok *tok = l->tok;
  if (json_is_null(p)) return 0;
  const char *type = jstr(p, "type");
  if (!type || strcmp(type, "TemplateProcessing"))
    return ld_err(l, CM_ERR_UNSUPPORTED, "post_processor.type \"%s\" is not supported (null or "
                  "TemplateProcessing)", type ? type : "?");
  json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
  if (!json_is_array(single))
    return ld_err(l, CM_ERR_PARSE, "post_processor.single: missing");
  int seen_a = 0;
  size_t i;
  json_t *e;
  json_array_foreach(single, i, e) {
    json_t *st = json_object_get(e, "SpecialToken"), *sq = json_object_get(e, "Sequence");
    if (sq) {
      const char *sid = jstr(sq, "id");
      if (seen_a || !sid || strcmp(sid, "A"))
        return ld_err(l, CM_ERR_UNSUPPORTED, "post_processor.single[%zu]: only one Sequence A "
                      "is supported", i);
      seen_a = 1;
      continue;
    }
    const char *name = jstr(st, "id");
    json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
    if (!name || !json_is_array(ids))
      return ld_err(l, CM_ERR_PARSE, "post_processor.single[%zu]: unknown special token", i);
    size_t k;
    json_t *idv;
    json_array_foreach(ids, k, idv) {
      json_int_t id = json_integer_value(idv);
      if (!json_is_integer(idv) || id < 0 || id >= tok->n_ids)
        return ld_err(l, CM_ERR_RANGE, "post_processor.special_tokens.%s: bad id", name);
      if ((seen_a ? tok->n_post_suf : tok->n_post_pre) == FE_TOK_MAX_POST)
        return ld_err(l, CM_ERR_UNSUPPORTED, "post_processor: too many special tokens");
      if (seen_a) tok->post_suf[tok->n_post_suf++] = (int32_t)id;
      else tok->post_pre[tok->n_post_pre++] = (int32_t)id;
    }
  }
  if (!seen_a) return ld_err(l, CM_ERR_PARSE, "post_processor.single: no Sequence A");
  return 0;
}

static int ld_decoder(struct ld *l, json_t *d) {
  struct fe_tok *tok = l->tok;
  if (json_is_null(d)) return 0;
  tok->has_decoder = 1;
  const char *type = jstr(d, "type");
  json_t *steps = d;
  int one = 1;
  if (type && !strcmp(type, "Sequence")) {
    steps = json_object_get(d, "decoders");
    if (!json_is_array(steps)) return ld_err(l, CM_ERR_PARSE, "decoder.decoders: missing");
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
      if (tok->n_dec == FE_TOK_MAX_REPLACE)
        return ld_err(l, CM_ERR_UNSUPPORTED, "decoder: more than %d steps", FE_TOK_MAX_REPLACE);
      int rc = ld_replace(l, e, "decoder.decoders[]", &tok->dec[tok->n_dec++]);
      if (rc) return rc;
    } else if (t && !strcmp(t, "ByteFallback") && !tok->dec_byte_fallback && !fused) {
      tok->dec_byte_fallback = 1;
    } else if (t && !strcmp(t, "Fuse")) {
      fused = 1;
    } else {
      return ld_err(l, CM_ERR_UNSUPPORTED, "decoder.decoders[%zu].type \"%s\" is not supported "
                    "here (Replace, then ByteFallback, then Fuse)", i, t ? t : "?");
    }
  }
  return 0;
}

static int ld_model_opts(struct ld *l, json_t *m) {
  struct fe_tok *tok = l->tok;
  const char *type = jstr(m, "type");
  if (type && strcmp(type, "BPE"))
    return ld_err(l, CM_ERR_UNSUPPORTED, "model.type \"%s\" is not supported (only BPE)", type);
  static const char *const must_null[] = {"dropout", "continuing_subword_prefix",
                                          "end_of_word_suffix"};
  for (size_t i = 0; i < sizeof must_null / sizeof must_null[0]; i++) {
    json_t *v = json_object_get(m, must_null[i]);
    if (v && !json_is_null(v))
      return ld_err(l, CM_ERR_UNSUPPORTED, "model.%s must be null", must_null[i]);
  }
  tok->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
  tok->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
  tok->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
  const char *unk = jstr(m, "unk_token");
  tok->unk = -1;
  if (unk) {
    tok->unk = fe_tok_vocab_get(tok, unk, strlen(unk));
    if (tok->unk < 0) return ld_err(l, CM_ERR_PARSE, "model.unk_token \"%s\" not in vocab", unk);
  }
  return 0;
}

/* ---- added_tokens ---------------------------------------------------------- */

static int trie_add(struct fe_tok *tok, const char *s, size_t n, int32_t id) {
  int32_t node = -1;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    int32_t ch = node < 0 ? tok->trie_root[c] : tok->trie[node].child;
    if (node >= 0)
      while (ch >= 0 && tok->trie[ch].byte != c) ch = tok->trie[ch].sibling;
    if (ch < 0) {
      if (tok->n_trie == tok->cap_trie) {
        int32_t nc = tok->cap_trie ? tok->cap_trie * 2 : 4096;
        struct fe_tok_trie_node *nt = realloc(tok->trie, (size_t)nc * sizeof *nt);
        if (!nt) return CM_ERR_NOMEM;
        tok->trie = nt;
        tok->cap_trie = nc;
      }
      ch = tok->n_trie++;
      tok->trie[ch] = (struct fe_tok_trie_node){.child = -1, .sibling = -1, .id = -1, .byte = c};
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
static int ld_added_max(struct ld *l, json_t *arr, int32_t *max_id) {
  size_t i;
  json_t *e;
  if (!json_is_array(arr)) return ld_err(l, CM_ERR_PARSE, "added_tokens: not an array");
  json_array_foreach(arr, i, e) {
    json_t *idv = json_object_get(e, "id");
    json_int_t id = json_integer_value(idv);
    if (!json_is_integer(idv) || id < 0 || id >= (1 << 24) || !jstr(e, "content") ||
        !json_string_length(json_object_get(e, "content")))
      return ld_err(l, CM_ERR_PARSE, "added_tokens[%zu]: needs an id and a non-empty content", i);
    if (id > *max_id) *max_id = (int32_t)id;
  }
  return 0;
}

static int ld_added(struct ld *l, json_t *arr) {
  struct fe_tok *tok = l->tok;
  size_t i;
  json_t *e;
  static const char *const must_false[] = {"single_word", "lstrip", "rstrip", "normalized"};
  json_array_foreach(arr, i, e) {
    int32_t id = (int32_t)json_integer_value(json_object_get(e, "id"));
    json_t *c = json_object_get(e, "content");
    for (size_t k = 0; k < sizeof must_false / sizeof must_false[0]; k++)
      if (json_is_true(json_object_get(e, must_false[k])))
        return ld_err(l, CM_ERR_UNSUPPORTED, "added_tokens[%zu].%s true is not supported", i,
                      must_false[k]);
    const char *s = json_string_value(c);
    size_t n = json_string_length(c);
    if (!fe_utf8_valid(s, n)) return ld_err(l, CM_ERR_PARSE, "added_tokens[%zu]: bad UTF-8", i);
    if (!(tok->tok_flags[id] & FE_TOKF_PRESENT) || tok->tok_len[id] != n ||
        memcmp(tok->blob + tok->tok_off[id], s, n)) {
      uint32_t off;
      int rc = blob_add(tok, s, n, &off);
      if (rc) return rc;
      tok->tok_off[id] = off;
      tok->tok_len[id] = (uint32_t)n;
    }
    tok->tok_flags[id] |= FE_TOKF_PRESENT | FE_TOKF_ADDED;
    if (json_is_true(json_object_get(e, "special"))) tok->tok_flags[id] |= FE_TOKF_SPECIAL;
    int rc = trie_add(tok, s, n, id);
    if (rc) return rc;
    tok->n_added++;
  }
  return 0;
}

static int ld_bytes(struct fe_tok *tok) {
  static const char hex[] = "0123456789ABCDEF";
  tok->bmp_id = malloc(0x10000 * sizeof *tok->bmp_id);
  if (!tok->bmp_id) return CM_ERR_NOMEM;
  memset(tok->bmp_id, 0xff, 0x10000 * sizeof *tok->bmp_id);
  for (int b = 0; b < 256; b++) {
    char s[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
    tok->byte_id[b] = fe_tok_vocab_get(tok, s, 6);
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
    if (fe_tok_vocab_get(tok, (const char *)u, n) == id) tok->bmp_id[cp] = id;
  }
  /* the decoder's rule: any token spelled <0xHH> (either case) is a byte */
  for (int32_t id = 0; id < tok->n_ids; id++) {
    const char *s = tok->blob + tok->tok_off[id];
    if (tok->tok_len[id] != 6 || memcmp(s, "<0x", 3) || s[5] != '>') continue;
    int v = 0, ok = 1;
    for (int k = 3; k < 5; k++) {
      char c = s[k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else ok = 0;
    }
    if (ok) {
      tok->byte_of[id] = (int16_t)v;
      tok->tok_flags[id] |= FE_TOKF_BYTE;
    }
  }
  return 0;
}

/* Finds where pre-tokens may be cut for the word cache (see fe-tok-impl.h). */
static void ld_cross(struct fe_tok *tok) {
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

/* ---- the file ------------------------------------------------------------- */

static int ld_read_file(struct ld *l, const char *path, char **buf, size_t *len) {
  struct stat sb;
  char *full = NULL;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    size_t n = strlen(path) + sizeof "/tokenizer.json";
    full = malloc(n);
    if (!full) return CM_ERR_NOMEM;
    snprintf(full, n, "%s/tokenizer.json", path);
    path = full;
  }
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    rc = errno == ENOENT ? CM_ERR_NOENT : CM_ERR_IO;
    if (l->err) snprintf(l->err, l->errlen, "%s: %s", path, fd < 0 ? strerror(errno) :
                         "not a regular file");
    goto out;
  }
  if (sb.st_size > (off_t)1 << 31) {
    rc = ld_err(l, CM_ERR_TOOBIG, "file larger than 2 GiB");
    goto out;
  }
  *len = (size_t)sb.st_size;
  *buf = malloc(*len + 1);
  if (!*buf) {
    rc = CM_ERR_NOMEM;
    goto out;
  }
  size_t got = 0;
  while (got < *len) {
    ssize_t r = read(fd, *buf + got, *len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = ld_err(l, CM_ERR_IO, "read failed");
      goto out;
    }
    got += (size_t)r;
  }
  (*buf)[*len] = 0;
out:
  if (fd >= 0) close(fd);
  free(full);
  return rc;
}

struct span {
  const char *s;
  size_t n; /* bytes; 0 = absent */
};

/* Scans the top-level object and the model object, recording the raw
 * span of each section we use. */
static int ld_scan(struct ld *l, const char *buf, size_t len, struct span *sec, struct span *vocab,
                   struct span *merges, struct span *model_rest) {
  static const char *const names[] = {"added_tokens", "normalizer", "pre_tokenizer",
                                      "post_processor", "decoder"};
  struct fe_tj t;
  int rc;
  fe_tj_init(&t, buf, len);
  if ((rc = fe_tj_expect(&t, '{'))) goto parse;
  if (fe_tj_peek(&t) == '}') goto parse;
  do {
    const char *k;
    size_t kn;
    if ((rc = fe_tj_string(&t, &k, &kn)) || (rc = fe_tj_expect(&t, ':'))) goto parse;
    struct span *dst = NULL;
    for (size_t i = 0; i < 5; i++)
      if (!strcmp(k, names[i])) dst = &sec[i];
    if (strcmp(k, "model")) {
      const char *vs;
      size_t vn;
      if ((rc = fe_tj_skip(&t, &vs, &vn))) goto parse;
      if (dst) *dst = (struct span){vs, vn};
      continue;
    }
    /* model: stream past vocab and merges, keep the scalar options */
    if ((rc = fe_tj_expect(&t, '{'))) goto parse;
    model_rest->s = t.p - 1;
    if (fe_tj_peek(&t) != '}') {
      do {
        const char *mk;
        size_t mn;
        if ((rc = fe_tj_string(&t, &mk, &mn)) || (rc = fe_tj_expect(&t, ':'))) goto parse;
        struct span *md = !strcmp(mk, "vocab") ? vocab : !strcmp(mk, "merges") ? merges : NULL;
        const char *vs;
        size_t vn;
        if ((rc = fe_tj_skip(&t, &vs, &vn))) goto parse;
        if (md) *md = (struct span){vs, vn};
      } while ((rc = fe_tj_more(&t, '}')) == 1);
      if (rc < 0) goto parse;
    } else {
      t.p++;
    }
    model_rest->n = (size_t)(t.p - model_rest->s);
  } while ((rc = fe_tj_more(&t, '}')) == 1);
  if (rc < 0) goto parse;
  fe_tj_free(&t);
  return 0;
parse:
  fe_tj_free(&t);
  if (rc == CM_ERR_NOMEM) return rc;
  return ld_err(l, CM_ERR_PARSE, "malformed JSON near byte %zu", t.err_off);
}

/* The model object without vocab and merges, for its scalar options: a
 * compact copy with those two values replaced by 0. */
static json_t *ld_model_scalars(struct ld *l, struct span rest, struct span vocab,
                                struct span merges, int *rc) {
  char *copy = malloc(rest.n + 1);
  if (!copy) {
    *rc = CM_ERR_NOMEM;
    return NULL;
  }
  struct span cut[2] = {vocab, merges};
  if (cut[0].n && cut[1].n && cut[1].s < cut[0].s) {
    struct span t = cut[0];
    cut[0] = cut[1];
    cut[1] = t;
  }
  size_t n = 0;
  const char *p = rest.s;
  for (int i = 0; i < 2; i++) {
    if (!cut[i].n) continue;
    memcpy(copy + n, p, (size_t)(cut[i].s - p));
    n += (size_t)(cut[i].s - p);
    copy[n++] = '0';
    p = cut[i].s + cut[i].n;
  }
  memcpy(copy + n, p, (size_t)(rest.s + rest.n - p));
  n += (size_t)(rest.s + rest.n - p);
  json_t *m = ld_section(l, copy, n, "model", rc);
  free(copy);
  return m;
}

void fe_tok_free(struct fe_tok *tok) {
  if (!tok) return;
  free(tok->blob);
  free(tok->tok_off);
  free(tok->tok_len);
  free(tok->tok_flags);
  free(tok->byte_of);
  free(tok->bmp_id);
  free(tok->vhash);
  free(tok->mhash);
  free(tok->trie);
  for (int i = 0; i < tok->n_norm; i++) {
    free(tok->norm[i].from);
    free(tok->norm[i].to);
  }
  for (int i = 0; i < tok->n_dec; i++) {
    free(tok->dec[i].from);
    free(tok->dec[i].to);
  }
  free(tok->split_pat);
  free(tok);
}

int fe_tok_load(const char *path, struct fe_tok **out, char *errbuf, size_t errlen) {
  struct ld l = {.err = errbuf, .errlen = errlen};
  char *buf = NULL;
  size_t len = 0;
  json_t *js[5] = {0}, *model = NULL;
  struct span sec[5] = {{0}}, vocab = {0}, merges = {0}, rest = {0};
  int rc;
  *out = NULL;
  if (errbuf && errlen) errbuf[0] = 0;
  l.tok = calloc(1, sizeof *l.tok);
  if (!l.tok) return CM_ERR_NOMEM;
  struct fe_tok *tok = l.tok;
  memset(tok->trie_root, 0xff, sizeof tok->trie_root);
  if ((rc = ld_read_file(&l, path, &buf, &len))) goto fail;
  if ((rc = ld_scan(&l, buf, len, sec, &vocab, &merges, &rest))) goto fail;
  if (!rest.n) {
    rc = ld_err(&l, CM_ERR_PARSE, "no \"model\" object");
    goto fail;
  }
  if (!(model = ld_model_scalars(&l, rest, vocab, merges, &rc))) goto fail;
  const char *mtype = jstr(model, "type");
  if (!mtype || strcmp(mtype, "BPE")) {
    rc = ld_err(&l, CM_ERR_UNSUPPORTED, "model.type \"%s\" is not supported (only BPE)",
                mtype ? mtype : "(missing)");
    goto fail;
  }
  if (!vocab.n) {
    rc = ld_err(&l, CM_ERR_PARSE, "model.vocab is missing");
    goto fail;
  }
  static const char *const names[] = {"added_tokens", "normalizer", "pre_tokenizer",
                                      "post_processor", "decoder"};
  for (int i = 0; i < 5; i++) {
    if (!sec[i].n) js[i] = i == 0 ? json_array() : json_null();
    else if (!(js[i] = ld_section(&l, sec[i].s, sec[i].n, names[i], &rc))) goto fail;
  }
  if ((rc = ld_vocab(&l, vocab.s, vocab.n))) goto fail;
  int32_t max_id = -1;
  for (size_t i = 0; i < l.n_v; i++)
    if (l.v_id[i] > max_id) max_id = l.v_id[i];
  if ((rc = ld_added_max(&l, js[0], &max_id))) goto fail;
  if ((rc = ld_ids(&l, max_id + 1))) goto fail;
  if (merges.n && (rc = ld_merges(&l, merges.s, merges.n))) goto fail;
  if ((rc = ld_model_opts(&l, model)) || (rc = ld_added(&l, js[0])) ||
      (rc = ld_normalizer(&l, js[1])) || (rc = ld_pre_tokenizer(&l, js[2])) ||
      (rc = ld_post_processor(&l, js[3])) || (rc = ld_decoder(&l, js[4])))
    goto fail;
  for (int32_t id = 0; id < tok->n_ids; id++)
    if (!(tok->tok_flags[id] & FE_TOKF_PRESENT)) {
      rc = ld_err(&l, CM_ERR_PARSE, "id %d has no token (ids must be dense)", id);
      goto fail;
    }
  if ((rc = ld_bytes(tok))) goto fail;
  ld_cross(tok);
  tok->bos = fe_tok_find(tok, "<bos>", 5);
  if (tok->bos < 0) tok->bos = fe_tok_find(tok, "<s>", 3);
  if (tok->bos < 0 && tok->n_post_pre == 1) tok->bos = tok->post_pre[0];
  tok->eos = fe_tok_find(tok, "<eos>", 5);
  if (tok->eos < 0) tok->eos = fe_tok_find(tok, "</s>", 4);
  tok->pad = fe_tok_find(tok, "<pad>", 5);
  rc = 0;
  *out = tok;
  tok = NULL;
fail:
  for (int i = 0; i < 5; i++) json_decref(js[i]);
  json_decref(model);
  free(buf);
  free(l.v_off);
  free(l.v_len);
  free(l.v_id);
  fe_tok_free(tok);
  return rc;
}
