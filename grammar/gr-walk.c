/* gr-walk.c — random valid generations (gr.h's gr_random_walk): what the
 * grammar tests validate with outside oracles and `lmserve bench grammar`
 * times masks along. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-hash.h"
#include "common/cm-time.h"
#include "grammar/gr-impl.h"

int gr_random_walk(struct gr_matcher *m, const struct gr_vocab *v, uint64_t *rng, int max_tokens,
                   char *buf, size_t cap, double *mask_us, int *steps) {
  int32_t n = v->n;
  uint32_t *bits = malloc(sizeof(uint32_t) * (((size_t)n + 31) / 32));
  int32_t *allowed = malloc(sizeof(int32_t) * (size_t)n);
  size_t k = 0;
  int rc = -1, t = 0;
  for (; bits && allowed && t < max_tokens; t++) {
    uint64_t t0 = cm_time_ns();
    if (gr_matcher_mask(m, v, bits)) break;
    if (mask_us) mask_us[t] = (double)(cm_time_ns() - t0) / 1e3;
    int32_t na = 0;
    for (int32_t i = 0; i < n; i++)
      if (bits[i >> 5] >> (i & 31) & 1) allowed[na++] = i;
    if (gr_matcher_is_accepting(m) && (na == 0 || cm_splitmix64(rng) % 4 == 0)) {
      rc = (int)k;
      t++;
      break;
    }
    if (na == 0) {
      t++;
      break;
    }
    int32_t id = allowed[cm_splitmix64(rng) % (uint64_t)na];
    /* now and then a token that closes something, so walks end */
    if (cm_splitmix64(rng) % 3 == 0) {
      int32_t nc = 0;
      for (int32_t i = 0; i < na; i++) {
        const uint8_t *b = v->bytes[allowed[i]];
        uint32_t l = v->lens[allowed[i]];
        if (memchr(b, '"', l) || memchr(b, '}', l) || memchr(b, ']', l)) allowed[nc++] = allowed[i];
      }
      if (nc) id = allowed[cm_splitmix64(rng) % (uint64_t)nc];
    }
    if (gr_matcher_accept_token(m, v, id)) {
      t++;
      break;
    }
    uint32_t len = v->lens[id];
    if (buf && k + len + 1 <= cap) memcpy(buf + k, v->bytes[id], len);
    k += len;
  }
  if (rc < 0 && gr_matcher_is_accepting(m)) rc = (int)k;
  if (buf && cap) buf[k < cap ? k : cap - 1] = 0;
  if (rc >= 0 && buf && k >= cap) rc = -1; /* the text did not fit */
  if (steps) *steps = t;
  free(bits);
  free(allowed);
  return rc;
}
