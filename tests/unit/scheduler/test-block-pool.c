/* test-block-pool.c — sch_block_pool: allocation order, reference counts, LRU eviction
 * of cached blocks, hash lookups that compare content, usage accounting. */
#include "common/cm-err.h"
#include "scheduler/sch-block-pool.h"
#include "scheduler/sch-hash.h"
#include "tests/harness/th.h"

static void check_pool(const struct sch_block_pool *p) {
  char err[256];
  int rc = sch_block_pool_check(p, err, sizeof(err));
  if (rc) th_fail(__FILE__, __LINE__, "pool check: %s", err);
}

TH_TEST(pool_alloc_free_and_usage) {
  struct sch_block_pool *p;
  TH_REQUIRE(sch_block_pool_create(4, 16, &p) == 0);
  TH_CHECK_EQ_INT(sch_block_pool_num_available(p), 4);
  TH_CHECK_NEAR(sch_block_pool_usage(p), 0.0, 1e-12);
  int32_t a = sch_block_pool_alloc(p), b = sch_block_pool_alloc(p);
  TH_CHECK_EQ_INT(a, 0);
  TH_CHECK_EQ_INT(b, 1);
  TH_CHECK_NEAR(sch_block_pool_usage(p), 0.5, 1e-12);
  sch_block_pool_ref(p, a);
  TH_CHECK_EQ_INT(sch_block_pool_refcount(p, a), 2);
  sch_block_pool_unref(p, a);
  TH_CHECK_EQ_INT(sch_block_pool_refcount(p, a), 1);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(p), 2);
  int32_t c = sch_block_pool_alloc(p), d = sch_block_pool_alloc(p);
  TH_CHECK(c >= 0 && d >= 0);
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), CM_ERR_FULL);
  check_pool(p);
  sch_block_pool_unref(p, b);
  TH_CHECK_EQ_INT(sch_block_pool_refcount(p, b), 0);
  /* an unhashed block goes straight back to the free list and is reused first */
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), b);
  sch_block_pool_unref(p, a);
  sch_block_pool_unref(p, b);
  sch_block_pool_unref(p, c);
  sch_block_pool_unref(p, d);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(p), 0);
  TH_CHECK_NEAR(sch_block_pool_usage(p), 0.0, 1e-12);
  check_pool(p);
  sch_block_pool_destroy(p);
}

TH_TEST(pool_rejects_bad_sizes) {
  struct sch_block_pool *p = (struct sch_block_pool *)1;
  TH_CHECK_EQ_INT(sch_block_pool_create(0, 16, &p), CM_ERR_INVAL);
  TH_CHECK(p == NULL);
  TH_CHECK_EQ_INT(sch_block_pool_create(8, 0, &p), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(sch_block_pool_create(-3, 16, &p), CM_ERR_INVAL);
}

TH_TEST(pool_lookup_compares_content) {
  struct sch_block_pool *p;
  TH_REQUIRE(sch_block_pool_create(8, 4, &p) == 0);
  int32_t toks[4] = {5, 6, 7, 8}, other[4] = {5, 6, 7, 9};
  uint64_t h = sch_hash_block(1, 0, 0, toks, 4);
  int32_t a = sch_block_pool_alloc(p);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, toks, 4), -1);
  TH_CHECK_EQ_INT(sch_block_pool_set_hash(p, a, h, 0, 0, toks, 4), 0);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, toks, 4), a);
  /* a forged hash collision: same hash, different tokens, parent or group -> miss */
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, other, 4), -1);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 1, 0, toks, 4), -1);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 1, toks, 4), -1);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, toks, 3), -1);
  /* the same content cannot be registered twice; a hashed block not again */
  int32_t b = sch_block_pool_alloc(p);
  TH_CHECK_EQ_INT(sch_block_pool_set_hash(p, b, h, 0, 0, toks, 4), CM_ERR_STATE);
  TH_CHECK_EQ_INT(sch_block_pool_set_hash(p, a, h + 1, 0, 0, other, 4), CM_ERR_STATE);
  TH_CHECK_EQ_INT(sch_block_pool_set_hash(p, b, h, 0, 0, other, 4), 0);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, other, 4), b);
  check_pool(p);
  /* released hashed blocks stay findable, count as free, and revive with ref 1 */
  sch_block_pool_unref(p, a);
  TH_CHECK(sch_block_pool_is_cached_free(p, a));
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(p), 1);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(p), 1);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, h, 0, 0, toks, 4), a);
  sch_block_pool_ref(p, a);
  TH_CHECK_EQ_INT(sch_block_pool_refcount(p, a), 1);
  TH_CHECK(!sch_block_pool_is_cached_free(p, a));
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(p), 0);
  check_pool(p);
  sch_block_pool_unref(p, a);
  sch_block_pool_unref(p, b);
  sch_block_pool_destroy(p);
}

TH_TEST(pool_lru_evicts_oldest_only_when_free_list_empty) {
  struct sch_block_pool *p;
  TH_REQUIRE(sch_block_pool_create(4, 2, &p) == 0);
  int32_t ids[4];
  for (int i = 0; i < 4; i++) {
    ids[i] = sch_block_pool_alloc(p);
    int32_t t[2] = {i, i};
    TH_REQUIRE(sch_block_pool_set_hash(p, ids[i], (uint64_t)(100 + i), 0, 0, t, 2) == 0);
  }
  /* release in the order 2, 0, 3: LRU order oldest-first is 2, 0, 3; 1 stays used */
  sch_block_pool_unref(p, ids[2]);
  sch_block_pool_unref(p, ids[0]);
  sch_block_pool_unref(p, ids[3]);
  TH_CHECK_EQ_INT(sch_block_pool_num_available(p), 3);
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(p), 3);
  /* touching 2 (a prefix hit) moves it to the newest end when released again */
  sch_block_pool_ref(p, ids[2]);
  sch_block_pool_unref(p, ids[2]);
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), ids[0]);
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), ids[3]);
  TH_CHECK_EQ_INT(sch_block_pool_num_evictions(p), 2);
  int32_t t0[2] = {0, 0}, t2[2] = {2, 2};
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, 100, 0, 0, t0, 2), -1); /* evicted: forgotten */
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, 102, 0, 0, t2, 2), ids[2]);
  check_pool(p);
  /* a plain free block is preferred over the last cached one */
  sch_block_pool_unref(p, ids[3]); /* unhashed now: free list */
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), ids[3]);
  TH_CHECK_EQ_INT(sch_block_pool_lookup(p, 102, 0, 0, t2, 2), ids[2]);
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), ids[2]);
  TH_CHECK_EQ_INT(sch_block_pool_alloc(p), CM_ERR_FULL);
  check_pool(p);
  sch_block_pool_destroy(p);
}

TH_TEST(hash_depends_on_every_input) {
  int32_t t[4] = {1, 2, 3, 4}, u[4] = {1, 2, 3, 5}, v[4] = {2, 1, 3, 4};
  uint64_t h = sch_hash_block(7, 0, 0, t, 4);
  TH_CHECK(h == sch_hash_block(7, 0, 0, t, 4));
  TH_CHECK(h != sch_hash_block(8, 0, 0, t, 4));
  TH_CHECK(h != sch_hash_block(7, 1, 0, t, 4));
  TH_CHECK(h != sch_hash_block(7, 0, 1, t, 4));
  TH_CHECK(h != sch_hash_block(7, 0, 0, u, 4));
  TH_CHECK(h != sch_hash_block(7, 0, 0, v, 4));
  TH_CHECK(h != sch_hash_block(7, 0, 0, t, 3));
  /* no collisions over many small distinct blocks */
  enum { N = 4096 };
  static uint64_t hs[N];
  for (int i = 0; i < N; i++) {
    int32_t b[3] = {i & 15, (i >> 4) & 15, i >> 8};
    hs[i] = sch_hash_block(7, 0, 0, b, 3);
  }
  int dup = 0;
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      dup += hs[i] == hs[j];
  TH_CHECK_EQ_INT(dup, 0);
}
