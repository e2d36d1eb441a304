/* fe-api.h — OpenAI request parsing and validation.
 *
 * fe_api_parse_request() turns the JSON body of /v1/completions,
 * /v1/chat/completions, /tokenize or /detokenize into a struct
 * fe_api_request that the serving path forwards. Every mistake is a 400
 * (404 for an unknown model) with `param` naming the field and a message
 * saying what is wrong; nothing the client sends can abort the process.
 * Numbers Jansson cannot hold (an integer past 64 bits, 1e999) and values
 * that are not JSON (NaN) are 400s naming their field too.
 * The request owns its memory (a capped arena): free it with
 * fe_api_request_free(). */
#ifndef LMSERVE_FE_API_H
#define LMSERVE_FE_API_H
#include <stddef.h>
#include <stdint.h>

#include "common/cm-arena.h"
#include "frontend/fe-g4.h"

#define FE_API_MAX_STOP           16  /* stop strings per request */
#define FE_API_MAX_STOP_TOKEN_IDS 64  /* stop token ids per request */
#define FE_API_MAX_LOGPROBS       20  /* top logprobs per token */
#define FE_API_MAX_N              128 /* choices per request */
#define FE_API_MAX_BEAMS          10  /* beams: each step asks 2 n logprobs, at most 20 */
#define FE_API_MAX_LOGIT_BIAS     1024 /* logit_bias entries (proto's PR_MAX_LOGIT_BIAS) */
#define FE_API_MAX_PROMPTS        256 /* prompts in one completions request */
#define FE_API_MAX_BAD_WORDS      128 /* bad_words per request */
#define FE_API_MAX_BAD_WORD_BYTES 256 /* bytes of one of them */
#define FE_API_MAX_IMAGES         64  /* image and audio parts in one chat request */
#define FE_API_MAX_GRAMMAR        32768 /* bytes of a constraint's text (proto's limit) */
#define FE_API_MAX_REQUEST_ID     128   /* bytes of a client's X-Request-Id */

enum fe_api_kind {
  FE_API_COMPLETION, /* POST /v1/completions */
  FE_API_CHAT,       /* POST /v1/chat/completions */
  FE_API_TOKENIZE,   /* POST /tokenize: prompt or messages */
  FE_API_DETOKENIZE, /* POST /detokenize: tokens in prompts[0].ids */
};

enum fe_api_role { FE_API_ROLE_SYSTEM, FE_API_ROLE_USER, FE_API_ROLE_ASSISTANT };

struct fe_api_prompt {
  const char *text;   /* NUL-terminated; NULL when given as token ids */
  size_t text_len;    /* bytes */
  const int32_t *ids; /* (n_ids) token ids; NULL when given as text */
  size_t n_ids;       /* tokens */
};

/* One part of a message's content, kept when the message has an image or an
 * audio clip (the chat template then sees the parts, as transformers passes
 * them). */
struct fe_api_part {
  int is_image;     /* 1: an image_url part (its url is in the request's images) */
  int is_audio;     /* 1: an input_audio part (its data is in the request's images) */
  const char *text; /* text parts: NUL-terminated */
  size_t text_len;
};

struct fe_api_message {
  enum fe_api_role role;
  const char *content; /* NUL-terminated; text parts joined with "\n" */
  size_t content_len;  /* bytes */
  const struct fe_api_part *parts; /* (n_parts) when the content has media, else NULL */
  size_t n_parts;
  /* A JSON object's text: the fields beyond role and content that the chat
   * template sees (Gemma 4's native tools: "tool_calls" with arguments as
   * objects, "tool_responses"); NULL: none. */
  const char *extra;
};

/* A media part: an image_url part's URL (data:, file://, http(s)://) as
 * given, or an input_audio part's base64 data and format ("wav", "mp3");
 * fetched and decoded by the serving path. */
struct fe_api_image {
  int audio;       /* 1: an input_audio part */
  const char *url; /* NUL-terminated: the URL, or the audio's base64 data */
  size_t url_len;
  char format[8]; /* audio: its "format" */
  char param[64]; /* "messages[1].content[2].image_url" / "...input_audio", for errors */
};

struct fe_api_request {
  enum fe_api_kind kind;
  const char *model;             /* the served model's name (validated) */
  struct fe_api_prompt *prompts; /* (n_prompts) completions, tokenize, detokenize */
  size_t n_prompts;
  struct fe_api_message *messages; /* (n_messages) chat, tokenize */
  size_t n_messages;
  struct fe_api_image *images; /* (n_images) the messages' image and audio parts in order */
  size_t n_images;
  size_t n_audio;            /* of them, input_audio parts */
  int64_t max_tokens;        /* tokens; -1: up to the context limit */
  int64_t min_tokens;        /* tokens; 0 by default */
  double temperature;        /* [0, 2]; default 1 */
  double top_p;              /* (0, 1]; default 1 */
  int32_t top_k;             /* -1 (off) or >= 1 */
  double min_p;              /* [0, 1]; default 0 */
  double presence_penalty;   /* [-2, 2] */
  double frequency_penalty;  /* [-2, 2] */
  double repetition_penalty; /* (0, 2]; default 1 */
  int has_seed;
  int64_t seed;
  const char **stop; /* (n_stop) NUL-terminated stop strings */
  size_t n_stop;
  int32_t *stop_token_ids; /* (n_stop_token_ids) */
  size_t n_stop_token_ids;
  /* Token-id fields are parsed as ids in [0, INT32_MAX]; the serving path
   * checks them against the vocabulary (400 naming the field). */
  int32_t *logit_bias_ids; /* (n_logit_bias) logit_bias keys */
  float *logit_bias;       /* (n_logit_bias) biases in [-100, 100] */
  size_t n_logit_bias;
  int32_t *allowed_token_ids; /* (n_allowed_token_ids) as given */
  size_t n_allowed_token_ids;
  /* What the sampler takes: logit_bias, or with allowed_token_ids each allowed id
   * once with its logit_bias (0 when it has none) and allowed_only set (only these
   * may be drawn); at most FE_API_MAX_LOGIT_BIAS */
  int32_t *bias_ids;
  float *bias;
  size_t n_bias;
  int allowed_only;
  /* bad_words (vLLM's): the words (NUL-terminated, in the arena), then, once the
   * tokenizing job ran, their token sequences one after another in bad_ids (malloc'd;
   * sequence i has bad_lens[i] >= 1 ids) */
  const char **bad_words;
  size_t n_bad_words;
  uint32_t *bad_ids;
  size_t n_bad_ids;
  uint32_t *bad_lens;
  size_t n_bad_seqs;
  int n;      /* choices run per prompt, >= 1 (with beam: the beams; with n_keep:
                 best_of) */
  int n_keep; /* best_of above n (vLLM's, OpenAI's): the n choices of each prompt's n (best_of)
                 that the answer keeps, those with the highest cumulative logprob; 0: all */
  int beam;              /* use_beam_search (vLLM's): n beams, each step ranking 2 n candidates per
                            beam by raw logprob (fe-engine-beam.c) */
  double length_penalty; /* beam: a beam's score is its cumulative logprob over its length
                            (prompt included) to this power; 1 by default */
  int logprobs; /* top logprobs per token; -1: no logprobs */
  int prompt_logprobs; /* vLLM's prompt_logprobs: top entries of each prompt token's logprob
                          (-1: not asked); completions' echo with logprobs asks them too */
  int tokens_as_ids; /* return_tokens_as_token_ids (vLLM's): logprobs' tokens as "token_id:N" */
  int token_strs;    /* /tokenize: return_token_strs (vLLM's), each token's vocabulary string */
  int template_only; /* /apply-template (llama.cpp's): a /tokenize request of messages whose
                        answer is the rendered chat's text, not its tokens */
  int return_token_ids; /* return_token_ids (vLLM's): the prompt's and the answer's token ids */
  uint64_t cache_salt; /* vLLM's cache_salt, hashed (0: none): the prefix cache is shared only
                          among requests with the same salt */
  int lora;            /* the LoRA adapter "model" named: 1 .. fe_api_config.n_loras, 0 = none */
  uint64_t lora_sum;   /* with lora: the adapter list's md_lora_list_sum, for the scheduler */
  uint64_t lora_uid;   /* a run-time adapter named (fe_api_config.run_loras): its id, and */
  const char *lora_path; /* its path (in the arena); 0 and NULL: none */
  int echo;          /* completions: each choice's text after its prompt's; chat: after the last
                        message's content when that is the assistant's (vLLM's echo) */
  int stream;
  int include_usage;    /* stream_options.include_usage */
  int continuous_usage; /* stream_options.continuous_usage_stats (vLLM): usage in every chunk */
  int ignore_eos;
  int add_generation_prompt;      /* chat / tokenize with messages; default 1 */
  int continue_final_message;     /* the same (vLLM): the rendered chat cut after the last
                                     message's text, which the model then continues */
  int32_t truncate_prompt_tokens; /* vLLM's: each prompt's last k tokens only (-1: the last
                                     max_model_len); 0: off */
  int truncate_turns; /* the Responses API's truncation "auto": a chat too long for the context
                         (with room for max_tokens, or one token) loses its fewest oldest turns
                         that make it fit (fe-engine-req.c's job_truncate) */
  int add_special_tokens;         /* tokenize; default 1 (completions), 0 (chat) */
  int skip_special_tokens;        /* detokenization drops special tokens; default 1 */
  int include_stop_str_in_output; /* keep the matched stop string; default 0 */
  int32_t priority;               /* scheduling priority as in vLLM: lower first; default 0 */
  /* Structured output (response_format, structured_outputs, guided_*): grammar/gr.h's
   * enum gr_kind (0: none) and its text (compact JSON for choices and schemas);
   * grammar_param names the field it came from. */
  int grammar_kind;
  const char *grammar;
  size_t grammar_len;
  char grammar_param[48];
  /* The grammars to compile before the request is queued, in the order the parse met
   * them (fe_api_check_grammars): the constraint above and each tool's parameter
   * schema. The parse does not compile them: a hostile regex can take the compiler
   * most of a second to refuse, and the parse runs on the event loop. */
  struct fe_api_grammar_check *checks;
  /* Tools (chat): 1 when the answer is a tool-call protocol object to turn into
   * message.tool_calls or content (fe_api_tool_answer); the protocol's
   * instruction and the tool messages of the history were written into the
   * messages as the chat template sees them. */
  int tool_answer;
  int legacy_functions; /* the tools came as OpenAI's deprecated functions: the answer's call
                           is message.function_call, finish reason "function_call" */
  /* Chat: chat_template_kwargs over the server's defaults, a JSON object's text the
   * template gets as variables (NULL: none); thinking: its enable_thinking is true. */
  const char *template_kwargs;
  /* Chat: the request's own template (vLLM's chat_template, or chat_template_kwargs'
   * chat_template; served with --trust-request-chat-template only), or NULL */
  const char *chat_template;
  int thinking;
  /* Chat and /tokenize with messages: mm_processor_kwargs.max_soft_tokens, Gemma 4's
   * soft-token budget per image (70, 140, 280, 560 or 1120); 0 = the model's default. */
  int max_soft_tokens;
  /* Gemma 4's notation in the answer: fe-g4.h's FE_G4_REASONING | FE_G4_TOOLS
   * (0: the text is all content). */
  unsigned g4;
  /* Native tools: the request's tools (a JSON array's text) for the template; NULL
   * when the template gets none. */
  const char *tools_json;
  /* /v1/audio/transcriptions and /translations (a chat request underneath): the
   * answer's form, enum fe_api_audio_format; 0 for the other endpoints */
  int audio_api;
  /* POST /v1/responses (a chat request underneath): the fields its response object
   * echoes (a JSON object's text, fe-responses.h); NULL for the other endpoints */
  const char *responses;
  /* The Responses API's store (fe-rstore.h) that keeps the answer (NULL: it is not
   * kept), with the conversation before it (a JSON array of chat messages, without
   * the instructions) and its input items (a JSON array, each with an id) */
  struct fe_rstore *store;
  const char *responses_conv;
  const char *responses_input;
  /* POST /v1/messages (Anthropic's Messages API, a chat request underneath):
   * FE_API_ANTHROPIC; /v1/messages/count_tokens (a /tokenize request underneath):
   * FE_API_ANTHROPIC_COUNT; 0 for the other endpoints */
  int anthropic;
  /* the client's X-Request-Id (or, with --enable-request-id-headers, one made): the
   * answer's id is the endpoint's prefix and it ("chatcmpl-ID"), as vLLM makes it;
   * NULL: a random id */
  const char *client_id;
  struct cm_arena arena;          /* owns every pointer above */
};

enum fe_api_anthropic {
  FE_API_ANTHROPIC = 1,       /* the answer is a message object or its events (fe-messages.h) */
  FE_API_ANTHROPIC_COUNT = 2, /* the answer is {"input_tokens": N} */
};

enum fe_api_audio_format {
  FE_API_AUDIO_JSON = 1, /* {"text": ..., "usage": ...} */
  FE_API_AUDIO_TEXT = 2, /* the text alone, text/plain */
};

/* One grammar to compile (fe_api_request.checks): a refusal is a 400 naming param. */
struct fe_api_grammar_check {
  struct fe_api_grammar_check *next;
  int kind;         /* enum gr_kind */
  const char *text; /* in the request's arena */
  size_t len;
  char param[64];
};

struct fe_api_error {
  int status;     /* HTTP status: 400, 404, ... */
  char param[64]; /* offending field ("top_p", "messages[2].role"), "" for none */
  char message[320];
};

/* What the served checkpoint's tokenizer and chat template offer (the serving
 * path finds out when it loads them). */
struct fe_api_model {
  int32_t marker[FE_G4_N_MARKERS]; /* Gemma 4's markers as special token ids; -1: none */
  int reasoning;    /* <|channel> and <channel|> are tokens: thoughts are read apart */
  int native_tools; /* Gemma 4's tool tokens, and a chat template that renders `tools` */
};

struct md_sampling; /* model/md-config.h */
struct fe_rstore;   /* fe-rstore.h */

/* A LoRA adapter loaded at run time (POST /v1/load_lora_adapter): its name, its path
 * and the id the scheduler knows it by. */
struct fe_api_lora {
  char *name, *path;
  uint64_t uid;
};

struct fe_api_config {
  const char *model_name; /* the served model; requests may also omit "model" */
  int64_t max_model_len;  /* tokens; 0: unknown (no length checks) */
  const struct fe_api_model *model; /* NULL: plain text, the JSON tool protocol */
  /* --default-chat-template-kwargs: a JSON object's text (NULL: none), under each
   * request's chat_template_kwargs */
  const char *default_template_kwargs;
  /* the checkpoint's sampling defaults (--generation-config), for the fields a
   * request leaves out; its max_tokens caps every request's (NULL: none) */
  const struct md_sampling *defaults;
  /* further names the model answers to (vLLM's --served-model-name a b): a request
   * naming one gets it back as its answer's "model" */
  const char *const *aliases;
  int n_aliases;
  /* the LoRA adapters served as models of their own (--lora-modules), in order: a
   * request naming loras[i] runs with adapter i + 1; lora_sum is the list's sum */
  const char *const *loras;
  int n_loras;
  uint64_t lora_sum;
  /* the Responses API's store (fe-rstore.h; NULL: off), for previous_response_id and
   * the answers it keeps */
  struct fe_rstore *store;
  /* vLLM's --max-logprobs: top logprobs a request may ask for (logprobs, top_logprobs,
   * prompt_logprobs), 1 .. PR_MAX_TOP_LOGPROBS; 0: FE_API_MAX_LOGPROBS (vLLM's 20) */
  int max_logprobs;
  /* vLLM's --scheduling-policy fcfs: a request's priority other than 0 is a 400 (0:
   * priorities are honoured, the policy "priority") */
  int fcfs;
  /* the LoRA adapters loaded at run time, served as models of their own too */
  const struct fe_api_lora *run_loras;
  int n_run_loras;
};

/* Parses and validates body[0..len). Returns 0 and fills `out`, or a
 * negative cm_err and fills `err` (then `out` needs no freeing). */
int fe_api_parse_request(enum fe_api_kind kind, const char *body, size_t len,
                         const struct fe_api_config *cfg, struct fe_api_request *out,
                         struct fe_api_error *err);
void fe_api_request_free(struct fe_api_request *r);

/* Compiles r->checks in order: 0, or a negative cm_err with err filled (a 400 naming
 * the field and why; 413 when out of memory). A grammar may take the compiler most
 * of a second: the server calls it on the thread pool, before tokenizing. */
int fe_api_check_grammars(const struct fe_api_request *r, struct fe_api_error *err);

/* POST /v1/audio/transcriptions (translate 0) and /v1/audio/translations
 * (translate 1): the multipart form body[0..len) (ctype: its Content-Type)
 * with OpenAI's fields file (WAV or MP3), model, language (ISO 639-1; and vLLM's
 * to_language, a translation's target),
 * response_format ("json", "text") and temperature (0 by default here), and vLLM's sampling
 * fields (top_p, top_k, min_p, seed, the penalties, max_completion_tokens),
 * turned into a chat request: one user turn of the instruction ("Transcribe
 * this audio into German:"; translations: "Translate this audio from German
 * into English:") then the clip.
 * `stream` true streams OpenAI's transcript.text events (fe-sse.h).
 * `prompt`, timestamps and `include[]` are refused by name. 0 or a
 * negative cm_err with err filled, as fe_api_parse_request. */
int fe_api_parse_audio(int translate, const char *ctype, size_t ctype_len, const char *body,
                       size_t len, const struct fe_api_config *cfg, struct fe_api_request *out,
                       struct fe_api_error *err);

/* POST /v1/responses (OpenAI's Responses API, as vLLM serves it): body[0..len)
 * turned into the chat request underneath. `instructions` is a system turn;
 * `input` a string (one user turn) or items: messages (input_text, input_image,
 * input_audio parts; an assistant's output_text), function_call items (the
 * assistant's tool calls; in a row, one turn) and function_call_output items
 * (tool turns); reasoning items are dropped as the chat template drops thoughts.
 * max_output_tokens, function tools, tool_choice, text.format, top_logprobs with
 * include's message.output_text.logprobs, truncation, reasoning.effort (low,
 * medium, high: enable_thinking) and vLLM's sampling fields are taken. With
 * cfg->store, the answer is kept unless `store` is false, and previous_response_id
 * puts a kept response's conversation first (404 when it is not kept);
 * conversation, background and stored prompts are refused by name, as are hosted
 * tools. Errors name the Responses fields
 * ("input[2].content[0]", "max_output_tokens"). 0, or a negative cm_err with err
 * filled, as fe_api_parse_request. */
int fe_api_parse_responses(const char *body, size_t len, const struct fe_api_config *cfg,
                           struct fe_api_request *out, struct fe_api_error *err);

/* POST /v1/messages (count 0) and /v1/messages/count_tokens (count 1): Anthropic's
 * Messages API, as vLLM and llama.cpp's server take it, turned into the chat request
 * underneath (count_tokens: the /tokenize request of the same messages). `system` (a
 * string or text blocks) is a system turn; each message's content a string or blocks:
 * a user's text, image (base64 or url source) and tool_result blocks (each a tool
 * message, its images a user turn after it), an assistant's text and tool_use blocks
 * (its tool_calls; thinking blocks are dropped as the chat template drops thoughts).
 * max_tokens (required here, not for count_tokens), stop_sequences, temperature,
 * top_p, top_k, custom tools (input_schema), tool_choice (auto, any, tool, none;
 * disable_parallel_tool_use), thinking (enabled: the template's enable_thinking; the
 * budget is not enforced apart from max_tokens), output_format or
 * output_config.format (a JSON Schema), metadata, and vLLM's sampling fields are
 * taken. Anthropic's server and client tools, container, mcp_servers and
 * context_management are refused by name. Errors name the Messages fields
 * ("messages[2].content[0].tool_use_id", "stop_sequences"). 0, or a negative cm_err
 * with err filled, as fe_api_parse_request. */
int fe_api_parse_messages(int count, const char *body, size_t len, const struct fe_api_config *cfg,
                          struct fe_api_request *out, struct fe_api_error *err);

/* A tool-call answer (fe_api_request.tool_answer): the generated text as the
 * protocol object {"tool_calls": [{"name", "arguments"}]} or {"response": s}.
 * With calls: *calls (malloc'd) is the OpenAI tool_calls array's JSON, each
 * call with a fresh "call_..." id and its arguments as a JSON string, and
 * *content NULL; with a response: *content (malloc'd) its text. Text that is
 * neither (cut by max_tokens) gives both NULL: the caller keeps the text as
 * the content. A call's arguments are the JSON text the model wrote (what a
 * stream sent of them, fe_api_tool_scan). */
void fe_api_tool_answer(const char *text, size_t len, char **calls, char **content);

/* What a tool-call answer's text so far says of its calls, as it streams: for each
 * call whose name has been read, the name's span and its arguments' text so far
 * (the JSON value as the model writes it, from args_at once args_len > 0;
 * args_done once it is whole). A call's
 * arguments only ever grow as the text does, so a stream sends their new bytes;
 * joined they are the arguments fe_api_tool_answer gives. The number of calls
 * found (at most max), or 0 for an answer that is a response or not yet a call. */
struct fe_api_tool_span {
  size_t name_at, name_len;
  size_t args_at, args_len;
  int args_done;
};
size_t fe_api_tool_scan(const char *text, size_t len, struct fe_api_tool_span *calls, size_t max);

/* The length check the serving path calls once it knows how many tokens a
 * prompt has: the prompt must leave room for at least one generated token,
 * and prompt + max_tokens must fit in max_model_len. On success returns 0
 * and sets *max_tokens_out to the tokens the request may generate (its
 * max_tokens, or what is left of the context when it gave none). Otherwise
 * returns CM_ERR_RANGE with a 400 in `err` that gives both numbers. */
int fe_api_check_prompt_len(const struct fe_api_request *r, int64_t n_prompt_tokens,
                            int64_t max_model_len, int64_t *max_tokens_out,
                            struct fe_api_error *err);

#endif
