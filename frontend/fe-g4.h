/* fe-g4.h — Gemma 4's output notation: the thinking channel
 * (`<|channel>thought\n ... <channel|>`) and native tool calls
 * (`<|tool_call>call:NAME{key:value,...}<tool_call|>`, strings between `<|"|>`
 * tokens, several calls one after another), split out of generated text as it
 * streams.
 *
 * The markers are special tokens of Gemma 4's tokenizer; the serving path looks
 * their strings up in the checkpoint's tokenizer (fe_g4_markers_find) and turns
 * parsing on only when they are there. The detokenizer then writes those tokens
 * as their strings, and the splitter reads them back out of the text:
 *
 *   struct fe_g4_split s;
 *   fe_g4_split_init(&s, FE_G4_REASONING | FE_G4_TOOLS);
 *   fe_g4_split_push(&s, text, len, &out);   // as text arrives: deltas in out
 *   fe_g4_split_flush(&s, &out);             // at the end
 *   fe_g4_split_free(&s);
 *
 * Text that could still become a marker (a tail like "<|chan") is held back
 * until the next push decides, so no piece of a marker ever reaches the content
 * or the reasoning. Allocates only the buffers it grows. */
#ifndef LMSERVE_FE_G4_H
#define LMSERVE_FE_G4_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-http-buf.h"

enum fe_g4_marker {
  FE_G4_CHANNEL,      /* <|channel>: a channel (the thought) opens */
  FE_G4_CHANNEL_END,  /* <channel|> */
  FE_G4_CALL,         /* <|tool_call> */
  FE_G4_CALL_END,     /* <tool_call|> */
  FE_G4_QUOTE,        /* <|"|>: around strings in calls */
  FE_G4_RESPONSE,     /* <|tool_response>: what the model stops on after its calls */
  FE_G4_RESPONSE_END, /* <tool_response|> */
  FE_G4_THINK,        /* <|think|>: thinking on, in the system turn */
  FE_G4_N_MARKERS,
};

/* The marker's text (a special token's content in Gemma 4's tokenizer). */
const char *fe_g4_marker_str(enum fe_g4_marker m);

/* What the splitter reads out of the text. */
enum {
  FE_G4_REASONING = 1,    /* <|channel>...<channel|> goes to reasoning */
  FE_G4_TOOLS = 2,        /* <|tool_call>...<tool_call|> becomes calls */
  FE_G4_STREAM_CALLS = 4, /* with FE_G4_TOOLS: calls also as deltas while they are read */
};

/* What one push or flush gives: appended to (the caller resets them). */
struct fe_g4_out {
  struct fe_buf content;   /* the answer's text */
  struct fe_buf reasoning; /* the thought, without its "thought\n" label */
  struct fe_buf calls;     /* complete calls, each {"name":..,"arguments":"<JSON>"}, comma
                            * separated (a JSON array's inside) */
  size_t n_calls;          /* calls in `calls` */
  /* FE_G4_STREAM_CALLS: the calls as they are read, comma separated: {"name":..} when
   * a call's name is known, then {"arguments":..} fragments of its arguments' JSON
   * text, which joined are the arguments `calls` gets when the call ends (a call
   * cut by the end of the text, or that turns out not to be one, stays what its
   * deltas said: its text does not go to the content as it does unstreamed) */
  struct fe_buf deltas;
  size_t n_deltas;
};

void fe_g4_out_init(struct fe_g4_out *o);
void fe_g4_out_reset(struct fe_g4_out *o);
void fe_g4_out_free(struct fe_g4_out *o);

struct fe_g4_split {
  unsigned flags;
  int mode;           /* content, reasoning, call */
  int label;          /* in reasoning: the "thought\n" label may still come */
  struct fe_buf hold; /* text not yet placed: a tail that may start a marker */
  struct fe_buf call; /* the call being read (after <|tool_call>) */
  struct fe_buf conv; /* FE_G4_STREAM_CALLS: its arguments' JSON so far */
  size_t call_sent;   /* bytes of conv given as deltas */
  int call_open;      /* its name was given */
};

void fe_g4_split_init(struct fe_g4_split *s, unsigned flags);
void fe_g4_split_free(struct fe_g4_split *s);
/* Reads text[0..n) into out. 0, or CM_ERR_NOMEM. */
int fe_g4_split_push(struct fe_g4_split *s, const char *text, size_t n, struct fe_g4_out *out);
/* The end of the text: what was held back goes where it stood (a call never
 * closed is given back as content, its marker included). */
int fe_g4_split_flush(struct fe_g4_split *s, struct fe_g4_out *out);

/* One call's text between the markers, `call:NAME{key:value,...}`, as JSON:
 * *name and *args (malloc'd; args a JSON object's text). Values: strings between
 * <|"|>, numbers, true, false, null, {..} and [..]; keys bare or quoted.
 * CM_ERR_PARSE when the text is not a call. */
int fe_g4_parse_call(const char *s, size_t n, char **name, char **args);

#endif

/* A GBNF grammar (grammar/gr.h's GR_GRAMMAR) for calls only, in Gemma 4's
 * notation: one call (several when parallel) of the tools in `tools` (a JSON
 * array of {"name", "parameters"}; only `only` when not NULL), each call's
 * arguments following its parameter schema: type (and lists of types), properties
 * (in the order Gemma 4's template writes them: sorted), required, enum, const,
 * items (one schema), anyOf / oneOf (whose branches the JSON Schema compiler
 * must tell apart: the request's checks compile each schema), a string's
 * minLength / maxLength; annotations and additionalProperties (only the listed
 * properties are written) are taken; any other keyword, an object or array in
 * enum / const, and schemas nested deeper than 16 are refused: CM_ERR_INVAL with "keyword 'K' at
 * tools[I].function.parameters/POINTER ..." in err and that tool's
 * "tools[I].function.parameters" in param[64], the request's 400.
 * marker: the special token ids of FE_G4_CALL, FE_G4_CALL_END and FE_G4_QUOTE.
 * *out is malloc'd. 0, CM_ERR_INVAL, or CM_ERR_NOMEM. */
struct json_t;
int fe_g4_tools_grammar(const struct json_t *tools, const char *only, int parallel,
                        const int32_t *marker, char **out, char *param, char *err, size_t errlen);
