/* gr-schema-scalar.c — JSON Schema's scalars: integers and numbers between
 * bounds (decimal ranges spelled digit by digit), multipleOf (the remainder
 * of the digits so far), strings with lengths, patterns and formats (and
 * both: the product of the pattern's automaton with a character count). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "grammar/gr-schema-impl.h"

/* ---- numbers --------------------------------------------------------------- */
#define SC_BIG 1000000000000000000ll /* 10^18: bounds past this are unbounded */

static int ndigits(long long x) {
  int d = 1;
  while (x >= 10)
    x /= 10, d++;
  return d;
}

static long long pow10ll(int d) {
  long long p = 1;
  while (d-- > 0)
    p *= 10;
  return p;
}

/* Decimal strings lo..hi of the same length (no sign). */
static void same_len(struct gr_nfa *n, uint32_t from, uint32_t to, const char *lo, const char *hi,
                     size_t len) {
  if (len == 0) {
    gr_nfa_eps(n, from, to);
    return;
  }
  if (lo[0] == hi[0]) {
    uint32_t a = len == 1 ? to : gr_nfa_state(n);
    gr_nfa_byte(n, from, a, (uint8_t)lo[0], (uint8_t)lo[0]);
    if (len > 1) same_len(n, a, to, lo + 1, hi + 1, len - 1);
    return;
  }
  int lo_zeros = 1, hi_nines = 1;
  for (size_t i = 1; i < len; i++)
    lo_zeros &= lo[i] == '0', hi_nines &= hi[i] == '9';
  char nines[24], zeros[24];
  memset(nines, '9', len);
  memset(zeros, '0', len);
  uint8_t first = (uint8_t)lo[0], last = (uint8_t)hi[0];
  if (!lo_zeros) { /* lo[0] followed by lo[1:] .. 99 */
    uint32_t a = gr_nfa_state(n);
    gr_nfa_byte(n, from, a, first, first);
    same_len(n, a, to, lo + 1, nines, len - 1);
    first++;
  }
  if (!hi_nines) { /* hi[0] followed by 00 .. hi[1:] */
    uint32_t a = gr_nfa_state(n);
    gr_nfa_byte(n, from, a, last, last);
    same_len(n, a, to, zeros, hi + 1, len - 1);
    last--;
  }
  if (first <= last) { /* the full middle */
    uint32_t a = len == 1 ? to : gr_nfa_state(n);
    gr_nfa_byte(n, from, a, first, last);
    if (len > 1) same_len(n, a, to, zeros, nines, len - 1);
  }
}

/* Unsigned decimals a..b (b < 0: unbounded), canonical (no leading zeros). */
static void uint_range(struct gr_nfa *n, uint32_t from, uint32_t to, long long a, long long b) {
  if (b >= 0 && a > b) return;
  int da = ndigits(a), db = b < 0 ? 19 : ndigits(b);
  for (int d = da; d <= db && d <= 18; d++) {
    long long lo = d == da ? a : pow10ll(d - 1), hi = pow10ll(d) - 1;
    if (b >= 0 && hi > b) hi = b;
    if (lo > hi) continue;
    char ls[24], hs[24];
    snprintf(ls, sizeof ls, "%0*lld", d, lo);
    snprintf(hs, sizeof hs, "%0*lld", d, hi);
    same_len(n, from, to, ls, hs, (size_t)d);
  }
  if (b < 0) { /* 19 digits and more */
    uint32_t s = gr_nfa_state(n), e = gr_nfa_state(n);
    gr_nfa_byte(n, from, s, '1', '9');
    uint32_t cur = s;
    for (int i = 0; i < 18; i++) {
      uint32_t nx = gr_nfa_state(n);
      gr_nfa_byte(n, cur, nx, '0', '9');
      cur = nx;
    }
    gr_nfa_eps(n, cur, e);
    gr_nfa_byte(n, e, e, '0', '9');
    gr_nfa_eps(n, e, to);
  }
}

/* Integers lo..hi (has_lo / has_hi: bounded on that side). */
static void int_range(struct gr_nfa *n, uint32_t from, uint32_t to, int has_lo, long long lo,
                      int has_hi, long long hi) {
  if (has_lo && has_hi && lo > hi) return;
  if (!has_hi || hi >= 0) uint_range(n, from, to, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
  if (!has_lo || lo < 0) {
    uint32_t m = gr_nfa_state(n);
    gr_nfa_byte(n, from, m, '-', '-');
    long long a = has_hi && hi < 0 ? -hi : 1;
    uint_range(n, m, to, a, has_lo ? -lo : -1);
  }
}

enum { FRAC_ANY, FRAC_ZERO, FRAC_NONZERO };

/* After an integer part: an optional fraction of any digits, of zeros only,
 * or a required fraction that is not all zeros. */
static void frac(struct gr_nfa *n, uint32_t from, uint32_t to, int kind) {
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
  if (kind != FRAC_NONZERO) gr_nfa_eps(n, from, to);
  gr_nfa_byte(n, from, a, '.', '.');
  if (kind == FRAC_NONZERO) {
    gr_nfa_byte(n, a, a, '0', '0');
    gr_nfa_byte(n, a, b, '1', '9');
    gr_nfa_byte(n, b, b, '0', '9');
  } else {
    gr_nfa_byte(n, a, b, '0', kind == FRAC_ZERO ? '0' : '9');
    gr_nfa_byte(n, b, b, '0', kind == FRAC_ZERO ? '0' : '9');
  }
  gr_nfa_eps(n, b, to);
}

/* Integer part k in a..b (b < 0: unbounded), optional '-' first, then a fraction. */
static void part(struct gr_nfa *n, uint32_t from, uint32_t to, int neg, long long a, long long b,
                 int kind) {
  if (b >= 0 && a > b) return;
  uint32_t m = from, k = gr_nfa_state(n);
  if (neg) {
    m = gr_nfa_state(n);
    gr_nfa_byte(n, from, m, '-', '-');
  }
  uint_range(n, m, k, a, b);
  frac(n, k, to, kind);
}

/* Numbers between integer bounds (exclusive or not), without exponents: the
 * value of "k.f" lies in [k, k + 1), that of "-k.f" in (-(k + 1), -k]. */
static void num_range(struct gr_nfa *n, uint32_t from, uint32_t to, int has_lo, long long lo,
                      int xlo, int has_hi, long long hi, int xhi) {
  if (has_lo && has_hi && (lo > hi || (lo == hi && (xlo || xhi)))) return;
  if (!has_hi || hi >= 0) { /* non-negative */
    long long a = 0;
    if (has_lo && lo >= 0) {
      a = xlo ? lo + 1 : lo;
      if (xlo && (!has_hi || lo < hi)) part(n, from, to, 0, lo, lo, FRAC_NONZERO);
    }
    if (!has_hi)
      part(n, from, to, 0, a, -1, FRAC_ANY);
    else if (hi - 1 >= a)
      part(n, from, to, 0, a, hi - 1, FRAC_ANY);
    if (has_hi && !xhi && (!has_lo || hi > lo || !xlo) && (!has_lo || hi >= lo))
      part(n, from, to, 0, hi, hi, FRAC_ZERO);
  }
  if (!has_lo || lo < 0) { /* negative */
    long long kmin = 0, L = has_lo ? -lo : -1;
    int special = 0; /* k = H with a nonzero fraction */
    long long H = 0;
    if (has_hi && (hi < 0 || (hi == 0 && xhi))) {
      H = -hi;
      kmin = xhi ? H + 1 : H;
      special = xhi;
    }
    long long kmax = has_lo ? L - 1 : -1;
    if (!has_lo || kmax >= kmin) part(n, from, to, 1, kmin, kmax, FRAC_ANY);
    if (special && (!has_lo || H < L)) part(n, from, to, 1, H, H, FRAC_NONZERO);
    if (has_lo && !xlo && (!has_hi || (xhi ? -L < hi : -L <= hi)) && L >= 1)
      part(n, from, to, 1, L, L, FRAC_ZERO);
  }
}

/* The numeric bounds of s: raw values and whether each is exclusive. 0, or -1
 * after an error. */
static int bounds(struct sc *c, const json_t *s, const char *path, int *has_lo, double *lo,
                  int *xlo, int *has_hi, double *hi, int *xhi) {
  static const char *kws[4] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  *has_lo = *has_hi = *xlo = *xhi = 0;
  for (int k = 0; k < 4; k++) {
    json_t *j = json_object_get(s, kws[k]);
    if (!j || json_is_boolean(j)) continue; /* draft 4's flags: read below */
    if (!json_is_number(j)) return gr_sc_fail(c, path, kws[k], "not a number"), -1;
    double x = json_number_value(j);
    /* past 2^53 a double no longer holds every integer: the bound written may be
     * another number than the one read (or past the range automata's long long) */
    if (fabs(x) >= 9007199254740992.0)
      return gr_sc_fail(c, path, kws[k], "magnitude of 2^53 or more"), -1;
    int low = k % 2 == 0, excl = k >= 2;
    if (low && (!*has_lo || x > *lo || (x == *lo && excl))) *has_lo = 1, *lo = x, *xlo = excl;
    if (!low && (!*has_hi || x < *hi || (x == *hi && excl))) *has_hi = 1, *hi = x, *xhi = excl;
  }
  if (json_is_true(json_object_get(s, "exclusiveMinimum")) && json_object_get(s, "minimum"))
    *xlo = 1;
  if (json_is_true(json_object_get(s, "exclusiveMaximum")) && json_object_get(s, "maximum"))
    *xhi = 1;
  return 0;
}

#define SC_MAX_MULTIPLE 1000

/* Integers that are multiples of k: the remainder of the digits so far. */
static void multiples(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t k) {
  uint32_t *r = malloc(k * sizeof *r);
  if (!r) {
    gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
    return;
  }
  for (uint32_t i = 0; i < k; i++)
    r[i] = gr_nfa_state(n);
  uint32_t neg = gr_nfa_state(n);
  gr_nfa_byte(n, from, to, '0', '0');
  gr_nfa_byte(n, from, neg, '-', '-');
  for (uint32_t d = 1; d <= 9; d++) {
    gr_nfa_byte(n, from, r[d % k], (uint8_t)('0' + d), (uint8_t)('0' + d));
    gr_nfa_byte(n, neg, r[d % k], (uint8_t)('0' + d), (uint8_t)('0' + d));
  }
  for (uint32_t i = 0; i < k; i++)
    for (uint32_t d = 0; d <= 9; d++)
      gr_nfa_byte(n, r[i], r[(i * 10 + d) % k], (uint8_t)('0' + d), (uint8_t)('0' + d));
  gr_nfa_eps(n, r[0], to);
  free(r);
}

void gr_sc_numeric(struct sc *c, const json_t *s, const char *path, int integer, uint32_t from,
                   uint32_t to) {
  double lo = 0, hi = 0;
  int has_lo, has_hi, xlo, xhi;
  if (bounds(c, s, path, &has_lo, &lo, &xlo, &has_hi, &hi, &xhi)) return;
  json_t *mul = json_object_get(s, "multipleOf");
  if (mul) {
    double k = json_number_value(mul);
    if (!json_is_number(mul) || k <= 0)
      return (void)gr_sc_fail(c, path, "multipleOf", "not a positive number");
    if (k != floor(k)) return (void)gr_sc_fail(c, path, "multipleOf", "not an integer");
    if (k > SC_MAX_MULTIPLE) return (void)gr_sc_fail(c, path, "multipleOf", "above 1000");
    if (has_lo || has_hi) return (void)gr_sc_fail(c, path, "multipleOf", "together with bounds");
    multiples(c->n, from, to, (uint32_t)k); /* numbers too: as integers */
    return;
  }
  if (integer) { /* integers: inclusive integer bounds */
    if (has_lo) lo = xlo ? floor(lo) + 1 : ceil(lo), xlo = 0;
    if (has_hi) hi = xhi ? ceil(hi) - 1 : floor(hi), xhi = 0;
  } else {
    if (has_lo && lo != floor(lo))
      return (void)gr_sc_fail(c, path, xlo ? "exclusiveMinimum" : "minimum",
                              "non-integer bound on a number");
    if (has_hi && hi != floor(hi))
      return (void)gr_sc_fail(c, path, xhi ? "exclusiveMaximum" : "maximum",
                              "non-integer bound on a number");
  }
  if (has_lo && lo <= -(double)SC_BIG) has_lo = 0;
  if (has_hi && hi >= (double)SC_BIG) has_hi = 0;
  if ((has_lo && lo >= (double)SC_BIG) || (has_hi && hi <= -(double)SC_BIG))
    return (void)gr_sc_fail(c, path, has_lo ? "minimum" : "maximum", "bound beyond 10^18");
  if (integer) {
    if (!has_lo && !has_hi)
      gr_json_integer(c->n, from, to);
    else
      int_range(c->n, from, to, has_lo, (long long)lo, has_hi, (long long)hi);
  } else {
    if (!has_lo && !has_hi)
      gr_json_number(c->n, from, to);
    else
      num_range(c->n, from, to, has_lo, (long long)lo, xlo, has_hi, (long long)hi, xhi);
  }
}

/* ---- strings ------------------------------------------------------------- */
/* dates: years 0001-9999, days that every year has (no February 29th) */
#define SC_DATE                                                                                    \
  "(000[1-9]|00[1-9]\\d|0[1-9]\\d\\d|[1-9]\\d{3})-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0["    \
  "469]|11)-("                                                                                     \
  "0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
/* RFC 3339 5.6: "T" and "Z" may be written in lower case */
#define SC_TIME                                                                                    \
  "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
static const struct {
  const char *name, *re;
} formats[] = {
    {"date", SC_DATE},
    {"time", SC_TIME},
    {"date-time", SC_DATE "[Tt]" SC_TIME},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email", "[A-Za-z0-9._%+-]+@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,12}"},
    {"ipv4", "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"},
    {"ipv6", "([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}|::|([0-9a-f]{1,4}:){1,7}:|:(:[0-9a-f]{1,4}){1,7}|"
             "([0-9a-f]{1,4}:){1,6}:[0-9a-f]{1,4}|([0-9a-f]{1,4}:){1,5}(:[0-9a-f]{1,4}){2}|"
             "([0-9a-f]{1,4}:){1,4}(:[0-9a-f]{1,4}){3}|([0-9a-f]{1,4}:){1,3}(:[0-9a-f]{1,4}){4}|"
             "([0-9a-f]{1,4}:){1,2}(:[0-9a-f]{1,4}){5}|[0-9a-f]{1,4}:(:[0-9a-f]{1,4}){6}"},
    {"hostname",
     /* labels of 1 to 63 characters (RFC 1123) */
     "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
     "*"},
    {"uri", "[A-Za-z][A-Za-z0-9+.-]*:(//)?[A-Za-z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=%]+"},
};

/* A pattern (or format) and a length together: the product of the pattern's
 * automaton, the JSON contents' decoder (to tell where characters begin) and a
 * character count 0..max (or 0..min, saturating, without a max). */
static void regex_len(struct sc *c, const char *re, size_t re_len, int mode, const char *what,
                      json_int_t mn, json_int_t mx, uint32_t from, uint32_t to) {
  struct gr_nfa *n = c->n, sub;
  gr_nfa_init(&sub, n->err, n->errlen);
  struct gr_grammar g = {0};
  uint32_t r = gr_nfa_rule(&sub);
  gr_regex_emit(&sub, re, re_len, mode, 1, sub.rule_start[r], sub.rule_final[r], what);
  int rc = gr_determinize(&sub, &g);
  gr_nfa_free(&sub);
  uint32_t *map = NULL, *queue = NULL;
  if (rc) {
    n->rc = rc; /* the message is in err already */
    goto out;
  }
  uint32_t K = (uint32_t)(mx >= 0 ? mx : mn) + 1; /* counts 0 .. K-1 */
  size_t np = (size_t)g.n_states * 13 * K;
  if (np > (8u << 20)) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "%s: too large together with minLength / maxLength", what);
    goto out;
  }
  map = malloc(np * sizeof *map);
  queue = malloc(np * sizeof *queue);
  if (!map || !queue) {
    gr_nfa_fail(n, CM_ERR_NOMEM, "json_schema: out of memory");
    goto out;
  }
  for (size_t i = 0; i < np; i++)
    map[i] = GR_NONE;
#define RL_KEY(s, a, k) (((size_t)(s)*13 + (size_t)(a)) * K + (k))
  size_t qh = 0, qt = 0;
  map[RL_KEY(g.root, 0, 0)] = from;
  queue[qt++] = (uint32_t)RL_KEY(g.root, 0, 0);
  while (qh < qt && !n->rc) {
    size_t key = queue[qh++];
    uint32_t k = (uint32_t)(key % K), sa = (uint32_t)(key / K);
    int ad = (int)(sa % 13);
    uint32_t st = sa / 13, src = map[key];
    if ((g.flags[st] & GR_F_FINAL) && ad == 0 && (json_int_t)k >= mn) gr_nfa_eps(n, src, to);
    uint32_t run_lo = 0, run_to = GR_NONE;
    for (uint32_t byte = 0; byte <= 256; byte++) {
      uint32_t target = GR_NONE;
      uint32_t t = byte < 256 ? g.delta[(size_t)st * g.n_cls + g.cls[byte]] : GR_NONE;
      int a2 = byte < 256 ? gr_json_sx_step(ad, (uint8_t)byte) : -1;
      uint32_t k2 = k + (ad == 0); /* a character begins at a boundary */
      if (k2 >= K && mx < 0) k2 = K - 1;
      if (t != GR_NONE && a2 >= 0 && a2 < 13 && k2 < K) {
        size_t key2 = RL_KEY(t, a2, k2);
        if (map[key2] == GR_NONE) {
          map[key2] = gr_nfa_state(n);
          queue[qt++] = (uint32_t)key2;
        }
        target = map[key2];
      }
      if (target != run_to || byte == 256) { /* bytes with one target go as one range */
        if (run_to != GR_NONE) gr_nfa_byte(n, src, run_to, (uint8_t)run_lo, (uint8_t)(byte - 1));
        run_to = target;
        run_lo = byte;
      }
    }
  }
#undef RL_KEY
out:
  free(map);
  free(queue);
  free(g.delta);
  free(g.flags);
  free(g.call_off);
  free(g.calls);
}

void gr_sc_string(struct sc *c, const json_t *s, const char *path, uint32_t from, uint32_t to) {
  struct gr_nfa *n = c->n;
  json_t *minl = json_object_get(s, "minLength"), *maxl = json_object_get(s, "maxLength");
  json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
  if (pat && fmt) return (void)gr_sc_fail(c, path, "format", "together with 'pattern'");
  json_int_t mn = 0, mx = -1;
  if (minl) {
    if (!json_is_integer(minl) || json_integer_value(minl) < 0)
      return (void)gr_sc_fail(c, path, "minLength", "not a non-negative integer");
    mn = json_integer_value(minl);
  }
  if (maxl) {
    if (!json_is_integer(maxl) || json_integer_value(maxl) < 0)
      return (void)gr_sc_fail(c, path, "maxLength", "not a non-negative integer");
    mx = json_integer_value(maxl);
  }
  if (mn > GR_MAX_REPEAT || mx > (json_int_t)GR_MAX_REPEAT) {
    gr_nfa_fail(n, CM_ERR_TOOBIG, "json_schema: %s at %s above %u",
                mx > mn ? "maxLength" : "minLength", path[0] ? path : "/", GR_MAX_REPEAT);
    return;
  }
  uint32_t a = gr_nfa_state(n), b = gr_nfa_state(n);
  gr_nfa_byte(n, from, a, '"', '"');
  gr_nfa_byte(n, b, to, '"', '"');
  const char *re = NULL;
  size_t re_len = 0;
  int mode = GR_RX_FULL;
  char what[SC_MAX_PATH + 32];
  if (pat) {
    if (!json_is_string(pat)) return (void)gr_sc_fail(c, path, "pattern", "not a string");
    snprintf(what, sizeof what, "json_schema: pattern at %s", path[0] ? path : "/");
    re = json_string_value(pat);
    re_len = json_string_length(pat);
    mode = GR_RX_SEARCH;
  } else if (fmt) {
    if (!json_is_string(fmt)) return (void)gr_sc_fail(c, path, "format", "not a string");
    for (size_t i = 0; i < sizeof formats / sizeof formats[0] && !re; i++)
      if (strcmp(formats[i].name, json_string_value(fmt)) == 0) re = formats[i].re;
    if (!re) {
      char why[128];
      snprintf(why, sizeof why, "format '%.60s'", json_string_value(fmt));
      return (void)gr_sc_fail(c, path, "format", why);
    }
    re_len = strlen(re);
    snprintf(what, sizeof what, "json_schema: format at %s", path[0] ? path : "/");
  }
  if (re && !minl && !maxl) {
    gr_regex_emit(n, re, re_len, mode, 1, a, b, what);
    return;
  }
  if (re) {
    regex_len(c, re, re_len, mode, what, mn, mx, a, b);
    return;
  }
  uint32_t cur = a;
  for (json_int_t i = 0; i < mn && !n->rc; i++) {
    uint32_t nx = gr_nfa_state(n);
    gr_json_char(n, cur, nx);
    cur = nx;
  }
  if (mx < 0) {
    gr_json_char(n, cur, cur);
    gr_nfa_eps(n, cur, b);
    return;
  }
  for (json_int_t i = mn; i < mx && !n->rc; i++) {
    uint32_t nx = gr_nfa_state(n);
    gr_nfa_eps(n, cur, b);
    gr_json_char(n, cur, nx);
    cur = nx;
  }
  gr_nfa_eps(n, cur, b);
}
