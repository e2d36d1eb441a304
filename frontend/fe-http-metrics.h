/* fe-http-metrics.h — a small Prometheus metrics registry: counters,
 * gauges and histograms with fixed buckets, rendered in the Prometheus text
 * format (0.0.4) for GET /metrics. Every series carries the registry's
 * model_name label, as vLLM's do.
 *
 * Metrics are registered once at start-up and then updated by id with no
 * allocation. The registry is not thread-safe: update it from the loop
 * thread. */
#ifndef LMSERVE_FE_HTTP_METRICS_H
#define LMSERVE_FE_HTTP_METRICS_H
#include <stddef.h>

#include "frontend/fe-http-buf.h"

struct fe_metrics;

enum fe_metric_kind { FE_METRIC_COUNTER, FE_METRIC_GAUGE, FE_METRIC_HISTOGRAM };

#define FE_METRICS_MAX          1024 /* series (of plain, indexed or info metrics) per registry */
#define FE_METRIC_LABELS_LEN    64   /* a series' own labels, as text */
#define FE_METRICS_MAX_REPLICAS 16   /* replicas with their own engine-side series */
#define FE_METRIC_MAX_BUCKETS 32 /* finite bucket bounds per histogram */
#define FE_METRIC_INFO_LEN    160 /* an info series' own labels, as text */

/* Creates an empty registry whose series are labelled model_name="...". */
int fe_metrics_create(const char *model_name, struct fe_metrics **out);
void fe_metrics_destroy(struct fe_metrics *m);

/* Registers a metric. `name` is the full exposed name ("lmserve:prompt_tokens_total"
 * for a counter: counters must end in _total). Histogram bounds must be
 * strictly increasing; +Inf is implicit. Returns the id (>= 0) or a
 * negative cm_err (CM_ERR_INVAL for a bad name or bounds, CM_ERR_FULL). */
int fe_metrics_add(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                   const char *help, const double *bounds, size_t n_bounds);
/* One series of a family: registers `name` with the series' own labels
 * `labels` (",replica=\"1\"", several pairs each after a comma; "" for none),
 * shown after model_name. The first call makes the family; later ones add
 * series, which must have the same kind (and buckets) and other labels. Id
 * or a negative cm_err. */
int fe_metrics_add_labelled(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                            const char *help, const double *bounds, size_t n_bounds,
                            const char *labels);
int fe_metrics_find(const struct fe_metrics *m,
                    const char *name); /* first series' id or CM_ERR_NOENT */
/* Registers a counter or gauge family with one extra label taking the values
 * 0, 1, .. FE_METRIC_MAX_BUCKETS (vLLM's spec_decode_num_accepted_tokens_per_pos
 * and its `position`; the engine gauges and their `replica`). A series is
 * rendered once its index has been counted or set (up to the largest index so
 * far). Id or a negative cm_err. */
int fe_metrics_add_indexed(struct fe_metrics *m, enum fe_metric_kind kind, const char *name,
                           const char *help, const char *label);
/* The same with the series' own labels besides (see fe_metrics_add_labelled). */
int fe_metrics_add_indexed_labelled(struct fe_metrics *m, enum fe_metric_kind kind,
                                    const char *name, const char *help, const char *label,
                                    const char *labels);
/* Registers an info gauge family, indexed by `label` as above: each series is
 * 1 and carries its own labels besides (vLLM's cache_config_info); it shows
 * once fe_metrics_set_info_at has set them. Id or a negative cm_err. */
int fe_metrics_add_info(struct fe_metrics *m, const char *name, const char *help,
                        const char *label);
/* Sets the labels of series `index` of an info family: keys[i]="values[i]"
 * for i < n (escaped here; NULL is ""; cut short past FE_METRIC_INFO_LEN). */
void fe_metrics_set_info_at(struct fe_metrics *m, int id, size_t index, const char *const *keys,
                            const char *const *values, size_t n);
/* Sets series `index` of an indexed gauge (fe_metrics_value: their sum). */
void fe_metrics_set_at(struct fe_metrics *m, int id, size_t index, double v);
void fe_metrics_inc_at(struct fe_metrics *m, int id, size_t index, double v); /* v >= 0 */
double fe_metrics_value_at(const struct fe_metrics *m, int id, size_t index);

void fe_metrics_inc(struct fe_metrics *m, int id, double v); /* counter, v >= 0 */
/* A counter that two sources feed with the same events at different
 * times: the engine's cumulative totals (complete, but they arrive with
 * the next PING's answer) through fe_metrics_inc, and per-request reports
 * (at once, as each request's output arrives, but they miss a request that
 * never produced any) through fe_metrics_inc_early. Each source keeps its
 * own sum and the counter shows the larger, so a finished request shows by
 * the time its answer is sent and nothing is counted twice. */
void fe_metrics_inc_early(struct fe_metrics *m, int id, double v); /* counter, v >= 0 */
void fe_metrics_set(struct fe_metrics *m, int id, double v);       /* gauge */
void fe_metrics_observe(struct fe_metrics *m, int id, double v);   /* histogram */
double fe_metrics_value(const struct fe_metrics *m,
                        int id); /* counter/gauge value, histogram sum */
double fe_metrics_count(const struct fe_metrics *m, int id); /* histogram observations */

/* Appends the whole registry in Prometheus text format. */
int fe_metrics_render(const struct fe_metrics *m, struct fe_buf *out);

/* request_success_total's finished_reason values, as vLLM names them */
enum fe_finish { FE_FINISH_STOP, FE_FINISH_LENGTH, FE_FINISH_ABORT, FE_FINISH_N };

/* The ids of one replica's engine-side series: each carries replica="i", as
 * vLLM labels them by `engine`. Histograms' counts are requests. */
struct fe_replica_metric_ids {
  int prompt_tokens;                           /* counter, tokens */
  int generation_tokens;                       /* counter, tokens */
  int time_to_first_token_seconds;             /* histogram, s */
  int inter_token_latency_seconds;             /* histogram, s */
  int e2e_request_latency_seconds;             /* histogram, s */
  int request_queue_time_seconds;              /* histogram, s: waiting to be scheduled */
  int request_prefill_time_seconds;            /* histogram, s: scheduled to first token */
  int request_decode_time_seconds;             /* histogram, s: first to last token */
  int request_inference_time_seconds;          /* histogram, s: scheduled to last token */
  int request_prompt_tokens;                   /* histogram, tokens */
  int request_generation_tokens;               /* histogram, tokens */
  int request_params_max_tokens;               /* histogram, tokens */
  int request_params_n;                        /* histogram: the choices asked (n) */
  int prefix_cache_queries;                    /* counter, tokens */
  int prefix_cache_hits;                       /* counter, tokens */
  int num_preemptions;                         /* counter */
  int spec_decode_num_drafts;                  /* counter */
  int spec_decode_num_draft_tokens;            /* counter, tokens */
  int spec_decode_num_accepted_tokens;         /* counter, tokens */
  int spec_decode_num_accepted_tokens_per_pos; /* indexed counter (position), tokens */
  int request_success[FE_FINISH_N];            /* counters by finished_reason: requests */
};

/* The ids of the standard lmserve metrics (DESIGN.md, "HTTP API"). */
struct fe_metric_ids {
  int num_requests_running; /* gauge (replica) */
  int num_requests_waiting; /* gauge (replica) */
  int kv_cache_usage_perc;  /* gauge (replica), 0..1 */
  int engine_info;          /* info gauge (replica): kernels, matmul_inputs */
  struct fe_replica_metric_ids rep[FE_METRICS_MAX_REPLICAS]; /* (n_rep) */
  int n_rep;
  int http_requests;      /* counter: HTTP requests answered */
  int http_client_errors; /* counter: 4xx answers */
  int http_server_errors; /* counter: 5xx answers */
};

/* Registers the standard metrics, with replica 0's engine-side series, and
 * fills `ids`. Returns 0 or a cm_err. */
int fe_metrics_register_standard(struct fe_metrics *m, struct fe_metric_ids *ids);
/* Registers the engine-side series of replicas up to n - 1 (those not yet
 * registered). Returns 0 or a cm_err. */
int fe_metrics_register_replicas(struct fe_metrics *m, struct fe_metric_ids *ids, int n);

#endif
