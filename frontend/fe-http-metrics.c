/* fe-http-metrics.c — the Prometheus registry (see fe-http-metrics.h). */
#include "frontend/fe-http-metrics.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"

struct fe_metric {
  enum fe_metric_kind kind;
  char name[96];
  char help[160];
  double value; /* counter/gauge value; histogram sum */
  double early; /* counters: the sum fe_metrics_inc_early adds to */
  size_t n_bounds;
  double bounds[FE_METRIC_MAX_BUCKETS];     /* finite upper bounds, increasing */
  double counts[FE_METRIC_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last is +Inf */
  double count;                             /* histogram observations */
  char label[32];                           /* indexed counter: its label; else "" */
  char fixed[FE_METRIC_LABELS_LEN];         /* the series' own labels: ",k=\"v\"..." or "" */
  size_t n_index;                           /* indexed counter: series rendered */
  char (*info)[FE_METRIC_INFO_LEN];         /* info family: per index, its other labels as text */
};

struct fe_metrics {
  char label[192]; /* model_name="..." (escaped) */
  size_t n, cap;
  struct fe_metric *m; /* (cap) registered: [0, n) */
};

/* Appends sep key="value" to dst (of size cap, holding o bytes) with the
 * value escaped as the text format wants (\\, \", \n) and cut short rather
 * than overrun (nothing when not even the key fits); the new length. */
static size_t put_label(char *dst, size_t cap, size_t o, const char *sep, const char *key,
                        const char *value) {
  int k = snprintf(dst + o, cap - o, "%s%s=\"", sep, key);
  if (k < 0 || (size_t)k + 2 > cap - o) {
    dst[o] = 0;
    return o;
  }
  o += (size_t)k;
  for (const char *p = value; *p && o + 4 < cap; p++) {
    if (*p == '"' || *p == '\\') dst[o++] = '\\';
    if (*p == '\n') {
      dst[o++] = '\\';
      dst[o++] = 'n';
      continue;
    }
    dst[o++] = *p;
  }
  dst[o++] = '"';
  dst[o] = 0;
  return o;
}

int fe_metrics_create(const char *model_name, struct fe_metrics **out) {
  struct fe_metrics *m = calloc(1, sizeof(*m));
  if (!m) return CM_ERR_NOMEM;
  put_label(m->label, sizeof(m->label), 0, "", "model_name", model_name);
  *out = m;
  return 0;
}

void fe_metrics_destroy(struct fe_metrics *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n; i++)
    free(m->m[i].info);
  free(m->m);
  free(m);
}

static int valid_name(const char *s) {
  if (!*s || (*s >= '0' && *s <= '9')) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == ':'))
      return 0;
  return 1;
}

int fe_metrics_add(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                   const char *help, const double *bounds, size_t n_bounds) {
  return fe_metrics_add_labelled(m, kind, name, help, bounds, n_bounds, "");
}

/* 1 when the series' labels read `,k="v"` pairs with valid keys. */
static int valid_labels(const char *s) {
  while (*s) {
    if (*s++ != ',') return 0;
    const char *k = s;
    while (*s && *s != '=')
      s++;
    if (s == k || s[0] != '=' || s[1] != '"') return 0;
    s += 2;
    while (*s && *s != '"')
      s += *s == '\\' && s[1] ? 2 : 1;
    if (*s++ != '"') return 0;
  }
  return 1;
}

int fe_metrics_add_labelled(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                            const char *help, const double *bounds, size_t n_bounds,
                            const char *labels) {
  if (!valid_name(name) || strlen(name) >= sizeof(m->m[0].name) ||
      strlen(help) >= sizeof(m->m[0].help) || strlen(labels) >= FE_METRIC_LABELS_LEN ||
      !valid_labels(labels))
    return CM_ERR_INVAL;
  size_t nl = strlen(name);
  if (kind == FE_METRIC_COUNTER && (nl < 6 || strcmp(name + nl - 6, "_total") != 0))
    return CM_ERR_INVAL;
  if (kind == FE_METRIC_HISTOGRAM) {
    if (n_bounds == 0 || n_bounds > FE_METRIC_MAX_BUCKETS) return CM_ERR_INVAL;
    for (size_t i = 0; i < n_bounds; i++)
      if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1])) return CM_ERR_INVAL;
  }
  for (size_t i = 0; i < m->n; i++) /* a family's series share kind and buckets */
    if (!strcmp(m->m[i].name, name) &&
        (m->m[i].kind != kind || !strcmp(m->m[i].fixed, labels) ||
         m->m[i].n_bounds != (kind == FE_METRIC_HISTOGRAM ? n_bounds : 0)))
      return CM_ERR_INVAL;
  if (m->n == FE_METRICS_MAX) return CM_ERR_FULL;
  if (m->n == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    struct fe_metric *nm = realloc(m->m, cap * sizeof(*nm));
    if (!nm) return CM_ERR_NOMEM;
    m->m = nm;
    m->cap = cap;
  }
  struct fe_metric *x = &m->m[m->n];
  memset(x, 0, sizeof(*x));
  x->kind = kind;
  strcpy(x->name, name);
  strcpy(x->help, help);
  strcpy(x->fixed, labels);
  if (kind == FE_METRIC_HISTOGRAM) {
    memcpy(x->bounds, bounds, n_bounds * sizeof(double));
    x->n_bounds = n_bounds;
  }
  return (int)m->n++;
}

int fe_metrics_find(const struct fe_metrics *m, const char *name) {
  for (size_t i = 0; i < m->n; i++)
    if (!strcmp(m->m[i].name, name)) return (int)i;
  return CM_ERR_NOENT;
}

int fe_metrics_add_indexed(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                           const char *help, const char *label) {
  return fe_metrics_add_indexed_labelled(m, kind, name, help, label, "");
}

int fe_metrics_add_indexed_labelled(struct fe_metrics *m, enum fe_metric_kind kind,
                                    const char *name, const char *help, const char *label,
                                    const char *labels) {
  if (!valid_name(label) || strchr(label, ':') || strlen(label) >= sizeof(m->m[0].label) ||
      kind == FE_METRIC_HISTOGRAM)
    return CM_ERR_INVAL;
  int id = fe_metrics_add_labelled(m, kind, name, help, NULL, 0, labels);
  if (id >= 0) strcpy(m->m[id].label, label);
  return id;
}

int fe_metrics_add_info(struct fe_metrics *m, const char *name, const char *help,
                        const char *label) {
  void *info = calloc(FE_METRIC_MAX_BUCKETS + 1, FE_METRIC_INFO_LEN);
  if (!info) return CM_ERR_NOMEM;
  int id = fe_metrics_add_indexed(m, FE_METRIC_GAUGE, name, help, label);
  if (id < 0) {
    free(info);
    return id;
  }
  m->m[id].info = info;
  return id;
}

static struct fe_metric *get(struct fe_metrics *m, int id, enum fe_metric_kind kind) {
  CM_ASSERT(id >= 0 && (size_t)id < m->n && m->m[id].kind == kind);
  return &m->m[id];
}

void fe_metrics_inc(struct fe_metrics *m, int id, double v) {
  if (v > 0) get(m, id, FE_METRIC_COUNTER)->value += v;
}

void fe_metrics_inc_early(struct fe_metrics *m, int id, double v) {
  struct fe_metric *x = get(m, id, FE_METRIC_COUNTER);
  CM_ASSERT(!x->label[0]);
  if (v > 0) x->early += v;
}

/* What a counter shows: the larger of its two sums (see fe-http-metrics.h). */
static double shown(const struct fe_metric *x) {
  return x->kind == FE_METRIC_COUNTER && x->early > x->value ? x->early : x->value;
}

void fe_metrics_inc_at(struct fe_metrics *m, int id, size_t index, double v) {
  struct fe_metric *x = get(m, id, FE_METRIC_COUNTER);
  CM_ASSERT(x->label[0]);
  if (!(v > 0) || index > FE_METRIC_MAX_BUCKETS) return;
  x->counts[index] += v;
  x->value += v;
  if (index + 1 > x->n_index) x->n_index = index + 1;
}

double fe_metrics_value_at(const struct fe_metrics *m, int id, size_t index) {
  CM_ASSERT(id >= 0 && (size_t)id < m->n);
  return index <= FE_METRIC_MAX_BUCKETS ? m->m[id].counts[index] : 0;
}

void fe_metrics_set_at(struct fe_metrics *m, int id, size_t index, double v) {
  struct fe_metric *x = get(m, id, FE_METRIC_GAUGE);
  CM_ASSERT(x->label[0]);
  if (index > FE_METRIC_MAX_BUCKETS) return;
  x->value += v - x->counts[index];
  x->counts[index] = v;
  if (index + 1 > x->n_index) x->n_index = index + 1;
}

void fe_metrics_set_info_at(struct fe_metrics *m, int id, size_t index, const char *const *keys,
                            const char *const *values, size_t n) {
  struct fe_metric *x = get(m, id, FE_METRIC_GAUGE);
  CM_ASSERT(x->info);
  if (index > FE_METRIC_MAX_BUCKETS) return;
  char *t = x->info[index];
  size_t o = 0;
  t[0] = 0;
  for (size_t i = 0; i < n; i++)
    o = put_label(t, FE_METRIC_INFO_LEN, o, ",", keys[i], values[i] ? values[i] : "");
  fe_metrics_set_at(m, id, index, 1);
}

void fe_metrics_set(struct fe_metrics *m, int id, double v) {
  get(m, id, FE_METRIC_GAUGE)->value = v;
}

void fe_metrics_observe(struct fe_metrics *m, int id, double v) {
  struct fe_metric *x = get(m, id, FE_METRIC_HISTOGRAM);
  if (isnan(v)) return;
  size_t b = 0;
  while (b < x->n_bounds && v > x->bounds[b])
    b++;
  x->counts[b] += 1;
  x->count += 1;
  x->value += v;
}

double fe_metrics_value(const struct fe_metrics *m, int id) {
  CM_ASSERT(id >= 0 && (size_t)id < m->n);
  return shown(&m->m[id]);
}

double fe_metrics_count(const struct fe_metrics *m, int id) {
  CM_ASSERT(id >= 0 && (size_t)id < m->n);
  return m->m[id].count;
}

/* A sample value as Prometheus text: +Inf, -Inf, NaN, "3.0" for whole
 * numbers, else the shortest form that reads back exactly ("0.005", not
 * 0.005000000000000001). */
static const char *fmt_num(char tmp[40], double v) {
  if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (isnan(v)) return "NaN";
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(tmp, 40, "%.1f", v);
    return tmp;
  }
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(tmp, 40, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  return tmp;
}

/* One sample line: name+suffix{labels} value, where labels is the model's
 * label and then extra (",le=\"0.5\"", or ""). */
static void put_sample(struct fe_buf *b, const char *name, const char *suffix, const char *labels,
                       const char *extra, double v) {
  char num[40];
  fe_buf_printf(b, "%s%s{%s%s} %s\n", name, suffix, labels, extra, fmt_num(num, v));
}

/* The samples of one series: its labels are the model's, the series' own,
 * then the index or bucket label. */
static void render_series(const struct fe_metrics *m, const struct fe_metric *x, struct fe_buf *b) {
  char labels[sizeof(m->label) + FE_METRIC_LABELS_LEN];
  snprintf(labels, sizeof(labels), "%s%s", m->label, x->fixed);
  char extra[80], num[40];
  if (x->label[0]) {
    for (size_t k = 0; k < x->n_index; k++) {
      if (x->info && !x->info[k][0]) continue; /* not said yet */
      snprintf(extra, sizeof extra, ",%s=\"%zu\"", x->label, k);
      if (x->info)
        fe_buf_printf(b, "%s{%s%s%s} 1\n", x->name, labels, extra, x->info[k]);
      else
        put_sample(b, x->name, "", labels, extra, x->counts[k]);
    }
    return;
  }
  if (x->kind != FE_METRIC_HISTOGRAM) {
    put_sample(b, x->name, "", labels, "", shown(x));
    return;
  }
  double cum = 0;
  for (size_t k = 0; k <= x->n_bounds; k++) {
    cum += x->counts[k];
    snprintf(extra, sizeof extra, ",le=\"%s\"",
             fmt_num(num, k < x->n_bounds ? x->bounds[k] : INFINITY));
    put_sample(b, x->name, "_bucket", labels, extra, cum);
  }
  put_sample(b, x->name, "_sum", labels, "", x->value);
  put_sample(b, x->name, "_count", labels, "", x->count);
}

int fe_metrics_render(const struct fe_metrics *m, struct fe_buf *b) {
  static const char *const kinds[] = {"counter", "gauge", "histogram"};
  for (size_t i = 0; i < m->n; i++) {
    const struct fe_metric *x = &m->m[i];
    if ((int)i != fe_metrics_find(m, x->name)) continue; /* shown with its family's first */
    fe_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name, kinds[x->kind]);
    for (size_t j = i; j < m->n; j++)
      if (!strcmp(m->m[j].name, x->name)) render_series(m, &m->m[j], b);
  }
  return b->err;
}

/* Buckets as vLLM uses them for the same metrics (seconds). */
static const double ttft_buckets[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_buckets[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                     5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

/* Token-count buckets as vLLM builds them (1, 2, 5, 10, 20, 50, ...), here up
 * to a million tokens: the ones past max_model_len stay empty. */
static const double token_buckets[] = {1,    2,    5,     10,    20,    50,  100, 200, 500, 1000,
                                       2000, 5000, 10000, 20000, 50000, 1e5, 2e5, 5e5, 1e6};

/* The n parameter's buckets, vLLM's. */
static const double n_buckets[] = {1, 2, 5, 10, 20};

/* Rows of the tables below: a metric's name is its field's, a counter's
 * with _total. */
#define COUNTER(f, help)                                                                           \
  {                                                                                                \
    offsetof(struct fe_replica_metric_ids, f), FE_METRIC_COUNTER, "lmserve:" #f "_total", help,    \
        NULL, 0                                                                                    \
  }
#define HISTOGRAM(f, help, bk)                                                                     \
  {                                                                                                \
    offsetof(struct fe_replica_metric_ids, f), FE_METRIC_HISTOGRAM, "lmserve:" #f, help, bk,       \
        CM_ARRAY_LEN(bk)                                                                           \
  }

/* The id of the series `name` with the series' own labels `labels`, made
 * now unless an earlier registration made it (the registry outlives an
 * engine, which registers its replicas' series when it starts). */
static int add_or_find(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                       const char *help, const double *b, size_t nb, const char *labels,
                       const char *index_label) {
  for (size_t i = 0; i < m->n; i++)
    if (!strcmp(m->m[i].name, name) && !strcmp(m->m[i].fixed, labels)) return (int)i;
  return index_label ? fe_metrics_add_indexed_labelled(m, kind, name, help, index_label, labels)
                     : fe_metrics_add_labelled(m, kind, name, help, b, nb, labels);
}

/* Replica i's engine-side series. */
static int register_replica(struct fe_metrics *m, struct fe_replica_metric_ids *r, int i) {
  static const struct {
    size_t off;
    enum fe_metric_kind kind;
    const char *name, *help;
    const double *b;
    size_t nb;
  } t[] = {
      COUNTER(prompt_tokens, "Prefill tokens processed."),
      COUNTER(generation_tokens, "Generation tokens produced."),
      HISTOGRAM(time_to_first_token_seconds, "Time to first token in seconds.", ttft_buckets),
      HISTOGRAM(inter_token_latency_seconds, "Inter-token latency in seconds.", itl_buckets),
      HISTOGRAM(e2e_request_latency_seconds, "End-to-end request latency in seconds.", e2e_buckets),
      HISTOGRAM(request_queue_time_seconds, "Time a request waited to be scheduled, in seconds.",
                e2e_buckets),
      HISTOGRAM(request_prefill_time_seconds,
                "Time from a request's first schedule to its first token, in seconds.",
                e2e_buckets),
      HISTOGRAM(request_decode_time_seconds,
                "Time from a request's first token to its last, in seconds.", e2e_buckets),
      HISTOGRAM(request_inference_time_seconds,
                "Time from a request's first schedule to its last token, in seconds.", e2e_buckets),
      HISTOGRAM(request_prompt_tokens, "Prompt tokens of each finished request.", token_buckets),
      HISTOGRAM(request_generation_tokens, "Generated tokens of each finished request.",
                token_buckets),
      HISTOGRAM(request_params_max_tokens, "The max_tokens of each finished request.",
                token_buckets),
      HISTOGRAM(request_params_n, "The n of each finished request.", n_buckets),
      COUNTER(prefix_cache_queries, "Prefix-cache queries, in tokens."),
      COUNTER(prefix_cache_hits, "Prefix-cache hits, in tokens."),
      COUNTER(num_preemptions, "Requests preempted (their KV blocks taken back)."),
      COUNTER(spec_decode_num_drafts, "Speculative-decoding drafts."),
      COUNTER(spec_decode_num_draft_tokens, "Draft tokens proposed."),
      COUNTER(spec_decode_num_accepted_tokens, "Draft tokens accepted."),
  };
  char lab[24]; /* ,replica="N" */
  snprintf(lab, sizeof(lab), ",replica=\"%d\"", i % 1000);
  for (size_t k = 0; k < CM_ARRAY_LEN(t); k++) {
    int id = add_or_find(m, t[k].kind, t[k].name, t[k].help, t[k].b, t[k].nb, lab, NULL);
    if (id < 0) return id;
    *(int *)((char *)r + t[k].off) = id;
  }
  static const char *const reasons[FE_FINISH_N] = {"stop", "length", "abort"};
  for (int f = 0; f < FE_FINISH_N; f++) {
    char fl[FE_METRIC_LABELS_LEN];
    snprintf(fl, sizeof(fl), "%s,finished_reason=\"%s\"", lab, reasons[f]);
    int id = add_or_find(m, FE_METRIC_COUNTER, "lmserve:request_success_total",
                         "Generation requests finished, by finish reason.", NULL, 0, fl, NULL);
    if (id < 0) return id;
    r->request_success[f] = id;
  }
  int id =
      add_or_find(m, FE_METRIC_COUNTER, "lmserve:spec_decode_num_accepted_tokens_per_pos_total",
                  "Draft tokens accepted, by position in the draft.", NULL, 0, lab, "position");
  if (id < 0) return id;
  r->spec_decode_num_accepted_tokens_per_pos = id;
  return 0;
}

int fe_metrics_register_replicas(struct fe_metrics *m, struct fe_metric_ids *ids, int n) {
  if (n > FE_METRICS_MAX_REPLICAS) return CM_ERR_INVAL;
  for (; ids->n_rep < n; ids->n_rep++) {
    int rc = register_replica(m, &ids->rep[ids->n_rep], ids->n_rep);
    if (rc) return rc;
  }
  return 0;
}

int fe_metrics_register_standard(struct fe_metrics *m, struct fe_metric_ids *ids) {
  /* the HTTP counters, then the engine's gauges: one series per model replica
   * (vLLM's `engine` label) */
  static const struct {
    size_t off;
    enum fe_metric_kind kind;
    const char *name, *help;
  } s[] = {
      {offsetof(struct fe_metric_ids, http_requests), FE_METRIC_COUNTER,
       "lmserve:http_requests_total", "HTTP requests answered."},
      {offsetof(struct fe_metric_ids, http_client_errors), FE_METRIC_COUNTER,
       "lmserve:http_client_errors_total", "HTTP requests answered with a 4xx status."},
      {offsetof(struct fe_metric_ids, http_server_errors), FE_METRIC_COUNTER,
       "lmserve:http_server_errors_total", "HTTP requests answered with a 5xx status."},
      {offsetof(struct fe_metric_ids, num_requests_running), FE_METRIC_GAUGE,
       "lmserve:num_requests_running", "Requests running on the engine."},
      {offsetof(struct fe_metric_ids, num_requests_waiting), FE_METRIC_GAUGE,
       "lmserve:num_requests_waiting", "Requests waiting to be scheduled."},
      {offsetof(struct fe_metric_ids, kv_cache_usage_perc), FE_METRIC_GAUGE,
       "lmserve:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent."},
  };
  memset(ids, 0, sizeof(*ids));
  for (size_t i = 0; i < CM_ARRAY_LEN(s); i++) {
    int gauge = s[i].kind == FE_METRIC_GAUGE;
    int id = gauge ? fe_metrics_add_indexed(m, s[i].kind, s[i].name, s[i].help, "replica")
                   : fe_metrics_add(m, s[i].kind, s[i].name, s[i].help, NULL, 0);
    if (id < 0) return id;
    if (gauge) fe_metrics_set_at(m, id, 0, 0); /* replica 0 shows from the start */
    *(int *)((char *)ids + s[i].off) = id;
  }
  ids->engine_info =
      fe_metrics_add_info(m, "lmserve:engine_info",
                          "What runs each replica's model: its rank 0's kernel set and the "
                          "precision its matmuls take their inputs in.",
                          "replica");
  if (ids->engine_info < 0) return ids->engine_info;
  return fe_metrics_register_replicas(m, ids, 1); /* replica 0 shows from the start */
}

#undef COUNTER
#undef HISTOGRAM
