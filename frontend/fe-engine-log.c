/* fe-engine-log.c — the engine's lines for operators: each request received and
 * each choice finished (vLLM's --enable-log-requests and --enable-log-outputs), and
 * every few seconds each replica's throughput and load (vLLM's stats log).
 *
 *   request chatcmpl-1f3a received: prompt "<bos><start_of_turn>user\nHi..." (+212
 *   bytes), 64 tokens [2, 105, 2364, ...] (+48), params {"max_tokens":16, ...}
 *   request chatcmpl-1f3a choice 0 finished (length): 16 tokens, "Hello! How ..."
 *   replica 0: prompt 812.4 tokens/s, generation 95.1 tokens/s, running 3, waiting 0,
 *   KV cache 4.2%, prefix cache hits 50.0%
 *
 * Texts are written as JSON strings (a prompt's newlines and quotes escaped, so a
 * line stays one line), cut at --max-log-len bytes on a character's boundary. */
#include <stdio.h>
#include <string.h>

#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"

#define TAG "fe-engine"

/* text[0..len) as a JSON string, at most max bytes of it (0: all), then how many
 * of the text's total bytes (len or more: what was not kept) are left out. */
static void put_text(struct fe_buf *b, const char *text, size_t len, size_t total, int64_t max) {
  size_t n = max > 0 && len > (size_t)max ? fe_utf8_whole(text, (size_t)max) : len;
  fe_buf_json_str(b, text, n);
  if (n < total) fe_buf_printf(b, " (+%zu bytes)", total - n);
}

void fe_eng_log_received(const struct fe_eng_req *r, size_t pi, const char *text, size_t text_len,
                         const int32_t *ids, size_t n_ids, int64_t max_tokens) {
  const struct fe_engine *e = r->e;
  if (!e->cfg.log_requests || !CM_LOG_ENABLED(CM_LOG_INFO)) return;
  const struct fe_api_request *q = r->api;
  const int64_t max = e->cfg.max_log_len;
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_buf_printf(&b, "request %s", r->id);
  if (q->n_prompts > 1) fe_buf_printf(&b, "-%zu", pi);
  fe_buf_puts(&b, " received: prompt ");
  if (text)
    put_text(&b, text, text_len, text_len, max);
  else
    fe_buf_puts(&b, "(token ids)");
  fe_buf_printf(&b, ", %zu tokens [", n_ids);
  size_t shown = max > 0 && n_ids > (size_t)max ? (size_t)max : n_ids;
  for (size_t i = 0; i < shown; i++)
    fe_buf_printf(&b, "%s%d", i ? ", " : "", (int)ids[i]);
  fe_buf_puts(&b, "]");
  if (shown < n_ids) fe_buf_printf(&b, " (+%zu)", n_ids - shown);
  fe_buf_printf(&b,
                ", params {\"model\":\"%s\",\"max_tokens\":%lld,\"min_tokens\":%lld,\"n\":%d,"
                "\"temperature\":%g,\"top_p\":%g,\"top_k\":%d,\"min_p\":%g,"
                "\"presence_penalty\":%g,\"frequency_penalty\":%g,\"repetition_penalty\":%g,",
                q->model ? q->model : "", (long long)max_tokens, (long long)q->min_tokens, q->n,
                q->temperature, q->top_p, (int)q->top_k, q->min_p, q->presence_penalty,
                q->frequency_penalty, q->repetition_penalty);
  if (q->has_seed)
    fe_buf_printf(&b, "\"seed\":%lld,", (long long)q->seed);
  else
    fe_buf_puts(&b, "\"seed\":null,");
  fe_buf_puts(&b, "\"stop\":[");
  for (size_t i = 0; i < q->n_stop; i++) {
    if (i) fe_buf_puts(&b, ",");
    fe_buf_json_str(&b, q->stop[i], strlen(q->stop[i]));
  }
  fe_buf_printf(&b, "],\"stop_token_ids\":%zu,\"logprobs\":%d,\"ignore_eos\":%s,\"stream\":%s",
                q->n_stop_token_ids, q->logprobs, q->ignore_eos ? "true" : "false",
                q->stream ? "true" : "false");
  if (q->grammar_kind) fe_buf_printf(&b, ",\"structured\":\"%s\"", q->grammar_param);
  if (q->n_images) fe_buf_printf(&b, ",\"media\":%zu", q->n_images);
  fe_buf_puts(&b, "}");
  if (!b.err) cm_log_text(CM_LOG_INFO, TAG, b.data, b.len);
  fe_buf_free(&b);
}

void fe_eng_log_keep(struct fe_eng_choice *ch, const char *t, size_t n) {
  const struct fe_engine *e = ch->req->e;
  if (!e->cfg.log_outputs) return;
  /* past the cut only the count grows: a long answer keeps max + 4 bytes (the cut
   * then falls on a character's boundary) */
  int64_t max = e->cfg.max_log_len;
  size_t room = max > 0 && ch->logged.len < (size_t)max + 4 ? (size_t)max + 4 - ch->logged.len
                : max > 0                                   ? 0
                                                            : n;
  fe_buf_append(&ch->logged, t, n < room ? n : room);
  ch->logged_bytes += n;
}

void fe_eng_log_finished(const struct fe_eng_choice *ch) {
  const struct fe_eng_req *r = ch->req;
  if (!r->e->cfg.log_outputs || !CM_LOG_ENABLED(CM_LOG_INFO)) return;
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_buf_printf(&b, "request %s choice %d finished (%s): %lld tokens, ", r->id, ch->index,
                ch->finish_reason ? ch->finish_reason : "-", (long long)ch->n_gen);
  put_text(&b, ch->logged.data ? ch->logged.data : "", ch->logged.len, ch->logged_bytes,
           r->e->cfg.max_log_len);
  if (!b.err) cm_log_text(CM_LOG_INFO, TAG, b.data, b.len);
  fe_buf_free(&b);
}

void fe_eng_log_stats(struct fe_engine *e, uint64_t now) {
  if (e->cfg.log_stats_s <= 0) return;
  if (!e->stats_ns) e->stats_ns = now;
  double dt = (double)(now - e->stats_ns) / 1e9;
  if (dt < e->cfg.log_stats_s) return;
  e->stats_ns = now;
  for (int i = 0; i < e->n_rep; i++) {
    struct fe_replica *p = &e->rep[i];
    /* a replica not heard from lately has nothing to say (fe_eng_lost warned) */
    if (!p->have_pong || now - p->last_pong_ns > (uint64_t)e->cfg.dead_ms * 1000000ull) {
      p->stats_busy = 0;
      continue;
    }
    const struct pr_pong *g = &p->last_pong;
    /* the counters since the last line: since 0 when the scheduler restarted */
    struct pr_pong zero;
    memset(&zero, 0, sizeof(zero));
    const struct pr_pong *a =
        p->have_logged && !fe_eng_pong_restarted(&p->logged_pong, g) ? &p->logged_pong : &zero;
    const int had = p->have_logged;
#define GREW(f) (had ? (double)(g->f - a->f) : 0.0)
    double prompt = GREW(prompt_tokens), gen = GREW(generation_tokens),
           queries = GREW(prefix_cache_queries), hits = GREW(prefix_cache_hits),
           drafts = GREW(spec_num_draft_tokens), accepted = GREW(spec_num_accepted_tokens);
#undef GREW
    /* an idle replica's line once at info (that it went idle), then at debug */
    int busy = prompt > 0 || gen > 0 || g->num_running || g->num_waiting;
    enum cm_log_level lvl = busy || p->stats_busy ? CM_LOG_INFO : CM_LOG_DEBUG;
    p->stats_busy = busy;
    p->logged_pong = *g;
    p->logged_pong.kernels = p->logged_pong.matmul_inputs = NULL;
    p->have_logged = 1;
    char spec[96] = "";
    if (drafts > 0)
      snprintf(spec, sizeof(spec), ", drafts accepted %.1f%% (%.0f of %.0f tokens)",
               100.0 * accepted / drafts, accepted, drafts);
    cm_log(lvl, TAG,
           "replica %d: prompt %.1f tokens/s, generation %.1f tokens/s, running %u, waiting %u, "
           "KV cache %.1f%%, prefix cache hits %.1f%%%s",
           p->index, prompt / dt, gen / dt, (unsigned)g->num_running, (unsigned)g->num_waiting,
           100.0 * g->kv_usage, queries > 0 ? 100.0 * hits / queries : 0.0, spec);
  }
}
