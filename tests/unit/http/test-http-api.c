/* test-http-api.c — OpenAI request validation: a matrix of bad inputs (each
 * must be a 400/404 naming the right field), good requests parsed into the
 * right struct values, and the prompt-length check. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "frontend/fe-api.h"
#include "grammar/gr.h"
#include "model/md-config.h"
#include "tests/harness/th.h"

static const struct fe_api_config cfg = {"gemma", 100};

struct bad_case {
  enum fe_api_kind kind;
  const char *body;
  int status;
  const char *param; /* "" for none */
};

#define C FE_API_COMPLETION
#define H FE_API_CHAT
/* the valid requests most rows add one field to */
#define PROMPT_A "{\"prompt\":\"a\","
#define CHAT_A   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
static const struct bad_case bad[] = {
    {C, "", 400, ""},
    {C, "{", 400, ""},
    {C, "{\"prompt\":\"a\",}", 400, ""},
    {C, "{\"prompt\":\"a\"", 400, ""},
    {C, "{\"prompt\":1e999", 400, "prompt"},
    {C, "{\"prompt\":\"a\" \"b\"}", 400, ""},
    {C, "{prompt:\"a\"}", 400, ""},
    {C, "{\"prompt\":\"a\x01b\"}", 400, "prompt"},
    {C, "{\"prompt\":\"a\\qb\"}", 400, "prompt"},
    {C, "{\"prompt\":\"a\xff\"}", 400, "prompt"},
    {C, "[1,2]", 400, ""},
    {C, "\"str\"", 400, ""},
    {C, PROMPT_A "\"prompt\":\"b\"}", 400, ""},
    {C, "{}", 400, "prompt"},
    {C, "{\"prompt\":null}", 400, "prompt"},
    {C, "{\"prompt\":5}", 400, "prompt"},
    {C, "{\"prompt\":[]}", 400, "prompt"},
    {C, "{\"prompt\":[[]]}", 400, "prompt"},
    {C, "{\"prompt\":[1,-2]}", 400, "prompt"},
    {C, "{\"prompt\":[1,\"a\"]}", 400, "prompt"},
    {C, "{\"prompt\":[\"a\",1]}", 400, "prompt"},
    {C, "{\"prompt\":[1,2.5]}", 400, "prompt"},
    {C, "{\"prompt\":[3000000000]}", 400, "prompt"},
    {C, PROMPT_A "\"model\":\"other\"}", 404, "model"},
    {C, PROMPT_A "\"model\":7}", 400, "model"},
    {C, PROMPT_A "\"max_tokens\":-1}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":0}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":\"5\"}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":5.5}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":true}", 400, "max_tokens"},
    {C, PROMPT_A "\"temperature\":-0.1}", 400, "temperature"},
    {C, PROMPT_A "\"temperature\":2.01}", 400, "temperature"},
    {C, PROMPT_A "\"temperature\":\"hot\"}", 400, "temperature"},
    {C, PROMPT_A "\"top_p\":1.5}", 400, "top_p"},
    {C, PROMPT_A "\"top_p\":0}", 400, "top_p"},
    {C, PROMPT_A "\"top_k\":-2}", 400, "top_k"},
    {C, PROMPT_A "\"min_p\":1.1}", 400, "min_p"},
    {C, PROMPT_A "\"presence_penalty\":2.5}", 400, "presence_penalty"},
    {C, PROMPT_A "\"frequency_penalty\":-3}", 400, "frequency_penalty"},
    {C, PROMPT_A "\"repetition_penalty\":0}", 400, "repetition_penalty"},
    {C, PROMPT_A "\"repetition_penalty\":2.5}", 400, "repetition_penalty"},
    {C, PROMPT_A "\"seed\":1.5}", 400, "seed"},
    {C, PROMPT_A "\"n\":0}", 400, "n"},
    {C, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":128}", 400, "n"},
    {C, PROMPT_A "\"n\":3,\"best_of\":2}", 400, "best_of"},
    {C, PROMPT_A "\"n\":2,\"best_of\":3,\"stream\":true}", 400, "best_of"},
    {C, PROMPT_A "\"best_of\":2,\"use_beam_search\":true}", 400, "best_of"},
    {C, "{\"prompt\":[\"a\",\"b\",\"c\"],\"best_of\":100}", 400, "best_of"},
    {H, CHAT_A "\"best_of\":129}", 400, "best_of"},
    {C, PROMPT_A "\"stop\":5}", 400, "stop"},
    {C, PROMPT_A "\"stop\":[\"x\",5]}", 400, "stop"},
    {C, PROMPT_A "\"stop\":[\"\"]}", 400, "stop"},
    {C,
     PROMPT_A "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
              "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
     400, "stop"},
    {C, PROMPT_A "\"stop_token_ids\":[-1]}", 400, "stop_token_ids"},
    {C, PROMPT_A "\"stop_token_ids\":7}", 400, "stop_token_ids"},
    {C, PROMPT_A "\"logprobs\":21}", 400, "logprobs"},
    {C, PROMPT_A "\"logprobs\":true}", 400, "logprobs"},
    {C, PROMPT_A "\"prompt_logprobs\":21}", 400, "prompt_logprobs"},
    {C, PROMPT_A "\"prompt_logprobs\":1,\"stream\":true}", 400, "prompt_logprobs"},
    {C, PROMPT_A "\"echo\":1}", 400, "echo"},
    {C, PROMPT_A "\"stream\":\"yes\"}", 400, "stream"},
    {C, PROMPT_A "\"stream_options\":{\"include_usage\":true}}", 400, "stream_options"},
    {C, PROMPT_A "\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
     "stream_options.include_usage"},
    {C, PROMPT_A "\"ignore_eos\":1}", 400, "ignore_eos"},
    {C, PROMPT_A "\"priority\":1.5}", 400, "priority"},
    {C, PROMPT_A "\"skip_special_tokens\":\"no\"}", 400, "skip_special_tokens"},
    {C, PROMPT_A "\"user\":5}", 400, "user"},
    {C, PROMPT_A "\"suffix\":\"x\"}", 400, "suffix"},
    {C, PROMPT_A "\"prompt_logprobs\":-1}", 400, "prompt_logprobs"},
    {C, PROMPT_A "\"use_beam_search\":1}", 400, "use_beam_search"},
    {C, PROMPT_A "\"use_beam_search\":true,\"stream\":true}", 400, "stream"},
    {C, PROMPT_A "\"use_beam_search\":true,\"n\":11}", 400, "n"},
    {C, PROMPT_A "\"use_beam_search\":true,\"length_penalty\":\"x\"}", 400, "length_penalty"},
    {C, PROMPT_A "\"bad_words\":\"x\"}", 400, "bad_words"},
    {C, PROMPT_A "\"bad_words\":[\"x\",{}]}", 400, "bad_words"},
    {C, PROMPT_A "\"bad_words\":[\"\\t \"]}", 400, "bad_words"},
    {C, PROMPT_A "\"truncate_prompt_tokens\":0}", 400, "truncate_prompt_tokens"},
    {C, PROMPT_A "\"truncate_prompt_tokens\":-2}", 400, "truncate_prompt_tokens"},
    {C, PROMPT_A "\"truncate_prompt_tokens\":101}", 400, "truncate_prompt_tokens"},
    {C, PROMPT_A "\"truncate_prompt_tokens\":\"8\"}", 400, "truncate_prompt_tokens"},
    {C, PROMPT_A "\"return_tokens_as_token_ids\":1}", 400, "return_tokens_as_token_ids"},
    {C, PROMPT_A "\"logit_bias\":[1]}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"x\":5}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"\":5}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"-1\":5}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"2147483648\":5}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"1000000000000000000000000000000\":5}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"1\":101}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"1\":\"5\"}}", 400, "logit_bias"},
    {C, PROMPT_A "\"logit_bias\":{\"1\":1e999}}", 400, "logit_bias"},
    {C, PROMPT_A "\"allowed_token_ids\":[1,-1]}", 400, "allowed_token_ids"},
    {C, PROMPT_A "\"allowed_token_ids\":5}", 400, "allowed_token_ids"},
    {C, PROMPT_A "\"stop_token_ids\":[1,3000000000]}", 400, "stop_token_ids"},
    {C, PROMPT_A "\"stop_token_ids\":[1,99999999999999999999999]}", 400, "stop_token_ids"},
    /* numbers Jansson cannot hold, and values that are not JSON: named */
    {C, PROMPT_A "\"seed\":18446744073709551616}", 400, "seed"},
    {C, PROMPT_A "\"seed\":9223372036854775808}", 400, "seed"},
    {C, PROMPT_A "\"seed\":-9223372036854775809}", 400, "seed"},
    {C, PROMPT_A "\"seed\":1e30}", 400, "seed"},
    {C, PROMPT_A "\"max_tokens\":1e999}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":-1e999}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":1e10}", 400, "max_tokens"},
    {C, PROMPT_A "\"max_tokens\":4294967297}", 400, "max_tokens"},
    {C, PROMPT_A "\"temperature\":1e999}", 400, "temperature"},
    {C, PROMPT_A "\"temperature\":1e308}", 400, "temperature"},
    {C, PROMPT_A "\"temperature\":NaN}", 400, "temperature"},
    {C, PROMPT_A "\"temperature\":nan}", 400, "temperature"},
    {C, PROMPT_A "\"top_p\":Infinity}", 400, "top_p"},
    {C, PROMPT_A "\"top_p\":-Infinity}", 400, "top_p"},
    {C, PROMPT_A "\"top_p\":+1}", 400, "top_p"},
    {C, PROMPT_A "\"top_p\":.5}", 400, "top_p"},
    {C, PROMPT_A "\"top_p\":01}", 400, "top_p"},
    {C, PROMPT_A "\"top_k\":-5}", 400, "top_k"},
    {C, PROMPT_A "\"min_tokens\":-1}", 400, "min_tokens"},
    {C, PROMPT_A "\"n\":-1}", 400, "n"},
    {C, PROMPT_A "\"n\":1e999}", 400, "n"},
    {C, PROMPT_A "\"priority\":2147483648}", 400, "priority"},
    {C, PROMPT_A "\"logprobs\":-1}", 400, "logprobs"},
    {C, "{\"prompt\":[1,2,1e999]}", 400, "prompt"},
    {C, "{\"prompt\":[[1,2],[3,99999999999999999999]]}", 400, "prompt"},
    {C, "{\"prompt\":[[1,2],[3,-4]]}", 400, "prompt"},
    {C, "{\"prompt\":[[1,2],[3,2147483648]]}", 400, "prompt"},
    {C, PROMPT_A "\"stream\":true,\"stream_options\":{\"include_usage\":tru}}", 400,
     "stream_options.include_usage"},
    {C, PROMPT_A "\"max_tokens\":5,\"min_tokens\":6}", 400, "min_tokens"},
    {C, "{\"prompt\":[1,2,3],\"max_tokens\":98}", 400, "max_tokens"},
    {C,
     "{\"prompt\":[[1],[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,"
     "29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,"
     "60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,"
     "91,92,93,94,95,96,97,98,99,100]]}",
     400, "prompt"},
    {H, "{}", 400, "messages"},
    {H, "{\"messages\":[]}", 400, "messages"},
    {H, "{\"messages\":{}}", 400, "messages"},
    {H, CHAT_A "\"continue_final_message\":true}", 400, "continue_final_message"},
    {H, CHAT_A "\"continue_final_message\":1,\"add_generation_prompt\":false}", 400,
     "continue_final_message"},
    {H, CHAT_A "\"chat_template\":5}", 400, "chat_template"},
    {H, CHAT_A "\"chat_template_kwargs\":{\"chat_template\":[]}}", 400,
     "chat_template_kwargs.chat_template"},
    {C, PROMPT_A "\"chat_template\":\"{{ messages }}\"}", 400, "chat_template"},
    {H, CHAT_A "\"documents\":\"d\"}", 400, "documents"},
    {H, CHAT_A "\"documents\":[{\"text\":\"d\"},1]}", 400, "documents[1]"},
    {H, "{\"messages\":[5]}", 400, "messages[0]"},
    {H, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0].role"},
    {H, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", 400, "messages[0].role"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\"}]}", 400,
     "messages[1].content"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", 400, "messages[0].content"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     400, "messages[0].content[0]"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
     "messages[0].content[0]"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
     "{\"type\":\"image_url\",\"image_url\":5}]}]}",
     400, "messages[0].content[1]"},
    {H,
     "{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"image_url\","
     "\"image_url\":{\"url\":\"data:,\"}}]}]}",
     400, "messages[0].content[0]"},
    {H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}", 400,
     "messages[0].content[0]"},
    {H, CHAT_A "\"logprobs\":3}", 400, "logprobs"},
    {H, CHAT_A "\"top_logprobs\":3}", 400, "top_logprobs"},
    {H, CHAT_A "\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs"},
    {H, CHAT_A "\"max_completion_tokens\":-5}", 400, "max_completion_tokens"},
    {H, CHAT_A "\"max_completion_tokens\":123456789012345678901234567890}", 400,
     "max_completion_tokens"},
    {H, CHAT_A "\"top_logprobs\":1e400}", 400, "top_logprobs"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":"
     "[{\"type\":\"text\",\"text\":-1e999}]}]}",
     400, "messages[1].content[0].text"},
    {H, CHAT_A "\"tools\":[{\"type\":\"function\"}]}", 400, "tools[0]"},
    {H, CHAT_A "\"tools\":{}}", 400, "tools"},
    {H, CHAT_A "\"tool_choice\":\"auto\"}", 400, "tool_choice"},
    {C, PROMPT_A "\"functions\":[{\"name\":\"f\"}]}", 400, "functions"},
    {H,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\","
     "\"content\":\"x\"}]}",
     400, "messages[1].tool_call_id"},
    {H, CHAT_A "\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type"},
    {H, CHAT_A "\"response_format\":\"json\"}", 400, "response_format"},
    {H, CHAT_A "\"response_format\":{\"type\":\"json_schema\"}}", 400,
     "response_format.json_schema"},
    {H, CHAT_A "\"structured_outputs\":{\"regex\":\"a(b\"}}", 400, "structured_outputs.regex"},
    {H, CHAT_A "\"structured_outputs\":{\"regex\":5}}", 400, "structured_outputs.regex"},
    {H, CHAT_A "\"structured_outputs\":{\"grammar\":\"x\"}}", 400, "structured_outputs.grammar"},
    {H, CHAT_A "\"structured_outputs\":{\"lark\":\"x\"}}", 400, "structured_outputs"},
    {H, CHAT_A "\"structured_outputs\":[1]}", 400, "structured_outputs"},
    {H, CHAT_A "\"guided_choice\":[]}", 400, "guided_choice"},
    {H, CHAT_A "\"guided_choice\":[\"a\",1]}", 400, "guided_choice"},
    {H, CHAT_A "\"guided_json\":\"{not json\"}", 400, "guided_json"},
    {H, CHAT_A "\"guided_json\":{\"type\":\"object\",\"not\":{}}}", 400, "guided_json"},
    {H, CHAT_A "\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}", 400, "guided_choice"},
    {H, CHAT_A "\"guided_grammar\":\"root ::= x\"}", 400, "guided_grammar"},
    {H, CHAT_A "\"guided_grammar\":7}", 400, "guided_grammar"},
    {H, CHAT_A "\"model\":\"nope\"}", 404, "model"},
    {FE_API_TOKENIZE, "{}", 400, "prompt"},
    {FE_API_TOKENIZE, PROMPT_A "\"add_special_tokens\":\"no\"}", 400, "add_special_tokens"},
    {FE_API_COMPLETION, PROMPT_A "\"add_special_tokens\":1}", 400, "add_special_tokens"},
    {H, CHAT_A "\"add_special_tokens\":\"yes\"}", 400, "add_special_tokens"},
    {FE_API_DETOKENIZE, "{\"tokens\":\"abc\"}", 400, "tokens"},
    {FE_API_DETOKENIZE, "{\"tokens\":[1,-1]}", 400, "tokens"},
    {FE_API_DETOKENIZE, "{\"tokens\":[1,2147483648]}", 400, "tokens"},
    {FE_API_DETOKENIZE, "{\"tokens\":[1,1e999]}", 400, "tokens"},
    {FE_API_DETOKENIZE, "{\"tokens\":[1,18446744073709551616]}", 400, "tokens"},
};

/* What the server does before queuing a request: the parse, then its grammars'
 * compilation (on the thread pool there); r is freed on a refusal. */
static int parse_and_check(enum fe_api_kind kind, const char *body, size_t len,
                           const struct fe_api_config *c, struct fe_api_request *r,
                           struct fe_api_error *e) {
  int rc = fe_api_parse_request(kind, body, len, c, r, e);
  if (!rc && (rc = fe_api_check_grammars(r, e)) != 0) fe_api_request_free(r);
  return rc;
}

/* Parses body as kind into r; a refusal fails the test with the parser's reason. */
static void parse_ok(enum fe_api_kind kind, const char *body, struct fe_api_request *r) {
  struct fe_api_error e;
  int rc = parse_and_check(kind, body, strlen(body), &cfg, r, &e);
  if (rc) th_fail(__FILE__, __LINE__, "%s (%s)", e.message, e.param);
  TH_REQUIRE(rc == 0);
}

TH_TEST(api_bad_matrix) {
  for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
    struct fe_api_request r;
    struct fe_api_error e;
    int rc = parse_and_check(bad[i].kind, bad[i].body, strlen(bad[i].body), &cfg, &r, &e);
    if (rc == 0) {
      th_fail(__FILE__, __LINE__, "bad[%zu] accepted: %s", i, bad[i].body);
      fe_api_request_free(&r);
      continue;
    }
    if (e.status != bad[i].status || strcmp(e.param, bad[i].param) != 0 || !e.message[0])
      th_fail(__FILE__, __LINE__, "bad[%zu] %s: got %d param '%s' (%s)", i, bad[i].body, e.status,
              e.param, e.message);
  }
}

/* Bytes that are not JSON at all, including NULs and truncations of a good body. */
TH_TEST(api_garbage_and_truncation) {
  const char *good = "{\"model\":\"gemma\",\"prompt\":\"hello\",\"max_tokens\":5,\"stop\":[\"x\"]}";
  size_t n = strlen(good);
  for (size_t k = 0; k < n; k++) {
    struct fe_api_request r;
    struct fe_api_error e;
    int rc = fe_api_parse_request(FE_API_COMPLETION, good, k, &cfg, &r, &e);
    TH_CHECK(rc < 0 && e.status == 400);
  }
  static const char nul[] = "{\"prompt\":\"a\0b\"}";
  struct fe_api_request r;
  struct fe_api_error e;
  TH_CHECK(fe_api_parse_request(FE_API_COMPLETION, nul, sizeof(nul) - 1, &cfg, &r, &e) < 0);
  static const char esc0[] = "{\"prompt\":\"a\\u0000b\"}";
  TH_CHECK(fe_api_parse_request(FE_API_COMPLETION, esc0, sizeof(esc0) - 1, &cfg, &r, &e) < 0);
  /* deep nesting must be refused, not recursed into without bound */
  size_t depth = 100000;
  char *deep = malloc(2 * depth + 16);
  TH_REQUIRE(deep);
  size_t o = 0;
  o += (size_t)sprintf(deep, "{\"prompt\":");
  for (size_t i = 0; i < depth; i++)
    deep[o++] = '[';
  for (size_t i = 0; i < depth; i++)
    deep[o++] = ']';
  deep[o++] = '}';
  TH_CHECK(fe_api_parse_request(FE_API_COMPLETION, deep, o, &cfg, &r, &e) < 0 && e.status == 400);
  free(deep);
}

/* best_of above n runs best_of choices and keeps n; equal to n (or absent) keeps all. */
TH_TEST(api_best_of) {
  struct fe_api_request r;
  parse_ok(FE_API_COMPLETION, PROMPT_A "\"n\":2,\"best_of\":5,\"temperature\":1}", &r);
  TH_CHECK(r.n == 5 && r.n_keep == 2);
  fe_api_request_free(&r);
  parse_ok(FE_API_CHAT, CHAT_A "\"best_of\":3}", &r);
  TH_CHECK(r.n == 3 && r.n_keep == 1);
  fe_api_request_free(&r);
  parse_ok(FE_API_COMPLETION, PROMPT_A "\"n\":3,\"best_of\":3}", &r);
  TH_CHECK(r.n == 3 && r.n_keep == 0);
  fe_api_request_free(&r);
}

TH_TEST(api_completion_good) {
  const char *b =
      "{\"model\":\"gemma\",\"prompt\":[\"ab\",\"cd\"],\"max_tokens\":7,\"temperature\":0,"
      "\"top_p\":0.5,\"top_k\":0,\"min_p\":0.1,\"presence_penalty\":-2,\"frequency_penalty\":2,"
      "\"repetition_penalty\":1.2,\"seed\":-42,\"stop\":\"##\",\"stop_token_ids\":[1,106],"
      "\"logprobs\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
      "\"ignore_eos\":true,\"user\":\"u\",\"best_of\":1,\"echo\":false,\"suffix\":null,"
      "\"prompt_logprobs\":null,\"use_beam_search\":false,\"bad_words\":[],"
      "\"skip_special_tokens\":false,\"include_stop_str_in_output\":true,\"priority\":-3}";
  struct fe_api_request r;
  parse_ok(FE_API_COMPLETION, b, &r);
  TH_CHECK_EQ_STR(r.model, "gemma");
  TH_CHECK_EQ_INT(r.n_prompts, 2);
  TH_CHECK_EQ_STR(r.prompts[1].text, "cd");
  TH_CHECK_EQ_INT(r.max_tokens, 7);
  TH_CHECK_NEAR(r.temperature, 0, 0);
  TH_CHECK_NEAR(r.top_p, 0.5, 0);
  TH_CHECK_EQ_INT(r.top_k, -1);
  TH_CHECK_NEAR(r.min_p, 0.1, 1e-12);
  TH_CHECK_NEAR(r.presence_penalty, -2, 0);
  TH_CHECK_NEAR(r.repetition_penalty, 1.2, 1e-12);
  TH_CHECK(r.has_seed && r.seed == -42);
  TH_CHECK_EQ_INT(r.n_stop, 1);
  TH_CHECK_EQ_STR(r.stop[0], "##");
  TH_CHECK(r.n_stop_token_ids == 2 && r.stop_token_ids[1] == 106);
  TH_CHECK_EQ_INT(r.logprobs, 3);
  TH_CHECK(r.stream && r.include_usage && r.ignore_eos);
  TH_CHECK_EQ_INT(r.n, 1);
  TH_CHECK(r.skip_special_tokens == 0 && r.include_stop_str_in_output == 1 && r.priority == -3);
  fe_api_request_free(&r);

  /* id-taking fields the serving path checks against the vocabulary; the extremes
   * that still fit; the sampler's biases: each allowed id once, with its logit_bias */
  const char *ids = "{\"prompt\":\"a\",\"logit_bias\":{\"7\":-100,\"2147483647\":100,\"3\":2},"
                    "\"allowed_token_ids\":[0,3,0],\"seed\":9223372036854775807,"
                    "\"temperature\":1e-999,\"bad_words\":[\"  hello\",\"x y\"]}";
  parse_ok(FE_API_COMPLETION, ids, &r);
  TH_CHECK_EQ_INT(r.n_logit_bias, 3);
  TH_CHECK(r.logit_bias_ids[0] == 7 && r.logit_bias[0] == -100.0f);
  TH_CHECK(r.logit_bias_ids[1] == INT32_MAX && r.logit_bias[1] == 100.0f);
  TH_CHECK(r.n_allowed_token_ids == 3 && r.allowed_token_ids[1] == 3);
  TH_CHECK(r.allowed_only && r.n_bias == 2);
  TH_CHECK(r.bias_ids[0] == 0 && r.bias[0] == 0.0f && r.bias_ids[1] == 3 && r.bias[1] == 2.0f);
  TH_CHECK_EQ_INT(r.n_bad_words, 2);
  TH_CHECK_EQ_STR(r.bad_words[0], "hello");
  TH_CHECK_EQ_STR(r.bad_words[1], "x y");
  TH_CHECK(r.has_seed && r.seed == INT64_MAX);
  TH_CHECK_NEAR(r.temperature, 0, 0);
  fe_api_request_free(&r);

  /* defaults; the model may be omitted; token-id prompts */
  const char *d = "{\"prompt\":[[5,6],[7]]}";
  parse_ok(FE_API_COMPLETION, d, &r);
  TH_CHECK_EQ_INT(r.n_prompts, 2);
  TH_CHECK(r.prompts[0].n_ids == 2 && r.prompts[0].ids[1] == 6 && r.prompts[0].text == NULL);
  TH_CHECK_EQ_INT(r.max_tokens, -1);
  TH_CHECK_NEAR(r.temperature, 1, 0);
  TH_CHECK_EQ_INT(r.top_k, -1);
  TH_CHECK_EQ_INT(r.logprobs, -1);
  TH_CHECK(!r.stream && !r.has_seed && r.n == 1);
  TH_CHECK(r.skip_special_tokens == 1 && r.include_stop_str_in_output == 0 && r.priority == 0);
  fe_api_request_free(&r);
  const char *one =
      "{\"prompt\":[5,6,7],\"top_k\":40,\"n\":3,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}";
  parse_ok(FE_API_COMPLETION, one, &r);
  TH_CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3);
  TH_CHECK(r.top_k == 40 && r.n == 3 && r.n_stop == 5);
  fe_api_request_free(&r);
}

TH_TEST(api_chat_good) {
  const char *b =
      "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
      "\"text\":\"b\"}]},"
      "{\"role\":\"assistant\",\"content\":null},{\"role\":\"developer\",\"content\":\"x\"}],"
      "\"max_tokens\":3,\"max_completion_tokens\":9,\"logprobs\":true,\"top_logprobs\":2}";
  struct fe_api_request r;
  parse_ok(FE_API_CHAT, b, &r);
  TH_CHECK_EQ_INT(r.n_messages, 4);
  TH_CHECK_EQ_INT(r.messages[0].role, FE_API_ROLE_SYSTEM);
  TH_CHECK_EQ_STR(r.messages[1].content, "a\nb");
  TH_CHECK_EQ_INT(r.messages[2].role, FE_API_ROLE_ASSISTANT);
  TH_CHECK_EQ_STR(r.messages[2].content, "");
  TH_CHECK_EQ_INT(r.messages[3].role, FE_API_ROLE_SYSTEM);
  TH_CHECK_EQ_INT(r.max_tokens, 9);
  TH_CHECK_EQ_INT(r.logprobs, 2);
  TH_CHECK_EQ_INT(r.add_generation_prompt, 1);
  TH_CHECK_EQ_INT(r.add_special_tokens, 0);
  fe_api_request_free(&r);
  /* documents become the template's variable documents, beside chat_template_kwargs */
  const char *d = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"documents\":"
                  "[{\"title\":\"t\",\"text\":\"d\"}],\"chat_template_kwargs\":{\"k\":1}}";
  parse_ok(FE_API_CHAT, d, &r);
  TH_CHECK(r.template_kwargs &&
           strstr(r.template_kwargs, "\"documents\":[{\"title\":\"t\",\"text\":\"d\"}]") &&
           strstr(r.template_kwargs, "\"k\":1"));
  fe_api_request_free(&r);
  const char *t = "{\"prompt\":\"hi\",\"add_special_tokens\":false}";
  parse_ok(FE_API_TOKENIZE, t, &r);
  TH_CHECK(r.n_prompts == 1 && r.add_special_tokens == 0);
  fe_api_request_free(&r);
  /* vLLM's add_special_tokens: completions' default true, chat's false, either way asked */
  parse_ok(FE_API_COMPLETION, "{\"prompt\":\"hi\"}", &r);
  TH_CHECK_EQ_INT(r.add_special_tokens, 1);
  fe_api_request_free(&r);
  parse_ok(FE_API_COMPLETION, t, &r);
  TH_CHECK_EQ_INT(r.add_special_tokens, 0);
  fe_api_request_free(&r);
  parse_ok(FE_API_CHAT,
           "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"add_special_tokens\":true}",
           &r);
  TH_CHECK_EQ_INT(r.add_special_tokens, 1);
  fe_api_request_free(&r);
  const char *dt = "{\"tokens\":[2,3,4]}";
  parse_ok(FE_API_DETOKENIZE, dt, &r);
  TH_CHECK(r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 4);
  fe_api_request_free(&r);
}

/* The structured-output fields, each turned into one constraint: its kind and text
 * (compact JSON for choices and schemas). */
TH_TEST(api_structured_fields) {
  static const struct {
    const char *body;
    int kind;
    const char *text;
  } ok[] = {
      {CHAT_A "\"response_format\":{\"type\":\"text\"}}", 0, NULL},
      {CHAT_A "\"response_format\":{\"type\":\"json_object\"}}", GR_JSON_OBJECT, NULL},
      {CHAT_A "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
              "\"schema\":{\"type\":\"integer\", \"maximum\": 9}}}}",
       GR_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":9}"},
      {CHAT_A "\"structured_outputs\":{\"regex\":\"[0-9]+\"}}", GR_REGEX, "[0-9]+"},
      {CHAT_A "\"structured_outputs\":{\"choice\":[\"a\", \"b\"]}}", GR_CHOICE, "[\"a\",\"b\"]"},
      {CHAT_A "\"structured_outputs\":{\"json_object\":true,\"disable_any_whitespace\":true}}",
       GR_JSON_OBJECT, NULL},
      {CHAT_A "\"structured_outputs\":{\"json\":\"{\\\"type\\\": \\\"boolean\\\"}\"}}",
       GR_JSON_SCHEMA, "{\"type\":\"boolean\"}"},
      {CHAT_A "\"guided_regex\":\"a|b\",\"structured_outputs\":null}", GR_REGEX, "a|b"},
      {CHAT_A "\"guided_choice\":[\"yes\"]}", GR_CHOICE, "[\"yes\"]"},
      {CHAT_A "\"guided_grammar\":\"root ::= \\\"a\\\" | \\\"b\\\"\"}", GR_GRAMMAR,
       "root ::= \"a\" | \"b\""},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(ok); i++) {
    struct fe_api_request r;
    parse_ok(FE_API_CHAT, ok[i].body, &r);
    TH_CHECK_EQ_INT(r.grammar_kind, ok[i].kind);
    if (ok[i].text) {
      TH_CHECK(r.grammar && r.grammar_len == strlen(ok[i].text));
      if (r.grammar) TH_CHECK_EQ_STR(r.grammar, ok[i].text);
    } else {
      TH_CHECK_EQ_INT(r.grammar_len, 0);
    }
    fe_api_request_free(&r);
  }
}

/* Several served names (vLLM's): a request naming an alias gets it back as its model;
 * none, the first name; another, a 404. */
TH_TEST(api_model_aliases) {
  const char *const aliases[] = {"b", "c"};
  struct fe_api_config acfg = {"a", 100};
  acfg.aliases = aliases;
  acfg.n_aliases = 2;
  struct fe_api_request r;
  struct fe_api_error e;
  const char *bodies[] = {"{\"prompt\":\"x\",\"model\":\"c\"}", "{\"prompt\":\"x\"}",
                          "{\"prompt\":\"x\",\"model\":\"a\"}"};
  const char *want[] = {"c", "a", "a"};
  for (int i = 0; i < 3; i++) {
    TH_REQUIRE(
        fe_api_parse_request(FE_API_COMPLETION, bodies[i], strlen(bodies[i]), &acfg, &r, &e) == 0);
    TH_CHECK_EQ_STR(r.model, want[i]);
    fe_api_request_free(&r);
  }
  const char *d = "{\"prompt\":\"x\",\"model\":\"d\"}";
  TH_CHECK(fe_api_parse_request(FE_API_COMPLETION, d, strlen(d), &acfg, &r, &e) != 0);
  TH_CHECK_EQ_INT(e.status, 404);
}

/* The checkpoint's sampling defaults (--generation-config) fill the fields a request
 * leaves out (or sends as null); a field sent wins; max_new_tokens caps max_tokens. */
TH_TEST(api_sampling_defaults) {
  const struct md_sampling d = {MD_SAMPLE_TEMPERATURE | MD_SAMPLE_TOP_K | MD_SAMPLE_TOP_P |
                                    MD_SAMPLE_MIN_P | MD_SAMPLE_REPETITION_PENALTY |
                                    MD_SAMPLE_MAX_TOKENS,
                                0.6,
                                0.9,
                                0.05,
                                1.1,
                                64,
                                100};
  const struct fe_api_config dcfg = {"m", 4096, NULL, NULL, &d};
  struct fe_api_request r;
  struct fe_api_error e;
  const char *b = "{\"prompt\":\"hi\",\"top_p\":null}";
  TH_REQUIRE(fe_api_parse_request(FE_API_COMPLETION, b, strlen(b), &dcfg, &r, &e) == 0);
  TH_CHECK(r.temperature == 0.6 && r.top_p == 0.9 && r.min_p == 0.05 &&
           r.repetition_penalty == 1.1);
  TH_CHECK_EQ_INT(r.top_k, 64);
  TH_CHECK_EQ_INT(r.max_tokens, 100);
  fe_api_request_free(&r);
  b = "{\"prompt\":\"hi\",\"temperature\":0,\"top_k\":0,\"top_p\":1,\"min_p\":0,"
      "\"repetition_penalty\":1,\"max_tokens\":20}";
  TH_REQUIRE(fe_api_parse_request(FE_API_COMPLETION, b, strlen(b), &dcfg, &r, &e) == 0);
  TH_CHECK(r.temperature == 0 && r.top_p == 1 && r.min_p == 0 && r.repetition_penalty == 1);
  TH_CHECK_EQ_INT(r.top_k, -1);
  TH_CHECK_EQ_INT(r.max_tokens, 20);
  fe_api_request_free(&r);
  /* the cap holds over a larger request, and min_tokens is checked against it */
  b = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_completion_tokens\":500}";
  TH_REQUIRE(fe_api_parse_request(FE_API_CHAT, b, strlen(b), &dcfg, &r, &e) == 0);
  TH_CHECK_EQ_INT(r.max_tokens, 100);
  fe_api_request_free(&r);
  b = "{\"prompt\":\"hi\",\"min_tokens\":101}";
  TH_CHECK(fe_api_parse_request(FE_API_COMPLETION, b, strlen(b), &dcfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "min_tokens");
  /* without defaults, vLLM's own */
  b = "{\"prompt\":\"hi\"}";
  TH_REQUIRE(fe_api_parse_request(FE_API_COMPLETION, b, strlen(b), &cfg, &r, &e) == 0);
  TH_CHECK(r.temperature == 1 && r.top_p == 1 && r.min_p == 0 && r.repetition_penalty == 1);
  TH_CHECK_EQ_INT(r.top_k, -1);
  TH_CHECK_EQ_INT(r.max_tokens, -1);
  fe_api_request_free(&r);
}

/* The parse compiles no grammar (a hostile one takes the compiler a second, and the
 * parse runs on the server's loop): it lists them, each tool's schema and then the
 * constraint, and fe_api_check_grammars refuses the first bad one by its field.
 * With thinking on, the constraint's check is the after-thought grammar around it. */
TH_TEST(api_grammar_checks_deferred) {
  const char *b = CHAT_A "\"structured_outputs\":{\"regex\":\"(a|b\"}}";
  struct fe_api_request r;
  struct fe_api_error e;
  TH_REQUIRE(fe_api_parse_request(FE_API_CHAT, b, strlen(b), &cfg, &r, &e) == 0);
  TH_REQUIRE(r.checks && !r.checks->next);
  TH_CHECK_EQ_INT(r.checks->kind, GR_REGEX);
  TH_CHECK_EQ_STR(r.checks->param, "structured_outputs.regex");
  TH_CHECK(fe_api_check_grammars(&r, &e) < 0);
  TH_CHECK_EQ_INT(e.status, 400);
  TH_CHECK_EQ_STR(e.param, "structured_outputs.regex");
  TH_CHECK(!strncmp(e.message, "'structured_outputs.regex': ", 28) && strlen(e.message) > 28);
  fe_api_request_free(&r);

  /* two tools, the second's schema one the compiler refuses, and their constraint */
  const char *t = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":["
                  "{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                  "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":"
                  "{\"type\":\"object\",\"not\":{}}}}],\"tool_choice\":\"required\"}";
  TH_REQUIRE(fe_api_parse_request(FE_API_CHAT, t, strlen(t), &cfg, &r, &e) == 0);
  const char *want[] = {"tools[0].function.parameters", "tools[1].function.parameters", "tools"};
  size_t n = 0;
  for (const struct fe_api_grammar_check *c = r.checks; c; c = c->next, n++)
    if (n < 3) TH_CHECK_EQ_STR(c->param, want[n]);
  TH_CHECK_EQ_INT(n, 3);
  TH_CHECK(fe_api_check_grammars(&r, &e) < 0);
  TH_CHECK_EQ_STR(e.param, "tools[1].function.parameters");
  fe_api_request_free(&r);

  /* thinking: one check, of the whole */
  struct fe_api_model g4 = {.reasoning = 1, .native_tools = 1};
  for (int i = 0; i < FE_G4_N_MARKERS; i++)
    g4.marker[i] = 100 + i;
  const struct fe_api_config tcfg = {"gemma", 100, &g4, "{\"enable_thinking\":true}"};
  const char *g = CHAT_A "\"guided_choice\":[\"yes\",\"no\"]}";
  TH_REQUIRE(fe_api_parse_request(FE_API_CHAT, g, strlen(g), &tcfg, &r, &e) == 0);
  TH_REQUIRE(r.checks && !r.checks->next);
  TH_CHECK_EQ_INT(r.grammar_kind, GR_AFTER_SPAN);
  TH_CHECK_EQ_INT(r.checks->kind, GR_AFTER_SPAN);
  TH_CHECK(r.checks->text == r.grammar && r.checks->len == r.grammar_len);
  TH_CHECK_EQ_INT(fe_api_check_grammars(&r, &e), 0);
  fe_api_request_free(&r);
}

/* Tools: the protocol's instruction goes into the system turn, the history's
 * tool turns become its JSON, and the answer is constrained; the answer's text
 * turns back into OpenAI tool_calls or content. */
TH_TEST(api_tools_protocol) {
  const char *b =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
      "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
      "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"no\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
      "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}],"
      "\"tool_choice\":\"required\"}";
  struct fe_api_request r;
  parse_ok(FE_API_CHAT, b, &r);
  TH_CHECK_EQ_INT(r.tool_answer, 1);
  TH_CHECK_EQ_INT(r.grammar_kind, GR_JSON_SCHEMA);
  TH_REQUIRE(r.n_messages == 4);
  TH_CHECK_EQ_INT(r.messages[0].role, FE_API_ROLE_SYSTEM);
  TH_CHECK(strstr(r.messages[0].content, "\"name\":\"f\"") != NULL);
  TH_CHECK_EQ_STR(r.messages[2].content,
                  "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"x\":1}}]}");
  TH_CHECK_EQ_INT(r.messages[3].role, FE_API_ROLE_USER);
  TH_CHECK_EQ_STR(r.messages[3].content,
                  "[{\"tool_response\":{\"tool_call_id\":\"c1\",\"content\":\"ok\"}},"
                  "{\"tool_response\":{\"tool_call_id\":\"c2\",\"content\":\"no\"}}]");
  TH_CHECK(r.grammar && strstr(r.grammar, "\"tool_calls\"") && !strstr(r.grammar, "\"response\""));
  fe_api_request_free(&r);

  char *calls, *content;
  const char *a = "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"x\": 1}}]}";
  fe_api_tool_answer(a, strlen(a), &calls, &content);
  TH_CHECK(calls && !content);
  /* the arguments as written */
  TH_CHECK(calls && strstr(calls, "\"arguments\":\"{\\\"x\\\": 1}\"") &&
           strstr(calls, "\"id\":\"call_"));
  free(calls);
  const char *t = "{\"response\":\"plain \\u00e9\"}";
  fe_api_tool_answer(t, strlen(t), &calls, &content);
  TH_CHECK(!calls && content && !strcmp(content, "plain \xc3\xa9"));
  free(content);
  fe_api_tool_answer("{\"tool_ca", 9, &calls, &content); /* cut by max_tokens */
  TH_CHECK(!calls && !content);
}

/* OpenAI's deprecated functions and function_call read as tools and tool_choice
 * (one call at most), the history's function_call and "function" turns as a tool
 * call and its result; the answer's call then goes back as function_call. */
TH_TEST(api_legacy_functions) {
  const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                  "{\"role\":\"assistant\",\"content\":null,\"function_call\":{\"name\":\"f\","
                  "\"arguments\":\"{\\\"x\\\":1}\"}},"
                  "{\"role\":\"function\",\"name\":\"f\",\"content\":\"ok\"}],"
                  "\"functions\":[{\"name\":\"f\",\"parameters\":"
                  "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}],"
                  "\"function_call\":{\"name\":\"f\"}}";
  struct fe_api_request r;
  parse_ok(FE_API_CHAT, b, &r);
  TH_CHECK_EQ_INT(r.legacy_functions, 1);
  TH_CHECK_EQ_INT(r.tool_answer, 1);
  TH_REQUIRE(r.n_messages == 4);
  TH_CHECK(strstr(r.messages[0].content, "\"name\":\"f\"") != NULL);
  TH_CHECK_EQ_STR(r.messages[2].content,
                  "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"x\":1}}]}");
  TH_CHECK_EQ_STR(r.messages[3].content,
                  "{\"tool_response\":{\"tool_call_id\":\"call_fn1\",\"content\":\"ok\"}}");
  /* one call, and that one named: no "response", no second call */
  TH_CHECK(r.grammar && strstr(r.grammar, "\"maxItems\":1") && !strstr(r.grammar, "\"response\""));
  fe_api_request_free(&r);
  /* "none": no tools in the prompt, no constraint */
  parse_ok(FE_API_CHAT,
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"functions\":[{\"name\":"
           "\"f\"}],\"function_call\":\"none\"}",
           &r);
  TH_CHECK(r.legacy_functions == 1 && r.tool_answer == 0 && r.grammar_kind == 0);
  fe_api_request_free(&r);
  static const struct {
    const char *body, *param;
  } refused[] = {
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{\"name\":\"f\"}],"
       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}",
       "functions"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{\"name\":\"f\"}],"
       "\"function_call\":\"auto\",\"tool_choice\":\"none\"}",
       "function_call"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":{\"name\":\"f\"}}",
       "functions"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[7]}",
       "functions[0].name"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{\"name\":\"f\"},"
       "{\"description\":\"x\"}]}",
       "functions[1].name"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{\"name\":\"f\"}],"
       "\"function_call\":\"required\"}",
       "function_call"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{\"name\":\"f\"}],"
       "\"function_call\":{\"name\":\"g\"}}",
       "tool_choice.function.name"},
      {"{\"messages\":[{\"role\":\"function\",\"name\":\"f\",\"content\":\"a\"}]}",
       "messages[0].role"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
       "\"function_call\":{\"name\":\"f\",\"arguments\":\"{}\"},\"tool_calls\":[]}]}",
       "messages[1].function_call"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(refused); i++) {
    struct fe_api_error e;
    int rc = parse_and_check(FE_API_CHAT, refused[i].body, strlen(refused[i].body), &cfg, &r, &e);
    if (rc == 0) fe_api_request_free(&r);
    if (rc == 0 || strcmp(e.param, refused[i].param))
      th_fail(__FILE__, __LINE__, "refused[%zu]: rc %d, param '%s' (%s)", i, rc, rc ? e.param : "",
              rc ? e.message : "");
  }
  /* completions have no functions */
  struct fe_api_error e;
  const char *c = PROMPT_A "\"functions\":[{\"name\":\"f\"}]}";
  TH_CHECK(parse_and_check(FE_API_COMPLETION, c, strlen(c), &cfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "functions");
}

/* Gemma 4's own tool tokens: an assistant turn that only calls tools may omit
 * its content (OpenAI's rule), as clients send a response's message back. */
TH_TEST(api_native_tool_history) {
  struct fe_api_model g4 = {.reasoning = 1, .native_tools = 1};
  for (int i = 0; i < FE_G4_N_MARKERS; i++)
    g4.marker[i] = 100 + i;
  const struct fe_api_config ncfg = {"gemma", 100, &g4, NULL};
  const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                  "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
                  "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],"
                  "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                  "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]}";
  struct fe_api_request r;
  struct fe_api_error e;
  int rc = fe_api_parse_request(FE_API_CHAT, b, strlen(b), &ncfg, &r, &e);
  if (rc) th_fail(__FILE__, __LINE__, "%s (%s)", e.message, e.param);
  TH_REQUIRE(rc == 0);
  TH_REQUIRE(r.n_messages >= 2);
  TH_CHECK_EQ_INT(r.messages[1].role, FE_API_ROLE_ASSISTANT);
  TH_CHECK(r.messages[1].extra && strstr(r.messages[1].extra, "\"tool_calls\""));
  fe_api_request_free(&r);
  /* a user turn still needs its content */
  const char *u = "{\"messages\":[{\"role\":\"user\",\"tool_calls\":[]}]}";
  TH_CHECK(fe_api_parse_request(FE_API_CHAT, u, strlen(u), &ncfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "messages[0].content");
}

/* The protocol's answer as it streams: every prefix tells the calls begun so far,
 * their names, and arguments that only ever grow into the whole call's. */
TH_TEST(api_tool_answer_scanned_as_it_streams) {
  const char *t =
      "{ \"tool_calls\" : [ {\"name\": \"get_w\", \"arguments\": {\"city\": \"Z\u00fcr\\\"ich\","
      " \"n\": [1, {\"a\": \"}\"}]}} , {\"name\":\"g\",\"arguments\":{}}]}";
  size_t n = strlen(t);
  struct fe_api_tool_span sp[4], prev[4];
  size_t np = 0;
  for (size_t k = 0; k <= n; k++) {
    size_t m = fe_api_tool_scan(t, k, sp, 4);
    TH_CHECK(m >= np); /* calls are never taken back */
    for (size_t i = 0; i < np && i < m; i++) {
      TH_CHECK(sp[i].args_len >= prev[i].args_len); /* where they begin, once they have */
      TH_CHECK(!prev[i].args_len || sp[i].args_at == prev[i].args_at);
      TH_CHECK(!prev[i].args_done || (sp[i].args_done && sp[i].args_len == prev[i].args_len));
    }
    memcpy(prev, sp, sizeof(sp));
    np = m;
  }
  TH_CHECK_EQ_INT(np, 2);
  TH_CHECK(sp[0].name_len == 5 && !memcmp(t + sp[0].name_at, "get_w", 5));
  TH_CHECK(sp[0].args_done && sp[1].args_done);
  char *a0 = strndup(t + sp[0].args_at, sp[0].args_len);
  TH_CHECK_EQ_STR(a0, "{\"city\": \"Z\u00fcr\\\"ich\", \"n\": [1, {\"a\": \"}\"}]}");
  free(a0);
  TH_CHECK(sp[1].args_len == 2 && !memcmp(t + sp[1].args_at, "{}", 2));
  /* a response is no call, and neither is the start of one */
  const char *r = "{\"response\": \"hi\"}";
  TH_CHECK_EQ_INT(fe_api_tool_scan(r, strlen(r), sp, 4), 0);
  TH_CHECK_EQ_INT(fe_api_tool_scan("{\"tool_calls\":[{\"na", 20, sp, 4), 0);
}

TH_TEST(api_chat_images) {
  const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"},"
                  "{\"role\":\"assistant\",\"content\":\"hi\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look \"},"
                  "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\","
                  "\"detail\":\"low\"}},{\"type\":\"text\",\"text\":\"and\"},"
                  "{\"type\":\"image_url\",\"image_url\":\"file:///x.png\"}]}]}";
  struct fe_api_request r;
  parse_ok(FE_API_CHAT, b, &r);
  TH_REQUIRE(r.n_images == 2);
  TH_CHECK_EQ_STR(r.images[0].url, "data:image/png;base64,AAAA");
  TH_CHECK_EQ_STR(r.images[0].param, "messages[2].content[1].image_url");
  TH_CHECK_EQ_STR(r.images[1].url, "file:///x.png");
  TH_CHECK_EQ_STR(r.images[1].param, "messages[2].content[3].image_url");
  /* a message without images keeps no parts; one with images keeps all of them */
  TH_CHECK(r.messages[0].parts == NULL && r.messages[0].n_parts == 0);
  const struct fe_api_message *m = &r.messages[2];
  TH_REQUIRE(m->n_parts == 4);
  TH_CHECK(!m->parts[0].is_image && m->parts[1].is_image && !m->parts[2].is_image &&
           m->parts[3].is_image);
  TH_CHECK_EQ_STR(m->parts[0].text, "look ");
  TH_CHECK_EQ_STR(m->parts[2].text, "and");
  TH_CHECK_EQ_STR(m->content, "look \nand");
  fe_api_request_free(&r);
  /* more image parts than a request may carry */
  char big[8192];
  size_t o = (size_t)snprintf(big, sizeof(big), "{\"messages\":[{\"role\":\"user\",\"content\":[");
  for (int i = 0; i <= FE_API_MAX_IMAGES; i++)
    o += (size_t)snprintf(big + o, sizeof(big) - o,
                          "%s{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\"}}",
                          i ? "," : "");
  snprintf(big + o, sizeof(big) - o, "]}]}");
  struct fe_api_error e;
  TH_CHECK(fe_api_parse_request(FE_API_CHAT, big, strlen(big), &cfg, &r, &e) < 0);
  TH_CHECK_EQ_INT(e.status, 400);
  TH_CHECK_EQ_STR(e.param, "messages");
}

TH_TEST(api_prompt_len) {
  struct fe_api_request r;
  struct fe_api_error e;
  const char *b = "{\"prompt\":\"x\",\"max_tokens\":10}";
  parse_ok(FE_API_COMPLETION, b, &r);
  int64_t mt = 0;
  TH_CHECK_EQ_INT(fe_api_check_prompt_len(&r, 90, 100, &mt, &e), 0);
  TH_CHECK_EQ_INT(mt, 10);
  TH_CHECK_EQ_INT(fe_api_check_prompt_len(&r, 91, 100, &mt, &e), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(e.status, 400);
  TH_CHECK_EQ_STR(e.param, "max_tokens");
  TH_CHECK(strstr(e.message, "100") && strstr(e.message, "101") && strstr(e.message, "91"));
  TH_CHECK_EQ_INT(fe_api_check_prompt_len(&r, 100, 100, &mt, &e), CM_ERR_RANGE);
  TH_CHECK_EQ_STR(e.param, "prompt");
  TH_CHECK(strstr(e.message, "100 input tokens") != NULL);
  r.max_tokens = -1;
  TH_CHECK_EQ_INT(fe_api_check_prompt_len(&r, 30, 100, &mt, &e), 0);
  TH_CHECK_EQ_INT(mt, 70);
  fe_api_request_free(&r);
}

/* A body another API's translator must refuse, and the field its error names. */
struct refusal {
  const char *body, *param;
};

static int parse_responses(const char *b, size_t n, struct fe_api_request *r,
                           struct fe_api_error *e) {
  return fe_api_parse_responses(b, n, &cfg, r, e);
}
static int parse_messages(const char *b, size_t n, struct fe_api_request *r,
                          struct fe_api_error *e) {
  return fe_api_parse_messages(0, b, n, &cfg, r, e);
}

/* Each case refused with a 4xx and a message, naming its field. */
static void check_refusals(const struct refusal *cases, size_t n,
                           int (*parse)(const char *, size_t, struct fe_api_request *,
                                        struct fe_api_error *)) {
  for (size_t i = 0; i < n; i++) {
    struct fe_api_request r;
    struct fe_api_error e;
    if (parse(cases[i].body, strlen(cases[i].body), &r, &e) == 0) {
      th_fail(__FILE__, __LINE__, "accepted: %s", cases[i].body);
      fe_api_request_free(&r);
      continue;
    }
    TH_CHECK(e.status == 400 || e.status == 404);
    TH_CHECK(e.message[0] != 0);
    if (strcmp(e.param, cases[i].param))
      th_fail(__FILE__, __LINE__, "%s: param '%s', not '%s' (%s)", cases[i].body, e.param,
              cases[i].param, e.message);
  }
}

/* POST /v1/responses: the items as the chat request's messages, the fields as
 * chat's, the echo; and the refusals naming the Responses fields. */
TH_TEST(api_responses_items) {
  const char *b =
      "{\"model\":\"gemma\",\"instructions\":\"Be brief.\",\"input\":["
      "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
      "{\"type\":\"input_text\",\"text\":\"b\"}]},"
      "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
      "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
      "\"text\":\"ok \"},{\"type\":\"output_text\",\"text\":\"then\"}]},"
      "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":"
      "\"{\\\"x\\\":1}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"2\"},"
      "{\"role\":\"developer\",\"content\":\"d\"}],"
      "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\","
      "\"properties\":{\"x\":{\"type\":\"integer\"}}}}],"
      "\"max_output_tokens\":7,\"temperature\":0.5,\"top_logprobs\":2,"
      "\"metadata\":{\"k\":\"v\"}}";
  struct fe_api_request r;
  struct fe_api_error e;
  int rc = fe_api_parse_responses(b, strlen(b), &cfg, &r, &e);
  if (rc) th_fail(__FILE__, __LINE__, "%s (%s)", e.message, e.param);
  TH_REQUIRE(rc == 0);
  TH_CHECK(r.kind == FE_API_CHAT && r.n == 1 && r.max_tokens == 7 && r.logprobs == 2);
  TH_CHECK(r.temperature == 0.5 && r.tool_answer == 1 && r.grammar_kind != 0);
  /* system, user, assistant (its text and its call, one turn), tool, system */
  TH_REQUIRE(r.n_messages == 5);
  TH_CHECK(r.messages[0].role == FE_API_ROLE_SYSTEM);
  TH_CHECK(strstr(r.messages[0].content, "Be brief.") != NULL);
  TH_CHECK_EQ_STR(r.messages[1].content, "a\nb");
  TH_CHECK(r.messages[2].role == FE_API_ROLE_ASSISTANT);
  /* (the JSON tool protocol writes a turn with calls as its protocol object) */
  TH_CHECK_EQ_STR(r.messages[2].content,
                  "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"x\":1}}]}");
  TH_CHECK(strstr(r.messages[3].content, "call_1") && strstr(r.messages[3].content, "\"2\""));
  TH_CHECK_EQ_STR(r.messages[4].content, "d");
  json_t *echo = json_loads(r.responses, 0, NULL);
  TH_REQUIRE(echo != NULL);
  TH_CHECK_EQ_STR(json_string_value(json_object_get(echo, "instructions")), "Be brief.");
  TH_CHECK(json_integer_value(json_object_get(echo, "max_output_tokens")) == 7);
  TH_CHECK(json_integer_value(json_object_get(echo, "top_logprobs")) == 2);
  TH_CHECK(json_is_false(json_object_get(echo, "store")));
  TH_CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(echo, "metadata"), "k")), "v");
  TH_CHECK_EQ_STR(json_string_value(json_object_get(echo, "tool_choice")), "auto");
  json_decref(echo);
  fe_api_request_free(&r);
  /* a string is one user turn; chat's own parse names chat's fields in these terms */
  static const struct refusal refused[] = {
      {"{\"input\":\"a\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
      {"{\"input\":\"a\",\"background\":true}", "background"},
      {"{\"input\":\"a\",\"include\":[\"file_search_call.results\"]}", "include"},
      {"{\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type"},
      {"{\"input\":\"a\",\"tool_choice\":{\"type\":\"mcp\"}}", "tool_choice"},
      {"{\"input\":[]}", "input"},
      {"{}", "input"},
      {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "input"},
      {"{\"input\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "input[0].role"},
      {"{\"input\":[{\"role\":\"user\"}]}", "input[0].content"},
      {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\"}]}]}",
       "input[0].content[0]"},
      {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}",
       "input[0].arguments"},
      {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0].output"},
      {"{\"input\":[{\"type\":\"computer_call\"}]}", "input[0]"},
      {"{\"input\":\"a\",\"max_output_tokens\":-1}", "max_output_tokens"},
      {"{\"input\":\"a\",\"top_p\":7}", "top_p"},
      {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type"},
      {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "text.format"},
      {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
      {"{\"input\":\"a\",\"truncation\":1}", "truncation"},
      {"{\"input\":\"a\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort"},
      {"{\"input\":\"a\",\"model\":\"other\"}", "model"},
      {"{\"input\":\"a\",\"max_tool_calls\":-1}", "max_tool_calls"},
      {"{\"input\":\"a\",\"prompt_cache_key\":1}", "prompt_cache_key"},
      {"[1]", ""},
      {"{\"input\":", ""},
  };
  check_refusals(refused, CM_ARRAY_LEN(refused), parse_responses);
  const char *s = "{\"input\":\"hi\",\"reasoning\":{\"effort\":\"high\"},\"truncation\":\"auto\"}";
  TH_REQUIRE(fe_api_parse_responses(s, strlen(s), &cfg, &r, &e) == 0);
  TH_CHECK(r.n_messages == 1 && r.messages[0].role == FE_API_ROLE_USER);
  TH_CHECK(r.truncate_turns == 1 && r.truncate_prompt_tokens == 0 && r.thinking == 1);
  fe_api_request_free(&r);
  s = "{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
      "\"schema\":{\"type\":\"integer\"}}}}";
  TH_REQUIRE(fe_api_parse_responses(s, strlen(s), &cfg, &r, &e) == 0);
  TH_CHECK(r.grammar_kind == GR_JSON_SCHEMA && !strcmp(r.grammar_param, "text.format.schema"));
  TH_CHECK(r.checks && !strcmp(r.checks->param, "text.format.schema"));
  fe_api_request_free(&r);
}

/* OpenAI's reasoning_effort as the template's enable_thinking; the request's own
 * chat_template_kwargs win over it, it wins over the server's defaults. */
TH_TEST(api_reasoning_effort) {
  static const struct {
    const char *extra;
    int thinking;
  } cases[] = {
      {"\"reasoning_effort\":\"high\"", 1},
      {"\"reasoning_effort\":\"low\"", 1},
      {"\"reasoning_effort\":\"minimal\"", 0},
      {"\"reasoning_effort\":null", 1}, /* the server's default below */
      {"\"reasoning_effort\":\"none\"", 0},
      {"\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"enable_thinking\":false}", 0},
  };
  struct fe_api_config dcfg = cfg;
  dcfg.default_template_kwargs = "{\"enable_thinking\":true}";
  for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
    char body[256];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],%s}",
             cases[i].extra);
    struct fe_api_request r;
    struct fe_api_error e;
    int rc = fe_api_parse_request(FE_API_CHAT, body, strlen(body), &dcfg, &r, &e);
    if (rc) th_fail(__FILE__, __LINE__, "%s: %s", body, e.message);
    TH_REQUIRE(rc == 0);
    if (r.thinking != cases[i].thinking)
      th_fail(__FILE__, __LINE__, "%s: thinking %d", body, r.thinking);
    fe_api_request_free(&r);
  }
  const char *nope = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"reasoning_effort\":1}";
  struct fe_api_request r;
  struct fe_api_error e;
  TH_CHECK(fe_api_parse_request(FE_API_CHAT, nope, strlen(nope), &cfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "reasoning_effort");
  const char *rb = "{\"input\":\"a\",\"reasoning\":{\"effort\":7}}";
  TH_CHECK(fe_api_parse_responses(rb, strlen(rb), &cfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "reasoning.effort");
}

/* POST /v1/messages: Anthropic's blocks as the chat request's messages (a tool
 * result a tool turn, its images a user turn after it; an assistant's tool_use its
 * calls; thoughts dropped), its fields as chat's; count_tokens as /tokenize; and the
 * refusals naming the Messages fields. */
TH_TEST(api_messages_blocks) {
  const char *b =
      "{\"model\":\"gemma\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"Be \"},"
      "{\"type\":\"text\",\"text\":\"brief.\"}],\"messages\":["
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
      "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\","
      "\"data\":\"iVBO\"}}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
      "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"ok \"},{\"type\":\"text\",\"text\":"
      "\"then\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"x\":1}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
      "\"content\":[{\"type\":\"text\",\"text\":\"2\"},{\"type\":\"text\",\"text\":\"3\"},"
      "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"file:///x.png\"}}]},"
      "{\"type\":\"text\",\"text\":\"next\"}]}],"
      "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\","
      "\"properties\":{\"x\":{\"type\":\"integer\"}}}}],"
      "\"tool_choice\":{\"type\":\"any\"},\"stop_sequences\":[\"##\"],\"temperature\":0.5,"
      "\"top_k\":5,\"metadata\":{\"user_id\":\"u\"}}";
  struct fe_api_request r;
  struct fe_api_error e;
  int rc = fe_api_parse_messages(0, b, strlen(b), &cfg, &r, &e);
  if (rc) th_fail(__FILE__, __LINE__, "%s (%s)", e.message, e.param);
  TH_REQUIRE(rc == 0);
  TH_CHECK(r.kind == FE_API_CHAT && r.anthropic == FE_API_ANTHROPIC && r.n == 1);
  TH_CHECK(r.max_tokens == 9 && r.temperature == 0.5 && r.top_k == 5 && r.tool_answer == 1);
  TH_CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "##"));
  /* system, user (text, image), assistant (text and call), tool, user (the result's
   * image, then next) */
  TH_REQUIRE(r.n_messages == 5);
  TH_CHECK(r.messages[0].role == FE_API_ROLE_SYSTEM);
  TH_CHECK(strstr(r.messages[0].content, "Be brief.") != NULL);
  TH_CHECK(r.messages[1].role == FE_API_ROLE_USER && r.messages[1].n_parts == 2);
  TH_REQUIRE(r.n_images == 2);
  TH_CHECK_EQ_STR(r.images[0].url, "data:image/png;base64,iVBO");
  TH_CHECK_EQ_STR(r.images[0].param, "messages[0].content[1].source");
  TH_CHECK_EQ_STR(r.images[1].url, "file:///x.png");
  TH_CHECK_EQ_STR(r.images[1].param, "messages[2].content[0].content[2].source");
  TH_CHECK(r.messages[2].role == FE_API_ROLE_ASSISTANT);
  TH_CHECK(strstr(r.messages[2].content, "ok then") == NULL); /* a turn with calls: the call */
  TH_CHECK_EQ_STR(r.messages[2].content,
                  "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"x\":1}}]}");
  TH_CHECK(strstr(r.messages[3].content, "toolu_1") && strstr(r.messages[3].content, "2\\n3"));
  TH_CHECK(r.messages[4].role == FE_API_ROLE_USER && r.messages[4].n_parts == 2);
  TH_CHECK_EQ_STR(r.messages[4].content, "next");
  fe_api_request_free(&r);

  /* Gemma 4's native tools: two results answer one turn's calls, the first with an
   * image, which goes after both; the image's block named through the rewriting */
  struct fe_api_model g4 = {.reasoning = 1, .native_tools = 1};
  for (int i = 0; i < FE_G4_N_MARKERS; i++)
    g4.marker[i] = 100 + i;
  const struct fe_api_config ncfg = {"gemma", 1000, &g4};
  const char *nb =
      "{\"model\":\"gemma\",\"max_tokens\":9,\"tools\":[{\"name\":\"f\",\"input_schema\":{"
      "\"type\":\"object\"}}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
      "\"text\":\"a\"},{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"file:///"
      "a.png\"}}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
      "\"f\",\"input\":{}},{\"type\":\"tool_use\",\"id\":\"t2\",\"name\":\"f\",\"input\":{}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and\"},{\"type\":"
      "\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"image\",\"source\":{"
      "\"type\":\"url\",\"url\":\"file:///b.png\"}}]},{\"type\":\"tool_result\",\"tool_use_id\":"
      "\"t2\",\"content\":\"ok\"}]}]}";
  rc = fe_api_parse_messages(0, nb, strlen(nb), &ncfg, &r, &e);
  if (rc) th_fail(__FILE__, __LINE__, "%s (%s)", e.message, e.param);
  TH_REQUIRE(rc == 0);
  TH_REQUIRE(r.n_images == 2);
  TH_CHECK_EQ_STR(r.images[0].param, "messages[0].content[1].source");
  TH_CHECK_EQ_STR(r.images[1].param, "messages[2].content[1].content[0].source");
  fe_api_request_free(&r);
  /* a result for no call: the chat parse's error in the Messages request's terms */
  const char *nocall =
      "{\"model\":\"gemma\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
      "\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
      "\"tool_use_id\":\"t1\",\"content\":\"1\"},{\"type\":\"tool_result\",\"tool_use_id\":"
      "\"t9\",\"content\":\"2\"}]}]}";
  TH_CHECK(fe_api_parse_messages(0, nocall, strlen(nocall), &ncfg, &r, &e) != 0);
  TH_CHECK_EQ_STR(e.param, "messages[2].content[1].tool_use_id");
  TH_CHECK(strstr(e.message, "'messages[2].content[1].tool_use_id'") != NULL);
  TH_CHECK(strstr(e.message, "tool_call_id") == NULL);

  /* count_tokens: the same messages as /tokenize's, max_tokens not needed */
  const char *cnt = "{\"model\":\"gemma\",\"system\":\"s\",\"messages\":[{\"role\":\"user\","
                    "\"content\":\"hi\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}}";
  TH_REQUIRE(fe_api_parse_messages(1, cnt, strlen(cnt), &cfg, &r, &e) == 0);
  TH_CHECK(r.kind == FE_API_TOKENIZE && r.anthropic == FE_API_ANTHROPIC_COUNT);
  TH_CHECK(r.n_messages == 2 && r.add_generation_prompt == 1 && r.thinking == 1);
  fe_api_request_free(&r);
  /* tool_choice and thinking, output_format */
  static const struct {
    const char *extra;
    const char *check;
  } ok[] = {
      {"\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}", "named"},
      {"\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}", "auto"},
      {"\"tool_choice\":{\"type\":\"none\"}", "none"},
      {"\"thinking\":{\"type\":\"disabled\"}", "nothink"},
      {"\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}", "think"},
      {"\"output_format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"integer\"}}", "schema"},
      {"\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"integer\"}}}",
       "schema"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(ok); i++) {
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\":\"gemma\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"a\"}],%s%s}",
             strstr(ok[i].extra, "tool_choice")
                 ? "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}},"
                   "{\"name\":\"g\",\"input_schema\":{\"type\":\"object\"}}],"
                 : "",
             ok[i].extra);
    rc = fe_api_parse_messages(0, body, strlen(body), &cfg, &r, &e);
    if (rc) th_fail(__FILE__, __LINE__, "%s: %s (%s)", body, e.message, e.param);
    if (rc) continue;
    const char *c = ok[i].check;
    if (!strcmp(c, "none"))
      TH_CHECK(r.tool_answer == 0);
    else if (!strcmp(c, "think") || !strcmp(c, "nothink"))
      TH_CHECK(r.thinking == !strcmp(c, "think"));
    else if (!strcmp(c, "schema"))
      TH_CHECK(r.grammar_kind == GR_JSON_SCHEMA &&
               !strcmp(r.grammar_param, strstr(ok[i].extra, "output_config")
                                            ? "output_config.format.schema"
                                            : "output_format.schema"));
    else
      TH_CHECK(r.tool_answer == 1 && r.grammar_kind != 0);
    fe_api_request_free(&r);
  }
  static const struct refusal refused[] = {
      {"{\"model\":\"gemma\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "max_tokens"},
      {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "model"},
      {"{\"model\":\"other\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]"
       "}",
       "model"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[]}", "messages"},
      {"{\"model\":\"gemma\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]"
       "}",
       "max_tokens"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"a\"}"
       "]}",
       "messages[0].role"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":7}]}",
       "messages[0].content"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{"
       "\"type\":\"document\"}]}]}",
       "messages[0].content[0]"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{"
       "\"type\":\"image\",\"source\":{\"type\":\"file\",\"file_id\":\"f\"}}]}]}",
       "messages[0].content[0].source"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{"
       "\"type\":\"tool_result\",\"content\":\"x\"}]}]}",
       "messages[0].content[0].tool_use_id"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\",\"content\":[{"
       "\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":\"{}\"}]}]}",
       "messages[0].content[0].input"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}",
       "tools[0]"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"tools\":[{\"input_schema\":{\"type\":\"object\"}}]}",
       "tools[0].name"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"tool_choice\":{\"type\":\"required\"}}",
       "tool_choice"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{"
       "\"type\":\"tool\","
       "\"name\":\"g\"}}",
       "tool_choice.name"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"tools\":[5]}",
       "tools[0]"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},\"chat_template_kwargs\":5}",
       "chat_template_kwargs"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":10}}",
       "thinking.budget_tokens"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"stop_sequences\":\"x\"}",
       "stop_sequences"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"stop_sequences\":[1]}",
       "stop_sequences"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"mcp_servers\":[]}",
       "mcp_servers"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"output_format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\"}},"
       "\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":{}}}}",
       "output_config.format"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"output_config\":{\"effort\":\"low\"}}",
       "output_config"},
      {"{\"model\":\"gemma\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
       "\"temperature\":5}",
       "temperature"},
      {"[1]", ""},
      {"{\"model\":", ""},
  };
  check_refusals(refused, CM_ARRAY_LEN(refused), parse_messages);
}
