/* api-serve.h — what the OpenAI-API integration tests share: a tiny Gemma 4
 * checkpoint in a temporary folder, `lmserve serve` started on it (and
 * always killed: th-proc), a blocking HTTP/1.1 client that also runs many
 * requests at once, SSE and /metrics parsing, and the check of OpenAI's
 * error envelope.
 *
 *   struct as_server s;
 *   as_start(&s, 0, (char *[]){"--max-model-len", "256", NULL});
 *   struct as_resp r;
 *   as_post(&s, "/v1/completions", "{\"prompt\":\"hi\"}", &r);
 *   json_t *j = as_json(&r);  ...  json_decref(j); as_resp_free(&r);
 *   as_stop(&s);
 *
 * Every request opens its own connection with `Connection: close`, so an
 * answer ends when the server closes. */
#ifndef LMSERVE_API_SERVE_H
#define LMSERVE_API_SERVE_H
#include <jansson.h>
#include <stddef.h>

#include "tests/harness/th-proc.h"

/* a running `lmserve serve` on its own tiny model */
struct as_server {
  struct th_proc p;
  int port;
  const char *api_key; /* sent with every request when set; NULL: none */
  int vision;          /* set before as_start: a tiny Gemma 3 with a vision tower
                          (make-tiny-model --arch gemma3 --vision), not a Gemma 4 */
  int vision_g4;       /* set before as_start: the tiny Gemma 4 with a vision tower, an
                          image mask (--bidir-vision) and Gemma 4's chat format */
  int gemma4_chat;     /* set before as_start: the tiny Gemma 4 with Gemma 4's tokenizer
                          and chat format (--chat-format gemma4) */
  int audio;           /* set before as_start: the tiny Gemma 4 with an audio and a vision
                          tower and Gemma 4's chat format (--audio --vision) */
  int audio_defaults;  /* set before as_start with audio: the audio tower's other settings
                          Gemma4AudioConfig's defaults (--audio-shape tiny-default), as an
                          mmproj file holds them */
  int gguf;            /* set before as_start (with vision or audio): the checkpoint as
                          export-gguf writes it, served as --model dir/g/model.gguf --mmproj
                          dir/mmproj-model-f16.gguf (llama.cpp's mmproj file); the
                          checkpoint stays in dir/m; a Gemma 4 one has the tiny-e text
                          stack, whose KV-shared layers llama.cpp's layout can hold) */
  char dir[256];       /* the temporary folder (removed at exit) */
  char model[300];     /* dir/m: the checkpoint */
  char log[300];       /* dir/serve.log: serve's stderr */
  char mmproj[300];    /* gguf: the vision file */
  void (*prepare)(struct as_server *s); /* set before as_start: called on the model made,
                                           before serve starts (NULL: none) */
};

/* one answer */
struct as_resp {
  int status;      /* -1: no answer */
  char *head;      /* status line and headers (malloc'd) */
  char *body;      /* de-chunked body, NUL-terminated (malloc'd) */
  size_t body_len; /* bytes */
};

/* Makes the tiny model (seed 1) in a new temporary folder; with
 * max_pos > 0 its config.json says max_position_embeddings = max_pos.
 * Skips the test when the model has no Gemma tokenizer. Then starts
 * `lmserve serve --model DIR --port P` with the `extra` flags (NULL or
 * NULL-terminated) and waits for "lmserve: serving". */
void as_start(struct as_server *s, int max_pos, char *const extra[]);
/* SIGTERM; serve must exit 0. Copies the end of serve's log to stderr. */
void as_stop(struct as_server *s);

/* One request on a fresh connection. `headers` (NULL or "Name: v\r\n"...)
 * are added; without them the server's API key goes as a Bearer token.
 * Returns r->status. */
int as_request(const struct as_server *s, const char *method, const char *path, const char *headers,
               const char *body, struct as_resp *r);
int as_get(const struct as_server *s, const char *path, struct as_resp *r);
int as_post(const struct as_server *s, const char *path, const char *body, struct as_resp *r);
/* A POST of len bytes (binary allowed) with the Content-Type ctype. */
int as_post_bytes(const struct as_server *s, const char *path, const char *ctype, const char *body,
                  size_t len, struct as_resp *r);
void as_resp_free(struct as_resp *r);
/* The body as JSON (NULL when it is not). */
json_t *as_json(const struct as_resp *r);
/* The value of a header of the answer, copied into out (0 when absent). */
int as_header(const struct as_resp *r, const char *name, char *out, size_t size);

/* A connection to the server (-1 on failure), for requests written by
 * hand; as_read_answer reads its answer until the server closes, then
 * closes it too. */
int as_connect(const struct as_server *s);
int as_read_answer(int fd, struct as_resp *r);

/* n POSTs of bodies[i] to paths[i], all sent before any answer is read,
 * answered concurrently. Returns how many got an answer. */
int as_post_many(const struct as_server *s, int n, const char *const paths[],
                 const char *const bodies[], struct as_resp out[]);

/* Opens a POST whose answer streams and reads until the first SSE event
 * arrived; returns the socket (the test closes it) or -1. */
int as_stream_open(const struct as_server *s, const char *path, const char *body);

/* An SSE body: the text of choice `index` (completions "text", chat
 * "delta.content") concatenated over the events into out. Returns the
 * number of data events with a JSON object, or -1 when an event is not
 * JSON or [DONE] is missing or not last. *usage (when not NULL) gets the
 * last "usage" object (a new reference, or NULL). */
int as_sse_text(const char *body, int index, char *out, size_t size, json_t **usage);

/* The value of a /metrics sample `name{...}` (NaN when absent). */
double as_metric(const struct as_server *s, const char *name);

/* Polls that sample until it equals `want` or timeout_ms passed (the
 * engine's gauges reach the frontend with its PINGs); returns the last. */
double as_metric_wait(const struct as_server *s, const char *name, double want, int timeout_ms);
/* The same until the sample is at least `min` (counters). */
double as_metric_wait_min(const struct as_server *s, const char *name, double min, int timeout_ms);

/* Checks OpenAI's error envelope: status, and {"error":{"message":non-empty
 * string,"type":string,"param":(param or null),"code":status}}. Logs the body
 * and fails the test (at the caller's line) when it is not so. */
#define as_check_error(r, status, param)                                                           \
  as_check_error_at(__FILE__, __LINE__, (r), (status), (param))
void as_check_error_at(const char *file, int line, const struct as_resp *r, int status,
                       const char *param);

/* A string member of member `k1`[i] of `o` (NULL when absent). */
const char *as_jstr(json_t *o, const char *k1, size_t i, const char *k2);
/* An integer member of object member `k1` of `o` (-1 when absent). */
long long as_jint(json_t *o, const char *k1, const char *k2);

#endif
