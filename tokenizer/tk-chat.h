/* tk-chat.h — chat templates: turn OpenAI-style messages into the prompt
 * text a checkpoint expects, by rendering its Jinja chat_template
 * (tk-jinja.h) the way Hugging Face's apply_chat_template does.
 *
 * The template comes from a model directory's chat_template.jinja when
 * present, else from tokenizer_config.json's "chat_template" (a string, or
 * a list of {name, template} where "default" is used). It is parsed once at
 * load: an unsupported construct fails the load, not a request.
 *
 * Render variables: messages, add_generation_prompt, every
 * tokenizer_config.json entry whose key ends in "_token" (bos_token,
 * eos_token, pad_token, ...; AddedToken objects give their "content"),
 * tools and documents (null unless given, as Hugging Face passes None),
 * and any extra variables the caller passes.
 *
 * The rendered text already holds <bos>: encode it with
 * TK_MATCH_SPECIAL only (no TK_ADD_SPECIAL), as vLLM does. */
#ifndef LMSERVE_TK_CHAT_H
#define LMSERVE_TK_CHAT_H
#include <jansson.h>
#include <stddef.h>

struct tk_chat;

/* `path`: a model directory or a tokenizer_config.json file. */
int tk_chat_load(const char *path, struct tk_chat **out, char *errbuf, size_t errlen);
/* From a template string and a tokenizer_config-like object (may be NULL)
 * supplying the *_token variables. */
int tk_chat_from_string(const char *tmpl, size_t len, json_t *config, struct tk_chat **out,
                        char *errbuf, size_t errlen);
void tk_chat_free(struct tk_chat *c);
/* The template's text, *len its bytes. */
const char *tk_chat_source(const struct tk_chat *c, size_t *len);

/* A --chat-template value, read as vLLM reads its flag: the text of the file
 * it names, else the value itself when it holds a template's characters ({,
 * } or a newline). *out is malloc'd and NUL-terminated. 0, or CM_ERR_NOENT
 * with a sentence for a value that is neither (a file that is not there). */
int tk_chat_template_arg(const char *value, char **out, char *errbuf, size_t errlen);

/* Renders `messages` (a JSON array of objects with "role" and "content":
 * a string, a list of parts like {"type": "text", "text": ...}, or null).
 * `extra` (object or NULL) adds variables. *out is malloc'd, NUL
 * terminated. Bad messages or a template's raise_exception give
 * CM_ERR_INVAL and the message in errbuf (a client error). */
int tk_chat_render(const struct tk_chat *c, json_t *messages, int add_generation_prompt,
                   json_t *extra, char **out, size_t *out_len, char *errbuf, size_t errlen);

#endif
