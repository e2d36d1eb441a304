/* te-fake-sched.h — a scripted scheduler for the serving-path tests: a
 * ROUTER on its own thread that answers PING with PONG and every ADD with
 * a fixed token script, one token per tick, batched into one OUT. What a
 * request gets depends on its max_tokens:
 *   7     ERR CM_ERR_INVAL ("fake: refused")
 *   9     ERR CM_ERR_DEVICE ("fake: device lost")
 *   11    two tokens, then ERR CM_ERR_DEVICE
 *   13    first junk (a token outside the vocabulary, an OUT and an ERR
 *         for unknown ids, an ERR about no request, a BEAT), then the script
 *   50    tokens forever, until ABORT
 *   else  the script up to max_tokens (finish "length"), or the script and
 *         EOS as the last token (finish "stop") when it is shorter
 * Every ADD and ABORT is recorded for the test to check. */
#ifndef LMSERVE_TE_FAKE_SCHED_H
#define LMSERVE_TE_FAKE_SCHED_H
#include <stdint.h>

#define TE_MAX_ADDS 256

struct te_add {
  uint64_t id;
  uint32_t prompt[128]; /* first tokens of the prompt */
  uint32_t n_prompt;    /* tokens */
  uint32_t max_tokens;
  uint32_t n_stop_ids;
  int has_seed;
  uint64_t seed;
  int32_t logprobs;
};

struct te_sched;

/* Binds `endpoint` and starts the thread. script: (n) token ids; eos: the
 * id a stop finish ends with. */
int te_sched_start(const char *endpoint, const int32_t *script, int n, int32_t eos,
                   uint32_t max_model_len, struct te_sched **out);
void te_sched_stop(struct te_sched *s);
/* 1: ignore every message from now on (an engine that stopped answering). */
void te_sched_mute(struct te_sched *s, int mute);
/* The generation_tokens total PONGs report (a smaller one reads as a
 * restarted scheduler). */
void te_sched_set_gen_total(struct te_sched *s, uint64_t v);
/* Copies the ADDs seen so far; returns how many. */
int te_sched_adds(struct te_sched *s, struct te_add *out, int max);
/* 1 when an ABORT named `id`. */
int te_sched_aborted(struct te_sched *s, uint64_t id);

#endif
