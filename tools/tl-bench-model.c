/* tl-bench-model.c — `lmserve bench model`: prefill and single-sequence decode
 * throughput of one model on the CPU backend, the machine's measured memory
 * bandwidth, the bandwidth bound of decoding (weight bytes read per token /
 * bandwidth) and the fraction of it achieved, and the KV bytes per token of
 * each KV group. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-registry.h"
#include "lmserve-config.h"
#if LMSERVE_HAVE_CUDA
#include "kernels/cuda/kn-cuda.h"
#endif
#include "tools/tl-main.h"
#include "worker/wk-greedy.h"
#include "worker/wk-main.h"
#include "worker/wk-model.h"

/* The KV plan: one entry per group, then the total (JSON: the fields that
 * follow the opening object's other members, without the closing brace). */
static void print_kv(const struct wk_kv_spec *kv, int json) {
  if (json) {
    printf("\"kv_groups\":[");
    for (int g = 0; g < kv->n_groups; g++) {
      const struct wk_kv_group *G = &kv->groups[g];
      printf("%s{\"kind\":\"%s\",\"head_dim\":%d,\"kv_heads\":%d,\"layers\":%d,"
             "\"bytes_per_token\":%zu,\"block_tokens\":%d}",
             g ? "," : "", G->kind == MD_LAYER_FULL ? "full" : "sliding", G->head_dim,
             G->n_kv_heads, G->n_layers, G->bytes_per_token, G->block_tokens);
    }
    printf("],\"kv_bytes_per_token\":%zu", wk_kv_bytes_per_token(kv));
    return;
  }
  for (int g = 0; g < kv->n_groups; g++) {
    const struct wk_kv_group *G = &kv->groups[g];
    printf("kv group %d %s, head dim %d x %d KV heads, %d storing layers: %zu bytes/token, %d "
           "tokens/page\n",
           g, G->kind == MD_LAYER_FULL ? "full" : "sliding", G->head_dim, G->n_kv_heads,
           G->n_layers, G->bytes_per_token, G->block_tokens);
  }
  printf("kv total   %zu bytes/token (%s), page %zu bytes\n", wk_kv_bytes_per_token(kv),
         kn_dtype_name(kv->dtype), kv->page_bytes);
}

/* --kv-only: the KV plan from config.json alone (no weights needed), bf16
 * pages of 16 tokens as the server lays them out. */
static int kv_only(const char *dir, int json) {
  static struct md_config c; /* large: per-layer tables */
  struct wk_kv_spec kv;
  char err[512] = "";
  int rc = md_config_load(dir, &c, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "lmserve bench model: %s\n", err);
    return 1;
  }
  if ((rc = wk_kv_spec_build(&c, KN_DTYPE_BF16, 16, &kv))) {
    fprintf(stderr, "lmserve bench model: KV plan of %s: %s\n", dir, cm_strerror(rc));
    return 1;
  }
  int storing = 0;
  for (int g = 0; g < kv.n_groups; g++)
    storing += kv.groups[g].n_layers;
  if (json) {
    printf("{\"model\":\"%s\",\"model_type\":\"%s\",\"layers\":%d,\"kv_storing_layers\":%d,", dir,
           c.model_type, c.n_layers, storing);
    print_kv(&kv, 1);
    printf("}\n");
  } else {
    printf("model      %s (%s, %d layers, %d of them store KV, %d KV-shared)\n", dir, c.model_type,
           c.n_layers, storing, c.n_kv_shared);
    print_kv(&kv, 0);
  }
  return 0;
}

/* How the decode loop picks its tokens: greedy (the head's argmax, no logits
 * written, the way the server takes greedy tokens) unless --temperature etc. */
static struct kn_sample_params bm_sample = {
    .top_p = 1.0f, .repetition_penalty = 1.0f, .n_logprobs = -1, .seed = 1};

/* Runs n tokens at pos0 (one forward); when next is given, the token sampled after
 * the last with bm_sample. */
static int run(struct wk_model *m, struct wk_page_alloc *pa, struct wk_seq_blocks *blk,
               const int32_t *toks, int n, int pos0, int32_t *next, char *err, size_t errlen) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  int rc = wk_seq_blocks_reserve(blk, kv, pa, pos0 + n);
  if (rc) {
    snprintf(err, errlen, "KV pool exhausted");
    return rc;
  }
  struct wk_seq_input s = {.tokens = toks, .n_tokens = n, .pos0 = pos0, .n_out = next ? 1 : 0};
  for (int g = 0; g < kv->n_groups; g++) {
    s.block_tables[g] = blk->table[g];
    s.n_blocks[g] = blk->n[g];
  }
  struct kn_sample_params p = bm_sample;
  p.counter = (uint64_t)(pos0 + n);
  struct kn_sample_out out;
  struct wk_batch b = {.seqs = &s, .n_seqs = 1, .sampled = next ? &out : NULL, .sample = &p};
  rc = wk_model_forward(m, &b, err, errlen);
  if (!rc && next) *next = out.token;
  return rc;
}

int tl_bench_model_main(int argc, char **argv) {
  const char *model = NULL, *dtype = "auto", *device = NULL, *kv_dtype_s = "auto",
             *quant_s = "none";
  int64_t prompt = 256, decode = 32, threads = 0, chunk = 256, tp = 1;
  int json = 0, kvo = 0, fast = 1, use_mmap = 0, eager = 0;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "PATH", MD_MODEL_HELP},
      {"prompt-tokens", CM_OPT_INT, &prompt, "N", "prefill length (default 256)", 1, 1 << 20},
      {"decode-tokens", CM_OPT_INT, &decode, "N", "decode steps (default 32)", 1, 1 << 20},
      {"chunk", CM_OPT_INT, &chunk, "N", "prefill chunk in tokens (default 256)", 1, 1 << 20},
      {"threads", CM_OPT_INT, &threads, "N", "CPU threads (default: one per core)", 0, 1024},
      {"device", CM_OPT_STR, &device, "auto|cpu|cuda",
       "kernel backend ($LMSERVE_DEVICE, else auto: cuda when a GPU is visible, else cpu); "
       "on a GPU the bound is the device's measured read bandwidth"},
      {"dtype", CM_OPT_STR, &dtype, "auto|float32|bfloat16|q8", KN_DTYPE_HELP},
      {"kv-cache-dtype", CM_OPT_STR, &kv_dtype_s, "auto|bf16|fp8|f32", WK_KV_DTYPE_HELP},
      {"json", CM_OPT_BOOL, &json, NULL, "print one JSON object instead of text"},
      {"kv-only", CM_OPT_BOOL, &kvo, NULL, "only the KV plan, from config.json alone (no weights)"},
      {"tensor-parallel-size", CM_OPT_INT, &tp, "N",
       "run the model as N ranks (processes on this host, threads / N each; default 1)", 1, 64},
      {"temperature", CM_OPT_DOUBLE, &temperature, "T",
       "decode samples at temperature T (default 0: greedy)", 0, 0, 0, 100},
      {"top-k", CM_OPT_INT, &top_k, "K", "sample among the K best (default 0: off)", 0, 1 << 30},
      {"top-p", CM_OPT_DOUBLE, &top_p, "P", "nucleus sampling (default 1: off)", 0, 0, 1e-6, 1},
      {"fast-prefill", CM_OPT_BOOL, &fast, NULL,
       "Gemma 4: skip KV-shared layers for rows nobody reads (default on; --no-fast-prefill)"},
      {"mmap", CM_OPT_BOOL, &use_mmap, NULL, WK_MMAP_HELP},
      {"enforce-eager", CM_OPT_BOOL, &eager, NULL, WK_EAGER_HELP},
      {"quantization", CM_OPT_STR, &quant_s, "none|fp8|q8_0|q4_0|q4_k", WK_QUANT_HELP},
      {0},
  };
  int rc = tl_args_parse("lmserve bench model",
                         "prefill / decode tokens per second against the memory-bandwidth bound",
                         opts, argc, argv);
  if (rc >= 0) return rc;
  int bf16 = 0, kv_dtype = 0, quant = 0;
  if (wk_dtype_args("lmserve bench model", dtype, kv_dtype_s, quant_s, &bf16, &kv_dtype, &quant))
    return 2;
  if (!model) {
    fprintf(stderr, "lmserve bench model: --model DIR is required\n");
    return 2;
  }
  if (kvo) return kv_only(model, json);
  const struct kn_backend_reg *reg = NULL;
  char err[512] = "";
  if (kn_backend_choose(device, &reg, err, sizeof(err))) {
    fprintf(stderr, "lmserve bench model: %s\n", err);
    return 2;
  }
  /* a device backend (no host memory): the bound is the device's bandwidth */
  int on_device = !(kn_backend_reg_caps(reg) & KN_CAP_HOST_MEMORY);
  if (on_device && tp > 1) {
    fprintf(stderr, "lmserve bench model: --tensor-parallel-size > 1 runs on the CPU only "
                    "(add --device cpu)\n");
    return 2;
  }
  bm_sample.temperature = (float)temperature;
  bm_sample.top_k = (int)top_k;
  bm_sample.top_p = (float)top_p;
  int status = 1;
  struct kn_backend *be = NULL;
  struct kn_cpu_bw_probe *probe = NULL;
  struct wk_model *m = NULL;
  struct wk_page_alloc pa = {0};
  struct wk_seq_blocks blk = {0};
  int32_t *toks = NULL;
  /* tensor parallelism: ranks 1..N-1 are forked children running the same steps on their
   * shards; rank 0 (this process) measures and prints */
  int rank = 0, n_kids = 0, all_threads = (int)threads;
  pid_t kids[64];
  struct kn_comm_id cid;
  if (all_threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    all_threads = cores > 0 ? (int)cores : 1;
  }
  if (tp > 1) {
    if ((rc = kn_cpu_backend_create(1, &be)) || (rc = kn_comm_id_new(be, &cid))) goto done;
    kn_backend_destroy(be);
    be = NULL;
    threads = all_threads / tp > 0 ? all_threads / tp : 1;
    fflush(NULL);
    for (int r = 1; r < tp; r++) {
      pid_t pid = fork();
      if (pid < 0) goto done;
      if (pid == 0) {
        rank = r;
        n_kids = 0;
        break;
      }
      kids[n_kids++] = pid;
    }
    /* rank r on cores [r * threads, (r + 1) * threads) */
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < threads; i++)
      CPU_SET(rank * (int)threads + i, &set);
    if (sched_setaffinity(0, sizeof set, &set))
      cm_warn("bench", "rank %d: cannot pin to its cores", rank);
  }
  if (on_device) {
    struct kn_backend_opts bo = {.n_threads = (int)threads, .local_rank = 0, .bf16 = bf16};
    if ((rc = kn_backend_reg_create(reg, &bo, &be, err, sizeof(err)))) {
      fprintf(stderr, "lmserve bench model: %s\n", err);
      goto done;
    }
  } else if ((rc = kn_cpu_backend_create_mode((int)threads, KN_CPU_ISA_BEST, bf16, &be))) {
    fprintf(stderr, "lmserve bench model: CPU backend: %s\n", cm_strerror(rc));
    goto done;
  }
  /* what the backend runs on: the processor's ISA path, or the device's name */
  char where[256];
  snprintf(where, sizeof(where), "%s", kn_cpu_isa_name(kn_cpu_isa_detect()));
  double dev_bw = 0; /* GB/s: measured before the weights take the device's memory */
#if LMSERVE_HAVE_CUDA
  if (on_device && kn_cuda_device_name(0, where, sizeof(where)))
    snprintf(where, sizeof(where), "?");
  if (on_device) dev_bw = kn_cuda_measure_bandwidth(0, (size_t)1 << 31); /* 2 GiB */
#endif
  struct wk_model_opts mo = {.max_batch_tokens = (int)CM_MIN(chunk, prompt),
                             .max_seqs = 1,
                             .kv_tokens = (int)(prompt + decode + 1),
                             .tp_rank = rank,
                             .tp_size = (int)tp,
                             .no_fast_prefill = !fast,
                             .kv_dtype = kv_dtype,
                             .mmap_weights = use_mmap,
                             .step_graphs = eager ? WK_GRAPHS_OFF : WK_GRAPHS_CAPTURE,
                             .quantization = quant};
  if ((rc = wk_model_load(model, be, &mo, &m, err, sizeof(err)))) {
    fprintf(stderr, "lmserve bench model: %s\n", err);
    goto done;
  }
  /* the group forms once every rank has loaded (loads take different times) */
  if (tp > 1 && (rc = kn_comm_join(be, &cid, rank, (int)tp, 60000))) {
    fprintf(stderr, "lmserve bench model: rank %d cannot join its group: %s\n", rank,
            cm_strerror(rc));
    goto done;
  }
  const struct md_config *c = wk_model_config(m);
  toks = malloc(sizeof(int32_t) * (size_t)prompt);
  if (!toks || wk_page_alloc_init(&pa, wk_model_n_pages(m))) goto done;
  uint32_t s = 12345;
  for (int i = 0; i < prompt; i++)
    toks[i] = (int32_t)(((s = s * 1664525u + 1013904223u) >> 8) % (uint32_t)c->vocab);
  toks[0] = c->bos_id;
  /* warm-up: the prompt's first chunk, untimed (the thread pool's start and the
   * first touches of the buffers a batch of that size writes, which a server
   * pays on its first request only), then from an empty cache again */
  int ch = (int)CM_MIN(chunk, prompt);
  if ((rc = run(m, &pa, &blk, toks, ch, 0, NULL, err, sizeof(err)))) goto fail_run;
  wk_seq_blocks_release(&blk, wk_model_kv_spec(m), &pa);

  double t0 = cm_time_s();
  int32_t tok = 0;
  for (int p = 0; p < prompt; p += ch) {
    int n = (int)CM_MIN((int64_t)ch, prompt - p);
    if ((rc = run(m, &pa, &blk, toks + p, n, p, p + n == prompt ? &tok : NULL, err, sizeof(err))))
      goto fail_run;
  }
  double t_prefill = cm_time_s() - t0;
  /* The bound: a streaming read of one token's weight bytes after every decode step
   * (one process only: ranks wait for each other), so that the steps and the reads
   * share the machine's moments; the best single pass is printed beside it. */
  double bpt = (double)wk_model_weight_bytes_per_token(m);
  if (tp == 1 && !on_device &&
      kn_cpu_bw_probe_create((size_t)CM_MIN(bpt, (double)(1ull << 30)), (int)all_threads, &probe))
    probe = NULL;
  double t_decode = 0, t_read = 0, bw_peak = 0, read_bytes = 0;
  for (int i = 0; i < decode; i++) {
    t0 = cm_time_s();
    if ((rc = run(m, &pa, &blk, &tok, 1, (int)prompt + i, &tok, err, sizeof(err)))) goto fail_run;
    t_decode += cm_time_s() - t0;
    if (probe) {
      double ps = kn_cpu_bw_probe_pass(probe), b = (double)kn_cpu_bw_probe_bytes(probe);
      t_read += ps;
      read_bytes += b;
      if (ps > 0 && b / ps / 1e9 > bw_peak) bw_peak = b / ps / 1e9;
    }
  }
  if (rank != 0) { /* rank 0 reports for the group */
    status = 0;
    goto done;
  }
  double bw = probe && t_read > 0 ? read_bytes / t_read / 1e9 : 0;
  if (on_device) {
    bw = bw_peak = dev_bw;
  } else if (!probe) {
    bw = bw_peak = kn_cpu_measure_bandwidth(0, all_threads); /* GB/s */
  }
  double prefill_tps = (double)prompt / t_prefill, decode_tps = (double)decode / t_decode;
  double bound_tps = bw > 0 ? bw * 1e9 / bpt : 0;
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  if (json) {
    printf("{\"model\":\"%s\",\"model_type\":\"%s\",\"backend\":\"%s\",\"isa\":\"%s\","
           "\"matmul_inputs\":\"%s\","
           "\"weight_bytes\":%llu,\"weight_bytes_per_token\":%.0f,\"prompt_tokens\":%lld,"
           "\"prefill_tokens_per_s\":%.2f,\"decode_tokens\":%lld,\"decode_tokens_per_s\":%.3f,"
           "\"bandwidth_gb_s\":%.2f,\"bandwidth_peak_gb_s\":%.2f,\"bandwidth_interleaved\":%s,"
           "\"bandwidth_bound_tokens_per_s\":%.3f,\"fraction_of_bound\":%.4f,"
           "\"tensor_parallel_size\":%lld,",
           model, c->model_type, kn_backend_name(be), where, kn_backend_matmul_inputs(be),
           (unsigned long long)wk_model_weight_bytes(m), bpt, (long long)prompt, prefill_tps,
           (long long)decode, decode_tps, bw, bw_peak, probe ? "true" : "false", bound_tps,
           bound_tps > 0 ? decode_tps / bound_tps : 0, (long long)tp);
    print_kv(kv, 1);
    printf("}\n");
  } else {
    printf("model      %s (%s, %d layers, hidden %d, vocab %d, %.1f MB of weights%s)\n", model,
           c->model_type, c->n_layers, c->hidden, c->vocab, (double)wk_model_weight_bytes(m) / 1e6,
           tp > 1 ? " on rank 0" : "");
    printf("ranks      %lld (tensor parallel), %lld threads each\n", (long long)tp,
           (long long)(tp > 1 ? threads : all_threads));
    printf("backend    %s (%s: %s), matmul inputs %s\n", kn_backend_name(be),
           on_device ? "device" : "processor", where, kn_backend_matmul_inputs(be));
    printf("prefill    %lld tokens in %.3f s: %.1f tokens/s (chunks of %d)\n", (long long)prompt,
           t_prefill, prefill_tps, ch);
    printf("decode     %lld tokens in %.3f s: %.2f tokens/s (one sequence, ", (long long)decode,
           t_decode, decode_tps);
    if (temperature > 0)
      printf("temperature %g, top-k %lld, top-p %g)\n", temperature, (long long)top_k, top_p);
    else
      printf("greedy)\n");
    if (probe)
      printf("bandwidth  %.2f GB/s streaming read, one token's weight bytes after each decode step "
             "(best pass %.2f GB/s)\n",
             bw, bw_peak);
    else if (on_device && bw > 0)
      printf("bandwidth  %.2f GB/s measured on the device (streaming read of 2 GiB, best of 5 "
             "passes)\n",
             bw);
    else if (on_device)
      printf("bandwidth  not measured (the device had no 2 GiB to read)\n");
    else
      printf("bandwidth  %.2f GB/s measured (streaming read, best of 4 passes)\n", bw);
    printf("bound      %.2f MB of weights read per decode token -> %.2f tokens/s at that "
           "bandwidth; achieved %.1f%%\n",
           bpt / 1e6, bound_tps, bound_tps > 0 ? 100.0 * decode_tps / bound_tps : 0.0);
    print_kv(kv, 0);
  }
  status = 0;
  goto done;
fail_run:
  fprintf(stderr, "lmserve bench model: %s\n", err);
done:
  for (int i = 0; i < n_kids; i++) {
    int st = 0;
    if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) status = 1;
  }
  if (m) wk_seq_blocks_release(&blk, wk_model_kv_spec(m), &pa);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  kn_backend_destroy(be);
  kn_cpu_bw_probe_destroy(probe);
  free(toks);
  return status;
}
