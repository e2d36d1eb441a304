/* test-tok-cli.c — the real `lmserve tokenize` / `lmserve detokenize`
 * processes: ids for a text, --no-special, a model directory as PATH, the
 * round trip, and clear failures (invalid UTF-8, bad ids, a missing or
 * unsupported tokenizer) with a non-zero exit and no crash. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tt-util.h"

static const char *bin(void) {
  /* children that fail early do not read their stdin: no SIGPIPE for us */
  signal(SIGPIPE, SIG_IGN);
  const char *b = getenv("LMSERVE_BIN");
  if (!b || access(b, X_OK)) TH_SKIP("LMSERVE_BIN is not built");
  return b;
}

static int run(const char *cmd, const char *path, const char *flag, const char *in, size_t len,
               char **out, char **err) {
  char *argv[] = {(char *)bin(), (char *)cmd, "--tokenizer", (char *)path, (char *)flag, NULL};
  return th_run(argv, NULL, in, len, 60000, out, err);
}

TH_TEST(cli_tokenize_detokenize) {
  tt_gemma();
  char *out = NULL, *err = NULL;
  const char *text = "Hello, my dog is cute";
  TH_CHECK_EQ_INT(run("tokenize", tt_gemma_path(), NULL, text, strlen(text), &out, &err), 0);
  TH_CHECK_EQ_STR(out, "[2, 9259, 236764, 1041, 4799, 563, 12864]\n");
  free(out), free(err);
  /* a model directory, special-token text, --no-special */
  const char *sp = "<start_of_turn>hi";
  TH_CHECK_EQ_INT(run("tokenize", tt_gemma_dir(), NULL, sp, strlen(sp), &out, &err), 0);
  TH_CHECK(out && !strncmp(out, "[2, 105, ", 9));
  free(out), free(err);
  TH_CHECK_EQ_INT(run("tokenize", tt_gemma_dir(), "--no-special", sp, strlen(sp), &out, &err), 0);
  TH_CHECK(out && strncmp(out, "[2,", 3) && !strstr(out, " 105,"));
  free(out), free(err);
  const char *ids = "[2, 9259, 236764, 1041, 4799, 563, 12864]";
  TH_CHECK_EQ_INT(run("detokenize", tt_gemma_path(), NULL, ids, strlen(ids), &out, &err), 0);
  TH_CHECK_EQ_STR(out, "<bos>Hello, my dog is cute");
  free(out), free(err);
  TH_CHECK_EQ_INT(run("detokenize", tt_gemma_path(), "--skip-special", ids, strlen(ids), &out, &err), 0);
  TH_CHECK_EQ_STR(out, "Hello, my dog is cute");
  free(out), free(err);
}

TH_TEST(cli_errors) {
  tt_gemma();
  char *out = NULL, *err = NULL;
  /* the small fixture tokenizer loads fast; the checks are the CLI's own */
  const char *tiny = tt_fixture("tiny/tokenizer.json");
  char tiny_path[4096];
  snprintf(tiny_path, sizeof tiny_path, "%s", tiny);
  const char bad[] = "ok \xff\xfe not utf-8";
  TH_CHECK_EQ_INT(run("tokenize", tiny_path, NULL, bad, sizeof bad - 1, &out, &err), 1);
  TH_CHECK(err && strstr(err, "not valid UTF-8"));
  free(out), free(err);
  static const char *const bad_ids[] = {"[2, 262145]", "[-1]", "[1.5]", "{\"a\": 1}", "[2,",
                                        "[\"x\"]"};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    int rc = run("detokenize", tiny_path, NULL, bad_ids[i], strlen(bad_ids[i]), &out, &err);
    if (rc != 1 || !err || !strstr(err, "lmserve detokenize:"))
      th_fail(__FILE__, __LINE__, "%s: rc %d, stderr %s", bad_ids[i], rc, err ? err : "");
    free(out), free(err);
  }
  TH_CHECK_EQ_INT(run("tokenize", "/nonexistent/dir", NULL, "x", 1, &out, &err), 1);
  TH_CHECK(err && strstr(err, "cannot load tokenizer"));
  free(out), free(err);
  /* an unsupported tokenizer kind names the field */
  char path[] = "/tmp/lmserve-tokcli-XXXXXX";
  int fd = mkstemp(path);
  const char *wp = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}";
  TH_REQUIRE(fd >= 0 && write(fd, wp, strlen(wp)) == (ssize_t)strlen(wp));
  close(fd);
  TH_CHECK_EQ_INT(run("tokenize", path, NULL, "x", 1, &out, &err), 1);
  TH_CHECK(err && strstr(err, "model.type \"WordPiece\" is not supported"));
  free(out), free(err);
  unlink(path);
  char *argv[] = {(char *)bin(), "tokenize", NULL};
  TH_CHECK_EQ_INT(th_run(argv, NULL, "x", 1, 20000, &out, &err), 2);
  TH_CHECK(err && strstr(err, "--tokenizer"));
  free(out), free(err);
}
