/* test-text.c — cm_utf8_len against the Unicode Standard's table of
 * well-formed byte sequences (Table 3-7: the allowed range of each byte by the
 * first byte), written out here as ranges, over every sequence of up to three
 * bytes and a sweep of four-byte ones; cm_grow's and cm_grow_items' doubling
 * and their refusals. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "common/cm-utf8.h"
#include "tests/harness/th.h"

/* Table 3-7: first-byte range, then the ranges of the following bytes. */
static const struct {
  uint8_t lo, hi, len, r[3][2];
} k_wellformed[] = {
    {0x00, 0x7f, 1, {{0}}},
    {0xc2, 0xdf, 2, {{0x80, 0xbf}}},
    {0xe0, 0xe0, 3, {{0xa0, 0xbf}, {0x80, 0xbf}}},
    {0xe1, 0xec, 3, {{0x80, 0xbf}, {0x80, 0xbf}}},
    {0xed, 0xed, 3, {{0x80, 0x9f}, {0x80, 0xbf}}},
    {0xee, 0xef, 3, {{0x80, 0xbf}, {0x80, 0xbf}}},
    {0xf0, 0xf0, 4, {{0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}}},
    {0xf1, 0xf3, 4, {{0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}}},
    {0xf4, 0xf4, 4, {{0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}}},
};

/* The table's answer for s[0..n): the length of the well-formed sequence at
 * its start, or 0. */
static size_t table_len(const unsigned char *s, size_t n) {
  for (size_t k = 0; k < sizeof k_wellformed / sizeof k_wellformed[0]; k++) {
    if (s[0] < k_wellformed[k].lo || s[0] > k_wellformed[k].hi) continue;
    size_t len = k_wellformed[k].len;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++)
      if (s[i] < k_wellformed[k].r[i - 1][0] || s[i] > k_wellformed[k].r[i - 1][1]) return 0;
    return len;
  }
  return 0;
}

TH_TEST(utf8_len_follows_the_standards_table) {
  unsigned char s[4];
  size_t checked = 0, bad = 0;
  for (unsigned a = 0; a < 256; a++)
    for (unsigned b = 0; b < 256; b++)
      for (unsigned c = 0; c < 256; c++) {
        s[0] = (unsigned char)a, s[1] = (unsigned char)b, s[2] = (unsigned char)c, s[3] = 0x80;
        for (size_t n = 1; n <= 4; n++) { /* every cut of the buffer, a fourth byte that fits */
          checked++;
          if (cm_utf8_len(s, n) != table_len(s, n) && bad++ < 5)
            th_fail(__FILE__, __LINE__, "%02x %02x %02x n=%zu: %zu, the table says %zu", a, b, c, n,
                    cm_utf8_len(s, n), table_len(s, n));
        }
      }
  for (unsigned a = 0xf0; a < 0x100; a++) /* four-byte sequences: every fourth byte */
    for (unsigned b = 0x70; b < 0xd0; b += 3)
      for (unsigned c = 0x70; c < 0xd0; c += 5)
        for (unsigned d = 0; d < 256; d++) {
          s[0] = (unsigned char)a, s[1] = (unsigned char)b, s[2] = (unsigned char)c;
          s[3] = (unsigned char)d;
          checked++;
          if (cm_utf8_len(s, 4) != table_len(s, 4) && bad++ < 5)
            th_fail(__FILE__, __LINE__, "%02x %02x %02x %02x: %zu, the table says %zu", a, b, c, d,
                    cm_utf8_len(s, 4), table_len(s, 4));
        }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK(checked > 60000000);
}

TH_TEST(grow_doubles_and_keeps_what_it_had) {
  char *buf = NULL;
  size_t cap = 0;
  TH_REQUIRE(cm_grow(&buf, &cap, 0, 16) == 0); /* nothing needed: nothing allocated */
  TH_CHECK(buf == NULL && cap == 0);
  TH_REQUIRE(cm_grow(&buf, &cap, 5, 16) == 0);
  TH_CHECK(buf != NULL && cap == 16);
  memcpy(buf, "abcde", 5);
  TH_REQUIRE(cm_grow(&buf, &cap, 17, 16) == 0);
  TH_CHECK_EQ_INT(cap, 32);
  TH_REQUIRE(cm_grow(&buf, &cap, 100, 16) == 0);
  TH_CHECK_EQ_INT(cap, 128);
  TH_CHECK(memcmp(buf, "abcde", 5) == 0);
  TH_REQUIRE(cm_grow(&buf, &cap, 3, 16) == 0); /* fits: unchanged */
  TH_CHECK_EQ_INT(cap, 128);
  /* a size no allocation can give: refused, the buffer as it was */
  char *was = buf;
  TH_CHECK_EQ_INT(cm_grow(&buf, &cap, SIZE_MAX - 8, 16), CM_ERR_NOMEM);
  TH_CHECK(buf == was && cap == 128);
  free(buf);
  char *b2 = NULL;
  size_t c2 = 0; /* no first size given: from one byte */
  TH_REQUIRE(cm_grow(&b2, &c2, 3, 0) == 0);
  TH_CHECK(b2 != NULL && c2 >= 3);
  free(b2);
}

TH_TEST(grow_items_doubles_a_table) {
  double *t = NULL;
  int cap = 0;
  TH_REQUIRE(cm_grow_items(&t, &cap, 0, sizeof(*t), 4) == 0); /* nothing needed */
  TH_CHECK(t == NULL && cap == 0);
  for (int n = 0; n < 100; n++) {
    TH_REQUIRE(cm_grow_items(&t, &cap, n + 1, sizeof(*t), 4) == 0);
    t[n] = n;
  }
  TH_CHECK_EQ_INT(cap, 128);
  int same = 1;
  for (int n = 0; n < 100; n++)
    same &= t[n] == n;
  TH_CHECK(same);
  TH_REQUIRE(cm_grow_items(&t, &cap, 1000, sizeof(*t), 4) == 0); /* past two doublings */
  TH_CHECK_EQ_INT(cap, 1024);
  /* more bytes than any allocation can give: refused, the table as it was */
  double *was = t;
  TH_CHECK_EQ_INT(cm_grow_items(&t, &cap, INT_MAX, SIZE_MAX / 8, 4), CM_ERR_NOMEM);
  TH_CHECK(t == was && cap == 1024);
  free(t);
}
