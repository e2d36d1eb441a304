/* fe-engine-req.c — the submit hook: token ids checked against the
 * vocabulary; then, on libuv's thread pool, /tokenize and /detokenize
 * answered from the tokenizer and completions and chat turned into prompt
 * ids (chat template, BOS rules); back on the loop, prompts length-checked
 * against max_model_len and sent to the scheduler as one ADD per choice
 * (see fe-engine.h). */
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

/* ---- off the loop: chat template and tokenization -------------------------
 *
 * Rendering the chat template and tokenizing take time in proportion to the
 * prompt (a 1 MB prompt takes a good fraction of a second), so they run on
 * libuv's thread pool and the loop goes on serving other connections. A job
 * carries everything its thread reads: the request (owned by the job until
 * it is handed on), the tokenizer and chat template (immutable; encoder
 * states come from the tokenizer's pool) and its own result buffers. The
 * engine outlives every job: a job keeps the loop alive until its after-work
 * callback ran, and both callers destroy the engine only after uv_run
 * returned. */

struct tok_job {
  uv_work_t work;
  struct fe_engine *e;
  struct fe_conn *c;
  struct fe_api_request *req;
  const struct tk_tokenizer *tok; /* read by the thread */
  const struct tk_chat *chat;     /* read by the thread; NULL: none */
  const json_t *chat_conf;        /* read by the thread: a request template's variables */
  const struct fe_mm *mm;         /* read by the thread */
  struct fe_mm_image *imgs;       /* (req->n_images) decoded by the thread (generation) */
  char param[64];                 /* the field at fault when rc != 0; "": the default */
  size_t n_prompts;               /* prompts to tokenize (chat: 1) */
  int32_t **ids;                  /* (n_prompts) each malloc'd; prompt token ids */
  size_t *n_ids;                  /* (n_prompts) tokens */
  size_t *cap_ids;                /* (n_prompts) ids allocated */
  char *text;                     /* /detokenize: the text (malloc'd) */
  size_t text_len, text_cap;      /* bytes */
  int rc;                         /* 0, or the failure of the first prompt that failed */
  char err[320];                  /* the client's error when rc != 0 */
  int gone;                       /* the client left while the thread worked */
  int64_t max_model_len;          /* tokens (0: unknown), for truncate_turns */
  int keep_render;                /* --enable-log-requests: keep the rendered chat */
  char *render;                   /* then the chat's text as rendered (malloc'd) */
  size_t render_len;
};

/* A message's parts as transformers hands them to a chat template:
 * {"type": "text", "text": ...}, {"type": "image"} and {"type": "audio"}. NULL
 * when out of memory (json_pack then fails too). */
static json_t *parts_json(const struct fe_api_message *m) {
  json_t *a = json_array();
  for (size_t k = 0; a && k < m->n_parts; k++) {
    const struct fe_api_part *pt = &m->parts[k];
    json_t *o = pt->is_image || pt->is_audio
                    ? json_pack("{s:s}", "type", pt->is_image ? "image" : "audio")
                    : json_pack("{s:s, s:s#}", "type", "text", "text", pt->text, (int)pt->text_len);
    if (!o || json_array_append_new(a, o) != 0) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* continue_final_message: the rendered chat text[*len] cut after the last
 * message's text (its last text part), found as transformers finds it: the
 * last occurrence of that text stripped of surrounding white space, kept with
 * its trailing white space where the template kept it. CM_ERR_INVAL with
 * errbuf when the message has no text or the template did not write it. */
static int cut_after_final(const struct fe_api_request *req, const char *text, size_t *len,
                           char *errbuf, size_t errlen) {
  const struct fe_api_message *m = &req->messages[req->n_messages - 1];
  const char *s = m->parts ? NULL : m->content;
  size_t n = m->parts ? 0 : m->content_len;
  for (size_t k = m->n_parts; m->parts && k-- > 0 && !s;)
    if (!m->parts[k].is_image && !m->parts[k].is_audio)
      s = m->parts[k].text, n = m->parts[k].text_len;
  while (s && n && is_space(*s)) /* s[n]: lstrip(content) */
    s++, n--;
  size_t core = n; /* strip(content) */
  while (core && is_space(s[core - 1]))
    core--;
  if (!s || !core) {
    snprintf(errbuf, errlen, "continue_final_message: the last message has no text to continue");
    return CM_ERR_INVAL;
  }
  for (size_t at = *len >= core ? *len - core + 1 : 0; at-- > 0;)
    if (!memcmp(text + at, s, core)) {
      *len = at + (at + n <= *len && !memcmp(text + at, s, n) ? n : core);
      return 0;
    }
  snprintf(errbuf, errlen,
           "continue_final_message: the chat template does not write the last message's text");
  return CM_ERR_INVAL;
}

/* Renders the chat template over the request's messages into a malloc'd
 * string. CM_ERR_INVAL with errbuf for a template that refuses them. */
static int render_chat(const struct tk_chat *chat, const struct fe_api_request *req, char **text,
                       size_t *len, char *errbuf, size_t errlen) {
  if (!chat) {
    snprintf(errbuf, errlen, "this model has no chat template; use /v1/completions");
    return CM_ERR_INVAL;
  }
  json_t *msgs = json_array();
  if (!msgs) return CM_ERR_NOMEM;
  for (size_t i = 0; i < req->n_messages; i++) {
    const struct fe_api_message *m = &req->messages[i];
    json_t *o = m->parts ? json_pack("{s:s, s:o}", "role", role_name(m->role), "content",
                                     parts_json(m))
                         : json_pack("{s:s, s:s#}", "role", role_name(m->role), "content",
                                     m->content ? m->content : "",
                                     m->content ? (int)m->content_len : 0);
    if (o && m->extra) { /* tool_calls, tool_responses (Gemma 4's notation) */
      json_t *x = json_loads(m->extra, 0, NULL);
      if (!x || json_object_update(o, x)) json_decref(o), o = NULL;
      json_decref(x);
    }
    if (!o || json_array_append_new(msgs, o) != 0) {
      json_decref(msgs);
      return CM_ERR_NOMEM;
    }
  }
  /* chat_template_kwargs (enable_thinking, ...) and the tools, as template variables */
  json_t *extra = req->template_kwargs ? json_loads(req->template_kwargs, 0, NULL) : json_object();
  json_t *tools = req->tools_json ? json_loads(req->tools_json, 0, NULL) : NULL;
  if (!extra || (req->tools_json && (!tools || json_object_set_new(extra, "tools", tools)))) {
    json_decref(extra);
    json_decref(msgs);
    return CM_ERR_NOMEM;
  }
  int rc = tk_chat_render(chat, msgs, req->add_generation_prompt, extra, text, len, errbuf, errlen);
  json_decref(extra);
  json_decref(msgs);
  return rc || !req->continue_final_message ? rc : cut_after_final(req, *text, len, errbuf, errlen);
}

/* The request's own chat template, compiled with the server's *_token variables
 * (a copy: other threads read them too). A template that does not parse is a 400
 * naming chat_template. */
static int own_template(struct tok_job *j, struct tk_chat **out) {
  const char *t = j->req->chat_template;
  json_t *conf = json_deep_copy(j->chat_conf);
  char why[256] = "";
  int rc = conf ? tk_chat_from_string(t, strlen(t), conf, out, why, sizeof(why)) : CM_ERR_NOMEM;
  json_decref(conf);
  if (rc && rc != CM_ERR_NOMEM) {
    snprintf(j->err, sizeof(j->err), "chat_template: %s", why[0] ? why : cm_strerror(rc));
    snprintf(j->param, sizeof(j->param), "chat_template");
    rc = CM_ERR_INVAL;
  }
  return rc;
}

/* Tokenizes the job's chat (its rendered messages) into job->ids[0]. */
static int job_chat(struct tok_job *j, struct tk_state *st) {
  const struct fe_api_request *req = j->req;
  int32_t **ids = &j->ids[0];
  size_t *n = &j->n_ids[0], *cap = &j->cap_ids[0];
  *n = 0;
  {
    char *text = NULL;
    size_t len = 0;
    struct tk_chat *own = NULL; /* the request's own template (trusted by the gate) */
    int rc = req->chat_template ? own_template(j, &own) : 0;
    if (!rc) rc = render_chat(own ? own : j->chat, req, &text, &len, j->err, sizeof(j->err));
    tk_chat_free(own);
    if (rc) {
      free(text);
      return rc;
    }
    if (req->template_only) { /* /apply-template: the text is the answer */
      j->text = text;
      j->text_len = len;
      return 0;
    }
    if (j->keep_render) { /* the request log's prompt: the chat before its media's tokens */
      free(j->render);
      if (!(j->render = malloc(len ? len : 1))) {
        free(text);
        return CM_ERR_NOMEM;
      }
      memcpy(j->render, text, len);
      j->render_len = len;
    }
    /* each image marker becomes its image's token run, each audio marker its clip's */
    for (int audio = 0; audio < 2 && !rc; audio++) {
      size_t n_kind = audio ? req->n_audio : req->n_images - req->n_audio;
      if (!n_kind) continue;
      int *nt = j->imgs ? malloc(sizeof(int) * n_kind) : NULL;
      if (j->imgs && !nt) {
        rc = CM_ERR_NOMEM;
        break;
      }
      for (size_t i = 0, k = 0; nt && i < req->n_images; i++)
        if (req->images[i].audio == audio) nt[k++] = j->imgs[i].tokens;
      char *full = NULL;
      size_t full_len = 0;
      rc = audio ? fe_mm_expand_audio(j->mm, text, len, n_kind, nt, &full, &full_len, j->err,
                                      sizeof(j->err))
                 : fe_mm_expand(j->mm, text, len, n_kind, nt, &full, &full_len, j->err,
                                sizeof(j->err));
      free(nt);
      free(text);
      text = full;
      len = full_len;
    }
    if (rc) {
      free(text);
      return rc;
    }
    /* the template writes <bos> itself: no post-processor unless asked */
    unsigned fl = TK_MATCH_SPECIAL | (req->add_special_tokens ? TK_ADD_SPECIAL : 0);
    rc = tk_encode(j->tok, st, text, len, fl, ids, n, cap);
    free(text);
    if (rc == CM_ERR_INVAL)
      snprintf(j->err, sizeof(j->err), "the rendered chat is not valid UTF-8");
    return rc;
  }
}

/* A user message that holds the JSON tool protocol's results (rewritten from
 * tool messages): it belongs to the turn of the calls it answers. */
static int results_turn(const struct fe_api_message *m) {
  static const char a[] = "{\"tool_response\":", b[] = "[{\"tool_response\":";
  return m->role == FE_API_ROLE_USER && !m->parts && m->content &&
         (!strncmp(m->content, a, sizeof(a) - 1) || !strncmp(m->content, b, sizeof(b) - 1));
}

/* The Responses API's truncation "auto" (fe_api_request.truncate_turns): while
 * the chat does not fit the context with room for max_tokens (or one token), its
 * oldest turns go, a turn being a user message and what answers it, the system
 * messages before the first kept. The fewest turns that make it fit go (a binary
 * search: fewer dropped is longer), the last turn always stays, and no turn with
 * an image or a clip goes (the media are decoded in order). A chat that still does
 * not fit is refused by the length check, as without truncation. */
/* The chat of all[0..n)'s first `lead` messages and those from `from` on, tokenized. */
static int job_chat_from(struct tok_job *j, struct tk_state *st, const struct fe_api_message *all,
                         size_t lead, size_t n, size_t from) {
  struct fe_api_request *req = j->req;
  memcpy(req->messages + lead, all + from, (n - from) * sizeof(*all));
  req->n_messages = lead + (n - from);
  return job_chat(j, st);
}

static int job_truncate(struct tok_job *j, struct tk_state *st) {
  struct fe_api_request *req = j->req;
  int64_t room = req->max_tokens > 0 ? req->max_tokens : 1;
#define FITS() ((int64_t)j->n_ids[0] + room <= j->max_model_len)
  if (!j->max_model_len || FITS()) return 0;
  size_t n = req->n_messages, lead = 0, n_turns = 0, limit = SIZE_MAX;
  while (lead < n && req->messages[lead].role == FE_API_ROLE_SYSTEM)
    lead++;
  size_t *start = malloc((n + 1) * sizeof(*start)); /* each turn's first message */
  struct fe_api_message *all = cm_arena_alloc(&req->arena, n * sizeof(*all));
  if (!start || !all) {
    free(start);
    return CM_ERR_NOMEM;
  }
  memcpy(all, req->messages, n * sizeof(*all));
  for (size_t i = lead; i < n; i++) {
    const struct fe_api_message *m = &all[i];
    if (i == lead || (m->role == FE_API_ROLE_USER && !results_turn(m))) start[n_turns++] = i;
    for (size_t k = 0; k < m->n_parts && limit == SIZE_MAX; k++)
      if (m->parts[k].is_image || m->parts[k].is_audio) limit = n_turns - 1; /* its turn stays */
  }
  /* dropping d turns keeps the messages from start[d] on: dropping lo is too long, and
   * hi is the fewest known to fit (the last turn stays; nor do media or what follows
   * them go) */
  size_t lo = 0, hi = n_turns ? n_turns - 1 : 0, at;
  if (limit < hi) hi = limit;
  int rc = hi ? job_chat_from(j, st, all, lead, n, start[hi]) : 0;
  if (!rc && hi && FITS()) { /* (else nothing fits: the length check refuses it) */
    at = hi;
    while (!rc && hi - lo > 1) {
      size_t mid = lo + (hi - lo) / 2;
      rc = job_chat_from(j, st, all, lead, n, start[mid]);
      at = mid;
      if (FITS())
        hi = mid;
      else
        lo = mid;
    }
    if (!rc && at != hi) rc = job_chat_from(j, st, all, lead, n, start[hi]);
  }
#undef FITS
  free(start);
  return rc;
}

/* Tokenizes prompt `pi` of the job's request (chat: the rendered messages)
 * into job->ids[pi]. Runs on a pool thread. */
static int job_prompt(struct tok_job *j, struct tk_state *st, size_t pi) {
  const struct fe_api_request *req = j->req;
  int32_t **ids = &j->ids[pi];
  size_t *n = &j->n_ids[pi], *cap = &j->cap_ids[pi];
  *n = 0;
  if (req->kind == FE_API_CHAT || (req->kind == FE_API_TOKENIZE && req->n_messages)) {
    int rc = job_chat(j, st);
    return rc || !req->truncate_turns ? rc : job_truncate(j, st);
  }
  const struct fe_api_prompt *p = &req->prompts[pi];
  if (p->ids) { /* checked against the vocabulary before the job was queued */
    if (!(*ids = malloc((p->n_ids ? p->n_ids : 1) * sizeof(**ids)))) return CM_ERR_NOMEM;
    memcpy(*ids, p->ids, p->n_ids * sizeof(**ids));
    *n = *cap = p->n_ids;
    return 0;
  }
  unsigned fl = TK_MATCH_SPECIAL | (req->add_special_tokens ? TK_ADD_SPECIAL : 0);
  int rc =
      tk_encode(j->tok, st, p->text ? p->text : "", p->text ? p->text_len : 0, fl, ids, n, cap);
  if (rc == CM_ERR_INVAL) snprintf(j->err, sizeof(j->err), "the prompt is not valid UTF-8");
  return rc;
}

/* bad_words as vLLM tokenizes them: each word (its leading white space gone, as
 * parsed) without special tokens added, then " " + word where that makes as many
 * tokens with another first one (the word within a text); the sequences into the
 * request's arena. */
static int job_bad_words(struct tok_job *j, struct tk_state *st) {
  struct fe_api_request *req = j->req;
  size_t cap = 2 * req->n_bad_words;
  req->bad_lens = cm_arena_alloc(&req->arena, cap * sizeof(*req->bad_lens));
  req->bad_ids = cm_arena_alloc(&req->arena, PR_MAX_BAD_WORD_IDS * sizeof(*req->bad_ids));
  if (!req->bad_lens || !req->bad_ids) return CM_ERR_NOMEM;
  int32_t *ids = NULL;
  size_t n = 0, icap = 0, first_n = 0;
  char *buf = malloc(FE_API_MAX_BAD_WORD_BYTES + 2);
  int rc = buf ? 0 : CM_ERR_NOMEM;
  for (size_t w = 0; w < req->n_bad_words && !rc; w++) {
    for (int space = 0; space < 2 && !rc; space++) {
      size_t len = strlen(req->bad_words[w]);
      buf[0] = ' ';
      memcpy(buf + 1, req->bad_words[w], len);
      n = 0;
      rc = tk_encode(j->tok, st, buf + !space, len + (size_t)space, TK_MATCH_SPECIAL, &ids, &n,
                     &icap);
      if (rc || !n) break;
      const uint32_t *prev = req->bad_ids + req->n_bad_ids - first_n;
      if (space && (n != first_n || (uint32_t)ids[0] == prev[0])) continue;
      if (n > PR_MAX_BAD_WORD_LEN || req->n_bad_ids + n > PR_MAX_BAD_WORD_IDS) {
        snprintf(j->err, sizeof(j->err),
                 "'bad_words' item %zu is %zu tokens (at most %d, and %d for all the words)", w, n,
                 PR_MAX_BAD_WORD_LEN, PR_MAX_BAD_WORD_IDS);
        rc = CM_ERR_TOOBIG;
        break;
      }
      for (size_t k = 0; k < n; k++)
        req->bad_ids[req->n_bad_ids + k] = (uint32_t)ids[k];
      req->n_bad_ids += n;
      req->bad_lens[req->n_bad_seqs++] = (uint32_t)n;
      if (!space) first_n = n;
    }
  }
  if (rc == CM_ERR_INVAL) snprintf(j->err, sizeof(j->err), "'bad_words' is not valid UTF-8");
  if (rc && rc != CM_ERR_NOMEM) snprintf(j->param, sizeof(j->param), "bad_words");
  free(buf);
  free(ids);
  return rc;
}

/* The thread's part: nothing here touches the engine or the connection. */
static void job_run(uv_work_t *w) {
  struct tok_job *j = w->data;
  if (j->req->kind == FE_API_DETOKENIZE) {
    const struct fe_api_prompt *p = &j->req->prompts[0];
    j->rc = tk_decode(j->tok, p->ids, p->n_ids, 0, &j->text, &j->text_len, &j->text_cap);
    return;
  }
  const struct fe_api_request *req = j->req;
  /* the request's grammars first: a refusal names the field, and a hostile one
   * takes its time here rather than on the loop */
  struct fe_api_error ge;
  if ((j->rc = fe_api_check_grammars(req, &ge)) != 0) {
    snprintf(j->err, sizeof(j->err), "%s", ge.message);
    memcpy(j->param, ge.param, sizeof(j->param));
    return;
  }
  /* then the images and clips: the cheaper refusal. Gemma 4's images and every
   * clip decide their token counts, so /tokenize decodes them too */
  if (req->n_images && !req->template_only &&
      (req->kind == FE_API_CHAT || j->mm->g4 || req->n_audio)) {
    if (!(j->imgs = calloc(req->n_images, sizeof(*j->imgs)))) {
      j->rc = CM_ERR_NOMEM;
      return;
    }
    for (size_t i = 0; i < req->n_images; i++) {
      const struct fe_api_image *im = &req->images[i];
      char why[256];
      int rc = im->audio ? fe_mm_audio(j->mm, im->url, im->url_len, im->format, &j->imgs[i], why,
                                       sizeof(why))
                         : fe_mm_image(j->mm, im->url, im->url_len, req->max_soft_tokens,
                                       &j->imgs[i], why, sizeof(why));
      if (rc) {
        j->rc = rc;
        snprintf(j->err, sizeof(j->err), "%.63s: %.250s", im->param, why);
        memcpy(j->param, im->param, sizeof(j->param));
        return;
      }
    }
  }
  struct tk_state *st = NULL;
  if ((j->rc = tk_state_acquire(j->tok, &st)) != 0) return;
  for (size_t pi = 0; pi < j->n_prompts && !j->rc; pi++)
    j->rc = job_prompt(j, st, pi);
  if (!j->rc && req->n_bad_words) j->rc = job_bad_words(j, st);
  tk_state_release(j->tok, st);
}

static void job_free(struct tok_job *j) {
  for (size_t i = 0; j->imgs && j->req && i < j->req->n_images; i++)
    fe_mm_image_free(&j->imgs[i]);
  free(j->imgs);
  for (size_t i = 0; j->ids && i < j->n_prompts; i++)
    free(j->ids[i]);
  free(j->ids);
  free(j->n_ids);
  free(j->cap_ids);
  free(j->text);
  free(j->render);
  if (j->req) {
    fe_api_request_free(j->req);
    free(j->req);
  }
  free(j);
}

static void job_on_client_abort(void *ud) {
  struct tok_job *j = ud;
  j->gone = 1;
}

/* ---- back on the loop ------------------------------------------------------- */

/* POST /tokenize and /detokenize, with the job's result. */
static void answer_tokens(struct fe_engine *e, struct fe_conn *c, struct tok_job *j) {
  const struct fe_api_request *req = j->req;
  struct fe_buf *b = &e->out;
  fe_buf_reset(b);
  if (j->rc) {
    if (req->kind == FE_API_TOKENIZE)
      answer_error(e, c, j->rc == CM_ERR_NOMEM ? 500 : 400, j->err[0] ? j->err : cm_strerror(j->rc),
                   NULL);
    else
      answer_error(e, c, j->rc == CM_ERR_NOMEM ? 500 : 400,
                   j->rc == CM_ERR_RANGE ? "a token id is outside the vocabulary"
                                         : "'tokens' must be a list of token ids",
                   "tokens");
    return;
  }
  if (req->template_only) {
    fe_api_write_detokenize(b, j->text ? j->text : "", j->text_len); /* {"prompt": TEXT} */
  } else if (req->anthropic == FE_API_ANTHROPIC_COUNT) {             /* /v1/messages/count_tokens */
    fe_buf_puts(b, "{\"input_tokens\":");
    fe_buf_i64(b, (int64_t)j->n_ids[0]);
    fe_buf_puts(b, "}");
  } else if (req->kind == FE_API_TOKENIZE) {
    size_t n = j->n_ids[0];
    const char **strs = req->token_strs ? calloc(n ? n : 1, sizeof(*strs)) : NULL;
    size_t *lens = req->token_strs ? calloc(n ? n : 1, sizeof(*lens)) : NULL;
    if (req->token_strs && (!strs || !lens)) {
      free(strs);
      free(lens);
      answer_error(e, c, 500, "out of memory", NULL);
      return;
    }
    for (size_t i = 0; strs && i < n; i++)
      strs[i] = tk_token_str(e->tok, j->ids[0][i], &lens[i]);
    fe_api_write_tokenize(b, j->ids[0], n, fe_engine_max_model_len(e), strs, lens);
    free(strs);
    free(lens);
  } else {
    fe_api_write_detokenize(b, j->text ? j->text : "", j->text_len);
  }
  if (b->err) {
    answer_error(e, c, 500, "response too large", NULL);
    return;
  }
  fe_conn_respond(c, 200, "application/json", NULL, b->data, b->len);
}

static void submit_tokenized(struct fe_engine *e, struct fe_conn *c, struct tok_job *j);

static void job_done(uv_work_t *w, int status) {
  struct tok_job *j = w->data;
  struct fe_engine *e = j->e;
  struct fe_conn *c = j->c;
  (void)status; /* jobs are never cancelled */
  fe_conn_set_abort_cb(c, NULL, NULL);
  if (j->gone || fe_conn_closed(c)) /* nobody to answer: this releases the connection */
    fe_conn_respond_error(c, 400, "the client went away", NULL);
  else if (j->req->kind == FE_API_TOKENIZE || j->req->kind == FE_API_DETOKENIZE)
    answer_tokens(e, c, j);
  else
    submit_tokenized(e, c, j);
  job_free(j);
}

/* ---- before the pool: what can be refused at once -------------------------- */

/* Every id a request names must be one the model has: prompt ids and the
 * ids of stop_token_ids, logit_bias and allowed_token_ids below n_vocab
 * (/detokenize: the tokenizer's ids). A 400 naming the field otherwise. */
static int check_ids(struct fe_engine *e, const struct fe_api_request *q, char *err, size_t errlen,
                     const char **param) {
  const struct {
    const char *name;
    const int32_t *ids;
    size_t n;
  } fields[] = {
      {"stop_token_ids", q->stop_token_ids, q->n_stop_token_ids},
      {"logit_bias", q->logit_bias_ids, q->n_logit_bias},
      {"allowed_token_ids", q->allowed_token_ids, q->n_allowed_token_ids},
  };
  int32_t nv = q->kind == FE_API_DETOKENIZE ? tk_n_vocab(e->tok) : e->n_vocab;
  for (size_t pi = 0; pi < q->n_prompts; pi++) {
    const struct fe_api_prompt *p = &q->prompts[pi];
    for (size_t i = 0; p->ids && i < p->n_ids; i++) {
      if (p->ids[i] >= 0 && p->ids[i] < nv) continue;
      *param = q->kind == FE_API_DETOKENIZE ? "tokens" : "prompt";
      return cm_fail(err, errlen, CM_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)",
                     (int)p->ids[i], (int)nv - 1);
    }
  }
  for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
    for (size_t i = 0; i < fields[f].n; i++) {
      if (fields[f].ids[i] >= 0 && fields[f].ids[i] < nv) continue;
      *param = fields[f].name;
      return cm_fail(err, errlen, CM_ERR_RANGE,
                     "'%s': token id %d is outside the vocabulary (0..%d)", fields[f].name,
                     (int)fields[f].ids[i], (int)nv - 1);
    }
  }
  return 0;
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
  s->logprobs = q->n_keep && q->logprobs < 0 ? 0 : q->logprobs; /* best_of ranks by them */
  s->prompt_logprobs = q->prompt_logprobs;
  s->ignore_eos = q->ignore_eos != 0;
  s->grammar_kind = (uint32_t)q->grammar_kind;
  s->grammar = (struct pr_bytes){(const uint8_t *)q->grammar, (uint32_t)q->grammar_len};
  s->bias_ids = (struct pr_u32s){(const uint32_t *)q->bias_ids, (uint32_t)q->n_bias};
  s->bias = (struct pr_f32s){q->bias, (uint32_t)q->n_bias};
  s->bias_only = q->allowed_only != 0;
  s->bad_ids = (struct pr_u32s){q->bad_ids, (uint32_t)q->n_bad_ids};
  s->bad_lens = (struct pr_u32s){q->bad_lens, (uint32_t)q->n_bad_seqs};
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
  fe_buf_init(&ch->logged, 0);
  fe_g4_out_init(&ch->g4_out);
  /* Gemma 4's notation: the markers come as their text (other special tokens are
   * dropped on the way in, fe-engine-out.c) */
  int rc = tk_detok_create(e->tok, r->api->g4 ? 0 : r->api->skip_special_tokens, &ch->detok);
  if (rc) return rc;
  if (r->api->g4) {
    if (!(ch->g4 = malloc(sizeof(*ch->g4)))) return CM_ERR_NOMEM;
    /* a stream sends each call's name, then its arguments as they are written */
    fe_g4_split_init(ch->g4, r->api->g4 | (r->stream ? FE_G4_STREAM_CALLS : 0u));
  }
  const struct fe_api_request *q = r->api;
  size_t lens[FE_API_MAX_STOP];
  for (size_t i = 0; i < q->n_stop && i < FE_API_MAX_STOP; i++)
    lens[i] = strlen(q->stop[i]);
  if ((rc = tk_stop_create(q->stop, lens, q->n_stop, &ch->stop))) return rc;
  return fe_eng_map_put(e, ch);
}

/* return_token_ids: a copy of the choice's prompt ids for its answer. */
static int keep_prompt_ids(struct fe_eng_choice *ch, const int32_t *ids, size_t n) {
  if (!(ch->prompt_ids = malloc((n ? n : 1) * sizeof(*ids)))) return CM_ERR_NOMEM;
  if (n) memcpy(ch->prompt_ids, ids, n * sizeof(*ids));
  ch->n_prompt_ids = n;
  return 0;
}

/* The k-th media part of a kind (audio: input_audio, else image_url); the
 * caller knows there is one. */
static const struct fe_api_image *nth_media(const struct fe_api_request *q, int audio, size_t k) {
  for (size_t i = 0; i < q->n_images; i++)
    if (q->images[i].audio == audio && k-- == 0) return &q->images[i];
  return &q->images[0];
}

/* Checks what needs no tokens, then hands the request to the thread pool;
 * submit_tokenized goes on once its prompts are tokens. */
int fe_eng_submit(void *ud, struct fe_conn *c, struct fe_api_request *req, const char **why) {
  struct fe_engine *e = ud;
  int gen = req->kind == FE_API_COMPLETION || req->kind == FE_API_CHAT;
  if (gen && !fe_engine_ready(e)) {
    *why = "engine not ready";
    return CM_ERR_AGAIN;
  }
  char err[320] = "";
  const char *param = NULL;
  size_t n_prompts = req->kind == FE_API_CHAT ? 1 : req->n_prompts;
  if (req->kind == FE_API_TOKENIZE) n_prompts = 1;
  /* the most bytes the images' pixels and the clips' features may take on the wire */
  size_t n_img = req->n_images - req->n_audio;
  size_t img_max = n_img ? fe_mm_image_max_bytes(&e->mm, req->max_soft_tokens) : 0;
  size_t clip_max = req->n_audio && e->mm.audio ? fe_mm_audio_max_bytes(&e->mm) : 0;
  size_t mm_bytes = n_img * img_max + req->n_audio * clip_max;
  if (gen && (n_prompts == 0 || n_prompts * (size_t)req->n > FE_API_MAX_N)) {
    param = req->n_keep ? "best_of" : "n";
    snprintf(err, sizeof(err), "%s times the number of prompts must be 1..%d, not %zu", param,
             FE_API_MAX_N, n_prompts * (size_t)req->n);
  } else if (req->kind == FE_API_TOKENIZE && !req->n_messages && !req->n_prompts) {
    snprintf(err, sizeof(err), "'prompt' (a string) or 'messages' is required");
  } else if (req->kind == FE_API_DETOKENIZE && !req->n_prompts) {
    param = "tokens";
    snprintf(err, sizeof(err), "'tokens' must be a list of token ids");
  } else if (n_img && !e->mm.enabled) {
    param = nth_media(req, 0, 0)->param;
    snprintf(err, sizeof(err), "%s", e->cfg.mm.limit == 0
                                         ? "images are turned off on this server "
                                           "(--limit-mm-per-prompt image=0)"
                                         : "this model does not take images");
  } else if (n_img > (size_t)e->mm.limit) {
    param = nth_media(req, 0, (size_t)e->mm.limit)->param;
    snprintf(err, sizeof(err),
             "%zu images in the prompt; this server takes at most %d "
             "(--limit-mm-per-prompt)",
             n_img, e->mm.limit);
  } else if (req->n_audio && !e->mm.audio) {
    param = nth_media(req, 1, 0)->param;
    snprintf(err, sizeof(err), "%s",
             e->cfg.mm.audio_limit == 0 ? "audio is turned off on this server "
                                          "(--limit-mm-per-prompt audio=0)"
                                        : "this model does not take audio");
  } else if (req->n_audio > (size_t)e->mm.audio_limit) {
    param = nth_media(req, 1, (size_t)e->mm.audio_limit)->param;
    snprintf(err, sizeof(err),
             "%zu audio clips in the prompt; this server takes at most %d "
             "(--limit-mm-per-prompt)",
             req->n_audio, e->mm.audio_limit);
  } else if (req->max_soft_tokens && !e->mm.g4) {
    param = "mm_processor_kwargs.max_soft_tokens";
    snprintf(err, sizeof(err), "this model's images take no max_soft_tokens (Gemma 4's)");
  } else if (mm_bytes > PR_MAX_MSG_DEFAULT / 2) {
    param = "messages";
    snprintf(err, sizeof(err),
             "%zu images of up to %zu bytes of pixels and %zu audio clips of up to %zu bytes "
             "of features take more than one request may carry (%u MB)",
             n_img, img_max, req->n_audio, clip_max, (unsigned)(PR_MAX_MSG_DEFAULT / 2 >> 20));
  } else if (req->chat_template && !e->cfg.trust_request_chat_template) {
    param = "chat_template"; /* vLLM's words */
    snprintf(err, sizeof(err),
             "Chat template is passed with request, but --trust-request-chat-template is not "
             "set. Refused request with untrusted chat template.");
  } else {
    check_ids(e, req, err, sizeof(err), &param);
  }
  if (err[0]) {
    answer_error(e, c, 400, err, param);
    fe_api_request_free(req);
    free(req);
    return 0;
  }
  struct tok_job *j = calloc(1, sizeof(*j));
  if (j) {
    j->n_prompts = n_prompts;
    j->ids = calloc(n_prompts ? n_prompts : 1, sizeof(*j->ids));
    j->n_ids = calloc(n_prompts ? n_prompts : 1, sizeof(*j->n_ids));
    j->cap_ids = calloc(n_prompts ? n_prompts : 1, sizeof(*j->cap_ids));
  }
  if (!j || !j->ids || !j->n_ids || !j->cap_ids) {
    if (j) job_free(j); /* req is not the job's yet */
    *why = "out of memory";
    return CM_ERR_NOMEM;
  }
  j->e = e;
  j->max_model_len = fe_engine_max_model_len(e);
  j->keep_render = e->cfg.log_requests && req->kind == FE_API_CHAT && CM_LOG_ENABLED(CM_LOG_INFO);
  j->c = c;
  j->tok = e->tok;
  j->chat = e->chat;
  j->chat_conf = e->chat_conf;
  j->mm = &e->mm;
  j->req = req; /* the job's from here on */
  j->work.data = j;
  int rc = uv_queue_work(e->loop, &j->work, job_run, job_done);
  if (rc != 0) {
    cm_error(TAG, "cannot queue tokenization: %s", uv_strerror(rc));
    j->req = NULL; /* the router frees it */
    job_free(j);
    *why = "cannot queue the request";
    return CM_ERR_IO;
  }
  fe_conn_set_abort_cb(c, job_on_client_abort, j);
  return 0;
}

/* echo: the text a choice of prompt pi begins with (vLLM's), into text.
 * Completions: the prompt as given, or as its (kept) ids decode, special
 * tokens included; chat: the last message's content when it is the
 * assistant's, which the answer then continues. */
static int echo_text(struct fe_engine *e, const struct fe_api_request *req, const struct tok_job *j,
                     size_t pi, struct fe_buf *text) {
  if (!req->echo) return 0;
  if (req->kind == FE_API_CHAT) {
    const struct fe_api_message *m = &req->messages[req->n_messages - 1];
    if (m->role == FE_API_ROLE_ASSISTANT && m->content)
      fe_buf_append(text, m->content, m->content_len);
    return text->err;
  }
  const struct fe_api_prompt *p = &req->prompts[pi];
  if (p->text && !req->truncate_prompt_tokens) {
    fe_buf_append(text, p->text, p->text_len);
    return text->err;
  }
  char *s = NULL;
  size_t n = 0, cap = 0;
  int rc = tk_decode(e->tok, j->ids[pi], j->n_ids[pi], 0, &s, &n, &cap);
  if (!rc) fe_buf_append(text, s, n), rc = text->err;
  free(s);
  return rc;
}

/* Completions and chat once their prompts are tokens: the length checks,
 * then one ADD per choice. Takes the request over from the job. */
static void submit_tokenized(struct fe_engine *e, struct fe_conn *c, struct tok_job *j) {
  struct fe_api_request *req = j->req;
  if (j->rc) {
    const char *msg = j->err[0] ? j->err : cm_strerror(j->rc);
    answer_error(e, c, j->rc == CM_ERR_NOMEM ? 500 : 400, msg,
                 j->param[0] ? j->param : req->kind == FE_API_CHAT ? "messages" : "prompt");
    return;
  }
  /* truncate_prompt_tokens: each prompt's last k tokens */
  int64_t keep = req->truncate_prompt_tokens < 0 ? fe_engine_max_model_len(e)
                                                 : req->truncate_prompt_tokens,
          cut = 0;
  for (size_t pi = 0; keep > 0 && pi < j->n_prompts; pi++)
    if ((int64_t)j->n_ids[pi] > keep) {
      cut += (int64_t)j->n_ids[pi] - keep;
      memmove(j->ids[pi], j->ids[pi] + j->n_ids[pi] - (size_t)keep, sizeof(int32_t) * (size_t)keep);
      j->n_ids[pi] = (size_t)keep;
    }
  struct pr_image *images = NULL;
  if (req->n_images) { /* where each image's and clip's tokens landed */
    char why[256];
    if (!(images = calloc(req->n_images, sizeof(*images)))) {
      answer_error(e, c, 500, "out of memory", NULL);
      return;
    }
    int *nt = malloc(sizeof(int) * req->n_images);
    for (size_t i = 0; nt && i < req->n_images; i++) {
      nt[i] = j->imgs[i].tokens;
      images[i].kind = req->images[i].audio ? PR_MEDIA_AUDIO : PR_MEDIA_IMAGE;
    }
    if (!nt || fe_mm_find_runs(&e->mm, j->ids[0], j->n_ids[0], images, req->n_images, nt, why,
                               sizeof(why))) {
      const int oom = !nt;
      if (oom) snprintf(why, sizeof(why), "out of memory");
      free(nt);
      free(images);
      if (cut && !oom)
        answer_error(e, c, 400,
                     "truncate_prompt_tokens cuts into the request's images or audio: keep more "
                     "tokens",
                     "truncate_prompt_tokens");
      else
        answer_error(e, c, 400, why, "messages");
      return;
    }
    free(nt);
    for (size_t i = 0; i < req->n_images; i++) {
      images[i].hash = j->imgs[i].hash;
      images[i].pixels = (struct pr_bytes){j->imgs[i].pixels, (uint32_t)j->imgs[i].n_bytes};
      /* Gemma 4's images are sized per image (the workers cut them into their
       * patches); a clip's features say their mel bins and frames */
      if (e->mm.g4 || images[i].kind == PR_MEDIA_AUDIO) {
        images[i].width = (uint32_t)j->imgs[i].width;
        images[i].height = (uint32_t)j->imgs[i].height;
      }
    }
  }
  /* the replica: by load and by where this prompt's prefix went before */
  struct fe_replica *rep =
      j->n_prompts ? fe_eng_route(e, (const uint32_t *)j->ids[0], j->n_ids[0]) : NULL;
  if (!rep) { /* it went away while the prompt was tokenized */
    answer_error(e, c, 503, "engine not ready", NULL);
    return;
  }
  size_t n_prompts = j->n_prompts;
  struct fe_eng_req *r = calloc(1, sizeof(*r));
  int n_ch = (int)n_prompts * req->n;
  if (!r || !(r->ch = calloc((size_t)n_ch, sizeof(*r->ch))) ||
      !(r->n_prompt = calloc(n_prompts, sizeof(*r->n_prompt)))) {
    if (r) free(r->ch);
    free(r);
    free(images);
    answer_error(e, c, 503, "out of memory", NULL);
    return;
  }
  /* the images' pixels are r's from here on */
  r->images = images;
  r->mm = j->imgs;
  r->n_images = req->n_images;
  j->imgs = NULL;
  j->req = NULL; /* r's from here on */
  r->e = e;
  r->conn = c;
  r->api = req;
  r->n_ch = n_ch;
  r->stream = req->stream;
  r->start_ns = cm_time_ns();
  r->created = (int64_t)(cm_time_wall_ns() / 1000000000ull);
  const char *prefix = req->responses             ? "resp_"
                       : req->anthropic           ? "msg_"
                       : req->kind == FE_API_CHAT ? "chatcmpl-"
                                                  : "cmpl-";
  /* the client's X-Request-Id, as vLLM names its answer; not a stored response's,
   * whose id must be one no other client can choose */
  if (req->client_id && !req->responses)
    snprintf(r->id, sizeof(r->id), "%s%s", prefix, req->client_id);
  else
    fe_api_make_id(r->id, sizeof(r->id), prefix);
  /* link first: fe_eng_req_fail and the abort callback find it */
  r->next = e->reqs;
  if (e->reqs) e->reqs->prev = r;
  e->reqs = r;
  e->n_reqs++;
  fe_eng_req_attach(r, rep);
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
    const int32_t *ids = j->ids[pi];
    size_t n_ids = j->n_ids[pi];
    if (n_ids == 0) {
      status = 400;
      param = "prompt";
      snprintf(err, sizeof(err), "the prompt is empty (no tokens)");
      break;
    }
    int64_t mt = 0;
    if (mml > 0) {
      if (fe_api_check_prompt_len(req, (int64_t)n_ids, mml, &mt, &aerr) != 0) {
        status = aerr.status ? aerr.status : 400;
        snprintf(err, sizeof(err), "%s", aerr.message);
        param = aerr.param;
        break;
      }
    } else {
      mt = req->max_tokens > 0 ? req->max_tokens : 16;
    }
    if (mt > UINT32_MAX) mt = UINT32_MAX;
    const struct fe_api_prompt *pp = pi < req->n_prompts ? &req->prompts[pi] : NULL;
    if (j->render)
      fe_eng_log_received(r, pi, j->render, j->render_len, ids, n_ids, mt);
    else
      fe_eng_log_received(r, pi, pp ? pp->text : NULL, pp ? pp->text_len : 0, ids, n_ids, mt);
    r->n_prompt[pi] = (int64_t)n_ids;
    r->prompt_total += (int64_t)n_ids;
    if (pi == 0) r->max_tokens_param = mt;
    uint32_t n_stop = 0;
    if (stop_ids(e, req, &n_stop)) {
      status = 500;
      snprintf(err, sizeof(err), "out of memory");
      break;
    }
    for (int k_ = 0; k_ < req->n && !status; k_++) {
      int k = (int)pi * req->n + k_;
      if (choice_init(e, r, k, (int)pi) != 0 || echo_text(e, req, j, pi, &r->ch[k].text) ||
          ((req->return_token_ids || req->prompt_logprobs >= 0) &&
           keep_prompt_ids(&r->ch[k], ids, n_ids))) {
        status = 500;
        snprintf(err, sizeof(err), "out of memory");
        break;
      }
      if (req->beam) { /* the search sends its steps once the prompt's choices are made */
        int brc = k_ + 1 < req->n ? 0 : fe_eng_beam_start(r, pi, ids, n_ids, mt);
        if (brc) {
          status = brc == CM_ERR_NOMEM ? 500 : 503;
          snprintf(err, sizeof(err), "cannot queue the request at the scheduler: %s",
                   cm_strerror(brc));
        }
        continue;
      }
      struct pr_msg m;
      pr_msg_init(&m, PR_ADD);
      struct pr_add *a = &m.u.add;
      a->request_id = r->ch[k].id;
      a->prompt.v = (const uint32_t *)ids;
      a->prompt.n = (uint32_t)n_ids;
      fill_sampling(req, k, &a->sampling);
      a->max_tokens = (uint32_t)mt;
      a->min_tokens = (uint32_t)(req->min_tokens < mt ? req->min_tokens : mt);
      a->stop_token_ids.v = e->stop_ids;
      a->stop_token_ids.n = n_stop;
      a->priority = req->priority;
      a->arrival_ns = cm_time_wall_ns();
      a->cache_salt = req->cache_salt;
      a->sampling.lora = (uint32_t)req->lora;
      a->lora_sum = req->lora_sum;
      a->lora_uid = req->lora_uid;
      a->lora_path = req->lora_path;
      a->images = r->images;
      a->n_images = (uint32_t)r->n_images;
      int src = fe_eng_send_add(r, &r->ch[k], &m);
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
}

void fe_eng_req_unmap(struct fe_eng_req *r) {
  for (int k = 0; k < r->n_ch; k++)
    if (r->ch[k].id) fe_eng_map_del(r->e, r->ch[k].id);
}

void fe_eng_req_free(struct fe_eng_req *r) {
  struct fe_engine *e = r->e;
  fe_eng_req_attach(r, NULL);
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
    fe_buf_free(&ch->logged);
    if (ch->g4) fe_g4_split_free(ch->g4);
    free(ch->g4);
    fe_g4_out_free(&ch->g4_out);
    free(ch->lps);
    free(ch->tops);
    free(ch->ids);
    free(ch->prompt_ids);
    free(ch->plp);
    free(ch->plp_rank);
    free(ch->plp_top);
  }
  fe_eng_beam_free(r);
  free(r->ch);
  free(r->n_prompt);
  for (size_t i = 0; r->mm && i < r->n_images; i++)
    fe_mm_image_free(&r->mm[i]);
  free(r->mm);
  free(r->images);
  fe_api_request_free(r->api);
  free(r->api);
  free(r);
}
