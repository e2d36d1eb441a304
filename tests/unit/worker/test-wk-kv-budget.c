/* test-wk-kv-budget.c — the KV pool size under --gpu-memory-utilization
 * (wk_kv_bytes_for_util): total * util minus what is already in use, the
 * (0, 1] range, and a budget the weights already exceed. Pure arithmetic:
 * runs everywhere, no device needed. */
#include <math.h>
#include <stdint.h>

#include "common/cm-err.h"
#include "tests/harness/th.h"
#include "worker/wk-kv.h"

#define GIB (1ull << 30)

TH_TEST(kv_budget_is_the_rest_of_the_share) {
  uint64_t kv = 1;
  /* 141 GiB device, 17 GiB in use (weights, scratch, other processes) */
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(0.9, 141 * GIB, 124 * GIB, &kv), 0);
  TH_CHECK_EQ_INT(kv, (uint64_t)(141.0 * GIB * 0.9) - 17 * GIB);
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(0.5, 80 * GIB, 70 * GIB, &kv), 0);
  TH_CHECK_EQ_INT(kv, 30 * GIB);
  /* the whole device, exactly */
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(1.0, 80 * GIB + 7, 80 * GIB + 7, &kv), 0);
  TH_CHECK_EQ_INT(kv, 80 * GIB + 7);
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(1.0, 80 * GIB, 1, &kv), 0);
  TH_CHECK_EQ_INT(kv, 1);
}

TH_TEST(kv_budget_already_spent) {
  uint64_t kv = 1;
  /* 0.3 of 40 GiB is 12 GiB; 20 GiB are in use */
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(0.3, 40 * GIB, 20 * GIB, &kv), CM_ERR_NOMEM);
  TH_CHECK_EQ_INT(kv, 0);
  /* exactly spent: nothing left for a pool */
  kv = 1;
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(0.5, 40 * GIB, 20 * GIB, &kv), CM_ERR_NOMEM);
  TH_CHECK_EQ_INT(kv, 0);
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(1.0, 40 * GIB, 0, &kv), CM_ERR_NOMEM);
}

TH_TEST(kv_budget_rejects_bad_input) {
  uint64_t kv = 1;
  const double bad[] = {0.0, -0.1, 1.0000001, 2.0, NAN, INFINITY};
  for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    TH_CHECK_EQ_INT(wk_kv_bytes_for_util(bad[i], 80 * GIB, 60 * GIB, &kv), CM_ERR_INVAL);
    TH_CHECK_EQ_INT(kv, 0);
  }
  /* more free than there is */
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(0.9, 10 * GIB, 11 * GIB, &kv), CM_ERR_INVAL);
  /* the smallest share that is accepted */
  TH_CHECK_EQ_INT(wk_kv_bytes_for_util(1e-9, 80 * GIB, 80 * GIB, &kv), 0);
  TH_CHECK_EQ_INT(kv, (uint64_t)(80.0 * GIB * 1e-9));
}
