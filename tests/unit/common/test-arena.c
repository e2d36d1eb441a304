/* test-arena.c — cm_arena: alignment, caps, reset, peak accounting. */
#include <stdint.h>

#include "common/cm-arena.h"
#include "tests/harness/th.h"

TH_TEST(arena_alignment_and_reuse) {
  struct cm_arena a;
  cm_arena_init(&a, 256, 0);
  for (int i = 0; i < 100; i++) {
    void *p = cm_arena_alloc(&a, (size_t)i + 1);
    TH_REQUIRE(p != NULL);
    TH_CHECK(((uintptr_t)p & 15u) == 0);
    memset(p, 0xab, (size_t)i + 1);
  }
  size_t peak = a.peak;
  TH_CHECK(peak >= 256);
  cm_arena_reset(&a);
  TH_CHECK_EQ_INT(a.used, 0);
  TH_CHECK(a.reserved <= peak);
  cm_arena_free(&a);
  TH_CHECK_EQ_INT(a.reserved, 0);
}

TH_TEST(arena_cap_refuses_large) {
  struct cm_arena a;
  cm_arena_init(&a, 1024, 4096);
  TH_CHECK(cm_arena_alloc(&a, 5000) == NULL);
  TH_CHECK(cm_arena_alloc(&a, (size_t)-8) == NULL);
  TH_CHECK(cm_arena_calloc(&a, SIZE_MAX / 2, 4) == NULL);
  void *p = cm_arena_alloc(&a, 3000);
  TH_CHECK(p != NULL);
  TH_CHECK(a.peak <= 4096);
  /* what is left under the cap is small: a second 3000 cannot fit */
  TH_CHECK(cm_arena_alloc(&a, 3000) == NULL);
  char *s = cm_arena_strndup(&a, "hello world", 5);
  TH_REQUIRE(s != NULL);
  TH_CHECK_EQ_STR(s, "hello");
  cm_arena_free(&a);
}
