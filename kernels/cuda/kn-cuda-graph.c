/* kn-cuda-graph.c — step graphs (kn-backend.h's kn_graph_*) as CUDA graphs.
 *
 * A graph owns a fixed input arena: one slot per host array the ops stage
 * (token ids, positions, slot mappings, block tables, attention rows), in
 * the order they stage them, each the size the measuring run asked for. The
 * captured kernels read their arrays from the arena's device copy; a replay
 * writes the step's arrays into a pinned mirror of it, copies the mirror up
 * in one cudaMemcpyAsync, then launches the graph. Two mirrors alternate, so
 * the host can write the next step's arrays while the previous copy is still
 * queued (async scheduling prepares step N+1 while step N runs); before it
 * reuses a mirror, the host waits for the event recorded after that
 * mirror's last copy.
 *
 * Scratch (converted activations, attention partials) comes from the graph's
 * own buffer, sized by the measuring run: the backend's shared scratch may
 * be reallocated by a later eager step, which would leave a captured pointer
 * dangling. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "kernels/cuda/kn-cuda-impl.h"

struct kn_cuda_graph {
  int max_keys;
  size_t *sizes; /* [n_slots] bytes of each staged array, exactly as measured */
  size_t *offs;  /* [n_slots] their offsets in the arena (16-byte aligned) */
  int n_slots, cap_slots;
  int cursor;               /* next slot in capture / replay */
  int mismatch;             /* a slot asked with another size in this mode */
  size_t arena_bytes;       /* sum of sizes */
  unsigned char *arena;     /* device */
  unsigned char *mirror[2]; /* pinned host copies */
  cudaEvent_t copied[2];    /* recorded after each mirror's last copy was queued */
  int copied_pending[2];    /* copied[k] recorded */
  int cur;                  /* the mirror this mode writes */
  size_t scratch_need;      /* the largest scratch request of the measuring run */
  void *scratch;            /* device, scratch_need bytes */
  cudaGraph_t graph;        /* captured */
  cudaGraphExec_t exec;     /* instantiated */
};

static size_t align16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

int kn_cuda_graph_keys(const struct kn_cuda_ctx *c) {
  return c->graph_mode && c->graph ? c->graph->max_keys : 0;
}

int kn_cuda_graph_refuse(const struct kn_cuda_ctx *c, const char *op) {
  if (!c->graph_mode) return 0;
  cm_error("cuda", "%s cannot run inside a step graph (it waits for the device or for peers)", op);
  return CM_ERR_UNSUPPORTED;
}

int kn_cuda_graph_note(struct kn_cuda_ctx *c, size_t stage_bytes, size_t scratch_bytes) {
  struct kn_cuda_graph *g = c->graph;
  if (scratch_bytes > g->scratch_need) g->scratch_need = scratch_bytes;
  if (!stage_bytes) return 0;
  if (g->n_slots == g->cap_slots) {
    int cap = g->cap_slots ? 2 * g->cap_slots : 256;
    size_t *s = realloc(g->sizes, sizeof(size_t) * (size_t)cap);
    if (!s) return CM_ERR_NOMEM;
    g->sizes = s;
    g->cap_slots = cap;
  }
  g->sizes[g->n_slots++] = stage_bytes;
  return 0;
}

int kn_cuda_graph_slot(struct kn_cuda_ctx *c, size_t bytes, void **host, void **dev) {
  struct kn_cuda_graph *g = c->graph;
  int i = g->cursor;
  /* the exact size: a count that differs and rounds to the same 16 bytes
   * would still run the kernels captured for the other count */
  size_t need = bytes ? bytes : 1; /* as kn_cuda_stage_alloc noted it */
  if (i >= g->n_slots || g->sizes[i] != need) {
    if (!g->mismatch)
      cm_warn("cuda", "step graph input %d: %zu bytes, where the graph was captured with %s", i,
              need, i >= g->n_slots ? "fewer inputs" : "another size");
    g->mismatch = 1;
    return CM_ERR_INVAL;
  }
  g->cursor++;
  *host = g->mirror[g->cur] + g->offs[i];
  *dev = g->arena + g->offs[i];
  return 0;
}

int kn_cuda_graph_scratch(struct kn_cuda_ctx *c, size_t bytes, void **dev) {
  struct kn_cuda_graph *g = c->graph;
  if (bytes > g->scratch_need) {
    if (!g->mismatch)
      cm_warn("cuda", "step graph scratch: %zu bytes asked, %zu measured", bytes, g->scratch_need);
    g->mismatch = 1;
    return CM_ERR_INVAL;
  }
  *dev = g->scratch;
  return 0;
}

int kn_cuda_graph_new(void *ctx, int max_keys, void **out) {
  struct kn_cuda_ctx *c = ctx;
  if (c->nccl) return CM_ERR_UNSUPPORTED; /* collectives stay eager (see README.md) */
  struct kn_cuda_graph *g = calloc(1, sizeof(*g));
  if (!g) return CM_ERR_NOMEM;
  g->max_keys = max_keys;
  int err = kn_cuda_enter(c);
  for (int k = 0; k < 2 && !err; k++)
    KN_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&g->copied[k], cudaEventDisableTiming), err, fail);
  if (!err) {
    *out = g;
    return 0;
  }
fail:
  kn_cuda_graph_free(c, g);
  return err;
}

/* Frees what a measure made, so that a new one starts clean. */
static void drop_arena(struct kn_cuda_graph *g) {
  if (g->exec) (void)cudaGraphExecDestroy(g->exec);
  if (g->graph) (void)cudaGraphDestroy(g->graph);
  if (g->arena) (void)cudaFree(g->arena);
  for (int k = 0; k < 2; k++) {
    if (g->mirror[k]) (void)cudaFreeHost(g->mirror[k]);
    g->mirror[k] = NULL;
    g->copied_pending[k] = 0;
  }
  if (g->scratch) (void)cudaFree(g->scratch);
  g->exec = NULL;
  g->graph = NULL;
  g->arena = NULL;
  g->scratch = NULL;
  free(g->offs);
  g->offs = NULL;
}

/* The mirror to write next: the other one, once its last copy has run. */
static int next_mirror(struct kn_cuda_graph *g) {
  g->cur ^= 1;
  if (g->copied_pending[g->cur]) {
    KN_CUDA_CHECK(cudaEventSynchronize(g->copied[g->cur]));
    g->copied_pending[g->cur] = 0;
  }
  return 0;
}

/* The arena's copy to the device, then the graph. */
static int launch(struct kn_cuda_ctx *c, struct kn_cuda_graph *g) {
  int k = g->cur;
  if (g->arena_bytes)
    KN_CUDA_CHECK(
        cudaMemcpyAsync(g->arena, g->mirror[k], g->arena_bytes, cudaMemcpyHostToDevice, c->stream));
  KN_CUDA_CHECK(cudaEventRecord(g->copied[k], c->stream));
  g->copied_pending[k] = 1;
  KN_CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
  return 0;
}

int kn_cuda_graph_begin(void *ctx, void *gp, int mode) {
  struct kn_cuda_ctx *c = ctx;
  struct kn_cuda_graph *g = gp;
  int err = kn_cuda_enter(c);
  if (err) return err;
  if (c->graph_mode) return CM_ERR_INVAL; /* one graph mode at a time */
  g->cursor = 0;
  g->mismatch = 0;
  if (mode == KN_GRAPH_MEASURE) {
    drop_arena(g);
    g->n_slots = 0;
    g->scratch_need = 0;
  } else {
    if ((err = next_mirror(g))) return err;
  }
  if (mode == KN_GRAPH_CAPTURE) {
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    if (g->graph) (void)cudaGraphDestroy(g->graph);
    g->exec = NULL;
    g->graph = NULL;
    /* thread-local: other threads' CUDA calls (none today) cannot break it */
    KN_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
  }
  c->graph = g;
  c->graph_mode = mode;
  return 0;
}

/* After a measure: the arena, its mirrors and the scratch, sized. */
static int make_arena(struct kn_cuda_graph *g) {
  g->offs = malloc(sizeof(size_t) * (size_t)(g->n_slots ? g->n_slots : 1));
  if (!g->offs) return CM_ERR_NOMEM;
  size_t off = 0;
  for (int i = 0; i < g->n_slots; i++) {
    g->offs[i] = off;
    off += align16(g->sizes[i]);
  }
  g->arena_bytes = off;
  size_t bytes = off ? off : 16;
  KN_CUDA_CHECK(cudaMalloc((void **)&g->arena, bytes));
  for (int k = 0; k < 2; k++)
    KN_CUDA_CHECK(cudaHostAlloc((void **)&g->mirror[k], bytes, cudaHostAllocDefault));
  if (g->scratch_need) KN_CUDA_CHECK(cudaMalloc(&g->scratch, g->scratch_need));
  return 0;
}

int kn_cuda_graph_end(void *ctx, void *gp, int ok) {
  struct kn_cuda_ctx *c = ctx;
  struct kn_cuda_graph *g = gp;
  int mode = c->graph_mode;
  c->graph = NULL;
  c->graph_mode = 0;
  int err = kn_cuda_enter(c);
  if (err) return err;
  int asked = ok; /* 0: the caller leaves after a failure of its own */
  if (g->mismatch) ok = 0;
  if (mode == KN_GRAPH_CAPTURE) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (e != cudaSuccess || !ok) {
      if (graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      if (e != cudaSuccess) return kn_cuda_fail(e, "cudaStreamEndCapture", __FILE__, __LINE__);
      return asked ? CM_ERR_INVAL : 0;
    }
    g->graph = graph;
    if (g->cursor != g->n_slots) {
      cm_warn("cuda", "step graph captured %d of the %d inputs measured", g->cursor, g->n_slots);
      return CM_ERR_INVAL;
    }
    KN_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    return launch(c, g);
  }
  if (!ok) return asked ? CM_ERR_INVAL : 0;
  if (mode == KN_GRAPH_MEASURE) return make_arena(g);
  if (g->cursor != g->n_slots) {
    cm_warn("cuda", "step graph replay staged %d of its %d inputs", g->cursor, g->n_slots);
    return CM_ERR_INVAL;
  }
  return launch(c, g);
}

void kn_cuda_graph_free(void *ctx, void *gp) {
  struct kn_cuda_ctx *c = ctx;
  struct kn_cuda_graph *g = gp;
  if (!g) return;
  if (kn_cuda_enter(c) == 0) (void)cudaStreamSynchronize(c->stream);
  drop_arena(g);
  for (int k = 0; k < 2; k++)
    if (g->copied[k]) (void)cudaEventDestroy(g->copied[k]);
  free(g->sizes);
  free(g);
}
