/* gr-dfa.c — from the NFA to the compiled grammar: bytes grouped into classes,
 * each rule determinized by subset construction (a call of rule R is a symbol
 * like a byte class: the states that call R move together to where R returns),
 * then trimmed so that every state left can still reach the end of its rule. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "grammar/gr-impl.h"

struct u32v {
  uint32_t *a;
  size_t n, cap;
};

/* Room for `more` elements past n. */
static __attribute__((noinline)) int u32v_grow(struct u32v *v, size_t more) {
  size_t cap = v->cap ? v->cap : 64;
  while (cap < v->n + more)
    cap *= 2;
  uint32_t *a = realloc(v->a, cap * sizeof *a);
  if (!a) return CM_ERR_NOMEM;
  v->a = a;
  v->cap = cap;
  return 0;
}

static inline int u32v_reserve(struct u32v *v, size_t more) {
  return v->n + more <= v->cap ? 0 : u32v_grow(v, more);
}

static inline int u32v_push(struct u32v *v, uint32_t x) {
  if (v->n == v->cap && u32v_grow(v, 1)) return CM_ERR_NOMEM;
  v->a[v->n++] = x;
  return 0;
}

struct dfa_call {
  uint32_t from, callee_rule, to; /* DFA states; the callee as a rule id until resolved */
};

struct det {
  struct gr_nfa *n;
  uint32_t *adj_off; /* (n_states + 1) CSR of edges by source */
  uint32_t *adj;     /* edge indices */
  uint32_t *mark;    /* (n_states): generation stamps for closures */
  uint32_t gen;
  /* DFA states: their NFA sets in a pool */
  struct u32v set_off; /* (n_dfa + 1) into pool */
  struct u32v pool;
  struct u32v delta; /* (n_dfa, n_cls) */
  struct u32v final;
  struct u32v rule_of; /* (n_dfa): which rule a state belongs to */
  uint32_t *tab;       /* open addressing: DFA ids, GR_NONE empty */
  size_t tab_cap;
  struct dfa_call *calls;
  size_t n_calls, cap_calls;
  uint32_t n_cls;
  uint8_t cls[256];
  uint8_t cls_rep[256];
  struct u32v work, tmp, radix;
};

/* v in increasing order (the sets of NFA states that determinization spends its
 * time on): small ones by insertion, the others by a radix sort of 8-bit digits,
 * as many as the largest element needs. */
static int sort_u32(struct u32v *v, struct u32v *buf) {
  uint32_t *a = v->a;
  if (v->n <= 48) {
    for (size_t i = 1; i < v->n; i++) {
      uint32_t x = a[i];
      size_t j = i;
      for (; j > 0 && a[j - 1] > x; j--)
        a[j] = a[j - 1];
      a[j] = x;
    }
    return 0;
  }
  uint32_t top = 0;
  for (size_t i = 0; i < v->n; i++)
    top |= a[i];
  buf->n = 0;
  if (u32v_reserve(buf, v->n)) return CM_ERR_NOMEM;
  uint32_t *src = a, *dst = buf->a;
  for (unsigned shift = 0; shift < 32 && (top >> shift); shift += 8) {
    uint32_t at[257] = {0};
    for (size_t i = 0; i < v->n; i++)
      at[((src[i] >> shift) & 255) + 1]++;
    for (unsigned k = 0; k < 256; k++)
      at[k + 1] += at[k];
    for (size_t i = 0; i < v->n; i++)
      dst[at[(src[i] >> shift) & 255]++] = src[i];
    uint32_t *t = src;
    src = dst, dst = t;
  }
  if (src != a) memcpy(a, src, v->n * sizeof *src);
  return 0;
}

/* Epsilon closure of d->tmp (in place, sorted, de-duplicated). */
static int closure(struct det *d) {
  d->gen++;
  d->work.n = 0;
  for (size_t i = 0; i < d->tmp.n; i++) {
    uint32_t s = d->tmp.a[i];
    if (d->mark[s] == d->gen) continue;
    d->mark[s] = d->gen;
    if (u32v_push(&d->work, s)) return CM_ERR_NOMEM;
  }
  for (size_t i = 0; i < d->work.n; i++) {
    uint32_t s = d->work.a[i];
    for (uint32_t k = d->adj_off[s]; k < d->adj_off[s + 1]; k++) {
      const struct gr_edge *e = &d->n->e[d->adj[k]];
      if (e->kind != GR_E_EPS || d->mark[e->to] == d->gen) continue;
      d->mark[e->to] = d->gen;
      if (u32v_push(&d->work, e->to)) return CM_ERR_NOMEM;
    }
  }
  return d->work.n > 1 ? sort_u32(&d->work, &d->radix) : 0;
}

static uint64_t set_hash(const uint32_t *a, size_t n) {
  uint64_t h = 0x51ed270b27d3f1a7ull ^ n;
  for (size_t i = 0; i < n; i++)
    h = cm_mix64(h ^ a[i]) + i;
  return h;
}

static int tab_grow(struct det *d) {
  size_t cap = d->tab_cap ? d->tab_cap * 2 : 1024;
  uint32_t *t = malloc(cap * sizeof *t);
  if (!t) return CM_ERR_NOMEM;
  for (size_t i = 0; i < cap; i++)
    t[i] = GR_NONE;
  uint32_t n_dfa = (uint32_t)d->set_off.n - 1;
  for (uint32_t id = 0; id < n_dfa; id++) {
    const uint32_t *a = d->pool.a + d->set_off.a[id];
    size_t len = d->set_off.a[id + 1] - d->set_off.a[id];
    size_t h = (size_t)(set_hash(a, len) ^ d->rule_of.a[id]) & (cap - 1);
    while (t[h] != GR_NONE)
      h = (h + 1) & (cap - 1);
    t[h] = id;
  }
  free(d->tab);
  d->tab = t;
  d->tab_cap = cap;
  return 0;
}

/* The DFA state of closed set d->work in rule r (made when new): its id, or GR_NONE. */
static uint32_t intern(struct det *d, uint32_t r, int *rc) {
  uint32_t n_dfa = (uint32_t)d->set_off.n - 1;
  if ((n_dfa + 1) * 2 > d->tab_cap && tab_grow(d)) {
    *rc = CM_ERR_NOMEM;
    return GR_NONE;
  }
  const uint32_t *a = d->work.a;
  size_t len = d->work.n;
  size_t h = (size_t)(set_hash(a, len) ^ r) & (d->tab_cap - 1);
  for (;;) {
    uint32_t id = d->tab[h];
    if (id == GR_NONE) break;
    size_t l2 = d->set_off.a[id + 1] - d->set_off.a[id];
    if (d->rule_of.a[id] == r && l2 == len &&
        memcmp(d->pool.a + d->set_off.a[id], a, len * sizeof *a) == 0)
      return id;
    h = (h + 1) & (d->tab_cap - 1);
  }
  if (n_dfa >= GR_MAX_DFA_STATES || (size_t)(n_dfa + 1) * d->n_cls > GR_MAX_DFA_CELLS) {
    *rc = gr_nfa_fail(d->n, CM_ERR_TOOBIG, "grammar: more than %u automaton states (DFA)", n_dfa);
    return GR_NONE;
  }
  if (u32v_reserve(&d->pool, len) || u32v_reserve(&d->delta, d->n_cls)) goto nomem;
  memcpy(d->pool.a + d->pool.n, a, len * sizeof *a);
  d->pool.n += len;
  if (u32v_push(&d->set_off, (uint32_t)d->pool.n) || u32v_push(&d->rule_of, r)) goto nomem;
  for (uint32_t c = 0; c < d->n_cls; c++)
    d->delta.a[d->delta.n++] = GR_NONE;
  d->tab[h] = n_dfa;
  return n_dfa;
nomem:
  *rc = CM_ERR_NOMEM;
  return GR_NONE;
}

struct pair {
  uint32_t key, to;
};

static int cmp_pair(const void *a, const void *b) {
  const struct pair *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->to < y->to ? -1 : x->to > y->to;
}

static int det_rule(struct det *d, uint32_t r, uint32_t *start_out) {
  int rc = 0;
  d->tmp.n = 0;
  if (u32v_push(&d->tmp, d->n->rule_start[r]) || closure(d)) return CM_ERR_NOMEM;
  uint32_t first = (uint32_t)d->set_off.n - 1;
  uint32_t start = intern(d, r, &rc);
  if (rc) return rc;
  *start_out = start;
  struct pair *pairs = NULL, *by_cls = NULL;
  size_t n_pairs = 0, cap_pairs = 0, cap_by_cls = 0;
  for (uint32_t id = first; id < (uint32_t)d->set_off.n - 1; id++) {
    /* gather (class, target) and (callee, return) pairs of the set's edges */
    n_pairs = 0;
    size_t n_byte = 0;
    for (int pass = 0; pass < 2; pass++) {
      for (uint32_t k = d->set_off.a[id]; k < d->set_off.a[id + 1]; k++) {
        uint32_t s = d->pool.a[k];
        for (uint32_t q = d->adj_off[s]; q < d->adj_off[s + 1]; q++) {
          const struct gr_edge *e = &d->n->e[d->adj[q]];
          if (pass == 0 && e->kind != GR_E_BYTE) continue;
          if (pass == 1 && e->kind != GR_E_CALL) continue;
          uint32_t c0 = pass == 0 ? d->cls[e->lo] : e->callee;
          uint32_t c1 = pass == 0 ? d->cls[e->hi] : e->callee;
          for (uint32_t c = c0; c <= c1; c++) {
            if (n_pairs == cap_pairs) {
              cap_pairs = cap_pairs ? cap_pairs * 2 : 256;
              struct pair *p = realloc(pairs, cap_pairs * sizeof *p);
              if (!p) {
                free(pairs);
                return CM_ERR_NOMEM;
              }
              pairs = p;
            }
            pairs[n_pairs++] = (struct pair){c, e->to};
          }
        }
      }
      if (pass == 0) n_byte = n_pairs;
    }
    if (n_byte) { /* grouped by class, in class order: closure() orders each group */
      if (n_byte > cap_by_cls) {
        free(by_cls);
        cap_by_cls = cap_pairs;
        if (!(by_cls = malloc(cap_by_cls * sizeof *by_cls))) {
          free(pairs);
          return CM_ERR_NOMEM;
        }
      }
      uint32_t at[257] = {0};
      for (size_t i = 0; i < n_byte; i++)
        at[pairs[i].key + 1]++;
      for (uint32_t c = 0; c < d->n_cls; c++)
        at[c + 1] += at[c];
      for (size_t i = 0; i < n_byte; i++)
        by_cls[at[pairs[i].key]++] = pairs[i];
      memcpy(pairs, by_cls, n_byte * sizeof *pairs);
    }
    if (n_pairs > n_byte) qsort(pairs + n_byte, n_pairs - n_byte, sizeof *pairs, cmp_pair);
    for (size_t i = 0; i < n_pairs;) {
      size_t j = i;
      d->tmp.n = 0;
      int is_call = i >= n_byte;
      while (j < n_pairs && pairs[j].key == pairs[i].key && (j >= n_byte) == is_call) {
        if (u32v_push(&d->tmp, pairs[j].to)) rc = CM_ERR_NOMEM;
        j++;
      }
      if (!rc) rc = closure(d);
      uint32_t t = rc ? GR_NONE : intern(d, r, &rc);
      if (rc) break;
      if (!is_call) {
        d->delta.a[(size_t)id * d->n_cls + pairs[i].key] = t;
      } else {
        if (d->n_calls == d->cap_calls) {
          size_t cap = d->cap_calls ? d->cap_calls * 2 : 64;
          struct dfa_call *c = realloc(d->calls, cap * sizeof *c);
          if (!c) {
            rc = CM_ERR_NOMEM;
            break;
          }
          d->calls = c;
          d->cap_calls = cap;
        }
        d->calls[d->n_calls++] = (struct dfa_call){id, pairs[i].key, t};
      }
      i = j;
    }
    if (rc) break;
  }
  free(pairs);
  free(by_cls);
  return rc;
}

static int cmp_call(const void *a, const void *b) {
  const struct dfa_call *x = a, *y = b;
  if (x->from != y->from) return x->from < y->from ? -1 : 1;
  if (x->callee_rule != y->callee_rule) return x->callee_rule < y->callee_rule ? -1 : 1;
  return 0;
}

/* Marks the states that can reach their rule's end (through bytes, and through
 * calls of rules that can end); rules that cannot end are dropped from calls. */
static int trim(struct det *d, const uint32_t *rule_start, uint8_t *live) {
  uint32_t n_dfa = (uint32_t)d->set_off.n - 1;
  uint32_t n_rules = d->n->n_rules;
  uint8_t *rule_live = calloc(n_rules ? n_rules : 1, 1);
  if (!rule_live) return CM_ERR_NOMEM;
  memset(live, 0, n_dfa);
  for (uint32_t s = 0; s < n_dfa; s++)
    if (d->final.a[s]) live[s] = 1;
  /* a naive fixpoint: grammars are small and the loop ends in a few rounds */
  for (int changed = 1; changed;) {
    changed = 0;
    for (uint32_t r = 0; r < n_rules; r++)
      if (!rule_live[r] && live[rule_start[r]]) rule_live[r] = 1, changed = 1;
    for (uint32_t s = n_dfa; s-- > 0;) {
      if (live[s]) continue;
      const uint32_t *row = d->delta.a + (size_t)s * d->n_cls;
      for (uint32_t c = 0; c < d->n_cls && !live[s]; c++)
        if (row[c] != GR_NONE && live[row[c]]) live[s] = 1, changed = 1;
    }
    for (size_t i = 0; i < d->n_calls; i++) {
      const struct dfa_call *c = &d->calls[i];
      if (!live[c->from] && rule_live[c->callee_rule] && live[c->to])
        live[c->from] = 1, changed = 1;
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < d->n_calls; i++) {
    const struct dfa_call *c = &d->calls[i];
    if (live[c->from] && rule_live[c->callee_rule] && live[c->to]) d->calls[w++] = *c;
  }
  d->n_calls = w;
  for (uint32_t s = 0; s < n_dfa; s++) {
    uint32_t *row = d->delta.a + (size_t)s * d->n_cls;
    for (uint32_t c = 0; c < d->n_cls; c++)
      if (row[c] != GR_NONE && !live[row[c]]) row[c] = GR_NONE;
  }
  free(rule_live);
  return 0;
}

int gr_determinize(struct gr_nfa *n, struct gr_grammar *g) {
  if (n->rc) return n->rc;
  if (n->n_rules == 0) return gr_nfa_fail(n, CM_ERR_INVAL, "grammar: no rules");
  struct det d = {.n = n};
  int rc = CM_ERR_NOMEM;
  uint32_t *rule_start = NULL;
  uint8_t *live = NULL;
  d.adj_off = calloc((size_t)n->n_states + 1, sizeof *d.adj_off);
  d.adj = malloc((n->n_e ? n->n_e : 1) * sizeof *d.adj);
  d.mark = calloc(n->n_states, sizeof *d.mark);
  rule_start = malloc(n->n_rules * sizeof *rule_start);
  if (!d.adj_off || !d.adj || !d.mark || !rule_start) goto done;
  for (size_t i = 0; i < n->n_e; i++)
    d.adj_off[n->e[i].from + 1]++;
  for (uint32_t s = 0; s < n->n_states; s++)
    d.adj_off[s + 1] += d.adj_off[s];
  {
    uint32_t *fill = malloc(((size_t)n->n_states + 1) * sizeof *fill);
    if (!fill) goto done;
    memcpy(fill, d.adj_off, ((size_t)n->n_states + 1) * sizeof *fill);
    for (size_t i = 0; i < n->n_e; i++)
      d.adj[fill[n->e[i].from]++] = (uint32_t)i;
    free(fill);
  }
  /* byte classes: bytes that no edge tells apart share a class */
  uint8_t cut[257] = {0};
  for (size_t i = 0; i < n->n_e; i++)
    if (n->e[i].kind == GR_E_BYTE) cut[n->e[i].lo] = 1, cut[n->e[i].hi + 1] = 1;
  d.n_cls = 0;
  for (int b = 0; b < 256; b++) {
    if (b > 0 && cut[b]) d.n_cls++;
    d.cls[b] = (uint8_t)d.n_cls;
    if (b == 0 || cut[b]) d.cls_rep[d.n_cls] = (uint8_t)b;
  }
  d.n_cls++;
  if (u32v_push(&d.set_off, 0)) goto done;
  for (uint32_t r = 0; r < n->n_rules; r++) {
    rc = det_rule(&d, r, &rule_start[r]);
    if (rc) goto done;
    if (r == 0) g->n_root = (uint32_t)d.set_off.n - 1;
  }
  rc = CM_ERR_NOMEM;
  uint32_t n_dfa = (uint32_t)d.set_off.n - 1;
  for (uint32_t s = 0; s < n_dfa; s++) {
    uint32_t r = d.rule_of.a[s], fin = 0;
    for (uint32_t k = d.set_off.a[s]; k < d.set_off.a[s + 1]; k++)
      if (d.pool.a[k] == n->rule_final[r]) fin = 1;
    if (u32v_push(&d.final, fin)) goto done;
  }
  live = malloc(n_dfa ? n_dfa : 1);
  if (!live || trim(&d, rule_start, live)) goto done;
  if (!live[rule_start[0]]) {
    rc = gr_nfa_fail(n, CM_ERR_INVAL, "grammar: the pattern matches no text at all");
    goto done;
  }
  if (d.n_calls) qsort(d.calls, d.n_calls, sizeof *d.calls, cmp_call);
  g->n_states = n_dfa;
  g->n_cls = d.n_cls;
  memcpy(g->cls, d.cls, 256);
  g->delta = d.delta.a;
  d.delta.a = NULL;
  g->flags = calloc(n_dfa, 1);
  g->call_off = calloc((size_t)n_dfa + 1, sizeof *g->call_off);
  g->calls = malloc((d.n_calls ? d.n_calls : 1) * sizeof *g->calls);
  if (!g->flags || !g->call_off || !g->calls) goto done;
  for (size_t i = 0; i < d.n_calls; i++) {
    g->calls[i] = (struct gr_call){rule_start[d.calls[i].callee_rule], d.calls[i].to};
    g->call_off[d.calls[i].from + 1]++;
  }
  for (uint32_t s = 0; s < n_dfa; s++)
    g->call_off[s + 1] += g->call_off[s];
  for (uint32_t s = 0; s < n_dfa; s++) {
    uint8_t f = 0;
    if (d.final.a[s]) f |= GR_F_FINAL;
    if (g->call_off[s + 1] > g->call_off[s]) f |= GR_F_CALLS;
    const uint32_t *row = g->delta + (size_t)s * d.n_cls;
    for (uint32_t c = 0; c < d.n_cls; c++)
      if (row[c] != GR_NONE) f |= GR_F_BYTES;
    g->flags[s] = f;
  }
  g->root = rule_start[0];
  rc = 0;
done:
  if (rc == CM_ERR_NOMEM) gr_nfa_fail(n, rc, "grammar: out of memory");
  free(d.adj_off);
  free(d.adj);
  free(d.mark);
  free(d.set_off.a);
  free(d.pool.a);
  free(d.delta.a);
  free(d.final.a);
  free(d.rule_of.a);
  free(d.tab);
  free(d.calls);
  free(d.work.a);
  free(d.tmp.a);
  free(d.radix.a);
  free(rule_start);
  free(live);
  return rc;
}
