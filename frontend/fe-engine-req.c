/* fe-engine-req.c — the submit hook: /tokenize and /detokenize answered
 * from the tokenizer; completions and chat turned into prompt ids (chat
 * template, BOS rules), length-checked against max_model_len, and sent to
 * the scheduler as one ADD per choice (see fe-engine.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "frontend/fe-engine-impl.h"

#define TAG "fe-engine"

static const char *role_name(enum fe_api_role r) {
  switch (r) {
  case FE_API_ROLE_SYSTEM: return "system";
  case FE_API_ROLE_ASSISTANT: return "assistant";
  default: return "user";
  }
}

/* Answers a client error now; the request is done with. */
static void answer_error(struct fe_engine *e, struct fe_conn *c, int status, const char *msg,
                         const char *param) {
  if (e->metrics) {
    if (status >= 500)
      fe_metrics_inc(e->metrics, e->mid.http_server_errors, 1);
    else
      fe_metrics_inc(e->metrics, e->mid.http_client_errors, 1);
  }
  fe_conn_respond_error(c, status, msg, param && *param ? param : NULL);
}

/* Renders the chat template over the request's messages into a malloc'd
 * string. CM_ERR_INVAL with errbuf for a template that refuses them. */
static int render_chat(struct fe_engine *e, const struct fe_api_request *req, char **text,
                       size_t *len, char *errbuf, size_t errlen) {
  if (!e->chat) {
    snprintf(errbuf, errlen, "this model has no chat template; use /v1/completions");
    return CM_ERR_INVAL;
  }
  json_t *msgs = json_array();
  if (!msgs) return CM_ERR_NOMEM;
  for (size_t i = 0; i < req->n_messages; i++) {
    const struct fe_api_message *m = &req->messages[i];
    json_t *o = json_pack("{s:s, s:s#}", "role", role_name(m->role), "content",
                          m->content ? m->content : "", m->content ? (int)m->content_len : 0);
    if (!o || json_array_append_new(msgs, o) != 0) {
      json_decref(msgs);
      return CM_ERR_NOMEM;
    }
  }
  int rc =
      tk_chat_render(e->chat, msgs, req->add_generation_prompt, NULL, text, len, errbuf, errlen);
  json_decref(msgs);
  return rc;
}

/* Tokenizes prompt `pi` of the request (chat: the rendered messages) into
 * e->ids. On a client error returns a negative cm_err with errbuf set. */
static int prompt_ids(struct fe_engine *e, const struct fe_api_request *req, size_t pi,
                      char *errbuf, size_t errlen) {
  e->n_ids = 0;
  if (req->kind == FE_API_CHAT || (req->kind == FE_API_TOKENIZE && req->n_messages)) {
    char *text = NULL;
    size_t len = 0;
    int rc = render_chat(e, req, &text, &len, errbuf, errlen);
    if (rc) {
      free(text);
      return rc;
    }
    /* the template writes <bos> itself: no post-processor unless asked */
    unsigned fl = TK_MATCH_SPECIAL | (req->add_special_tokens ? TK_ADD_SPECIAL : 0);
    rc = tk_encode(e->tok, e->tok_st, text, len, fl, &e->ids, &e->n_ids, &e->cap_ids);
    free(text);
    if (rc == CM_ERR_INVAL) snprintf(errbuf, errlen, "the rendered chat is not valid UTF-8");
    return rc;
  }
  const struct fe_api_prompt *p = &req->prompts[pi];
  if (p->ids) {
    int32_t nv = e->n_vocab;
    for (size_t i = 0; i < p->n_ids; i++) {
      if (p->ids[i] < 0 || p->ids[i] >= nv) {
        snprintf(errbuf, errlen, "token id %d is outside the vocabulary (0..%d)", (int)p->ids[i],
                 (int)nv - 1);
        return CM_ERR_RANGE;
      }
    }
    if (p->n_ids > e->cap_ids) {
      int32_t *n = realloc(e->ids, p->n_ids * sizeof(*n));
      if (!n) return CM_ERR_NOMEM;
      e->ids = n;
      e->cap_ids = p->n_ids;
    }
    memcpy(e->ids, p->ids, p->n_ids * sizeof(*e->ids));
    e->n_ids = p->n_ids;
    return 0;
  }
  unsigned fl = TK_MATCH_SPECIAL | (req->add_special_tokens ? TK_ADD_SPECIAL : 0);
  int rc = tk_encode(e->tok, e->tok_st, p->text ? p->text : "", p->text ? p->text_len : 0, fl,
                         &e->ids, &e->n_ids, &e->cap_ids);
  if (rc == CM_ERR_INVAL) snprintf(errbuf, errlen, "the prompt is not valid UTF-8");
  return rc;
}

/* POST /tokenize and /detokenize. */
static void answer_tokens(struct fe_engine *e, struct fe_conn *c,
                          const struct fe_api_request *req) {
  char err[320] = "";
  struct fe_buf *b = &e->out;
  fe_buf_reset(b);
  if (req->kind == FE_API_TOKENIZE) {
    int rc =
        req->n_messages || req->n_prompts ? prompt_ids(e, req, 0, err, sizeof(err)) : CM_ERR_INVAL;
    if (rc) {
      answer_error(e, c, rc == CM_ERR_NOMEM ? 500 : 400, err[0] ? err : cm_strerror(rc), NULL);
      return;
    }
    fe_api_write_tokenize(b, e->ids, e->n_ids, fe_engine_max_model_len(e));
  } else {
    const struct fe_api_prompt *p = req->n_prompts ? &req->prompts[0] : NULL;
    size_t len = 0;
    int rc =
        p ? tk_decode(e->tok, p->ids, p->n_ids, 0, &e->dec, &len, &e->dec_cap) : CM_ERR_INVAL;
    if (rc) {
      answer_error(e, c, rc == CM_ERR_NOMEM ? 500 : 400,
                   rc == CM_ERR_RANGE ? "a token id is outside the vocabulary"
                                      : "'tokens' must be a list of token ids",
                   "tokens");
      return;
    }
    fe_api_write_detokenize(b, e->dec, len);
  }
  if (b->err) {
    answer_error(e, c, 500, "response too large", NULL);
    return;
  }
  fe_conn_respond(c, 200, "application/json", NULL, b->data, b->len);
}

static void fill_sampling(const struct fe_api_request *q, int choice, struct pr_sampling *s) {
  pr_sampling_default(s);
  s->temperature = (float)q->temperature;
  s->top_p = (float)q->top_p;
  s->top_k = q->top_k;
  s->min_p = (float)q->min_p;
  s->presence_penalty = (float)q->presence_penalty;
  s->frequency_penalty = (float)q->frequency_penalty;
  s->repetition_penalty = (float)q->repetition_penalty;
  s->has_seed = q->has_seed != 0;
  s->seed = q->has_seed ? (uint64_t)q->seed + (uint64_t)choice : 0;
  s->logprobs = q->logprobs;
  s->ignore_eos = q->ignore_eos != 0;
}

/* The stop ids an ADD carries: the request's plus the model's EOS ids. */
static int stop_ids(struct fe_engine *e, const struct fe_api_request *q, uint32_t *n_out) {
  size_t need = q->n_stop_token_ids + (size_t)e->n_eos;
  if (need > e->cap_stop_ids) {
    uint32_t *p = realloc(e->stop_ids, need * sizeof(*p));
    if (!p) return CM_ERR_NOMEM;
    e->stop_ids = p;
    e->cap_stop_ids = need;
  }
  uint32_t n = 0;
  for (size_t i = 0; i < q->n_stop_token_ids; i++)
    e->stop_ids[n++] = (uint32_t)q->stop_token_ids[i];
  if (!q->ignore_eos)
    for (int i = 0; i < e->n_eos; i++)
      e->stop_ids[n++] = (uint32_t)e->eos[i];
  *n_out = n;
  return 0;
}

static int choice_init(struct fe_engine *e, struct fe_eng_req *r, int k, int prompt_i) {
  struct fe_eng_choice *ch = &r->ch[k];
  ch->req = r;
  ch->index = k;
  ch->prompt_i = prompt_i;
  ch->id = e->next_id++;
  fe_buf_init(&ch->text, 0);
  int rc = tk_detok_create(e->tok, r->api->skip_special_tokens, &ch->detok);
  if (rc) return rc;
  const struct fe_api_request *q = r->api;
  size_t lens[FE_API_MAX_STOP];
  for (size_t i = 0; i < q->n_stop && i < FE_API_MAX_STOP; i++)
    lens[i] = strlen(q->stop[i]);
  if ((rc = tk_stop_create(q->stop, lens, q->n_stop, &ch->stop))) return rc;
  return fe_eng_map_put(e, ch);
}

int fe_eng_submit(void *ud, struct fe_conn *c, struct fe_api_request *req, const char **why) {
  struct fe_engine *e = ud;
  if (req->kind == FE_API_TOKENIZE || req->kind == FE_API_DETOKENIZE) {
    answer_tokens(e, c, req);
    fe_api_request_free(req);
    free(req);
    return 0;
  }
  if (!fe_engine_ready(e)) {
    *why = "engine not ready";
    return CM_ERR_AGAIN;
  }
  size_t n_prompts = req->kind == FE_API_CHAT ? 1 : req->n_prompts;
  if (n_prompts == 0 || n_prompts * (size_t)req->n > FE_API_MAX_N) {
    char msg[160];
    snprintf(msg, sizeof(msg), "n times the number of prompts must be 1..%d, not %zu", FE_API_MAX_N,
             n_prompts * (size_t)req->n);
    answer_error(e, c, 400, msg, "n");
    fe_api_request_free(req);
    free(req);
    return 0;
  }
  struct fe_eng_req *r = calloc(1, sizeof(*r));
  int n_ch = (int)n_prompts * req->n;
  if (!r || !(r->ch = calloc((size_t)n_ch, sizeof(*r->ch))) ||
      !(r->n_prompt = calloc(n_prompts, sizeof(*r->n_prompt)))) {
    if (r) free(r->ch);
    free(r);
    *why = "out of memory";
    return CM_ERR_NOMEM;
  }
  r->e = e;
  r->conn = c;
  r->api = req;
  r->n_ch = n_ch;
  r->stream = req->stream;
  r->start_ns = cm_time_ns();
  r->created = (int64_t)(cm_time_wall_ns() / 1000000000ull);
  fe_api_make_id(r->id, sizeof(r->id), req->kind == FE_API_CHAT ? "chatcmpl-" : "cmpl-");
  /* link first: fe_eng_req_fail and the abort callback find it */
  r->next = e->reqs;
  if (e->reqs) e->reqs->prev = r;
  e->reqs = r;
  e->n_reqs++;
  fe_conn_set_abort_cb(c, fe_eng_on_client_abort, r);

  /* no receiving while the ADDs go out: an OUT or ERR for this request
   * must not arrive before every choice is registered */
  int was_pumping = e->pumping;
  e->pumping = 1;
  char err[320] = "";
  struct fe_api_error aerr;
  memset(&aerr, 0, sizeof(aerr));
  int status = 0;
  const char *param = NULL;
  int64_t mml = fe_engine_max_model_len(e);
  for (size_t pi = 0; pi < n_prompts && !status; pi++) {
    int rc = prompt_ids(e, req, pi, err, sizeof(err));
    if (rc) {
      status = rc == CM_ERR_NOMEM ? 500 : 400;
      param = req->kind == FE_API_CHAT ? "messages" : "prompt";
      if (!err[0]) snprintf(err, sizeof(err), "%s", cm_strerror(rc));
      break;
    }
    if (e->n_ids == 0) {
      status = 400;
      param = "prompt";
      snprintf(err, sizeof(err), "the prompt is empty (no tokens)");
      break;
    }
    int64_t mt = 0;
    if (mml > 0) {
      if (fe_api_check_prompt_len(req, (int64_t)e->n_ids, mml, &mt, &aerr) != 0) {
        status = aerr.status ? aerr.status : 400;
        snprintf(err, sizeof(err), "%s", aerr.message);
        param = aerr.param;
        break;
      }
    } else {
      mt = req->max_tokens > 0 ? req->max_tokens : 16;
    }
    if (mt > UINT32_MAX) mt = UINT32_MAX;
    r->n_prompt[pi] = (int64_t)e->n_ids;
    r->prompt_total += (int64_t)e->n_ids;
    uint32_t n_stop = 0;
    if (stop_ids(e, req, &n_stop)) {
      status = 500;
      snprintf(err, sizeof(err), "out of memory");
      break;
    }
    for (int j = 0; j < req->n && !status; j++) {
      int k = (int)pi * req->n + j;
      if (choice_init(e, r, k, (int)pi) != 0) {
        status = 500;
        snprintf(err, sizeof(err), "out of memory");
        break;
      }
      struct pr_msg m;
      pr_msg_init(&m, PR_ADD);
      struct pr_add *a = &m.u.add;
      a->request_id = r->ch[k].id;
      a->prompt.v = (const uint32_t *)e->ids;
      a->prompt.n = (uint32_t)e->n_ids;
      fill_sampling(req, k, &a->sampling);
      a->max_tokens = (uint32_t)mt;
      a->min_tokens = (uint32_t)(req->min_tokens < mt ? req->min_tokens : mt);
      a->stop_token_ids.v = e->stop_ids;
      a->stop_token_ids.n = n_stop;
      a->priority = req->priority;
      a->arrival_ns = cm_time_wall_ns();
      int src = fe_eng_send_add(e, &r->ch[k], &m);
      if (src) {
        status = src == CM_ERR_INVAL || src == CM_ERR_RANGE ? 400 : 503;
        snprintf(err, sizeof(err), "cannot queue the request at the scheduler: %s",
                 cm_strerror(src));
        break;
      }
      r->ch[k].live = 1;
      r->ch[k].last_ns = r->start_ns;
    }
  }
  if (status) /* frees r and req */
    fe_eng_req_fail(r, status, err[0] ? err : "request failed", param && *param ? param : NULL);
  e->pumping = was_pumping;
  if (!was_pumping) fe_eng_pump(e);
  return 0;
}

void fe_eng_req_unmap(struct fe_eng_req *r) {
  for (int k = 0; k < r->n_ch; k++)
    if (r->ch[k].id) fe_eng_map_del(r->e, r->ch[k].id);
}

void fe_eng_req_free(struct fe_eng_req *r) {
  struct fe_engine *e = r->e;
  if (r->prev)
    r->prev->next = r->next;
  else if (e->reqs == r)
    e->reqs = r->next;
  if (r->next) r->next->prev = r->prev;
  e->n_reqs--;
  for (int k = 0; k < r->n_ch; k++) {
    struct fe_eng_choice *ch = &r->ch[k];
    if (ch->id) fe_eng_map_del(e, ch->id);
    tk_detok_free(ch->detok);
    tk_stop_free(ch->stop);
    fe_buf_free(&ch->text);
    free(ch->lps);
    free(ch->top_ids);
    free(ch->top_lps);
  }
  free(r->ch);
  free(r->n_prompt);
  fe_api_request_free(r->api);
  free(r->api);
  free(r);
}
