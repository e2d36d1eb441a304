/* test-api-openai.c — the official `openai` npm client against `lmserve
 * serve`: starts serve (with an API key and --max-model-len) on a tiny
 * Gemma 4, runs api-openai.mjs under node against it, and kills serve
 * whatever happens (th-proc: process groups, PR_SET_PDEATHSIG, the
 * watchdog); then api-structured.mjs, api-tools.mjs, api-gemma4.mjs,
 * api-responses.mjs and api-anthropic.mjs (the official @anthropic-ai/sdk
 * client) the same way. Skips, loudly, when node or node_modules/openai (or
 * the Anthropic client) is missing (tools/setup installs them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-serve.h"

#define KEY     "sdk-test-key"
#define NAME    "tiny"
#define MAX_LEN "256"

/* Runs tests/integration/api/SCRIPT under node against serve on the tiny Gemma 4
 * (API key KEY, --max-model-len MAX_LEN), skipping loudly without node or
 * node_modules/openai. */
static void run_script_on(const char *script_name, const char *max_len, int gemma4_chat) {
  th_proc_init(900);
  int major = th_node_major();
  if (!major) TH_SKIP("no `node` on PATH: the openai client conformance test did not run");
  if (major < 18) TH_SKIP("node older than 18: the openai client conformance test did not run");
  if (!th_npm_has("openai"))
    TH_SKIP("node_modules/openai is missing (run tools/setup): the openai client conformance "
            "test did not run");
  if (strstr(script_name, "anthropic") && !th_npm_has("@anthropic-ai/sdk"))
    TH_SKIP("node_modules/@anthropic-ai/sdk is missing (run tools/setup): the Anthropic client "
            "conformance test did not run");
  char script[1024];
  snprintf(script, sizeof(script), "%s/integration/api/%s", th_tests_dir(), script_name);
  TH_REQUIRE(access(script, R_OK) == 0);

  struct as_server s = {.api_key = KEY, .gemma4_chat = gemma4_chat};
  as_start(&s, 0,
           (char *[]){"--served-model-name", NAME, "--max-model-len", (char *)max_len, NULL});
  char url[96], key[64], model[64], len[64];
  snprintf(url, sizeof(url), "LMSERVE_URL=http://127.0.0.1:%d/v1", s.port);
  snprintf(key, sizeof(key), "LMSERVE_KEY=%s", KEY);
  snprintf(model, sizeof(model), "LMSERVE_MODEL=%s", NAME);
  snprintf(len, sizeof(len), "LMSERVE_MAX_LEN=%s", max_len);
  char *env[] = {url, key, model, len, "NO_COLOR=1", NULL};
  /* node's output goes straight into the test log */
  th_node_test(script, env, 600000);
  as_stop(&s);
}

static void run_script(const char *script_name, const char *max_len) {
  run_script_on(script_name, max_len, 0);
}

TH_TEST(api_openai_client) {
  run_script("api-openai.mjs", MAX_LEN);
}

/* Structured outputs (response_format, structured_outputs, guided_*) through the
 * client: every finished output checked by JavaScript itself (RegExp, JSON.parse). */
TH_TEST(api_structured_outputs) {
  run_script("api-structured.mjs", MAX_LEN);
}

/* Tool calls (the JSON protocol any chat template carries) through the client:
 * forced, named and auto choices, parallel calls, streaming, the history round
 * trip; the arguments checked against the tools' schemas by hand. */
TH_TEST(api_tool_calls) {
  run_script("api-tools.mjs", "2048");
}

/* Gemma 4's notation on the tiny Gemma 4 with Gemma 4's tokenizer and chat format:
 * reasoning apart (stream and not), chat_template_kwargs, native tool calls forced
 * and auto, parallel, streamed, the history round trip, and the 400s. */
TH_TEST(api_gemma4_reasoning_and_tools) {
  run_script_on("api-gemma4.mjs", "2048", 1);
}

/* POST /v1/responses (OpenAI's Responses API) on the same Gemma 4: the client's
 * create and stream helpers, each answer held to the chat completion of the same
 * conversation and seed (text, thoughts, calls, logprobs, structured text), and
 * the 400s naming the Responses fields. */
TH_TEST(api_responses) {
  run_script_on("api-responses.mjs", "2048", 1);
}

/* POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) on the
 * same Gemma 4, through the official @anthropic-ai/sdk client: create, stream and
 * countTokens, each answer held to the chat completion of the same conversation and
 * seed (text, stop sequences, thoughts, tool_use blocks, tool results, schemas), and
 * the errors in Anthropic's envelope as the client's error classes. */
TH_TEST(api_anthropic_messages) {
  run_script_on("api-anthropic.mjs", "2048", 1);
}
