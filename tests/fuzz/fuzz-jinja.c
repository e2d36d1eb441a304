/* fuzz-jinja.c — fuzz target for the chat-template engine: the input is a
 * template; it is parsed and, when it parses, rendered with a small fixed
 * conversation. Parse and render must fail cleanly (negative cm_err, a
 * message), never crash, leak or run away (output, memory and loop caps). */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/tk-jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static json_t *vars;
  if (!vars)
    vars = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
        " {\"role\": \"user\", \"content\": \"hi <b>\"},"
        " {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"ok\"}]}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<bos>\", \"eos_token\": \"<eos>\","
        " \"n\": 3, \"f\": 0.5, \"d\": {\"k\": [1, null, false]}}",
        0, NULL);
  struct tk_jinja *t = NULL;
  char err[256];
  if (tk_jinja_parse((const char *)data, size, &t, err, sizeof err) == 0) {
    char *out = NULL;
    size_t len = 0;
    if (tk_jinja_render(t, vars, &out, &len, err, sizeof err) == 0) free(out);
    tk_jinja_free(t);
  }
  return 0;
}
