/* kn-cuda.h — the CUDA kernel backend: the kn-backend.h ops on one NVIDIA
 * device, on one stream per backend, with cuBLAS for the dense GEMMs.
 *
 * Memory hooks are cudaMalloc / cudaFree / cudaMemcpyAsync on the backend's
 * stream, so kn_alloc'd pointers are device memory. Host index arrays (token
 * ids, positions, slot mappings, block tables, sequence descriptors) are
 * staged through a pinned ring buffer; ops stay asynchronous except those
 * whose results land in host memory (kn_download, kn_argmax, kn_router_topk),
 * which wait for the stream.
 *
 * A backend is used by one thread at a time (any thread: each op makes the
 * backend's device current). See kernels/cuda/README.md for the contract.
 *
 * This header is plain C and builds without CUDA: when the build has no CUDA
 * (LMSERVE_HAVE_CUDA == 0) the functions below are not compiled at all, so
 * guard calls with `#if LMSERVE_HAVE_CUDA` (lmserve-config.h). */
#ifndef LMSERVE_KN_CUDA_H
#define LMSERVE_KN_CUDA_H
#include "kernels/kn-backend.h"
#include "lmserve-config.h"

/* What the CUDA backend can do (kn-backend.h): device memory, kn_sample on
 * the device, collectives over NCCL where the build has NCCL, every block
 * format (those its check at creation passes); the registry's
 * automatic choice prefers it to the CPU. These two are plain constants,
 * usable in builds without CUDA. */
#if LMSERVE_HAVE_NCCL
#define KN_CUDA_CAPS (KN_CAP_SAMPLE | KN_CAP_ALLREDUCE | KN_CAP_BLOCK_WEIGHTS | KN_CAP_BLOCK_LOWBIT)
#else
#define KN_CUDA_CAPS (KN_CAP_SAMPLE | KN_CAP_BLOCK_WEIGHTS | KN_CAP_BLOCK_LOWBIT)
#endif
#define KN_CUDA_PRIORITY 100

/* Number of CUDA devices visible to this process; 0 when there is no device,
 * no driver, or the runtime fails to initialise (never an error). */
int kn_cuda_device_count(void);

/* Creates a CUDA backend on device `device` (0 <= device < kn_cuda_device_count()):
 * 0 and *out (destroy with kn_backend_destroy), or CM_ERR_INVAL (bad device index),
 * CM_ERR_DEVICE (CUDA / cuBLAS initialisation failed) or CM_ERR_NOMEM, *out NULL. */
int kn_cuda_backend_create(int device, struct kn_backend **out);

/* 1 when be (a CUDA backend) runs matmuls of few rows on its one-launch
 * kernel (kn-cuda-gemv.cu: it passed its check when be was made and
 * $LMSERVE_CUDA_GEMV is not 0), 0 when they stay on cuBLAS. */
int kn_cuda_backend_gemv(const struct kn_backend *be);

/* Streaming-read bandwidth of device `device` in GB/s (10^9 bytes/s): the
 * best of five timed passes over a fresh buffer of `bytes` (choose many times
 * the L2, e.g. 1 GiB). 0 when it cannot be measured. Used as decode's bound. */
double kn_cuda_measure_bandwidth(int device, size_t bytes);

/* "NAME (N multiprocessors, X GiB)" of device `device` into out[size]:
 * 0, or -1 when the device cannot be read. */
int kn_cuda_device_name(int device, char *out, size_t size);

/* The device a rank with local index local_rank (>= 0) runs on among n_dev
 * (>= 1) visible devices: local_rank modulo n_dev, so that ranks spread over
 * the devices of their host as torchrun's LOCAL_RANK does. Plain arithmetic,
 * compiled in every build. */
static inline int kn_cuda_device_for_rank(int local_rank, int n_dev) {
  return n_dev > 0 && local_rank >= 0 ? local_rank % n_dev : 0;
}

#endif
