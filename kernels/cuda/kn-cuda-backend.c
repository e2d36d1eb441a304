/* kn-cuda-backend.c — the CUDA backend's handle: device discovery, creation
 * and teardown, the memory hooks (cudaMalloc / cudaMemcpyAsync on the
 * backend's stream), the pinned staging ring for host index arrays, the
 * device scratch, error conversion and the ops table (the registry entry
 * "cuda" is kernels/kn-registry.c's). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend-impl.h"
#include "lmserve-config.h"

#define KN_CUDA_STAGE_SEG_MIN ((size_t)1 << 20) /* bytes per segment to start with */
#define KN_CUDA_ALIGN         256               /* bytes: staging and scratch alignment */
#define KN_CUDA_BLAS_WS       ((size_t)32 << 20) /* bytes of cuBLAS workspace */

static size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

/* ---- errors ------------------------------------------------------------- */

int kn_cuda_fail(cudaError_t e, const char *expr, const char *file, int line) {
  cm_error("cuda", "%s:%d: %s failed: %s (%s)", file, line, expr, cudaGetErrorName(e),
           cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? CM_ERR_NOMEM : CM_ERR_DEVICE;
}

int kn_cublas_fail(cublasStatus_t st, const char *expr, const char *file, int line) {
  cm_error("cuda", "%s:%d: %s failed: %s", file, line, expr, cublasGetStatusString(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return CM_ERR_NOMEM;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH)
    return CM_ERR_UNSUPPORTED;
  if (st == CUBLAS_STATUS_INVALID_VALUE) return CM_ERR_INVAL;
  return CM_ERR_DEVICE;
}

int kn_cuda_device_count(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver / no device: not an error for the caller */
    cm_debug("cuda", "no CUDA device: %s", cudaGetErrorString(e));
    return 0;
  }
  return n;
}

int kn_cuda_enter(struct kn_cuda_ctx *c) {
  KN_CUDA_CHECK(cudaSetDevice(c->device));
  return 0;
}

int kn_cuda_check_view(const struct kn_kv_view *v) {
  size_t elt = kn_dtype_size(v->dtype);
  if (v->page_bytes % elt || v->k_off % elt || v->v_off % elt || (uintptr_t)v->pool % elt) {
    cm_debug("cuda", "kv view not aligned to %zu-byte elements", elt);
    return CM_ERR_INVAL;
  }
  return 0;
}

/* ---- staging ring ------------------------------------------------------- */

static void stage_release(struct kn_cuda_ctx *c) {
  if (c->stage_host) (void)cudaFreeHost(c->stage_host);
  if (c->stage_dev) (void)cudaFree(c->stage_dev);
  c->stage_host = NULL;
  c->stage_dev = NULL;
}

/* (Re)creates the ring with segments of seg_bytes; the stream must be idle. */
static int stage_init(struct kn_cuda_ctx *c, size_t seg_bytes) {
  stage_release(c);
  size_t total = seg_bytes * KN_CUDA_STAGE_SEGS;
  KN_CUDA_CHECK(cudaHostAlloc((void **)&c->stage_host, total, cudaHostAllocDefault));
  KN_CUDA_CHECK(cudaMalloc((void **)&c->stage_dev, total));
  c->seg_bytes = seg_bytes;
  c->seg = 0;
  c->seg_used = 0;
  for (int i = 0; i < KN_CUDA_STAGE_SEGS; i++)
    c->seg_pending[i] = 0;
  return 0;
}

int kn_cuda_stage_alloc(struct kn_cuda_ctx *c, size_t bytes, void **host, void **dev) {
  if (c->graph_mode == KN_GRAPH_CAPTURE || c->graph_mode == KN_GRAPH_REPLAY)
    return kn_cuda_graph_slot(c, bytes, host, dev); /* the graph's arena */
  if (c->graph_mode == KN_GRAPH_MEASURE) {
    int err = kn_cuda_graph_note(c, bytes ? bytes : 1, 0);
    if (err) return err;
  }
  size_t need = align_up(bytes ? bytes : 1, 16);
  if (need > c->seg_bytes) {
    /* a request bigger than a segment: wait for everything, grow the ring */
    size_t seg = c->seg_bytes;
    while (seg < need)
      seg *= 2;
    KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    int err = stage_init(c, seg);
    if (err) return err;
  } else if (c->seg_used + need > c->seg_bytes) {
    /* leave the current segment (its copies are queued), enter the next */
    KN_CUDA_CHECK(cudaEventRecord(c->seg_done[c->seg], c->stream));
    c->seg_pending[c->seg] = 1;
    c->seg = (c->seg + 1) % KN_CUDA_STAGE_SEGS;
    c->seg_used = 0;
    if (c->seg_pending[c->seg]) {
      KN_CUDA_CHECK(cudaEventSynchronize(c->seg_done[c->seg]));
      c->seg_pending[c->seg] = 0;
    }
  }
  size_t off = (size_t)c->seg * c->seg_bytes + c->seg_used;
  c->seg_used += need;
  *host = c->stage_host + off;
  *dev = c->stage_dev + off;
  return 0;
}

int kn_cuda_stage_push(struct kn_cuda_ctx *c, const void *host, void *dev, size_t bytes) {
  if (c->graph_mode == KN_GRAPH_CAPTURE || c->graph_mode == KN_GRAPH_REPLAY)
    return 0; /* the arena goes up in one copy before the graph's launch */
  KN_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->stream));
  return 0;
}

int kn_cuda_stage(struct kn_cuda_ctx *c, const void *src, size_t bytes, void **dev) {
  void *h;
  int err = kn_cuda_stage_alloc(c, bytes, &h, dev);
  if (err) return err;
  memcpy(h, src, bytes);
  return kn_cuda_stage_push(c, h, *dev, bytes);
}

/* ---- scratch and result buffers ----------------------------------------- */

int kn_cuda_scratch(struct kn_cuda_ctx *c, size_t bytes, void **dev) {
  if (c->graph_mode == KN_GRAPH_CAPTURE || c->graph_mode == KN_GRAPH_REPLAY)
    return kn_cuda_graph_scratch(c, bytes, dev);
  if (c->graph_mode == KN_GRAPH_MEASURE) {
    int err = kn_cuda_graph_note(c, 0, bytes);
    if (err) return err;
  }
  if (bytes > c->scratch_bytes) {
    size_t want = align_up(bytes + bytes / 4, KN_CUDA_ALIGN); /* headroom against regrowth */
    KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));          /* earlier ops may still read it */
    if (c->scratch) KN_CUDA_CHECK(cudaFree(c->scratch));
    c->scratch = NULL;
    c->scratch_bytes = 0;
    KN_CUDA_CHECK(cudaMalloc(&c->scratch, want));
    c->scratch_bytes = want;
  }
  *dev = c->scratch;
  return 0;
}

int kn_cuda_result_host(struct kn_cuda_ctx *c, size_t bytes, void **host) {
  if (bytes > c->result_bytes) {
    size_t want = align_up(bytes, 4096);
    KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (c->result_host) KN_CUDA_CHECK(cudaFreeHost(c->result_host));
    c->result_host = NULL;
    c->result_bytes = 0;
    KN_CUDA_CHECK(cudaHostAlloc(&c->result_host, want, cudaHostAllocDefault));
    c->result_bytes = want;
  }
  *host = c->result_host;
  return 0;
}

/* ---- memory hooks --------------------------------------------------------- */

static void *cuda_alloc(void *ctx, size_t bytes) {
  struct kn_cuda_ctx *c = ctx;
  void *p = NULL;
  if (kn_cuda_enter(c)) return NULL;
  cudaError_t e = cudaMalloc(&p, bytes); /* 256-byte aligned */
  if (e != cudaSuccess) {
    cm_error("cuda", "cudaMalloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_free(void *ctx, void *p) {
  struct kn_cuda_ctx *c = ctx;
  if (kn_cuda_enter(c)) return;
  /* ops queued on the stream may still read p: let them finish first */
  cudaError_t e = cudaStreamSynchronize(c->stream);
  if (e == cudaSuccess) e = cudaFree(p);
  if (e != cudaSuccess) cm_error("cuda", "cudaFree failed: %s", cudaGetErrorString(e));
}

/* cudaMemcpyAsync on the context's stream, its device made current first. */
static int copy_async(struct kn_cuda_ctx *c, void *dst, const void *src, size_t bytes,
                      enum cudaMemcpyKind kind) {
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
  return 0;
}

static int cuda_upload(void *ctx, void *dst, const void *src, size_t bytes) {
  /* from pageable memory the call returns once src has been read: the caller
   * may reuse src at once (not something a graph can hold) */
  int err = kn_cuda_graph_refuse(ctx, "kn_upload");
  return err ? err : copy_async(ctx, dst, src, bytes, cudaMemcpyHostToDevice);
}

static int cuda_download(void *ctx, void *dst, const void *src, size_t bytes) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_graph_refuse(c, "kn_download");
  if (!err) err = copy_async(c, dst, src, bytes, cudaMemcpyDeviceToHost);
  if (err) return err;
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  struct kn_cuda_ctx *c = ctx;
  if (c->graph_mode == KN_GRAPH_REPLAY) return 0; /* the graph copies */
  return copy_async(c, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

static int cuda_memset(void *ctx, void *dst, int v, size_t bytes) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_RUN(c, cudaMemsetAsync(dst, v, bytes, c->stream));
  return 0;
}

static int cuda_sync(void *ctx) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_graph_refuse(c, "kn_sync");
  if (!err) err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return 0;
}

static int cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
  struct kn_cuda_ctx *c = ctx;
  int err = kn_cuda_enter(c);
  if (err) return err;
  KN_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return 0;
}

/* ---- lifetime ------------------------------------------------------------- */

static void cuda_destroy(void *ctx) {
  struct kn_cuda_ctx *c = ctx;
  if (!c) return;
  if (cudaSetDevice(c->device) == cudaSuccess && c->stream) (void)cudaStreamSynchronize(c->stream);
#if LMSERVE_HAVE_NCCL
  kn_cuda_nccl_destroy(c);
#endif
  kn_cuda_fp8_destroy(c);
  stage_release(c);
  for (int i = 0; i < KN_CUDA_STAGE_SEGS; i++)
    if (c->seg_done[i]) (void)cudaEventDestroy(c->seg_done[i]);
  if (c->scratch) (void)cudaFree(c->scratch);
  if (c->kept_d) (void)cudaFree(c->kept_d);
  if (c->result_host) (void)cudaFreeHost(c->result_host);
  if (c->blas) (void)cublasDestroy(c->blas);
  if (c->blas_ws) (void)cudaFree(c->blas_ws);
  if (c->stream) (void)cudaStreamDestroy(c->stream);
  free(c);
}

/* the activations are narrowed to bf16 / f16 weights' type (kn-cuda-gemm.c) */
static const char *cuda_matmul_inputs(void *ctx) {
  (void)ctx;
  return "weights";
}

static struct kn_backend_ops cuda_ops = {
    .name = "cuda",
    .caps = KN_CUDA_CAPS,
    .destroy = cuda_destroy,
    .matmul_inputs = cuda_matmul_inputs,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .sync = cuda_sync,
    .mem_info = cuda_mem_info,
    .embed = kn_cuda_op_embed,
    .rmsnorm = kn_cuda_op_rmsnorm,
    .matmul = kn_cuda_op_matmul,
    .matmul_rows = kn_cuda_op_matmul_rows,
    .matmul_fp8 = kn_cuda_op_matmul_fp8,
    .fp8_weights = kn_cuda_op_fp8_weights,
    .rope = kn_cuda_op_rope,
    .gelu_mul = kn_cuda_op_gelu_mul,
    .add = kn_cuda_op_add,
    .mul = kn_cuda_op_mul,
    .scale = kn_cuda_op_scale,
    .softcap = kn_cuda_op_softcap,
    .copy_rows = kn_cuda_op_copy_rows,
    .add_norm = kn_cuda_op_add_norm,
    .qkv_prep = kn_cuda_op_qkv_prep,
    .matmul_n = kn_cuda_op_matmul_n,
    .matmul_glu = kn_cuda_op_matmul_glu,
    .argmax = kn_cuda_op_argmax,
    .router_topk = kn_cuda_op_router_topk,
    .sample = kn_cuda_op_sample,
    .kept_ids = kn_cuda_op_kept_ids,
    .sample_masks = kn_cuda_op_sample_masks,
    .ids_take = kn_cuda_op_ids_take,
    .embed_dev = kn_cuda_op_embed_dev,
    .kv_write = kn_cuda_op_kv_write,
    .attention = kn_cuda_op_attention,
    .layernorm = kn_cuda_op_layernorm,
    .bias_act = kn_cuda_op_bias_act,
    .avg_pool2d = kn_cuda_op_avg_pool2d,
    .clamp = kn_cuda_op_clamp,
    .avg_pool_grid = kn_cuda_op_avg_pool_grid,
    .standardize = kn_cuda_op_standardize,
    .conv3x3_s2 = kn_cuda_op_conv3x3_s2,
    .dwconv_causal = kn_cuda_op_dwconv_causal,
    .local_attn_rel = kn_cuda_op_local_attn_rel,
    .graph_new = kn_cuda_graph_new,
    .graph_begin = kn_cuda_graph_begin,
    .graph_end = kn_cuda_graph_end,
    .graph_free = kn_cuda_graph_free,
};

#if LMSERVE_HAVE_NCCL
static void fill_nccl_ops(void) {
  kn_cuda_nccl_fill(&cuda_ops);
}
#endif

int kn_cuda_backend_gemv(const struct kn_backend *be) {
  return be && be->ops == &cuda_ops && ((const struct kn_cuda_ctx *)be->ctx)->gemv;
}

int kn_cuda_backend_create(int device, struct kn_backend **out) {
  int err = 0;
  *out = NULL;
  struct kn_cuda_ctx *c = NULL;
  struct kn_backend *be = NULL;
  int n = kn_cuda_device_count();
  if (device < 0 || device >= n) {
    cm_error("cuda", "device %d requested, %d visible", device, n);
    err = CM_ERR_INVAL;
    goto fail;
  }
  c = calloc(1, sizeof(*c));
  if (!c) {
    err = CM_ERR_NOMEM;
    goto fail;
  }
  c->device = device;
  KN_CUDA_CHECK_GOTO(cudaSetDevice(device), err, fail);
  KN_CUDA_CHECK_GOTO(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device), err,
                     fail);
  KN_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), err, fail);
  const char *no_blas = kn_cuda_blas_error();
  if (no_blas) {
    cm_error("cuda", "%s", no_blas);
    err = CM_ERR_UNSUPPORTED;
    goto fail;
  }
  KN_CUBLAS_CHECK_GOTO(cublasCreate(&c->blas), err, fail);
  KN_CUBLAS_CHECK_GOTO(cublasSetStream(c->blas, c->stream), err, fail);
  /* a workspace of our own (32 MiB, what cuBLAS asks for on Hopper), so that
   * step graphs capture cuBLAS calls without an allocation inside */
  KN_CUDA_CHECK_GOTO(cudaMalloc(&c->blas_ws, KN_CUDA_BLAS_WS), err, fail);
  KN_CUBLAS_CHECK_GOTO(cublasSetWorkspace(c->blas, c->blas_ws, KN_CUDA_BLAS_WS), err, fail);
  KN_CUDA_CHECK_GOTO(cudaMalloc((void **)&c->kept_d, sizeof(int32_t) * KN_KEPT_IDS_MAX), err, fail);
  KN_CUDA_CHECK_GOTO(cudaMemsetAsync(c->kept_d, 0, sizeof(int32_t) * KN_KEPT_IDS_MAX, c->stream),
                     err, fail);
  for (int i = 0; i < KN_CUDA_STAGE_SEGS; i++)
    KN_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&c->seg_done[i], cudaEventDisableTiming), err,
                       fail);
  err = stage_init(c, KN_CUDA_STAGE_SEG_MIN);
  if (err) goto fail;
  const char *gv = getenv("LMSERVE_CUDA_GEMV");
  if (!gv || strcmp(gv, "0")) {
    err = kn_cuda_gemv_check(c);
    if (err && cudaStreamSynchronize(c->stream) != cudaSuccess) goto fail; /* context broken */
    c->gemv = err == 0;
    if (err)
      cm_warn("cuda", "few-rows matmuls stay on cuBLAS: the kernel's check failed (%s)",
              cm_strerror(err));
    err = 0;
  }
  if ((err = kn_cuda_fp8_check(c))) goto fail; /* only a broken context fails it */
#if LMSERVE_HAVE_NCCL
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_nccl_ops);
#endif
  be = kn_backend_wrap(&cuda_ops, c);
  if (!be) {
    err = CM_ERR_NOMEM;
    goto fail;
  }
  err = kn_cuda_fused_check(be);
  if (!err) err = kn_cuda_ids_check(be, c);
  if (!err) err = kn_cuda_mask_check(be, c);
  if (!err) err = kn_cuda_audio_check(be, c);
  if (err) {
    kn_backend_destroy(be); /* frees c */
    return err;
  }
  cm_debug("cuda", "backend on device %d (%d SMs)", device, c->n_sm);
  *out = be;
  return 0;
fail:
  cuda_destroy(c);
  return err;
}
