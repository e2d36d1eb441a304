/* fe-engine-out.c — what comes back from the scheduler: OUT messages
 * turned into text per choice (incremental detokenization, stop strings,
 * logprobs), SSE chunks or one JSON answer once every choice finished,
 * ERR mapped to HTTP statuses, client disconnects turned into ABORTs, and
 * the per-request metrics (TTFT, inter-token latency, e2e, token totals). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"
#include "frontend/fe-messages.h"
#include "frontend/fe-responses.h"
#include "frontend/fe-rstore.h"

#define TAG "fe-engine"

static void m_inc(struct fe_engine *e, int id, double v) {
  if (e->metrics) fe_metrics_inc(e->metrics, id, v);
}
static void m_obs(struct fe_engine *e, int id, double v) {
  if (e->metrics) fe_metrics_observe(e->metrics, id, v);
}
/* The ids of the series of the replica request r runs on. */
static const struct fe_replica_metric_ids *rep_ids(const struct fe_eng_req *r) {
  int i = r->rep ? r->rep->index : 0;
  return &r->e->mid.rep[i < r->e->mid.n_rep ? i : 0];
}

static enum fe_finish finish_kind(const char *reason) {
  if (reason && !strcmp(reason, "length")) return FE_FINISH_LENGTH;
  if (reason && !strcmp(reason, "abort")) return FE_FINISH_ABORT;
  return FE_FINISH_STOP;
}

/* A finished request's metrics, on its replica's series: one observation
 * per request in every histogram, counted once in request_success by its
 * first choice's finish reason. */
static void observe_finished(struct fe_eng_req *r, const struct fe_api_usage *u) {
  struct fe_engine *e = r->e;
  const struct fe_replica_metric_ids *ri = rep_ids(r);
  uint64_t now = cm_time_ns();
  m_obs(e, ri->e2e_request_latency_seconds, (double)(now - r->start_ns) / 1e9);
  m_inc(e, ri->request_success[finish_kind(r->n_ch ? r->ch[0].finish_reason : NULL)], 1);
  m_inc(e, ri->prompt_tokens, (double)r->prompt_total);
  m_obs(e, ri->request_prompt_tokens, (double)u->prompt_tokens);
  m_obs(e, ri->request_generation_tokens, (double)u->completion_tokens);
  m_obs(e, ri->request_params_max_tokens, (double)r->max_tokens_param);
  m_obs(e, ri->request_params_n, (double)(r->api->n_keep ? r->api->n_keep : r->api->n));
  double decode = r->first_token_seen ? (double)(now - r->first_token_ns) / 1e9 : 0;
  m_obs(e, ri->request_decode_time_seconds, decode);
  if (r->have_sched_times) {
    m_obs(e, ri->request_queue_time_seconds, r->queue_s);
    m_obs(e, ri->request_prefill_time_seconds, r->prefill_s);
    m_obs(e, ri->request_inference_time_seconds, r->prefill_s + decode);
  }
}

/* ---- aborts and failures --------------------------------------------------- */

/* Frees r and what the retry path kept of it. */
static void req_release(struct fe_eng_req *r) {
  for (int k = 0; k < r->n_ch; k++)
    fe_eng_choice_forget_add(&r->ch[k]);
  if (r->parked) r->e->n_parked--;
  r->parked = 0;
  fe_eng_req_free(r);
}

void fe_eng_abort_live(struct fe_eng_req *r) {
  uint64_t ids[FE_API_MAX_N];
  uint32_t n = 0;
  for (int k = 0; k < r->n_ch; k++) {
    if (!r->ch[k].live) continue;
    r->ch[k].live = 0;
    ids[n++] = r->ch[k].id;
  }
  if (!n) return;
  struct pr_msg m;
  pr_msg_init(&m, PR_ABORT);
  m.u.abort.request_ids.v = ids;
  m.u.abort.request_ids.n = n;
  int rc = r->rep ? fe_eng_send(r->rep, &m) : CM_ERR_CLOSED;
  if (rc) cm_warn(TAG, "ABORT of %u request(s) not sent: %s", (unsigned)n, cm_strerror(rc));
}

/* The usage so far: prompt tokens once a prompt, the cached ones those of each
 * prompt's first choice (with --enable-prompt-tokens-details), and the
 * completion tokens of all choices, or of ch alone (a streamed chunk's). */
static void usage_of(const struct fe_eng_req *r, const struct fe_eng_choice *ch,
                     struct fe_api_usage *u) {
  *u = (struct fe_api_usage){.prompt_tokens = r->prompt_total,
                             .details = r->e->cfg.prompt_tokens_details};
  for (int k = 0; k < r->n_ch; k++) {
    if (!ch || ch == &r->ch[k]) u->completion_tokens += r->ch[k].n_gen;
    if (!ch || ch == &r->ch[k]) u->reasoning_tokens += r->ch[k].n_thought;
    if (k % r->api->n == 0) u->cached_tokens += r->ch[k].n_cached;
  }
}

/* return_token_ids: a token generated after the choice's. */
static int ids_push(struct fe_eng_choice *ch, int32_t id) {
  if (ch->n_ids == ch->cap_ids) {
    size_t cap = ch->cap_ids ? ch->cap_ids * 2 : 64;
    int32_t *p = realloc(ch->ids, cap * sizeof(*p));
    if (!p) return CM_ERR_NOMEM;
    ch->ids = p;
    ch->cap_ids = cap;
  }
  ch->ids[ch->n_ids++] = id;
  return 0;
}

/* return_token_ids: c's token ids (ch's), and its prompt's where `prompt` says. */
static void with_ids(const struct fe_eng_req *r, const struct fe_eng_choice *ch,
                     struct fe_api_choice *c, int prompt) {
  if (!r->api->return_token_ids) return;
  c->with_ids = 1;
  c->ids = ch->ids;
  c->n_ids = ch->n_ids;
  if (prompt) {
    c->prompt_ids = ch->prompt_ids;
    c->n_prompt_ids = ch->n_prompt_ids;
  }
}

static void stream_begin(struct fe_eng_req *r) {
  if (r->sse_on) return;
  r->sse_on = 1;
  fe_sse_begin(&r->sse, r->conn, r->api, r->id, r->created);
  r->sse.n = r->n_ch; /* several prompts: n per prompt */
  if (r->api->kind != FE_API_CHAT) return;
  for (int k = 0; k < r->n_ch; k++) { /* the role first, with empty content, as vLLM does */
    struct fe_api_choice c = {k, "", 0, NULL, NULL, 0, 0};
    with_ids(r, &r->ch[k], &c, 1); /* return_token_ids: the prompt's here, no tokens yet */
    c.n_ids = 0;
    usage_of(r, &r->ch[k], &r->sse.usage);
    r->sse.usage.completion_tokens = 0;
    fe_sse_send(&r->sse, &c);
  }
}

void fe_eng_req_fail(struct fe_eng_req *r, int status, const char *msg, const char *param) {
  struct fe_engine *e = r->e;
  if (r->busy) { /* inside OUT processing: the caller fails it afterwards */
    if (!r->fail_status) {
      r->fail_status = status;
      snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg);
    }
    return;
  }
  if (r->answering) return; /* failed again from inside its own answer */
  r->answering = 1;
  /* sending ABORT receives too: nothing more may reach this request */
  fe_eng_req_unmap(r);
  fe_eng_abort_live(r);
  m_inc(e, status >= 500 ? e->mid.http_server_errors : e->mid.http_client_errors, 1);
  if (r->sse_on) {
    fe_sse_send_error(&r->sse, status, msg);
    fe_sse_end(&r->sse, NULL);
  } else {
    fe_conn_respond_error(r->conn, status, msg, param);
  }
  req_release(r);
}

void fe_eng_on_client_abort(void *ud) {
  struct fe_eng_req *r = ud;
  if (r->busy || r->answering) { /* the code that holds r frees it */
    r->gone = 1;
    return;
  }
  cm_debug(TAG, "client left: aborting %d choice(s)", r->n_ch);
  r->answering = 1;
  fe_eng_req_unmap(r);
  fe_eng_abort_live(r);
  if (r->sse_on)
    fe_sse_end(&r->sse, NULL);
  else
    fe_conn_respond_error(r->conn, 499, "client closed the request", NULL);
  req_release(r);
}

static int err_status(int code) {
  switch (code) {
  case CM_ERR_INVAL:
  case CM_ERR_RANGE:
  case CM_ERR_TOOBIG:
  case CM_ERR_PARSE:
  case CM_ERR_UNSUPPORTED: return 400;
  case CM_ERR_FULL: return 429;
  case CM_ERR_AGAIN:
  case CM_ERR_CLOSED:
  case CM_ERR_TIMEOUT: return 503;
  default: return 500;
  }
}

void fe_eng_on_err(struct fe_engine *e, const struct pr_err *er) {
  struct fe_eng_choice *ch = er->request_id ? fe_eng_map_get(e, er->request_id) : NULL;
  if (!ch || ch->done) {
    /* CM_ERR_AGAIN for a choice of a request parked already is expected */
    if (er->code == CM_ERR_AGAIN)
      cm_debug(TAG, "scheduler error (request %llu): %s", (unsigned long long)er->request_id,
               er->message);
    else
      cm_warn(TAG, "scheduler error (request %llu): %s: %s", (unsigned long long)er->request_id,
              cm_strerror(er->code), er->message);
    return;
  }
  ch->live = 0;
  /* the engine lost it (a worker failed) or cannot take it now, and nothing of it
   * reached the client: it waits for the engine to be ready again */
  if (er->code == CM_ERR_AGAIN && fe_eng_req_retryable(ch->req)) {
    struct fe_replica *p = ch->req->rep;
    if (p && p->workers_ok)
      cm_warn(TAG, "request %llu lost in the engine (%s): sent again once it is ready",
              (unsigned long long)er->request_id, er->message);
    if (p) p->workers_ok = 0; /* until a PONG says it is ready */
    fe_eng_req_park(ch->req);
    return;
  }
  int status = err_status(er->code);
  /* the engine may have failed (a worker died): its PONG says at once, so that
   * /health and new requests need not wait for the next ping */
  if (status >= 500 && ch->req->rep) /* one PING after the messages at hand */
    ch->req->rep->ping_soon = 1;
  fe_eng_req_fail(ch->req, status, er->message, NULL);
}

/* ---- text and logprobs ------------------------------------------------------- */

static int lp_push(struct fe_eng_choice *ch, int32_t id, const struct pr_logprobs *lp, uint32_t t) {
  if (ch->n_lps == ch->cap_lps) {
    size_t cap = ch->cap_lps ? ch->cap_lps * 2 : 64;
    struct fe_eng_lp *p = realloc(ch->lps, cap * sizeof(*p));
    if (!p) return CM_ERR_NOMEM;
    ch->lps = p;
    ch->cap_lps = cap;
  }
  uint32_t nt = lp->n_top;
  if (ch->n_top_all + nt > ch->cap_top) {
    size_t cap = ch->cap_top ? ch->cap_top * 2 : 256;
    while (cap < ch->n_top_all + nt)
      cap *= 2;
    struct fe_eng_top *p = realloc(ch->tops, cap * sizeof(*p));
    if (!p) return CM_ERR_NOMEM;
    ch->tops = p;
    ch->cap_top = cap;
  }
  struct fe_eng_lp *x = &ch->lps[ch->n_lps++];
  x->id = id;
  x->logprob = lp->sampled.v[t];
  x->top_i = (uint32_t)ch->n_top_all;
  x->n_top = nt;
  for (uint32_t j = 0; j < nt; j++) {
    size_t k = (size_t)t * nt + j;
    ch->tops[ch->n_top_all++] = (struct fe_eng_top){(int32_t)lp->top_ids.v[k], lp->top.v[k]};
  }
  return 0;
}

/* The prompt's logprobs from ch's first output s into ch (all of them: a prompt of
 * n tokens has n - 1), and with completions' echo and logprobs its tokens ahead of
 * the answer's in ch->lps (the first without a logprob). CM_ERR_STATE when they did
 * not all come. */
static int take_prompt_lps(struct fe_eng_choice *ch, const struct pr_out_seq *s) {
  const struct fe_api_request *q = ch->req->api;
  const struct pr_logprobs *lp = &s->prompt_logprobs;
  size_t n = ch->n_prompt_ids ? ch->n_prompt_ids - 1 : 0;
  uint32_t k = (uint32_t)q->prompt_logprobs;
  if (lp->sampled.n != n || (n && (lp->n_top < k || lp->ranks.n != n))) return CM_ERR_STATE;
  ch->plp = malloc((n ? n : 1) * sizeof(*ch->plp));
  ch->plp_rank = malloc((n ? n : 1) * sizeof(*ch->plp_rank));
  ch->plp_top = malloc((n && k ? n * k : 1) * sizeof(*ch->plp_top));
  if (!ch->plp || !ch->plp_rank || !ch->plp_top) return CM_ERR_NOMEM;
  for (size_t i = 0; i < n; i++) {
    ch->plp[i] = lp->sampled.v[i];
    ch->plp_rank[i] = lp->ranks.v[i];
    for (uint32_t j = 0; j < k; j++)
      ch->plp_top[i * k + j] = (struct fe_eng_top){(int32_t)lp->top_ids.v[i * lp->n_top + j],
                                                   lp->top.v[i * lp->n_top + j]};
  }
  ch->n_plp = n;
  ch->plp_k = k;
  ch->have_plp = 1;
  if (q->kind != FE_API_COMPLETION || !q->echo || q->logprobs < 0) return 0;
  /* the echoed tokens' entries, as a generated token's: logprob and logprobs top ones */
  float none = NAN;
  uint32_t nt = (uint32_t)q->logprobs;
  for (size_t i = 0; i < ch->n_prompt_ids; i++) {
    struct pr_logprobs one = {0};
    if (i == 0)
      one = (struct pr_logprobs){0, {&none, 1}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    else
      one = (struct pr_logprobs){nt,
                                 {&lp->sampled.v[i - 1], 1},
                                 {&lp->top_ids.v[(i - 1) * lp->n_top], nt},
                                 {&lp->top.v[(i - 1) * lp->n_top], nt},
                                 {NULL, 0}};
    int rc = lp_push(ch, ch->prompt_ids[i], &one, 0);
    if (rc) return rc;
  }
  return 0;
}

/* Released text into ch->text, through Gemma 4's splitter when the request reads
 * its notation (the content to ch->text; the thought and calls stay in g4_out). */
static void emit(struct fe_eng_choice *ch, const char *t, size_t n) {
  fe_eng_log_keep(ch, t, n);
  if (!ch->g4) {
    fe_buf_append(&ch->text, t, n);
    return;
  }
  if (fe_g4_split_push(ch->g4, t, n, &ch->g4_out)) ch->text.err = CM_ERR_NOMEM;
  fe_buf_append(&ch->text, ch->g4_out.content.data, ch->g4_out.content.len);
  fe_buf_reset(&ch->g4_out.content);
}

/* Feeds detokenized text through the stop matcher into ch->text. Returns 1
 * when a stop string matched. */
static int feed(struct fe_eng_choice *ch, const char *piece, size_t len) {
  const char *o = NULL;
  size_t ol = 0;
  int hit = -1;
  if (tk_stop_push(ch->stop, piece, len, &o, &ol, &hit) != 0) return 0;
  emit(ch, o, ol);
  if (hit < 0) return 0;
  ch->stop_str = ch->req->api->stop[hit];
  if (ch->req->api->include_stop_str_in_output) emit(ch, ch->stop_str, strlen(ch->stop_str));
  return 1;
}

/* The end of Gemma 4's notation: what the splitter held back. */
static void flush_g4(struct fe_eng_choice *ch) {
  if (!ch->g4) return;
  if (fe_g4_split_flush(ch->g4, &ch->g4_out)) ch->text.err = CM_ERR_NOMEM;
  fe_buf_append(&ch->text, ch->g4_out.content.data, ch->g4_out.content.len);
  fe_buf_reset(&ch->g4_out.content);
}

/* End of the token stream: whatever detok and stop held back. */
static int flush_text(struct fe_eng_choice *ch) {
  const char *p = NULL;
  size_t n = 0;
  if (tk_detok_flush(ch->detok, &p, &n) == 0 && n && feed(ch, p, n)) return 1;
  if (tk_stop_flush(ch->stop, &p, &n) == 0) emit(ch, p, n);
  return 0;
}

/* items (JSON values, comma separated: the splitter's calls or deltas) as an array
 * (NULL: out of memory) */
static json_t *json_list(const struct fe_buf *items) {
  struct fe_buf b;
  fe_buf_init(&b, 0);
  fe_buf_puts(&b, "[");
  fe_buf_append(&b, items->data, items->len);
  fe_buf_puts(&b, "]");
  json_t *a = b.err ? NULL : json_loadb(b.data, b.len, 0, NULL);
  fe_buf_free(&b);
  return a;
}

/* The calls Gemma 4's splitter read (ch->g4_out.calls) as OpenAI's tool_calls
 * array (malloc'd; NULL: none), each with a fresh id. */
static char *native_calls(const struct fe_eng_choice *ch) {
  if (!ch->g4 || !ch->g4_out.n_calls) return NULL;
  json_t *calls = json_list(&ch->g4_out.calls), *out = json_array();
  size_t i;
  json_t *c;
  json_array_foreach(calls, i, c) {
    char id[40];
    fe_api_make_id(id, sizeof(id), "call_");
    json_t *call =
        json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name",
                  json_object_get(c, "name"), "arguments", json_object_get(c, "arguments"));
    json_array_append_new(out, call);
  }
  char *s = json_array_size(out) ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(calls);
  json_decref(out);
  return s;
}

/* A streamed call's first delta: its index, a fresh id, type and name, empty arguments. */
static json_t *call_begins(size_t index, const char *name, size_t len) {
  char id[40];
  fe_api_make_id(id, sizeof(id), "call_");
  return json_pack("{s:I, s:s, s:s, s:{s:s%, s:s}}", "index", (json_int_t)index, "id", id, "type",
                   "function", "function", "name", name, len, "arguments", "");
}

/* A streamed call's next delta: a fragment of its arguments under its index. */
static json_t *call_goes_on(size_t index, const char *args, size_t len) {
  return json_pack("{s:I, s:{s:s%}}", "index", (json_int_t)index, "function", "arguments", args,
                   len);
}

/* A stream's deltas of the calls being read (ch->g4_out.deltas) as OpenAI's
 * delta.tool_calls (malloc'd; NULL: none): a call's index, id, type and name
 * once with empty arguments, then its argument fragments under its index.
 * Counts the calls begun in ch->n_calls. */
static char *native_deltas(struct fe_eng_choice *ch) {
  if (!ch->g4_out.n_deltas) return NULL;
  json_t *ds = json_list(&ch->g4_out.deltas), *out = json_array();
  size_t i;
  json_t *d, *name;
  json_array_foreach(ds, i, d) {
    json_t *x;
    const char *args = json_string_value(json_object_get(d, "arguments"));
    if ((name = json_object_get(d, "name")))
      x = call_begins(ch->n_calls++, json_string_value(name), json_string_length(name));
    else
      x = call_goes_on(ch->n_calls ? ch->n_calls - 1 : 0, args ? args : "",
                       args ? strlen(args) : 0);
    json_array_append_new(out, x);
  }
  char *s = json_array_size(out) ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(ds);
  json_decref(out);
  return s;
}

/* Gemma 4's parts of choice c: the thought, the calls (*calls, the caller frees;
 * finish reason "tool_calls" once some were made). A stream's calls go as deltas
 * while they are read. */
static void native_answer(struct fe_eng_choice *ch, struct fe_api_choice *c, char **calls) {
  if (!ch->g4) return;
  c->reasoning = ch->g4_out.reasoning.data;
  c->reasoning_len = ch->g4_out.reasoning.len;
  if (ch->g4->flags & FE_G4_STREAM_CALLS) {
    *calls = native_deltas(ch);
    if (*calls) c->tool_calls = *calls;
    if (ch->n_calls && c->finish_reason && !strcmp(c->finish_reason, "stop"))
      c->finish_reason = "tool_calls";
    return;
  }
  *calls = native_calls(ch);
  if (*calls) c->tool_calls = *calls;
  ch->n_calls += ch->g4_out.n_calls;
  if (ch->n_calls && c->finish_reason && !strcmp(c->finish_reason, "stop"))
    c->finish_reason = "tool_calls";
}

/* Builds the OpenAI logprobs of ch->lps[0..n_lps) in e->tmp (token texts;
 * as_ids: "token_id:N", vLLM's return_tokens_as_token_ids) and the arrays
 * *tl / *tops (malloc'd; the caller frees both). */
static int build_logprobs(struct fe_engine *e, const struct fe_eng_choice *ch, int as_ids,
                          struct fe_api_token_logprob **tl, struct fe_api_top_logprob **tops,
                          struct fe_buf *txt) {
  *tl = NULL;
  *tops = NULL;
  if (!ch->n_lps) return 0;
  size_t n_top = 0;
  for (size_t i = 0; i < ch->n_lps; i++)
    n_top += ch->lps[i].n_top;
  size_t n_ids = ch->n_lps + n_top;
  size_t *off = malloc((n_ids + 1) * sizeof(*off));
  *tl = calloc(ch->n_lps, sizeof(**tl));
  *tops = n_top ? calloc(n_top, sizeof(**tops)) : NULL;
  if (!off || !*tl || (n_top && !*tops)) {
    free(off);
    return CM_ERR_NOMEM;
  }
  /* texts first (the buffer may move), pointers after */
  size_t k = 0;
  char piece[256];
  for (size_t i = 0; i < ch->n_lps; i++) {
    for (uint32_t j = 0; j <= ch->lps[i].n_top; j++) {
      int32_t id = j == 0 ? ch->lps[i].id : ch->tops[ch->lps[i].top_i + j - 1].id;
      size_t len = 0;
      if (as_ids)
        len = (size_t)snprintf(piece, sizeof(piece), "token_id:%d", (int)id);
      else if (tk_token_to_piece(e->tok, id, piece, sizeof(piece), &len) != 0)
        len = 0;
      off[k++] = txt->len;
      fe_buf_append(txt, piece, len);
    }
  }
  off[k] = txt->len;
  if (txt->err) {
    free(off);
    return txt->err;
  }
  k = 0;
  size_t t = 0;
  for (size_t i = 0; i < ch->n_lps; i++) {
    struct fe_api_token_logprob *x = &(*tl)[i];
    x->token = txt->data + off[k];
    x->token_len = off[k + 1] - off[k];
    x->logprob = ch->lps[i].logprob;
    k++;
    x->top = *tops ? *tops + t : NULL;
    x->n_top = ch->lps[i].n_top;
    for (uint32_t j = 0; j < ch->lps[i].n_top; j++, t++, k++) {
      (*tops)[t].token = txt->data + off[k];
      (*tops)[t].token_len = off[k + 1] - off[k];
      (*tops)[t].logprob = ch->tops[ch->lps[i].top_i + j].logprob;
    }
  }
  free(off);
  return 0;
}

/* One entry of vLLM's prompt logprobs: "id":{"logprob","rank","decoded_token"}
 * (a logprob of -inf as -9999, as vLLM writes it). */
static void plp_entry(struct fe_engine *e, struct fe_buf *b, int as_ids, int32_t id, float lp,
                      int64_t rank) {
  char piece[256];
  size_t len = 0;
  if (as_ids)
    len = (size_t)snprintf(piece, sizeof(piece), "token_id:%d", (int)id);
  else if (tk_token_to_piece(e->tok, id, piece, sizeof(piece), &len) != 0)
    len = 0;
  fe_buf_puts(b, "\"");
  fe_buf_i64(b, id);
  fe_buf_puts(b, "\":{\"logprob\":");
  fe_buf_json_double(b, lp > -9999.0f ? lp : -9999.0);
  fe_buf_puts(b, ",\"rank\":");
  fe_buf_i64(b, rank);
  fe_buf_puts(b, ",\"decoded_token\":");
  fe_buf_json_str(b, piece, len);
  fe_buf_puts(b, "}");
}

/* ch's prompt logprobs as vLLM's array into b: null for the first token, then per
 * token an object of its own entry and the top ones (each id once). */
static int prompt_lps_json(struct fe_engine *e, const struct fe_eng_choice *ch, int as_ids,
                           struct fe_buf *b) {
  uint32_t k = ch->plp_k;
  fe_buf_puts(b, "[null");
  for (size_t i = 0; i < ch->n_plp; i++) {
    int32_t id = ch->prompt_ids[i + 1];
    fe_buf_puts(b, ",{");
    plp_entry(e, b, as_ids, id, ch->plp[i], ch->plp_rank[i]);
    for (uint32_t j = 0; j < k; j++) {
      const struct fe_eng_top *t = &ch->plp_top[i * k + j];
      if (t->id == id || !(t->logprob > -INFINITY)) continue;
      fe_buf_puts(b, ",");
      plp_entry(e, b, as_ids, t->id, t->logprob, (int64_t)j + 1);
    }
    fe_buf_puts(b, "}");
  }
  return fe_buf_puts(b, "]");
}

/* ---- answers ------------------------------------------------------------------ */

/* A finished tool-call answer (fe_api_request.tool_answer) into c: its calls
 * (finish reason "tool_calls") or its response's text; *calls and *content
 * (malloc'd) are the caller's to free. Text the protocol does not read stays. */
static void tool_answer(const struct fe_eng_choice *ch, struct fe_api_choice *c, char **calls,
                        char **content) {
  fe_api_tool_answer(ch->text.data ? ch->text.data : "", ch->text.len, calls, content);
  if (*calls) {
    c->tool_calls = *calls;
    c->text = "";
    c->text_len = 0;
    if (c->finish_reason && !strcmp(c->finish_reason, "stop")) c->finish_reason = "tool_calls";
  } else if (*content) {
    c->text = *content;
    c->text_len = strlen(*content);
  }
}

/* A streamed tool-call answer (its text whole so far in ch->text): the calls read
 * since the last chunk as delta.tool_calls (malloc'd; NULL: nothing new), a
 * call's index, id, type and name once, then its arguments' new bytes. */
static char *tool_deltas(struct fe_eng_choice *ch) {
  struct fe_api_tool_span sp[64];
  const char *t = ch->text.data ? ch->text.data : "";
  size_t n = fe_api_tool_scan(t, ch->text.len, sp, 64);
  json_t *out = json_array();
  for (size_t i = ch->n_calls ? ch->n_calls - 1 : 0; i < n && out; i++) {
    if (i >= ch->n_calls) {
      json_array_append_new(out, call_begins(i, t + sp[i].name_at, sp[i].name_len));
      ch->n_calls = i + 1;
      ch->tool_args_sent = 0;
    }
    if (sp[i].args_len > ch->tool_args_sent) {
      json_array_append_new(out, call_goes_on(i, t + sp[i].args_at + ch->tool_args_sent,
                                              sp[i].args_len - ch->tool_args_sent));
      ch->tool_args_sent = sp[i].args_len;
    }
  }
  char *s = json_array_size(out) ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(out);
  return s;
}

/* A stream's tool-call answer into c: the calls as they are read; once done, a
 * response's text (or, cut before it was either, the text) as the content. 0:
 * nothing to send yet. */
static int tool_chunk(struct fe_eng_choice *ch, struct fe_api_choice *c, char **calls,
                      char **content) {
  *calls = tool_deltas(ch);
  c->tool_calls = *calls;
  c->text = "";
  c->text_len = 0;
  if (!ch->done) return *calls != NULL;
  char *whole = NULL;
  fe_api_tool_answer(ch->text.data ? ch->text.data : "", ch->text.len, &whole, content);
  free(whole);
  if (ch->n_calls) {
    if (c->finish_reason && !strcmp(c->finish_reason, "stop")) c->finish_reason = "tool_calls";
  } else if (*content) {
    c->text = *content;
    c->text_len = strlen(*content);
  } else {
    c->text = ch->text.data ? ch->text.data : "";
    c->text_len = ch->text.len;
  }
  return 1;
}

static void send_chunk(struct fe_eng_req *r, struct fe_eng_choice *ch) {
  struct fe_engine *e = r->e;
  struct fe_api_choice c = {ch->index,    ch->text.data ? ch->text.data : "",
                            ch->text.len, ch->done ? ch->finish_reason : NULL,
                            NULL,         0,
                            ch->text_sent};
  c.function_call = r->api->legacy_functions;
  c.stop_str = ch->done ? ch->stop_str : NULL;
  char *calls = NULL, *content = NULL;
  if (r->api->tool_answer && !tool_chunk(ch, &c, &calls, &content)) return;
  native_answer(ch, &c, &calls);
  struct fe_api_token_logprob *tl = NULL;
  struct fe_api_top_logprob *tops = NULL;
  fe_buf_reset(&e->tmp);
  /* (a tool-call answer's logprobs go with its last chunk: its text is kept whole) */
  if (r->api->logprobs >= 0 && (!r->api->tool_answer || ch->done) &&
      build_logprobs(e, ch, r->api->tokens_as_ids, &tl, &tops, &e->tmp) == 0 && tl) {
    c.logprobs = tl;
    c.n_logprobs = ch->n_lps;
  }
  /* the ids as the logprobs go (a tool-call answer's with its last chunk); the prompt's
   * in the choice's first chunk (a chat's role chunk, stream_begin) */
  if (!r->api->tool_answer || ch->done)
    with_ids(r, ch, &c, !ch->streamed && r->api->kind != FE_API_CHAT);
  stream_begin(r);
  usage_of(r, ch, &r->sse.usage);
  fe_sse_send(&r->sse, &c);
  free(tl);
  free(tops);
  free(calls);
  free(content);
  if (!r->api->tool_answer) ch->text_sent += ch->text.len;
  ch->streamed = 1;
}

/* The choices the answer holds into order (how many): all in order; with best_of
 * above n, each prompt's n_keep of the highest cumulative logprob, best first (the
 * earlier of equals first), as vLLM ranks them. */
static int kept_choices(const struct fe_eng_req *r, int *order) {
  int per = r->api->n, keep = r->api->n_keep ? r->api->n_keep : per, n = 0;
  for (int first = 0; first + per <= r->n_ch; first += per, n += keep) {
    int *o = order + n; /* room for per: n + per <= first + per */
    for (int j = 0; j < per; j++) {
      int i = j;
      for (; i > 0 && r->ch[o[i - 1]].cum_lp < r->ch[first + j].cum_lp; i--)
        o[i] = o[i - 1];
      o[i] = first + j;
    }
  }
  return n;
}

static void complete(struct fe_eng_req *r) {
  struct fe_engine *e = r->e;
  r->answering = 1; /* a client that leaves while we write changes nothing here */
  fe_eng_req_unmap(r);
  struct fe_api_usage u;
  usage_of(r, NULL, &u);
  observe_finished(r, &u);
  if (r->stream) {
    stream_begin(r);
    fe_sse_end(&r->sse,
               r->api->include_usage || r->api->audio_api || r->api->responses || r->api->anthropic
                   ? &u
                   : NULL);
    req_release(r);
    return;
  }
  struct fe_api_choice *cs = calloc((size_t)r->n_ch, sizeof(*cs));
  struct fe_api_token_logprob **tls = calloc((size_t)r->n_ch, sizeof(*tls));
  struct fe_api_top_logprob **tops = calloc((size_t)r->n_ch, sizeof(*tops));
  struct fe_buf *txt = calloc((size_t)r->n_ch, sizeof(*txt));
  struct fe_buf *pj = calloc((size_t)r->n_ch, sizeof(*pj)); /* prompt logprobs' JSON */
  char **tool_bufs = calloc((size_t)r->n_ch * 2, sizeof(char *));
  int *order = calloc((size_t)r->n_ch, sizeof(*order));
  int rc = cs && tls && tops && txt && pj && tool_bufs && order ? 0 : CM_ERR_NOMEM;
  int n_out = rc ? 0 : kept_choices(r, order);
  for (int k = 0; k < n_out && !rc; k++) {
    struct fe_eng_choice *ch = &r->ch[order[k]];
    fe_buf_init(&txt[k], 0);
    cs[k].index = k;
    cs[k].text = ch->text.data ? ch->text.data : "";
    cs[k].text_len = ch->text.len;
    cs[k].finish_reason = ch->finish_reason;
    cs[k].stop_str = ch->stop_str;
    cs[k].function_call = r->api->legacy_functions;
    with_ids(r, ch, &cs[k], 1);
    if (r->api->tool_answer) tool_answer(ch, &cs[k], &tool_bufs[2 * k], &tool_bufs[2 * k + 1]);
    native_answer(ch, &cs[k], &tool_bufs[2 * k]);
    if (r->api->logprobs >= 0) {
      rc = build_logprobs(e, ch, r->api->tokens_as_ids, &tls[k], &tops[k], &txt[k]);
      cs[k].logprobs = tls[k];
      cs[k].n_logprobs = tls[k] ? ch->n_lps : 0;
    }
    if (!rc && ch->have_plp) {
      fe_buf_init(&pj[k], 0);
      rc = prompt_lps_json(e, ch, r->api->tokens_as_ids, &pj[k]);
      if (!rc && pj[k].err) rc = pj[k].err;
      cs[k].prompt_logprobs = rc ? NULL : pj[k].data;
      cs[k].prompt_logprobs_len = rc ? 0 : pj[k].len;
    }
  }
  struct fe_buf *b = &e->out;
  fe_buf_reset(b);
  struct fe_api_resp_meta meta = {r->id, r->created, r->api->model};
  const char *ctype = "application/json";
  if (!rc && r->api->audio_api == FE_API_AUDIO_TEXT) { /* the audio endpoints' text */
    fe_buf_append(b, cs[0].text, cs[0].text_len);
    ctype = "text/plain; charset=utf-8";
  } else if (!rc && r->api->audio_api) { /* {"text", "usage"}: OpenAI's token usage form */
    fe_api_write_audio_text(b, NULL, cs[0].text, cs[0].text_len, &u);
  } else if (!rc && r->api->responses) {
    rc = fe_resp_write(b, &meta, r->api->responses, &cs[0], &u);
  } else if (!rc && r->api->anthropic) {
    rc = fe_msg_write(b, &meta, &cs[0], &u);
  } else if (!rc) {
    if (r->api->kind == FE_API_CHAT)
      rc = fe_api_write_chat(b, &meta, cs, (size_t)n_out, &u);
    else
      rc = fe_api_write_completion(b, &meta, cs, (size_t)n_out, &u);
  }
  if (!rc && !b->err && r->api->store) /* the Responses API's store keeps it */
    fe_rstore_put(r->api->store, b->data, b->len, r->api->responses_conv, r->api->responses_input);
  if (!rc && !b->err)
    fe_conn_respond(r->conn, 200, ctype, NULL, b->data, b->len);
  else
    fe_conn_respond_error(r->conn, 500, "response too large to build", NULL);
  for (int k = 0; tls && tops && txt && k < r->n_ch; k++) {
    free(tls[k]);
    free(tops[k]);
    fe_buf_free(&txt[k]);
  }
  for (int k = 0; pj && k < r->n_ch; k++)
    fe_buf_free(&pj[k]);
  free(pj);
  for (int k = 0; tool_bufs && k < 2 * r->n_ch; k++)
    free(tool_bufs[k]);
  free(tool_bufs);
  free(order);
  free(cs);
  free(tls);
  free(tops);
  free(txt);
  req_release(r);
}

static const char *finish_name(uint8_t f) {
  switch (f) {
  case PR_FINISH_STOP: return "stop";
  case PR_FINISH_LENGTH: return "length";
  default: return "abort";
  }
}

static int is_stop_id(const struct fe_engine *e, const struct fe_api_request *q, int64_t id) {
  for (int i = 0; i < e->n_eos; i++)
    if (e->eos[i] == id) return 1;
  for (size_t i = 0; i < q->n_stop_token_ids; i++)
    if (q->stop_token_ids[i] == id) return 1;
  return 0;
}

/* 1 for a special token other than the markers Gemma 4's splitter reads (with
 * the splitter on, the detokenizer writes special tokens: these are dropped
 * before it, as skip_special_tokens asks). */
static int is_unread_special(const struct fe_engine *e, int32_t id) {
  if (!tk_is_special(e->tok, id)) return 0;
  static const enum fe_g4_marker read[] = {FE_G4_CHANNEL, FE_G4_CHANNEL_END, FE_G4_CALL,
                                           FE_G4_CALL_END, FE_G4_QUOTE};
  for (size_t i = 0; i < sizeof(read) / sizeof(read[0]); i++)
    if (e->model.marker[read[i]] == id) return 0;
  return 1;
}

void fe_eng_count_lookup(struct fe_eng_req *r, const struct pr_out_seq *s) {
  struct fe_engine *e = r->e;
  if (!e->metrics) return;
  const struct fe_replica_metric_ids *ri = rep_ids(r);
  fe_metrics_inc_early(e->metrics, ri->prefix_cache_queries, (double)s->n_prompt_tokens);
  fe_metrics_inc_early(e->metrics, ri->prefix_cache_hits, (double)s->n_cached_tokens);
}

/* One sequence of an OUT for choice `ch` of request r (r->busy is set). */
void fe_eng_on_seq(struct fe_engine *e, struct fe_eng_choice *ch, const struct pr_out_seq *s) {
  struct fe_eng_req *r = ch->req;
  uint64_t now = cm_time_ns();
  if (r->stream && !r->api->tool_answer && ch->streamed) { /* chunks carry deltas (a tool-call
                                                            * answer is read whole, and sent
                                                            * when done; the first one an echo) */
    fe_buf_reset(&ch->text);
    fe_g4_out_reset(&ch->g4_out);
    ch->n_lps = 0;
    ch->n_top_all = 0;
    ch->n_ids = 0;
  }
  const struct fe_replica_metric_ids *ri = rep_ids(r);
  if (s->tokens.n && ch->n_gen == 0) { /* the first output: its prefix-cache lookup */
    ch->n_cached = s->n_cached_tokens;
    fe_eng_count_lookup(r, s);
  }
  if (s->tokens.n && !r->have_sched_times && s->scheduled_ns && s->first_token_ns &&
      s->queued_ns) { /* the scheduler's clock: differences only */
    r->have_sched_times = 1;
    r->queue_s =
        s->scheduled_ns > s->queued_ns ? (double)(s->scheduled_ns - s->queued_ns) / 1e9 : 0;
    r->prefill_s = s->first_token_ns > s->scheduled_ns
                       ? (double)(s->first_token_ns - s->scheduled_ns) / 1e9
                       : 0;
  }
  if (s->tokens.n) {
    if (!r->first_token_seen) {
      r->first_token_seen = 1;
      r->first_token_ns = now;
      m_obs(e, ri->time_to_first_token_seconds, (double)(now - r->start_ns) / 1e9);
    } else if (ch->n_gen > 0) {
      m_obs(e, ri->inter_token_latency_seconds,
            (double)(now - ch->last_ns) / 1e9 / (double)s->tokens.n);
    }
    ch->last_ns = now;
    m_inc(e, ri->generation_tokens, (double)s->tokens.n);
  }
  if (s->tokens.n && r->api->prompt_logprobs >= 0 && !ch->have_plp) {
    int rc = take_prompt_lps(ch, s);
    if (rc) {
      fe_eng_req_fail(r, 500,
                      rc == CM_ERR_NOMEM ? "out of memory"
                                         : "the prompt's logprobs did not come from the engine",
                      NULL);
      return;
    }
  }
  int have_lp = s->logprobs.sampled.n == s->tokens.n, want_lp = r->api->logprobs >= 0 && have_lp;
  if (r->api->n_keep && !have_lp) { /* best_of ranks the choices by them */
    fe_eng_req_fail(r, 500, "the tokens' logprobs did not come from the engine", NULL);
    return;
  }
  int hit = 0; /* a stop string matched */
  for (uint32_t t = 0; t < s->tokens.n && !hit; t++) {
    int32_t id = (int32_t)s->tokens.v[t];
    ch->n_gen++;
    int thought = 0; /* the thought's tokens, from <|channel> to <channel|> */
    if (ch->g4 && e->model.reasoning) {
      if (id == e->model.marker[FE_G4_CHANNEL]) ch->in_thought = 1;
      thought = ch->in_thought;
      ch->n_thought += thought;
      if (id == e->model.marker[FE_G4_CHANNEL_END]) ch->in_thought = 0;
    }
    /* (the Responses API's logprobs are its output_text's: the thought's are not) */
    if (want_lp && !(thought && r->api->responses)) lp_push(ch, id, &s->logprobs, t);
    if (have_lp) ch->cum_lp += s->logprobs.sampled.v[t];
    if (r->api->return_token_ids && ids_push(ch, id)) {
      fe_eng_req_fail(r, 500, "out of memory", NULL);
      return;
    }
    /* the EOS / stop id that ended the sequence is not part of the text */
    if (s->finish == PR_FINISH_STOP && t + 1 == s->tokens.n && s->stop_token == id &&
        is_stop_id(e, r->api, id))
      continue;
    if (ch->g4 && r->api->skip_special_tokens && is_unread_special(e, id)) continue;
    const char *piece = NULL;
    size_t len = 0;
    if (tk_detok_push(ch->detok, id, &piece, &len) != 0) {
      cm_warn(TAG, "request %llu: token id %d outside the vocabulary; dropped",
              (unsigned long long)ch->id, (int)id);
      continue;
    }
    if (len) hit = feed(ch, piece, len);
  }
  if (ch->n_gen > 0) fe_eng_choice_forget_add(ch); /* begun: never sent again */
  int finished = s->finish != PR_FINISH_NONE;
  if (finished) ch->live = 0;
  if (!hit && finished) {
    if (s->finish == PR_FINISH_ERROR) {
      fe_eng_req_fail(r, 500, "generation failed in the engine", NULL);
      return;
    }
    hit = flush_text(ch);
  }
  if (hit || finished) flush_g4(ch);
  if (hit || finished) {
    if (hit && ch->live) { /* the scheduler would go on: stop it */
      struct pr_msg m;
      pr_msg_init(&m, PR_ABORT);
      m.u.abort.request_ids.v = &ch->id;
      m.u.abort.request_ids.n = 1;
      ch->live = 0;
      int rc = r->rep ? fe_eng_send(r->rep, &m) : CM_ERR_CLOSED;
      if (rc) cm_warn(TAG, "ABORT not sent: %s", cm_strerror(rc));
    }
    ch->done = 1;
    ch->finish_reason = hit ? "stop" : finish_name(s->finish);
    r->n_done++;
    fe_eng_log_finished(ch);
  }
  if (r->stream &&
      (r->api->tool_answer ? 1 /* send_chunk tells */
                           : ch->text.len || ch->n_lps || ch->done || ch->g4_out.reasoning.len ||
                                 ch->g4_out.n_calls || ch->g4_out.n_deltas))
    send_chunk(r, ch);
}

void fe_eng_on_out(struct fe_engine *e, const struct pr_out *o) {
  for (uint32_t i = 0; i < o->n_seqs; i++) {
    const struct pr_out_seq *s = &o->seqs[i];
    struct fe_eng_choice *ch = fe_eng_map_get(e, s->request_id);
    if (!ch || ch->done) continue; /* finished or aborted here already */
    struct fe_eng_req *r = ch->req;
    r->busy = 1;
    if (r->beams)
      fe_eng_beam_on_seq(e, ch, s);
    else
      fe_eng_on_seq(e, ch, s);
    r->busy = 0;
    if (r->gone)
      fe_eng_on_client_abort(r);
    else if (r->fail_status)
      fe_eng_req_fail(r, r->fail_status, r->fail_msg, NULL);
    else if (r->n_done == r->n_ch)
      complete(r);
  }
}
