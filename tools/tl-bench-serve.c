/* tl-bench-serve.c — `lmserve bench serve`: a load generator against a running
 * OpenAI-compatible server, in the manner of `vllm bench serve`.
 *
 * Each request is a streamed /v1/completions call whose prompt is a list of
 * --input-len random token ids, asking for exactly --output-len tokens
 * (ignore_eos). Requests start at --request-rate per second (Poisson
 * arrivals; inf = all at once) with at most --concurrency in flight. From
 * the SSE stream it measures time to first token (TTFT), time per output
 * token after the first (TPOT), inter-token latency (ITL, between chunks)
 * and end-to-end latency, and prints mean / median / p99 of each, request
 * and token throughput, and — from /metrics before and after — the prefix
 * cache hit rate and the speculative-decoding mean acceptance length. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-grow.h"
#include "common/cm-time.h"
#include "tools/tl-http-client.h"
#include "tools/tl-main.h"

struct bs_config {
  const char *url, *model, *api_key;
  struct tl_url u;
  int64_t concurrency, num_prompts, input_len, output_len, seed, vocab;
  double rate;        /* requests/s; <= 0 means all at once */
  json_t *extra_body; /* --extra-body: fields set in every request (a structured output), or NULL */
};

struct bs_result {
  int ok;
  double start, ttft, e2e; /* seconds */
  int out_tokens;          /* from usage, else chunk count */
  int prompt_tokens;
  double *itl; /* seconds between chunks */
  int n_itl, cap_itl;
  char err[160];
};

struct bs_shared {
  struct bs_config *cfg;
  struct bs_result *res;
  double *start_at; /* seconds from t0 at which request i may start */
  double t0;
  int next; /* next request index to take */
  pthread_mutex_t mu;
};

static void itl_push(struct bs_result *r, double v) {
  if (cm_grow_items(&r->itl, &r->cap_itl, r->n_itl + 1, sizeof(*r->itl), 64)) return;
  r->itl[r->n_itl++] = v;
}

/* Handles one SSE event payload (the text after "data: "). */
static void on_event(struct bs_result *r, const char *data, size_t len, double now, double *last,
                     int *chunks) {
  if (len == 6 && !memcmp(data, "[DONE]", 6)) return;
  json_error_t jerr;
  json_t *j = json_loadb(data, len, 0, &jerr);
  if (!j) return;
  json_t *usage = json_object_get(j, "usage");
  if (json_is_object(usage)) {
    r->out_tokens = (int)json_integer_value(json_object_get(usage, "completion_tokens"));
    r->prompt_tokens = (int)json_integer_value(json_object_get(usage, "prompt_tokens"));
  }
  json_t *choices = json_object_get(j, "choices");
  if (json_is_array(choices) && json_array_size(choices) > 0) {
    json_t *text = json_object_get(json_array_get(choices, 0), "text");
    if (json_is_string(text) || json_object_get(json_array_get(choices, 0), "finish_reason")) {
      if (*chunks == 0)
        r->ttft = now - r->start;
      else if (json_is_string(text) && json_string_length(text) > 0)
        itl_push(r, now - *last);
      if (json_is_string(text) && json_string_length(text) > 0) {
        *last = now;
        (*chunks)++;
      }
    }
  }
  json_t *err = json_object_get(j, "error");
  if (json_is_object(err)) {
    snprintf(r->err, sizeof(r->err), "%s",
             json_string_value(json_object_get(err, "message")) ?: "error event");
    r->ok = 0;
  }
  json_decref(j);
}

/* Runs one streamed completion; fills r. */
static void run_request(const struct bs_config *c, int idx, struct bs_result *r) {
  char *body = NULL, *req = NULL;
  struct tl_buf in = {0};
  int fd = -1;
  /* prompt: random token ids from a per-request seeded generator */
  uint64_t s = (uint64_t)c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)idx + 1;
  json_t *ids = json_array();
  for (int64_t i = 0; i < c->input_len; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    /* skip the first 256 ids (specials, bytes) so prompts look like text */
    json_array_append_new(ids, json_integer(256 + (json_int_t)(s % (uint64_t)(c->vocab - 256))));
  }
  json_t *j = json_pack("{s:s, s:o, s:I, s:b, s:b, s:{s:b}, s:f}", "model", c->model, "prompt", ids,
                        "max_tokens", (json_int_t)c->output_len, "ignore_eos", 1, "stream", 1,
                        "stream_options", "include_usage", 1, "temperature", 0.0);
  if (j && c->extra_body) json_object_update(j, c->extra_body);
  body = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!body) {
    snprintf(r->err, sizeof(r->err), "out of memory");
    return;
  }
  size_t blen = strlen(body);
  char auth[600] = "";
  if (c->api_key) snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", c->api_key);
  if (asprintf(
          &req,
          "POST %s/v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
          "%sContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
          c->u.base_path, c->u.host, c->u.port, auth, blen, body) < 0) {
    req = NULL;
    snprintf(r->err, sizeof(r->err), "out of memory");
    goto out;
  }
  r->start = cm_time_s();
  fd = tl_url_connect(&c->u);
  if (fd < 0 || tl_write_all(fd, req, strlen(req)) != 0) {
    snprintf(r->err, sizeof(r->err), "cannot connect or send: %s", strerror(errno));
    goto out;
  }
  /* read the status line and headers, then SSE lines as they arrive */
  int status = 0, headers_done = 0, chunks = 0;
  size_t scan = 0;
  double last = r->start;
  r->ok = 1;
  for (;;) {
    if (tl_buf_read(&in, fd) <= 0) break;
    double now = cm_time_s();
    if (!headers_done) {
      char *end = strstr(in.p, "\r\n\r\n");
      if (!end) continue;
      if (sscanf(in.p, "HTTP/1.%*d %d", &status) != 1) status = 0;
      headers_done = 1;
      scan = (size_t)(end + 4 - in.p);
      if (status != 200) {
        snprintf(r->err, sizeof(r->err), "HTTP %d: %.120s", status, in.p + scan);
        r->ok = 0;
        continue;
      }
    }
    if (status != 200) continue;
    /* chunked transfer framing lines are not "data: " lines, so they are ignored */
    for (;;) {
      char *nl = memchr(in.p + scan, '\n', in.n - scan);
      if (!nl) break;
      char *line = in.p + scan;
      size_t len = (size_t)(nl - line);
      if (len && line[len - 1] == '\r') len--;
      if (len > 6 && !memcmp(line, "data: ", 6))
        on_event(r, line + 6, len - 6, now, &last, &chunks);
      scan = (size_t)(nl + 1 - in.p);
    }
  }
  r->e2e = cm_time_s() - r->start;
  if (status != 200) r->ok = 0;
  if (r->ok && chunks == 0) {
    r->ok = 0;
    snprintf(r->err, sizeof(r->err), "no tokens streamed");
  }
  if (r->ok && r->out_tokens == 0) r->out_tokens = chunks;
out:
  if (fd >= 0) close(fd);
  free(in.p);
  free(req);
  free(body);
}

static void *client_thread(void *arg) {
  struct bs_shared *sh = arg;
  for (;;) {
    pthread_mutex_lock(&sh->mu);
    int i = sh->next < sh->cfg->num_prompts ? sh->next++ : -1;
    pthread_mutex_unlock(&sh->mu);
    if (i < 0) break;
    double wait = sh->t0 + sh->start_at[i] - cm_time_s();
    if (wait > 0) cm_time_sleep_ns((uint64_t)(wait * 1e9));
    run_request(sh->cfg, i, &sh->res[i]);
  }
  return NULL;
}

/* ---- metrics -------------------------------------------------------------------- */

static void stats_line(const char *name, double *v, int n, double scale, const char *unit) {
  if (n == 0) {
    printf("%-26s (no samples)\n", name);
    return;
  }
  qsort(v, (size_t)n, sizeof(double), tl_cmp_double);
  double sum = 0;
  for (int i = 0; i < n; i++)
    sum += v[i];
  double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  int p99i = (int)ceil(0.99 * n) - 1;
  if (p99i < 0) p99i = 0;
  printf("%-26s mean %9.2f  median %9.2f  p99 %9.2f %s\n", name, sum / n * scale, med * scale,
         v[p99i] * scale, unit);
}

/* Sum of the series of `name` carrying the label text `label` ("position=\"0\""); -1
 * when there is none. */
static double metric_labelled(const char *text, const char *name, const char *label) {
  double total = -1;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (*p != '#' && !strncmp(p, name, nl) && p[nl] == '{') {
      const char *end = strchr(p + nl, '}'), *l = strstr(p + nl, label);
      if (end && l && l < end && (l[-1] == '{' || l[-1] == ','))
        total = (total < 0 ? 0 : total) + strtod(end + 1, NULL);
    }
    p = eol ? eol + 1 : NULL;
  }
  return total;
}

/* The value of label `key` in the label set [l, end) of one sample line,
 * unescaped into out[cap]; "" when absent. */
static void label_value(const char *l, const char *end, const char *key, char *out, size_t cap) {
  size_t kl = strlen(key), o = 0;
  out[0] = 0;
  const char *p = l;
  while (p && p < end) {
    if ((size_t)(end - p) > kl + 1 && !strncmp(p, key, kl) && p[kl] == '=' && p[kl + 1] == '"') {
      for (const char *q = p + kl + 2; q < end && *q != '"' && o + 1 < cap; q++) {
        char ch = *q;
        if (ch == '\\' && q + 1 < end) ch = *++q == 'n' ? '\n' : *q;
        out[o++] = ch;
      }
      out[o] = 0;
      return;
    }
    p = memchr(p, ',', (size_t)(end - p));
    if (p) p++;
  }
}

/* What runs the model, from lmserve:engine_info: one line per replica. */
static void print_engines(const char *text) {
  static const char name[] = "lmserve:engine_info{";
  int n = 0;
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (!strncmp(p, name, sizeof(name) - 1)) {
      const char *l = p + sizeof(name) - 1, *end = strchr(l, '}');
      char rep[16], kernels[64], inputs[32], head[64];
      if (end) {
        label_value(l, end, "replica", rep, sizeof(rep));
        label_value(l, end, "kernels", kernels, sizeof(kernels));
        label_value(l, end, "matmul_inputs", inputs, sizeof(inputs));
        snprintf(head, sizeof(head), "Kernels (replica %s):", rep);
        printf("%-40s %s, matmul inputs %s\n", head, kernels, inputs[0] ? inputs : "?");
        n++;
      }
    }
    p = eol ? eol + 1 : NULL;
  }
  if (!n) printf("%-40s %s\n", "Kernels:", "not reported by the server");
}

int tl_bench_serve_main(int argc, char **argv) {
  struct bs_config c = {
      .url = "http://127.0.0.1:8000",
      .concurrency = 1,
      .num_prompts = 100,
      .input_len = 128,
      .output_len = 128,
      .seed = 0,
      .vocab = 262144,
      .rate = 0,
  };
  const char *model = NULL, *extra = NULL;
  const struct cm_opt opts[] = {
      {"url", CM_OPT_STR, &c.url, "URL", "server base URL (http://127.0.0.1:8000)"},
      {"model", CM_OPT_STR, &model, "NAME", "model name (default: the first of /v1/models)"},
      {"api-key", CM_OPT_STR, &c.api_key, "KEY", "bearer token"},
      {"concurrency", CM_OPT_INT, &c.concurrency, "C", "most requests in flight (1)", 1, 4096},
      {"num-prompts", CM_OPT_INT, &c.num_prompts, "N", "requests to send (100)", 1, 10000000},
      {"input-len", CM_OPT_INT, &c.input_len, "I", "prompt tokens per request (128)", 1, 1 << 20},
      {"output-len", CM_OPT_INT, &c.output_len, "O", "output tokens per request (128)", 1, 1 << 20},
      {"request-rate", CM_OPT_DOUBLE, &c.rate, "R", "requests/s, Poisson (0 = all at once)", 0, 0,
       0, 1e9},
      {"seed", CM_OPT_INT, &c.seed, "N", "prompt and arrival seed (0)", 0, INT64_MAX},
      {"vocab-size", CM_OPT_INT, &c.vocab, "V", "random prompt ids are < V (262144)", 257, 1 << 30},
      {"extra-body", CM_OPT_STR, &extra, "JSON",
       "a JSON object whose fields every request also sends, e.g. "
       "'{\"response_format\": {\"type\": \"json_object\"}}'"},
      {0},
  };
  int rc = tl_args_parse("lmserve bench serve", "Load-test a running server.", opts, argc, argv);
  if (rc >= 0) return rc;
  if (extra) {
    json_error_t je;
    c.extra_body = json_loads(extra, 0, &je);
    if (!json_is_object(c.extra_body)) {
      fprintf(stderr, "lmserve bench serve: --extra-body must be a JSON object%s%s\n",
              c.extra_body ? "" : ": ", c.extra_body ? "" : je.text);
      json_decref(c.extra_body);
      return 2;
    }
  }
  if (tl_url_parse(c.url, &c.u) != 0) {
    fprintf(stderr, "lmserve bench serve: --url must look like http://HOST:PORT, got '%s'\n",
            c.url);
    return 2;
  }
  char model_buf[256];
  if (!model) {
    /* ask the server */
    rc = tl_http_first_model(&c.u, c.api_key, model_buf, sizeof(model_buf));
    if (rc) {
      fprintf(stderr,
              rc == CM_ERR_IO
                  ? "lmserve bench serve: cannot connect to %s\n"
                  : "lmserve bench serve: could not read a model name from %s/v1/models\n",
              c.url);
      return 1;
    }
    model = model_buf;
  }
  c.model = model;

  struct bs_shared sh = {.cfg = &c};
  sh.res = calloc((size_t)c.num_prompts, sizeof(*sh.res));
  sh.start_at = calloc((size_t)c.num_prompts, sizeof(double));
  pthread_t *th = calloc((size_t)c.concurrency, sizeof(pthread_t));
  if (!sh.res || !sh.start_at || !th) {
    fprintf(stderr, "lmserve bench serve: out of memory\n");
    return 1;
  }
  /* Poisson arrivals: exponential gaps with mean 1/rate */
  uint64_t s = (uint64_t)c.seed * 0x2545F4914F6CDD1Dull + 7;
  double t = 0;
  for (int64_t i = 0; i < c.num_prompts; i++) {
    sh.start_at[i] = c.rate > 0 ? t : 0;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    double u = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
    if (c.rate > 0) t += -log(u) / c.rate;
  }
  char *m0 = tl_http_get(&c.u, "/metrics", c.api_key);
  pthread_mutex_init(&sh.mu, NULL);
  sh.t0 = cm_time_s();
  int nthreads = (int)(c.concurrency < c.num_prompts ? c.concurrency : c.num_prompts);
  for (int i = 0; i < nthreads; i++)
    pthread_create(&th[i], NULL, client_thread, &sh);
  for (int i = 0; i < nthreads; i++)
    pthread_join(th[i], NULL);
  double dur = cm_time_s() - sh.t0;
  char *m1 = tl_http_get(&c.u, "/metrics", c.api_key);

  int ok = 0, failed = 0;
  long long in_tok = 0, out_tok = 0;
  double *ttft = calloc((size_t)c.num_prompts, sizeof(double));
  double *tpot = calloc((size_t)c.num_prompts, sizeof(double));
  double *e2e = calloc((size_t)c.num_prompts, sizeof(double));
  size_t n_itl_all = 0;
  for (int64_t i = 0; i < c.num_prompts; i++)
    n_itl_all += (size_t)sh.res[i].n_itl;
  double *itl = calloc(n_itl_all + 1, sizeof(double));
  int n_tpot = 0, n_itl = 0;
  const char *first_err = NULL;
  for (int64_t i = 0; i < c.num_prompts; i++) {
    struct bs_result *r = &sh.res[i];
    if (!r->ok) {
      failed++;
      if (!first_err) first_err = r->err[0] ? r->err : "unknown";
      continue;
    }
    ttft[ok] = r->ttft;
    e2e[ok] = r->e2e;
    ok++;
    in_tok += r->prompt_tokens ? r->prompt_tokens : c.input_len;
    out_tok += r->out_tokens;
    if (r->out_tokens > 1) tpot[n_tpot++] = (r->e2e - r->ttft) / (r->out_tokens - 1);
    for (int k = 0; k < r->n_itl; k++)
      itl[n_itl++] = r->itl[k];
  }
  printf("============ Serving Benchmark Result ============\n");
  printf("%-40s %d\n", "Successful requests:", ok);
  printf("%-40s %d\n", "Failed requests:", failed);
  if (first_err) printf("%-40s %s\n", "First error:", first_err);
  printf("%-40s %lld\n", "Maximum request concurrency:", (long long)c.concurrency);
  print_engines(m1 ? m1 : m0);
  printf("%-40s %.2f\n", "Benchmark duration (s):", dur);
  printf("%-40s %lld\n", "Total input tokens:", in_tok);
  printf("%-40s %lld\n", "Total generated tokens:", out_tok);
  printf("%-40s %.2f\n", "Request throughput (req/s):", ok / dur);
  printf("%-40s %.2f\n", "Output token throughput (tok/s):", out_tok / dur);
  printf("%-40s %.2f\n", "Total token throughput (tok/s):", (in_tok + out_tok) / dur);
  stats_line("TTFT", ttft, ok, 1000, "ms");
  stats_line("TPOT (excl. 1st token)", tpot, n_tpot, 1000, "ms");
  stats_line("ITL", itl, n_itl, 1000, "ms");
  stats_line("E2E latency", e2e, ok, 1000, "ms");
  if (m0 && m1) {
    double q = tl_metric_sum(m1, "lmserve:prefix_cache_queries_total") -
               tl_metric_sum(m0, "lmserve:prefix_cache_queries_total");
    double h = tl_metric_sum(m1, "lmserve:prefix_cache_hits_total") -
               tl_metric_sum(m0, "lmserve:prefix_cache_hits_total");
    if (q > 0) printf("%-40s %.2f%%\n", "Prefix cache hit rate:", 100.0 * h / q);
    double d = tl_metric_sum(m1, "lmserve:spec_decode_num_drafts_total") -
               tl_metric_sum(m0, "lmserve:spec_decode_num_drafts_total");
    double a = tl_metric_sum(m1, "lmserve:spec_decode_num_accepted_tokens_total") -
               tl_metric_sum(m0, "lmserve:spec_decode_num_accepted_tokens_total");
    if (d > 0) {
      printf("%-40s %.2f\n", "Mean acceptance length:", 1.0 + a / d);
      /* vLLM's per-position view: of the drafts, the share whose i-th token was accepted */
      static const char *const pname = "lmserve:spec_decode_num_accepted_tokens_per_pos_total";
      printf("%-40s", "Acceptance rate by position:");
      for (int i = 0; i < 64; i++) {
        char label[32];
        snprintf(label, sizeof(label), "position=\"%d\"", i);
        double v1 = metric_labelled(m1, pname, label), v0 = metric_labelled(m0, pname, label);
        if (v1 < 0) break;
        printf(" %.3f", (v1 - (v0 < 0 ? 0 : v0)) / d);
      }
      printf("\n");
    }
  }
  printf("==================================================\n");
  for (int64_t i = 0; i < c.num_prompts; i++)
    free(sh.res[i].itl);
  free(sh.res);
  free(sh.start_at);
  free(th);
  free(ttft);
  free(tpot);
  free(e2e);
  free(itl);
  free(m0);
  free(m1);
  pthread_mutex_destroy(&sh.mu);
  json_decref(c.extra_body);
  return failed ? 1 : 0;
}
