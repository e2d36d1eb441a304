/* test-kv.c — sch_kv: block tables per group, sliding-window freeing with holes,
 * prefix matching across groups and salted by a request's cache salt, rollback,
 * worst-case sizing. */
#include <string.h>

#include "common/cm-err.h"
#include "scheduler/sch-block-pool.h"
#include "scheduler/sch-kv.h"
#include "tests/harness/th.h"

struct fixture {
  struct sch_block_pool *pool;
  struct sch_kv *kv;
};

static void setup(struct fixture *f, int32_t nblocks, const struct sch_kv_group_cfg *g, int32_t ng,
                  int caching) {
  int32_t maxbt = 0;
  for (int32_t i = 0; i < ng; i++)
    maxbt = g[i].block_tokens > maxbt ? g[i].block_tokens : maxbt;
  TH_REQUIRE(sch_block_pool_create(nblocks, maxbt, &f->pool) == 0);
  TH_REQUIRE(sch_kv_create(f->pool, g, ng, caching, 42, &f->kv) == 0);
}

static void teardown(struct fixture *f) {
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f->pool), 0);
  sch_kv_destroy(f->kv);
  sch_block_pool_destroy(f->pool);
}

/* Frees s's blocks and its tables. */
static void seq_end(struct fixture *f, struct sch_kv_seq *s) {
  sch_kv_free(f->kv, s);
  sch_kv_seq_release(s);
}

TH_TEST(kv_full_group_grows_by_blocks) {
  struct fixture f;
  setup(&f, 7, (const struct sch_kv_group_cfg[]){{4, 0}}, 1, 0);
  struct sch_kv_seq s;
  int32_t toks[32];
  for (int i = 0; i < 32; i++)
    toks[i] = i;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 32) == 0);
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 0, 5), 0);
  TH_CHECK_EQ_INT(s.len[0], 2);
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 5, 8), 0);
  TH_CHECK_EQ_INT(s.len[0], 2);
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 8, 9), 0);
  TH_CHECK_EQ_INT(s.len[0], 3);
  /* all or nothing: positions [0, 32) need 8 blocks, the pool has 7 */
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 9, 32), CM_ERR_FULL);
  TH_CHECK_EQ_INT(s.len[0], 3);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 3);
  seq_end(&f, &s);
  teardown(&f);
}

TH_TEST(kv_sliding_window_frees_with_holes) {
  struct fixture f;
  /* group 0 full attention, 4 tokens per block; group 1 sliding W = 6, 2 per block */
  setup(&f, 64, (const struct sch_kv_group_cfg[]){{4, 0}, {2, 6}}, 2, 0);
  struct sch_kv_seq s;
  int32_t toks[40] = {0};
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 40) == 0);
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 0, 10), 0);
  TH_CHECK_EQ_INT(s.len[0], 3);
  TH_CHECK_EQ_INT(s.len[1], 5);
  /* next query at 10 sees keys 5..10: sliding blocks 0 (0-1) and 1 (2-3) are dead,
   * block 2 (4-5) still holds position 5 */
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 10, 11), 0);
  TH_CHECK_EQ_INT(s.len[1], 6);
  TH_CHECK_EQ_INT(s.table[1][0], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s.table[1][1], SCH_BLOCK_HOLE);
  TH_CHECK(s.table[1][2] >= 0);
  TH_CHECK_EQ_INT(s.len[0], 3);
  for (int i = 0; i < 3; i++)
    TH_CHECK(s.table[0][i] >= 0);
  TH_CHECK_EQ_INT(sch_kv_seq_num_blocks(&s, 2), 3 + 4);
  /* query at 13 sees 8..13: blocks 2 and 3 go */
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 13, 14), 0);
  TH_CHECK_EQ_INT(s.table[1][2], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s.table[1][3], SCH_BLOCK_HOLE);
  TH_CHECK(s.table[1][4] >= 0);
  TH_CHECK_EQ_INT(s.len[1], 7);
  TH_CHECK_EQ_INT(sch_kv_seq_num_blocks(&s, 2), 4 + 3);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 7);
  /* a big chunk far ahead: blocks wholly behind the chunk's first query window are
   * holes from the start, never allocated */
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 14, 40), 0);
  TH_CHECK_EQ_INT(s.len[1], 20);
  TH_CHECK_EQ_INT(s.len[0], 10);
  sch_kv_free(f.kv, &s);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 0);
  sch_kv_seq_release(&s);
  teardown(&f);
}

TH_TEST(kv_rollback_releases_draft_blocks) {
  struct fixture f;
  setup(&f, 16, (const struct sch_kv_group_cfg[]){{4, 0}}, 1, 0);
  struct sch_kv_seq s;
  int32_t toks[32] = {0};
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 32) == 0);
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 0, 7), 0); /* prompt 7 */
  /* decode at 7 with 5 draft slots: positions 7..12 -> blocks 0..3 */
  TH_CHECK_EQ_INT(sch_kv_allocate(f.kv, &s, toks, 7, 13), 0);
  TH_CHECK_EQ_INT(s.len[0], 4);
  /* one draft accepted: positions 7 and 8 hold valid KV, keep 9 positions */
  sch_kv_rollback(f.kv, &s, 9);
  TH_CHECK_EQ_INT(s.len[0], 3);
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 3);
  sch_kv_rollback(f.kv, &s, 8);
  TH_CHECK_EQ_INT(s.len[0], 2);
  seq_end(&f, &s);
  teardown(&f);
}

/* Runs a "sequence" of ntok tokens through the cache: allocate, commit, free. */
static void run_and_cache(struct fixture *f, const int32_t *toks, int32_t ntok) {
  struct sch_kv_seq s;
  TH_REQUIRE(sch_kv_seq_init(f->kv, &s, ntok) == 0);
  int32_t h = sch_kv_prefix_match(f->kv, &s, toks, ntok);
  TH_REQUIRE(sch_kv_allocate(f->kv, &s, toks, h, ntok) == 0);
  sch_kv_commit(f->kv, &s, toks, ntok);
  seq_end(f, &s);
}

TH_TEST(kv_prefix_match_across_groups) {
  struct fixture f;
  setup(&f, 64, (const struct sch_kv_group_cfg[]){{4, 0}, {2, 0}}, 2, 1);
  int32_t a[20], b[20];
  for (int i = 0; i < 20; i++)
    a[i] = b[i] = 100 + i;
  b[13] = 7;                /* b shares a's first 13 tokens */
  run_and_cache(&f, a, 19); /* registers 4 full blocks of group 0, 9 of group 1 */
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 0);
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(f.pool), 4 + 9);
  struct sch_kv_seq s;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 20) == 0);
  /* a itself again: capped at 19 - 1 = 18 -> 16 (group 0 has 4 blocks) */
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 20), 16);
  sch_kv_seq_release(&s);
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 20) == 0);
  /* b: 13 shared tokens -> group 0 gives 12, group 1 gives 12 */
  int32_t h = sch_kv_prefix_match(f.kv, &s, b, 20);
  TH_CHECK_EQ_INT(h, 12);
  TH_REQUIRE(sch_kv_allocate(f.kv, &s, b, h, 20) == 0);
  /* 3 + 6 blocks revived from the LRU list, 2 + 4 new */
  TH_CHECK_EQ_INT(sch_block_pool_num_used(f.pool), 3 + 6 + 2 + 4);
  TH_CHECK_EQ_INT(s.num_registered[0], 3);
  /* the very last prompt token always runs: a prompt of exactly 4 cached tokens */
  struct sch_kv_seq t;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &t, 8) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &t, a, 4), 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &t, a, 5), 4);
  sch_kv_seq_release(&t);
  seq_end(&f, &s);
  teardown(&f);
}

/* A salted sequence (a request's cache_salt) shares cached blocks only with
 * sequences of the same salt: no hit across salts, or between salted and not. */
TH_TEST(kv_prefix_salted_only_by_its_salt) {
  struct fixture f;
  setup(&f, 64, (const struct sch_kv_group_cfg[]){{4, 0}}, 1, 1);
  int32_t a[17];
  for (int i = 0; i < 17; i++)
    a[i] = 300 + i;
  struct sch_kv_seq s;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 17) == 0);
  s.salt = 0x5a17;
  TH_REQUIRE(sch_kv_allocate(f.kv, &s, a, sch_kv_prefix_match(f.kv, &s, a, 17), 17) == 0);
  sch_kv_commit(f.kv, &s, a, 17);
  seq_end(&f, &s);
  static const uint64_t salts[] = {0x5a17, 0x5a18, 0};
  static const int32_t hits[] = {16, 0, 0};
  for (int k = 0; k < 3; k++) {
    TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 17) == 0);
    s.salt = salts[k];
    TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 17), hits[k]);
    sch_kv_seq_release(&s);
  }
  /* and the other way: blocks cached without a salt serve no salted sequence */
  run_and_cache(&f, a, 17);
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 17) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 17), 16);
  sch_kv_seq_release(&s);
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 17) == 0);
  s.salt = 0x5a18;
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 17), 0);
  sch_kv_seq_release(&s);
  teardown(&f);
}

TH_TEST(kv_prefix_with_sliding_group_and_caching_off) {
  struct fixture f;
  struct sch_kv_group_cfg g[2] = {{4, 0}, {4, 4}};
  setup(&f, 64, g, 2, 1);
  int32_t a[16];
  for (int i = 0; i < 16; i++)
    a[i] = i * 3;
  run_and_cache(&f, a, 16);
  struct sch_kv_seq s;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 16) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 16), 12);
  /* taking the hit: the sliding group's dead blocks (window 4 at query 12: block 2 holds
   * 9..11 and stays) are holes, not revived */
  TH_REQUIRE(sch_kv_allocate(f.kv, &s, a, 12, 16) == 0);
  TH_CHECK_EQ_INT(s.table[1][0], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s.table[1][1], SCH_BLOCK_HOLE);
  TH_CHECK(s.table[1][2] >= 0);
  TH_CHECK(s.table[0][0] >= 0);
  seq_end(&f, &s);
  teardown(&f);

  setup(&f, 64, g, 2, 0);
  run_and_cache(&f, a, 16);
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(f.pool), 0);
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 16) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 16), 0);
  sch_kv_seq_release(&s);
  uint64_t q, hits;
  sch_kv_count_query(f.kv, 16, 0);
  sch_kv_counters(f.kv, &q, &hits);
  TH_CHECK_EQ_INT(q, 0); /* caching off: nothing counted */
  teardown(&f);
}

TH_TEST(kv_prefix_sliding_group_needs_only_its_window) {
  struct fixture f;
  setup(&f, 8, (const struct sch_kv_group_cfg[]){{4, 0}, {4, 4}}, 2, 1);
  int32_t a[16];
  for (int i = 0; i < 16; i++)
    a[i] = 7 + i;
  /* run a in four chunks: the sliding group releases blocks 0 and 1 on the way, so
   * they are the oldest on the LRU list after the sequence ends */
  struct sch_kv_seq s;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 16) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 16), 0);
  for (int32_t q0 = 0; q0 < 16; q0 += 4) {
    TH_REQUIRE(sch_kv_allocate(f.kv, &s, a, q0, q0 + 4) == 0);
    sch_kv_commit(f.kv, &s, a, q0 + 4);
  }
  TH_CHECK_EQ_INT(s.table[1][0], SCH_BLOCK_HOLE); /* released: the entries are holes now */
  TH_CHECK_EQ_INT(s.table[1][1], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s.first_live[1], 2);
  seq_end(&f, &s);
  TH_CHECK_EQ_INT(sch_block_pool_num_cached_free(f.pool), 8);
  /* two new blocks evict the two oldest cached ones: the sliding group's blocks 0, 1 */
  int32_t x = sch_block_pool_alloc(f.pool), y = sch_block_pool_alloc(f.pool);
  TH_REQUIRE(x >= 0 && y >= 0);
  TH_CHECK_EQ_INT(sch_block_pool_num_evictions(f.pool), 2);
  /* the full group still has blocks 0..2 and the window of a query at 12 (keys 9..11)
   * lies in sliding block 2: the hit is 12 tokens */
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 16) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, a, 16), 12);
  TH_REQUIRE(sch_kv_allocate(f.kv, &s, a, 12, 16) == 0);
  TH_CHECK_EQ_INT(s.table[1][0], SCH_BLOCK_HOLE);
  TH_CHECK_EQ_INT(s.table[1][1], SCH_BLOCK_HOLE);
  TH_CHECK(s.table[1][2] >= 0 && s.table[1][3] >= 0);
  TH_CHECK_EQ_INT(sch_block_pool_num_available(f.pool), 0);
  seq_end(&f, &s);
  /* a prompt that diverges inside sliding block 2: the window at 12 misses, and at 8
   * (keys 5..7, block 1) it misses too: no hit */
  int32_t b[16];
  memcpy(b, a, sizeof(b));
  b[10] = 999;
  TH_REQUIRE(sch_kv_seq_init(f.kv, &s, 16) == 0);
  TH_CHECK_EQ_INT(sch_kv_prefix_match(f.kv, &s, b, 16), 0);
  sch_kv_seq_release(&s);
  sch_block_pool_unref(f.pool, x);
  sch_block_pool_unref(f.pool, y);
  teardown(&f);
}

TH_TEST(kv_worst_case_blocks) {
  struct fixture f;
  setup(&f, 8, (const struct sch_kv_group_cfg[]){{16, 0}, {16, 512}}, 2, 1);
  /* full: ceil(1000/16) = 63; sliding: min(63, ceil((511 + 64) / 16) + 1 = 37) */
  TH_CHECK_EQ_INT(sch_kv_worst_case_blocks(f.kv, 1000, 64), 63 + 37);
  TH_CHECK_EQ_INT(sch_kv_worst_case_blocks(f.kv, 100, 64), 7 + 7);
  teardown(&f);
}
