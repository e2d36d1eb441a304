/* tl-generate.c — `lmserve generate`: offline greedy generation in one
 * process (no sockets), through the paged KV pool and block tables as the
 * server drives the model.
 *
 * With --draft DIR, a gemma4_assistant proposes tokens that the target
 * verifies (greedy speculative decoding: the same tokens).
 *
 * stdout: line 1 is the generated ids as a JSON array, line 2 the decoded
 * text (special tokens skipped) when there is a tokenizer (--tokenizer's, a
 * GGUF model's own, or the checkpoint folder's tokenizer.json), else an
 * empty line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-registry.h"
#include "model/md-config.h"
#include "tokenizer/tk-tokenizer.h"
#include "tools/tl-main.h"
#include "worker/wk-greedy.h"
#include "worker/wk-model.h"
#include "worker/wk-ngram.h"

/* "1,2,3", "1 2 3" or "[1, 2, 3]" -> ids (malloc'd). */
static int parse_ids(const char *s, int32_t **out, int *n) {
  size_t cap = 16;
  int32_t *ids = malloc(sizeof(int32_t) * cap);
  if (!ids) return CM_ERR_NOMEM;
  int k = 0;
  const char *p = s;
  while (*p) {
    if (*p == '[' || *p == ']' || *p == ',' || *p == ' ' || *p == '\n' || *p == '\t') {
      p++;
      continue;
    }
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX) {
      free(ids);
      return CM_ERR_PARSE;
    }
    if ((size_t)k == cap) {
      cap *= 2;
      int32_t *ni = realloc(ids, sizeof(int32_t) * cap);
      if (!ni) {
        free(ids);
        return CM_ERR_NOMEM;
      }
      ids = ni;
    }
    ids[k++] = (int32_t)v;
    p = end;
  }
  *out = ids;
  *n = k;
  return 0;
}

int tl_generate_main(int argc, char **argv) {
  const char *model = NULL, *prompt = NULL, *prompt_ids = NULL, *kv_dtype = NULL, *draft = NULL,
             *quant_s = NULL, *tok_dir = NULL;
  const char *dtype = "auto";
  int64_t max_tokens = 16, chunk = 0, threads = 0, draft_tokens = 3, tp = 1, ngram_max = 0,
          ngram_min = 0;
  int ignore_eos = 0, eager = 0;
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "PATH", MD_MODEL_HELP},
      {"tokenizer", CM_OPT_STR, &tok_dir, "DIR",
       "DIR/tokenizer.json instead of the model's own tokenizer"},
      {"prompt", CM_OPT_STR, &prompt, "TEXT",
       "prompt text (needs a tokenizer: the model's or --tokenizer's; adds BOS)"},
      {"prompt-ids", CM_OPT_STR, &prompt_ids, "IDS",
       "prompt token ids: \"2,651,1234\" or a JSON array"},
      {"max-tokens", CM_OPT_INT, &max_tokens, "N", "tokens to generate (default 16)", 1, 1 << 20},
      {"chunk", CM_OPT_INT, &chunk, "N", "prefill chunk size in tokens (default: whole prompt)", 0,
       1 << 20},
      {"threads", CM_OPT_INT, &threads, "N", "CPU threads (default: one per core)", 0, 1024},
      {"kv-dtype", CM_OPT_STR, &kv_dtype, "auto|bf16|fp8|f32", WK_KV_DTYPE_HELP},
      {"dtype", CM_OPT_STR, &dtype, "auto|float32|bfloat16|q8", KN_DTYPE_HELP},
      {"ignore-eos", CM_OPT_BOOL, &ignore_eos, NULL, "keep generating past an end-of-sequence id"},
      {"enforce-eager", CM_OPT_BOOL, &eager, NULL, WK_EAGER_HELP},
      {"quantization", CM_OPT_STR, &quant_s, "none|fp8|q8_0|q4_0|q4_k", WK_QUANT_HELP},
      {"draft", CM_OPT_STR, &draft, "DIR|ngram",
       "speculative decoding with this gemma4_assistant checkpoint, or with n-gram drafts "
       "looked up in the prompt and the output (same output)"},
      {"ngram-prompt-lookup-max", CM_OPT_INT, &ngram_max, "N", WK_NGRAM_MAX_HELP, 1, 1024},
      {"ngram-prompt-lookup-min", CM_OPT_INT, &ngram_min, "N", WK_NGRAM_MIN_HELP, 1, 1024},
      {"draft-tokens", CM_OPT_INT, &draft_tokens, "K", "draft tokens per round (default 3)", 1, 64},
      {"tensor-parallel-size", CM_OPT_INT, &tp, "N",
       "run the model as N ranks (processes on this host, one shard each; default 1)", 1, 64},
      {0},
  };
  int rc = tl_args_parse("lmserve generate", "offline greedy generation in one process", opts, argc,
                         argv);
  if (rc >= 0) return rc;
  int bf16 = 0;
  char why[128];
  if (kn_backend_dtype_parse(dtype, &bf16, why, sizeof(why))) {
    fprintf(stderr, "lmserve generate: %s\n", why);
    return 2;
  }
  int ngram =
      wk_spec_ngram_args("lmserve generate", draft, ngram_max, ngram_min, &ngram_max, &ngram_min);
  if (ngram < 0) return 2;
  if (!model || (!prompt == !prompt_ids)) {
    fprintf(
        stderr,
        "lmserve generate: --model PATH and exactly one of --prompt / --prompt-ids are required\n");
    return 2;
  }
  int kvdt = 0, quant = 0;
  char kv_why[160];
  if ((kv_dtype && wk_kv_dtype_parse(kv_dtype, &kvdt, kv_why, sizeof(kv_why))) ||
      wk_quantization_parse(quant_s, &quant, kv_why, sizeof(kv_why))) {
    fprintf(stderr, "lmserve generate: %s\n", kv_why);
    return 2;
  }
  char err[512] = "";
  int rank = 0, n_kids = 0; /* tensor parallelism: this process's rank, ranks it forked */
  pid_t kids[64];
  struct kn_comm_id cid;
  struct tk_tokenizer *tok = NULL;
  int32_t *ids = NULL, *gen = NULL;
  int n_ids = 0, status = 1;
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL, *dm = NULL;
  struct wk_page_alloc pa = {0};
  char tpath[4200], gpath[4096];
  /* the tokenizer: --tokenizer's, else a GGUF model's own, else the folder's */
  int is_gguf = md_model_gguf_path(model, gpath, sizeof(gpath), err, sizeof(err));
  if (is_gguf < 0) {
    fprintf(stderr, "lmserve generate: %s\n", err);
    status = 2;
    goto done;
  }
  snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", tok_dir ? tok_dir : model);
  FILE *tf = NULL;
  if (is_gguf && !tok_dir) {
    /* with --prompt-ids the vocabulary only decodes the text: a file without one
       ("no_vocab") still runs */
    if ((rc = tk_load_gguf(gpath, &tok, NULL, err, sizeof(err))) && prompt) {
      fprintf(stderr, "lmserve generate: %s\n", err);
      goto done;
    }
    rc = 0;
  } else if (tok_dir || (tf = fopen(tpath, "rb"))) {
    if (tf) fclose(tf);
    if ((rc = tk_load(tpath, &tok, err, sizeof(err)))) {
      fprintf(stderr, "lmserve generate: %s\n", err);
      goto done;
    }
  }
  if (prompt) {
    if (!tok) {
      fprintf(stderr,
              "lmserve generate: --prompt needs a tokenizer: %s is missing (name one with "
              "--tokenizer DIR, or use --prompt-ids)\n",
              tpath);
      status = 2;
      goto done;
    }
    size_t n = 0, cap = 0;
    if ((rc = tk_encode(tok, NULL, prompt, strlen(prompt), TK_DEFAULT, &ids, &n, &cap))) {
      fprintf(stderr, "lmserve generate: cannot tokenize the prompt: %s\n", cm_strerror(rc));
      goto done;
    }
    n_ids = (int)n;
  } else if (parse_ids(prompt_ids, &ids, &n_ids) || n_ids == 0) {
    fprintf(stderr, "lmserve generate: --prompt-ids: expected a list of token ids\n");
    status = 2;
    goto done;
  }
  /* tensor parallelism: ranks 1..N-1 are forked children that run the same steps on
   * their shards (before any thread exists); rank 0, this process, prints */
  if (tp > 1) {
    if ((rc = kn_cpu_backend_create(1, &be)) || (rc = kn_comm_id_new(be, &cid))) {
      fprintf(stderr, "lmserve generate: cannot make a tensor-parallel group: %s\n",
              cm_strerror(rc));
      goto done;
    }
    kn_backend_destroy(be);
    be = NULL;
    if (threads == 0) {
      long cores = sysconf(_SC_NPROCESSORS_ONLN);
      threads = cores / tp > 0 ? cores / tp : 1;
    }
    fflush(NULL);
    for (int r = 1; r < tp; r++) {
      pid_t pid = fork();
      if (pid < 0) {
        fprintf(stderr, "lmserve generate: fork failed\n");
        goto done;
      }
      if (pid == 0) {
        rank = r;
        n_kids = 0;
        break;
      }
      kids[n_kids++] = pid;
    }
  }
  if ((rc = kn_cpu_backend_create_mode((int)threads, KN_CPU_ISA_BEST, bf16, &be))) {
    fprintf(stderr, "lmserve generate: cannot create the CPU backend: %s\n", cm_strerror(rc));
    goto done;
  }
  int batch = chunk > 0 ? (int)chunk : n_ids;
  if (draft && batch < draft_tokens + 1) batch = (int)draft_tokens + 1;
  struct wk_model_opts mo = {
      .max_batch_tokens = batch,
      .max_seqs = 1,
      .kv_tokens = n_ids + (int)max_tokens + (int)draft_tokens + 2,
      .kv_dtype = kvdt,
      .tp_rank = rank,
      .tp_size = (int)tp,
      .step_graphs = eager ? WK_GRAPHS_OFF : WK_GRAPHS_CAPTURE,
      .graph_verify_tokens = draft ? (int)draft_tokens + 1 : 0,
      .quantization = quant,
  };
  if ((rc = wk_model_load(model, be, &mo, &m, err, sizeof(err)))) {
    fprintf(stderr, "lmserve generate: %s\n", err);
    goto done;
  }
  if (draft && !ngram && (rc = wk_draft_load(draft, m, &mo, &dm, err, sizeof(err)))) {
    fprintf(stderr, "lmserve generate: --draft: %s\n", err);
    goto done;
  }
  /* the group forms once every rank has loaded (their loads take different times:
   * quantizing at load, a busy machine), so no first step waits on a slow load */
  if (tp > 1 && (rc = kn_comm_join(be, &cid, rank, (int)tp, 60000))) {
    fprintf(stderr, "lmserve generate: rank %d cannot join its group: %s\n", rank, cm_strerror(rc));
    goto done;
  }
  if ((rc = wk_page_alloc_init(&pa, wk_model_n_pages(m)))) goto done;
  gen = malloc(sizeof(int32_t) * (size_t)max_tokens);
  if (!gen) goto done;
  int n_gen = 0;
  struct wk_greedy_opts go = {
      .chunk = (int)chunk, .max_new = (int)max_tokens, .stop_at_eos = !ignore_eos};
  int drafted = 0, accepted = 0;
  if (dm)
    rc = wk_greedy_generate_spec(m, dm, &pa, ids, n_ids, &go, (int)draft_tokens, gen, &n_gen,
                                 &drafted, &accepted, err, sizeof(err));
  else if (ngram)
    rc = wk_greedy_generate_ngram(m, &pa, ids, n_ids, &go, (int)draft_tokens, (int)ngram_min,
                                  (int)ngram_max, gen, &n_gen, &drafted, &accepted, err,
                                  sizeof(err));
  else
    rc = wk_greedy_generate(m, &pa, ids, n_ids, &go, gen, &n_gen, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "lmserve generate: %s\n", err);
    goto done;
  }
  if (rank != 0) { /* the ranks ran the same steps; rank 0 reports */
    status = 0;
    goto done;
  }
  if (draft)
    fprintf(stderr, "lmserve generate: %d draft tokens proposed, %d accepted (%.1f%%)\n", drafted,
            accepted, drafted ? 100.0 * accepted / drafted : 0.0);
  printf("[");
  for (int i = 0; i < n_gen; i++)
    printf("%s%d", i ? ", " : "", gen[i]);
  printf("]\n");
  if (tok) {
    char *text = NULL;
    size_t len = 0, cap = 0;
    if ((rc = tk_decode(tok, gen, (size_t)n_gen, 1, &text, &len, &cap))) {
      fprintf(stderr, "lmserve generate: cannot decode: %s\n", cm_strerror(rc));
      free(text);
      goto done;
    }
    fwrite(text, 1, len, stdout);
    free(text);
  }
  printf("\n");
  fflush(stdout);
  status = 0;
done:
  for (int i = 0; i < n_kids; i++) { /* every rank must have succeeded */
    int st = 0;
    if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) status = 1;
  }
  wk_page_alloc_free(&pa);
  wk_model_free(dm);
  wk_model_free(m);
  kn_backend_destroy(be);
  tk_free(tok);
  free(ids);
  free(gen);
  return status;
}
