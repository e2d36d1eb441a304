/* pr-samples.h — sample messages for proto's tests and fuzz seed corpus: for
 * every message type a typical one, a minimal one (empty arrays, absent
 * optional fields) and one with maximum-size fields and extreme values. */
#ifndef LMSERVE_TESTS_PR_SAMPLES_H
#define LMSERVE_TESTS_PR_SAMPLES_H
#include "proto/pr-msg.h"

/* Number of samples. */
int prs_count(void);
/* Fills *m with sample i (0 <= i < prs_count()); arrays point into static
 * storage that lives as long as the program; `name` gets a short file-safe
 * label like "add-typical". */
void prs_build(int i, struct pr_msg *m, const char **name);

#endif
