/* test-api-concurrent.c — 32 greedy streams at once through `lmserve serve`
 * on a tiny Gemma 4, prompts and lengths all different: every stream
 * completes ([DONE], usage) with exactly the text the same request gets
 * when it runs alone (the CPU backend is batch invariant, DESIGN.md), and
 * the engine is idle afterwards. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define N_STREAMS 32

static struct as_server g_srv;

static struct as_server *server(void) {
  if (!g_srv.port) {
    th_proc_init(900);
    as_start(&g_srv, 0, NULL);
  }
  return &g_srv;
}

static const char *const g_words[] = {"river",  "stone", "lantern", "quiet",  "north",
                                      "copper", "maple", "signal",  "harbor", "ember"};

/* Request i: a prompt of 1 + 3*i words (chat every fourth), 6 + i % 7
 * tokens; streamed or not. */
static char *request(int i, int stream, const char **path) {
  char prompt[2048];
  size_t n = (size_t)snprintf(prompt, sizeof(prompt), "Story %d:", i);
  for (int w = 0; w < 3 * i; w++)
    n += (size_t)snprintf(prompt + n, sizeof(prompt) - n, " %s", g_words[(i + w * 7) % 10]);
  char *body = malloc(4096);
  TH_REQUIRE(body);
  const char *tail = stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "";
  if (i % 4 == 3) {
    *path = "/v1/chat/completions";
    snprintf(body, 4096,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,"
             "\"temperature\":0,\"ignore_eos\":true%s}",
             prompt, 6 + i % 7, tail);
  } else {
    *path = "/v1/completions";
    snprintf(body, 4096,
             "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true%s}",
             prompt, 6 + i % 7, tail);
  }
  return body;
}

/* The text of a non-streamed answer (malloc'd; NULL when there is none). */
static char *answer_text(const struct as_resp *r) {
  json_t *j = as_json(r);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  json_t *t = json_object_get(c, "text");
  if (!t) t = json_object_get(json_object_get(c, "message"), "content");
  char *s = json_is_string(t) ? strdup(json_string_value(t)) : NULL;
  json_decref(j);
  return s;
}

TH_TEST(api_concurrent_streams) {
  struct as_server *s = server();
  char *bodies[N_STREAMS];
  const char *paths[N_STREAMS];
  for (int i = 0; i < N_STREAMS; i++)
    bodies[i] = request(i, 1, &paths[i]);

  /* completions and chats, all sent before any answer is read */
  static struct as_resp got[N_STREAMS];
  TH_CHECK_EQ_INT(as_post_many(s, N_STREAMS, paths, (const char *const *)bodies, got), N_STREAMS);

  char texts[N_STREAMS][1024];
  for (int i = 0; i < N_STREAMS; i++) {
    TH_CHECK_EQ_INT(got[i].status, 200);
    json_t *usage = NULL;
    int ev = as_sse_text(got[i].body, 0, texts[i], sizeof(texts[i]), &usage);
    if (ev < 1) fprintf(stderr, "stream %d: %d events: %s\n", i, ev, got[i].body);
    TH_CHECK(ev >= 1);
    TH_CHECK_EQ_INT(json_integer_value(json_object_get(usage, "completion_tokens")), 6 + i % 7);
    TH_CHECK(texts[i][0] != 0);
    json_decref(usage);
    as_resp_free(&got[i]);
    free(bodies[i]);
  }

  /* one at a time, not streamed: the same text */
  for (int i = 0; i < N_STREAMS; i++) {
    const char *path;
    char *body = request(i, 0, &path);
    struct as_resp r;
    TH_CHECK_EQ_INT(as_post(s, path, body, &r), 200);
    char *alone = answer_text(&r);
    if (!alone || strcmp(alone, texts[i]))
      th_fail(__FILE__, __LINE__, "request %d: alone \"%s\", among 32 streams \"%s\"", i,
              alone ? alone : "(none)", texts[i]);
    free(alone);
    as_resp_free(&r);
    free(body);
  }
  TH_CHECK_EQ_INT(as_metric_wait(s, "lmserve:num_requests_running", 0, 30000), 0);
  TH_CHECK_EQ_INT(as_metric_wait(s, "lmserve:kv_cache_usage_perc", 0, 30000), 0);
  as_stop(s);
}
