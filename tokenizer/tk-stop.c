/* tk-stop.c — the stop-string matcher (see tk-stop.h).
 *
 * The object keeps `buf`: the held-back tail followed by the newest piece.
 * A push searches buf for the earliest complete stop string (a stop could
 * only start in the old tail or the new piece, both in buf), then keeps
 * back the longest suffix that is a proper prefix of a stop string. Work
 * per push is O((tail + piece) * total stop bytes), tails are short. */
#include "tokenizer/tk-stop.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"

struct stop_str {
  const char *s;
  size_t len; /* bytes */
};

struct tk_stop {
  struct stop_str *stops; /* [n] after the struct, the strings' bytes after them (one block) */
  size_t n, max_len;
  char *buf;        /* held-back tail + newest piece */
  size_t buf_len, buf_cap; /* bytes */
  char *out;        /* released text of the last call */
  size_t out_cap;   /* bytes */
  size_t held;      /* bytes of buf held back after the last push */
  int done;
};

int tk_stop_create(const char *const *stops, const size_t *lens, size_t n, struct tk_stop **out) {
  size_t total = 0, max_len = 0; /* bytes */
  for (size_t i = 0; i < n; i++) {
    if (!lens[i]) return CM_ERR_INVAL;
    total += lens[i];
    if (lens[i] > max_len) max_len = lens[i];
  }
  struct tk_stop *s = calloc(1, sizeof *s + n * sizeof *s->stops + total + 1);
  if (!s) return CM_ERR_NOMEM;
  s->stops = (struct stop_str *)(s + 1);
  s->max_len = max_len;
  s->buf_cap = s->out_cap = max_len + 256;
  s->buf = malloc(s->buf_cap);
  s->out = malloc(s->out_cap);
  if (!s->buf || !s->out) {
    tk_stop_free(s);
    return CM_ERR_NOMEM;
  }
  char *text = (char *)(s->stops + n);
  for (size_t i = 0; i < n; text += lens[i++])
    s->stops[i] = (struct stop_str){memcpy(text, stops[i], lens[i]), lens[i]};
  s->n = n;
  s->out[0] = 0;
  *out = s;
  return 0;
}

void tk_stop_free(struct tk_stop *s) {
  if (!s) return;
  free(s->buf);
  free(s->out);
  free(s);
}

void tk_stop_reset(struct tk_stop *s) {
  s->buf_len = 0;
  s->held = 0;
  s->done = 0;
}

size_t tk_stop_pending(const struct tk_stop *s) { return s->buf_len; }
size_t tk_stop_max_len(const struct tk_stop *s) { return s->max_len; }

/* Sets *out to buf[0, n) and keeps buf[n, buf_len) as the new tail. */
static int release(struct tk_stop *s, size_t n, const char **out, size_t *out_len) {
  if (cm_grow(&s->out, &s->out_cap, n + 1, 256)) return CM_ERR_NOMEM;
  memcpy(s->out, s->buf, n);
  s->out[n] = 0;
  memmove(s->buf, s->buf + n, s->buf_len - n);
  s->buf_len -= n;
  *out = s->out;
  *out_len = n;
  return 0;
}

int tk_stop_push(struct tk_stop *s, const char *piece, size_t len, const char **out,
                 size_t *out_len, int *hit) {
  *hit = -1;
  *out = "";
  *out_len = 0;
  if (s->done) return 0;
  if (cm_grow(&s->buf, &s->buf_cap, s->buf_len + len, 256)) return CM_ERR_NOMEM;
  memcpy(s->buf + s->buf_len, piece, len);
  s->buf_len += len;
  if (!s->n) return release(s, s->buf_len, out, out_len);
  /* earliest complete stop string */
  size_t best_at = SIZE_MAX;
  for (size_t k = 0; k < s->n; k++) {
    const char *st = s->stops[k].s;
    size_t sl = s->stops[k].len;
    if (sl > s->buf_len) continue;
    const char *p = memmem(s->buf, s->buf_len, st, sl);
    if (p && (size_t)(p - s->buf) < best_at) {
      best_at = (size_t)(p - s->buf);
      *hit = (int)k;
    }
  }
  if (*hit >= 0) {
    s->done = 1;
    int rc = release(s, best_at, out, out_len);
    s->buf_len = 0;
    return rc;
  }
  /* hold back the longest suffix that begins some stop string */
  size_t keep = 0;
  size_t lim = s->max_len - 1 < s->buf_len ? s->max_len - 1 : s->buf_len;
  for (size_t t = lim; t > 0 && !keep; t--) {
    const char *tail = s->buf + s->buf_len - t;
    for (size_t k = 0; k < s->n; k++)
      if (s->stops[k].len > t && !memcmp(s->stops[k].s, tail, t)) {
        keep = t;
        break;
      }
  }
  s->held = keep;
  return release(s, s->buf_len - keep, out, out_len);
}

int tk_stop_flush(struct tk_stop *s, const char **out, size_t *out_len) {
  *out = "";
  *out_len = 0;
  if (s->done) return 0;
  s->done = 1;
  return release(s, s->buf_len, out, out_len);
}
