/* fuzz-proto.c — fuzz target for proto's message decoder.
 *
 * Input: byte 0 is the message type, the rest is frame 1 (the msgpack body).
 * The decoder must return 0 or a negative cm_err code (CM_ERR_UNKNOWN for an
 * unknown type), never allocate past its arena's cap, and whatever it accepts
 * must validate, re-encode, decode again to an equal message, and re-encode
 * to the same bytes. Any other outcome aborts (a finding). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-arena.h"
#include "common/cm-err.h"
#include "proto/pr-msg.h"

#define ARENA_CAP (1u << 20) /* bytes */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void finding(const char *what, int rc) {
  fprintf(stderr, "fuzz-proto: %s (rc %d: %s)\n", what, rc, cm_strerror(rc));
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  enum pr_type type = (enum pr_type)data[0];
  struct cm_arena a, a2;
  struct pr_buf b, b2;
  struct pr_msg m, m2;
  cm_arena_init(&a, 4096, ARENA_CAP);
  cm_arena_init(&a2, 4096, ARENA_CAP);
  pr_buf_init(&b, 0);
  pr_buf_init(&b2, 0);

  int rc = pr_msg_decode_body(type, data + 1, size - 1, &a, &m);
  if (rc > 0) finding("positive result", rc);
  if (!pr_type_known(data[0]) && rc != CM_ERR_UNKNOWN) finding("unknown type accepted", rc);
  if (a.peak > ARENA_CAP) finding("arena past its cap", CM_ERR_NOMEM);
  if (rc == 0) {
    if ((rc = pr_msg_validate(&m)) != 0) finding("decoded message does not validate", rc);
    if ((rc = pr_msg_encode(&m, &b)) != 0) finding("re-encode failed", rc);
    rc = pr_msg_decode_body(type, b.data, b.len, &a2, &m2);
    if (rc != 0) finding("second decode failed", rc);
    if (!pr_msg_equal(&m, &m2)) finding("round trip differs", 0);
    if ((rc = pr_msg_encode(&m2, &b2)) != 0) finding("third encode failed", rc);
    if (b.len != b2.len || memcmp(b.data, b2.data, b.len) != 0)
      finding("encoding not canonical", 0);
  }
  pr_buf_free(&b);
  pr_buf_free(&b2);
  cm_arena_free(&a);
  cm_arena_free(&a2);
  return 0;
}
