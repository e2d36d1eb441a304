/* fuzz-api.c — fuzz target for the JSON bodies of the OpenAI API
 * (frontend/fe-api-req.c): /v1/completions, /v1/chat/completions, /tokenize
 * and /detokenize, with the structured outputs they compile, tools, chat
 * template arguments and multimodal parts, /v1/responses (its items turned
 * into the chat request) and Anthropic's /v1/messages and its count_tokens (their
 * blocks turned into the chat and /tokenize requests). The first byte picks the
 * endpoint (byte % 4; byte / 16 % 4: 1 /v1/responses, 2 /v1/messages, 3
 * /v1/messages/count_tokens) and the served model (byte / 4 % 2: plain text,
 * or Gemma 4's markers, thoughts and native tools); the rest is the body. Each parse, and
 * the compilation of the grammars it leaves, must give a request or a 4xx/5xx
 * with a message naming it; any other outcome aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/fe-api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  static const enum fe_api_kind kinds[] = {FE_API_COMPLETION, FE_API_CHAT, FE_API_TOKENIZE,
                                           FE_API_DETOKENIZE};
  static struct fe_api_model g4 = {.reasoning = 1, .native_tools = 1};
  if (!g4.marker[1])
    for (int i = 0; i < FE_G4_N_MARKERS; i++)
      g4.marker[i] = 100 + i;
  const struct fe_api_config cfg = {"m", 4096, data[0] / 4 % 2 ? &g4 : NULL,
                                    data[0] / 8 % 2 ? "{\"enable_thinking\":true}" : NULL};
  /* the body as the server holds it: its own allocation, no terminator */
  char *body = malloc(size - 1 ? size - 1 : 1);
  if (!body) abort();
  memcpy(body, data + 1, size - 1);
  struct fe_api_request r;
  struct fe_api_error e;
  memset(&e, 0, sizeof e);
  int api = data[0] / 16 % 4, responses = api == 1, anthropic = api >= 2 ? api - 1 : 0;
  enum fe_api_kind kind = responses || anthropic == FE_API_ANTHROPIC ? FE_API_CHAT
                          : anthropic                               ? FE_API_TOKENIZE
                                                                    : kinds[data[0] % 4];
  int rc = responses   ? fe_api_parse_responses(body, size - 1, &cfg, &r, &e)
           : anthropic ? fe_api_parse_messages(anthropic == FE_API_ANTHROPIC_COUNT, body, size - 1,
                                               &cfg, &r, &e)
                       : fe_api_parse_request(kind, body, size - 1, &cfg, &r, &e);
  if (rc == 0) { /* then the grammars, as the server compiles them before queuing */
    if (r.kind != kind || !r.responses != !responses || r.anthropic != anthropic) abort();
    rc = fe_api_check_grammars(&r, &e);
    fe_api_request_free(&r);
  }
  if (rc > 0 ||
      (rc < 0 && (e.status < 400 || e.status > 599 || !e.message[0] ||
                  !memchr(e.message, 0, sizeof e.message) || !memchr(e.param, 0, sizeof e.param))))
    abort();
  free(body);
  return 0;
}
