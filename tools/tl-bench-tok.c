/* tl-bench-tok.c — `lmserve bench tokenizer`: tokenizer load time, encode
 * throughput on a 1 MiB mixed corpus (generated from a fixed seed unless
 * --corpus is given), decode and streaming-detokenize speed, and the same
 * encode measured with @lenml/tokenizers under node when available
 * (tests/reference/tokenizer/bench-ref.js), so both numbers come from one
 * run on one input; the two id sequences are compared by count and
 * checksum.
 *
 *   lmserve bench tokenizer --tokenizer PATH [--corpus FILE] [--repeat N]
 *                           [--node-script FILE | --no-node] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"
#include "common/cm-proc.h"
#include "common/cm-time.h"
#include "tokenizer/tk-detok.h"
#include "tokenizer/tk-tokenizer.h"
#include "tools/tl-main.h"

#define BENCH_CORPUS_BYTES (1u << 20)

/* ---- the generated corpus ---------------------------------------------------- */

static uint64_t bench_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
  return (uint32_t)(cm_xorshift64(&bench_rng) >> 20) % n;
}

static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "server", "token",
    "request", "memory", "batch", "cache", "latency", "throughput", "kernel", "attention",
    "sequence", "prompt", "response", "language", "network", "system", "process", "thread",
    "because", "through", "between", "however", "although", "important", "different",
    "information", "development", "government", "international", "understanding", "Wednesday",
    "Mississippi", "approximately", "nevertheless", "characteristically", "Python", "Linux",
    "GPU", "CUDA", "OpenAI", "JSON", "HTTP/1.1", "e.g.", "i.e.", "don't", "it's", "we'll",
    "naïve", "café", "résumé", "Zürich", "São", "Paulo", "2026", "3.14159", "1,024", "42%",
};
static const char *const cjk[] = {"我们", "今天", "天气", "很好", "语言", "模型", "服务器", "数据",
                                  "東京", "日本語", "テキスト", "です", "ます", "한국어", "문장",
                                  "，", "。", "、", "「", "」"};
static const char *const other[] = {"Привет", "мир", "данные", "مرحبا", "بالعالم", "Ελληνικά",
                                    "שלום", "हिन्दी", "ไทย", "😀", "👍🏽", "👨‍👩‍👧", "🚀", "∑", "→"};

struct gbuf {
  char *p;
  size_t n, cap;
};

static void put(struct gbuf *b, const char *s) {
  size_t l = strlen(s);
  if (b->n + l + 1 > b->cap) return;
  memcpy(b->p + b->n, s, l);
  b->n += l;
}

static void gen_prose(struct gbuf *b) {
  int sentences = 2 + (int)rnd(6);
  for (int s = 0; s < sentences; s++) {
    int n = 5 + (int)rnd(16);
    for (int w = 0; w < n; w++) {
      char tmp[64];
      const char *word = words[rnd(sizeof words / sizeof words[0])];
      snprintf(tmp, sizeof tmp, "%s", word);
      if (w == 0 && tmp[0] >= 'a' && tmp[0] <= 'z') tmp[0] = (char)(tmp[0] - 32);
      put(b, tmp);
      if (w + 1 < n) put(b, rnd(12) == 0 ? ", " : " ");
    }
    put(b, rnd(8) == 0 ? "? " : rnd(10) == 0 ? "! " : ". ");
  }
  put(b, rnd(3) ? "\n\n" : "\n");
}

static void gen_code(struct gbuf *b) {
  char tmp[256];
  int fn = (int)rnd(1000);
  if (rnd(2)) {
    snprintf(tmp, sizeof tmp, "static int helper_%d(const char *buf, size_t len) {\n", fn);
    put(b, tmp);
    for (int i = 0, n = 2 + (int)rnd(6); i < n; i++) {
      snprintf(tmp, sizeof tmp, "%sif (len > %u && buf[%d] == '%c') return %d; // check %d\n",
               rnd(4) ? "    " : "\t", rnd(4096), i, 'a' + (int)rnd(26), (int)rnd(100), i);
      put(b, tmp);
    }
    put(b, "    return -1;\n}\n\n");
  } else {
    snprintf(tmp, sizeof tmp, "def compute_%d(xs, scale=%u.5):\n", fn, rnd(10));
    put(b, tmp);
    for (int i = 0, n = 2 + (int)rnd(5); i < n; i++) {
      snprintf(tmp, sizeof tmp, "        result_%d = [x ** %d for x in xs if x %% %d == 0]\n", i,
               1 + (int)rnd(3), 2 + (int)rnd(7));
      put(b, tmp);
    }
    put(b, "    return sum(result_0) * scale\n\n");
  }
}

static void gen_json(struct gbuf *b) {
  char tmp[256];
  snprintf(tmp, sizeof tmp,
           "{\"id\": \"req-%u\", \"model\": \"gemma-3-1b\", \"messages\": [{\"role\": \"user\", "
           "\"content\": \"%s %s\"}], \"temperature\": 0.%u, \"max_tokens\": %u, \"stream\": %s}\n",
           rnd(1u << 30), words[rnd(40)], words[rnd(40)], rnd(10), 16 + rnd(2000),
           rnd(2) ? "true" : "false");
  put(b, tmp);
}

static void gen_intl(struct gbuf *b) {
  int n = 5 + (int)rnd(30);
  for (int i = 0; i < n; i++) {
    if (rnd(3)) put(b, cjk[rnd(sizeof cjk / sizeof cjk[0])]);
    else {
      put(b, other[rnd(sizeof other / sizeof other[0])]);
      put(b, " ");
    }
  }
  put(b, "\n");
}

/* ~60% prose, 15% code, 10% JSON, 15% other scripts and emoji */
static char *gen_corpus(size_t *len) {
  struct gbuf b = {.cap = BENCH_CORPUS_BYTES + 4096};
  b.p = malloc(b.cap);
  if (!b.p) return NULL;
  while (b.n < BENCH_CORPUS_BYTES) {
    uint32_t r = rnd(100);
    if (r < 60) gen_prose(&b);
    else if (r < 75) gen_code(&b);
    else if (r < 85) gen_json(&b);
    else gen_intl(&b);
  }
  /* cut to exactly 1 MiB at a character boundary */
  size_t n = BENCH_CORPUS_BYTES;
  while (n && ((unsigned char)b.p[n] & 0xC0) == 0x80) n--;
  b.p[n] = 0;
  *len = n;
  return b.p;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (!r) break;
    if (n + 1 == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
      }
      buf = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf) buf[n] = 0, *len = n;
  return buf;
}

/* ---- the node reference --------------------------------------------------------- */

/* Runs bench-ref.js on the corpus file under node (spawned directly, no shell); fills the
 * numbers or returns -1. */
static int run_node(const char *script, const char *corpus, int repeat, double *load_s,
                    double *encode_s, double *mbps, long *n_tokens, unsigned long *checksum) {
  char reps[16], line[4096];
  snprintf(reps, sizeof reps, "%d", repeat);
  char *const argv[] = {"node", (char *)script, (char *)corpus, reps, NULL};
  int st = cm_run_capture(argv, line, sizeof line);
  if (st != 0) {
    fprintf(stderr, "node reference failed (%s): %s\n",
            st < 0 ? cm_strerror(st) : "non-zero exit", line);
    return -1;
  }
  /* {"load_s":..,"encode_s":..,"mb_per_s":..,"n_tokens":..,"checksum":..} */
  if (sscanf(line,
             "{\"load_s\":%lf,\"encode_s\":%lf,\"mb_per_s\":%lf,\"n_tokens\":%ld,\"checksum\":%lu}",
             load_s, encode_s, mbps, n_tokens, checksum) != 5) {
    fprintf(stderr, "node reference: unexpected output: %s", line);
    return -1;
  }
  return 0;
}

static const char *find_script(const char *given) {
  static char buf[4096];
  if (given) return given;
  const char *src = getenv("LMSERVE_SOURCE_DIR");
  snprintf(buf, sizeof buf, "%s/tests/reference/tokenizer/bench-ref.js", src ? src : ".");
  return access(buf, R_OK) == 0 ? buf : NULL;
}

int tl_bench_tokenizer_main(int argc, char **argv) {
  const char *path = NULL, *corpus_path = NULL, *script = NULL;
  int64_t repeat = 3;
  int use_node = 1;
  const struct cm_opt opts[] = {
      {"tokenizer", CM_OPT_STR, &path, "PATH", "tokenizer.json or a model directory"},
      {"corpus", CM_OPT_STR, &corpus_path, "FILE", "UTF-8 text (default: 1 MiB generated)"},
      {"repeat", CM_OPT_INT, &repeat, "N", "runs per measurement; the best counts", 1, 100},
      {"node-script", CM_OPT_STR, &script, "FILE", "bench-ref.js (default: found from "
       "$LMSERVE_SOURCE_DIR or the current directory)"},
      {"node", CM_OPT_BOOL, &use_node, NULL,
       "also measure @lenml/tokenizers under node (default); --no-node: skip"},
      {0},
  };
  int rc = tl_args_parse("lmserve bench tokenizer", "tokenizer load time and encode throughput",
                         opts, argc, argv);
  if (rc >= 0) return rc;
  if (!path) {
    fprintf(stderr, "lmserve bench tokenizer: --tokenizer PATH is required\n");
    return 2;
  }
  size_t len = 0;
  char *text = corpus_path ? read_file(corpus_path, &len) : gen_corpus(&len);
  if (!text) {
    fprintf(stderr, "lmserve bench tokenizer: cannot read %s\n", corpus_path ? corpus_path : "corpus");
    return 1;
  }
  struct tk_tokenizer *tok = NULL;
  struct tk_state *st = NULL;
  struct tk_detok *dt = NULL;
  int32_t *ids = NULL;
  char *out = NULL, tmpl[] = "/tmp/lmserve-tokbench-XXXXXX", err[512];
  int status = 1, tmp_fd = -1;
  size_t n = 0, cap = 0, out_len = 0, out_cap = 0;
  double load_best = 1e30, load_sum = 0;
  for (int r = 0; r < repeat; r++) {
    tk_free(tok);
    tok = NULL;
    double t0 = cm_time_s();
    if ((rc = tk_load(path, &tok, err, sizeof err))) {
      fprintf(stderr, "lmserve bench tokenizer: %s\n", err);
      goto done;
    }
    double dt_s = cm_time_s() - t0;
    load_sum += dt_s;
    if (dt_s < load_best) load_best = dt_s;
  }
  if (tk_state_create(tok, &st) || tk_detok_create(tok, 0, &dt)) goto done;
  double t0 = cm_time_s();
  if ((rc = tk_encode(tok, st, text, len, TK_DEFAULT, &ids, &n, &cap))) {
    fprintf(stderr, "lmserve bench tokenizer: encode failed: %s\n", cm_strerror(rc));
    goto done;
  }
  double cold = cm_time_s() - t0, warm = 1e30;
  for (int r = 0; r < repeat; r++) {
    t0 = cm_time_s();
    tk_encode(tok, st, text, len, TK_DEFAULT, &ids, &n, &cap);
    double d = cm_time_s() - t0;
    if (d < warm) warm = d;
  }
  double nocache = 1e30;
  for (int r = 0; r < repeat; r++) {
    t0 = cm_time_s();
    tk_encode(tok, NULL, text, len, TK_DEFAULT, &ids, &n, &cap);
    double d = cm_time_s() - t0;
    if (d < nocache) nocache = d;
  }
  t0 = cm_time_s();
  tk_decode(tok, ids, n, 0, &out, &out_len, &out_cap);
  double dec = cm_time_s() - t0;
  int roundtrip = out_len == len + 5 && !memcmp(out + 5, text, len);
  t0 = cm_time_s();
  size_t streamed = 0;
  for (size_t i = 0; i < n; i++) {
    const char *piece;
    size_t pl;
    tk_detok_push(dt, ids[i], &piece, &pl);
    streamed += pl;
  }
  double stream = cm_time_s() - t0;
  unsigned long sum = 0;
  for (size_t i = 0; i < n; i++) sum = (sum + (unsigned long)ids[i] * (i + 1)) % 4294967296ul;
  double mb = (double)len / 1e6;
  printf("tokenizer  %s\n", path);
  printf("corpus     %s, %zu bytes, %zu tokens (%.2f bytes/token)\n",
         corpus_path ? corpus_path : "generated (seeded, mixed prose/code/JSON/CJK/emoji)", len, n,
         (double)len / (double)(n ? n : 1));
  printf("load       best %.3f s, mean %.3f s over %d\n", load_best, load_sum / (double)repeat,
         (int)repeat);
  printf("encode     %.1f MB/s warm word cache (best of %d), %.1f MB/s first run, %.1f MB/s "
         "without cache\n", mb / warm, (int)repeat, mb / cold, mb / nocache);
  printf("decode     %.1f MB/s (round trip %s)\n", mb / dec, roundtrip ? "exact" : "DIFFERS");
  printf("detok      %.1f ns/token streaming (%zu bytes)\n", stream * 1e9 / (double)(n ? n : 1),
         streamed);
  status = roundtrip ? 0 : 1;
  if (!use_node) goto done;
  const char *js = find_script(script);
  if (!js) {
    printf("reference  skipped: bench-ref.js not found (run from the source tree or set "
           "LMSERVE_SOURCE_DIR)\n");
    goto done;
  }
  if ((tmp_fd = mkstemp(tmpl)) < 0 || write(tmp_fd, text, len) != (ssize_t)len) {
    printf("reference  skipped: cannot write a temporary corpus file\n");
    goto done;
  }
  double nl, ne, nmb;
  long nt;
  unsigned long ns;
  if (run_node(js, tmpl, (int)repeat, &nl, &ne, &nmb, &nt, &ns)) {
    printf("reference  skipped: node or @lenml/tokenizers unavailable\n");
    goto done;
  }
  printf("reference  @lenml/tokenizers (node): load %.3f s, encode %.2f MB/s (best of %d)\n", nl,
         nmb, (int)repeat);
  printf("speedup    encode %.1fx, load %.1fx; ids %s (%ld vs %zu tokens)\n", (mb / warm) / nmb,
         nl / load_best, (nt == (long)n && ns == sum) ? "identical" : "DIFFER", nt, n);
  if (nt != (long)n || ns != sum) status = 1;
done:
  if (tmp_fd >= 0) {
    close(tmp_fd);
    unlink(tmpl);
  }
  free(text);
  free(ids);
  free(out);
  tk_detok_free(dt);
  tk_state_free(st);
  tk_free(tok);
  return status;
}
