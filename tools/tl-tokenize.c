/* tl-tokenize.c — `lmserve tokenize` and `lmserve detokenize`.
 *
 *   lmserve tokenize --tokenizer PATH [--no-special] < text
 *     prints one line: a JSON array of ids. By default this is Hugging
 *     Face's tokenizer.encode(text): BOS first and special-token text such
 *     as "<start_of_turn>" matched as the special token. --no-special is
 *     encode(text, add_special_tokens=False) with split_special_tokens=True:
 *     no BOS, and text spelling a special token is encoded as ordinary text
 *     (non-special added tokens like "\n\n" are still matched).
 *   lmserve detokenize --tokenizer PATH [--skip-special] < '[2, 9259]'
 *     prints the decoded text (no newline added).
 *
 * PATH is a tokenizer.json file, a model directory holding one, or a GGUF
 * file (its vocabulary, tk_load_gguf). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "tools/tl-main.h"
#include "tokenizer/tk-tokenizer.h"

#define FE_CLI_MAX_INPUT ((size_t)1 << 30) /* bytes read from stdin at most */

/* Reads all of stdin; returns a malloc'd buffer (NUL terminated). */
static char *read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (n + 1 == cap) {
      if (cap >= FE_CLI_MAX_INPUT) {
        free(buf);
        return NULL;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        return NULL;
      }
      buf = nb;
      cap *= 2;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, stdin);
    n += r;
    if (r == 0) break;
  }
  if (ferror(stdin)) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

static int load(const char *path, struct tk_tokenizer **tok) {
  char err[512];
  size_t n = strlen(path);
  int gguf = n > 5 && !strcmp(path + n - 5, ".gguf");
  int rc =
      gguf ? tk_load_gguf(path, tok, NULL, err, sizeof err) : tk_load(path, tok, err, sizeof err);
  if (rc) fprintf(stderr, "lmserve: cannot load tokenizer: %s (%s)\n", err, cm_strerror(rc));
  return rc;
}

/* What both commands begin with: the flags (--tokenizer PATH is required),
 * the tokenizer and all of stdin. Returns -1 to go on, else the exit
 * status (help, a usage mistake, or nothing to work on). */
static int start(const char *prog, const char *summary, const struct cm_opt *opts, int argc,
                 char **argv, const char *const *path, struct tk_tokenizer **tok, char **text,
                 size_t *len) {
  int rc = tl_args_parse(prog, summary, opts, argc, argv);
  if (rc >= 0) return rc;
  if (!*path) {
    fprintf(stderr, "%s: --tokenizer PATH is required\n", prog);
    return 2;
  }
  if (load(*path, tok)) return 1;
  if (!(*text = read_stdin(len))) {
    fprintf(stderr, "%s: cannot read stdin\n", prog);
    tk_free(*tok);
    return 1;
  }
  return -1;
}

int tl_tokenize_main(int argc, char **argv) {
  const char *path = NULL;
  int special = 1;
  const struct cm_opt opts[] = {
      {"tokenizer", CM_OPT_STR, &path, "PATH", "tokenizer.json or a model directory"},
      {"special", CM_OPT_BOOL, &special, NULL,
       "add BOS and match special-token text (default); --no-special: neither"},
      {0},
  };
  struct tk_tokenizer *tok = NULL;
  char *text = NULL;
  size_t len = 0, n = 0, cap = 0;
  int status =
      start("lmserve tokenize", "reads UTF-8 text on stdin, prints its token ids as a JSON array",
            opts, argc, argv, &path, &tok, &text, &len);
  if (status >= 0) return status;
  int32_t *ids = NULL;
  status = 1;
  int rc = tk_encode(tok, NULL, text, len, special ? TK_DEFAULT : 0, &ids, &n, &cap);
  if (rc == CM_ERR_INVAL) {
    fprintf(stderr, "lmserve tokenize: input is not valid UTF-8\n");
    goto out;
  }
  if (rc) {
    fprintf(stderr, "lmserve tokenize: %s\n", cm_strerror(rc));
    goto out;
  }
  putchar('[');
  for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
  printf("]\n");
  status = fflush(stdout) ? 1 : 0;
out:
  free(text);
  free(ids);
  tk_free(tok);
  return status;
}

int tl_detokenize_main(int argc, char **argv) {
  const char *path = NULL;
  int skip = 0;
  const struct cm_opt opts[] = {
      {"tokenizer", CM_OPT_STR, &path, "PATH", "tokenizer.json or a model directory"},
      {"skip-special", CM_OPT_BOOL, &skip, NULL, "leave special tokens out of the text"},
      {0},
  };
  struct tk_tokenizer *tok = NULL;
  char *text = NULL;
  size_t len = 0, n = 0, out_len = 0, out_cap = 0;
  int status =
      start("lmserve detokenize", "reads a JSON array of token ids on stdin, prints the text", opts,
            argc, argv, &path, &tok, &text, &len);
  if (status >= 0) return status;
  status = 1;
  int32_t *ids = NULL;
  char *out = NULL;
  json_t *arr = NULL;
  json_error_t je;
  arr = json_loadb(text, len, 0, &je);
  if (!json_is_array(arr)) {
    fprintf(stderr, "lmserve detokenize: expected a JSON array of ids: %s\n",
            arr ? "not an array" : je.text);
    goto done;
  }
  n = json_array_size(arr);
  ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) goto done;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= tk_n_vocab(tok)) {
      fprintf(stderr, "lmserve detokenize: element %zu is not an id in [0, %d)\n", i,
              tk_n_vocab(tok));
      goto done;
    }
    ids[i] = (int32_t)id;
  }
  int rc = tk_decode(tok, ids, n, skip, &out, &out_len, &out_cap);
  if (rc) {
    fprintf(stderr, "lmserve detokenize: %s\n", cm_strerror(rc));
    goto done;
  }
  status = (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) ? 1 : 0;
done:
  json_decref(arr);
  free(text);
  free(ids);
  free(out);
  tk_free(tok);
  return status;
}
