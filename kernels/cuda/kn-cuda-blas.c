/* kn-cuda-blas.c — cuBLAS and cuBLASLt loaded on first use instead of at
 * program start. The binary is not linked against them: their static
 * initialisers touch ~85 MB of cuBLASLt's .bss and ~60 MB of its text, which
 * every process would otherwise carry (a CPU worker, the frontend, the
 * scheduler). Each cuBLAS function the backend calls is defined here with the
 * header's own prototype and forwards to the library's, resolved with dlsym
 * the first time any of them is called (the CUDA backend's creation). Where a
 * library cannot be loaded, every call returns CUBLAS_STATUS_NOT_INITIALIZED
 * and kn_cuda_blas_error says why (dlerror's sentence), which the backend's
 * creation reports. The sonames are the toolkit's major version, as the
 * linker would have recorded them; LD_LIBRARY_PATH and the executable's
 * RUNPATH apply as for any dlopen. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* cublasLt.h declares a function without a prototype */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <cublas_v2.h>

#include "kernels/cuda/kn-cuda-impl.h"

#define KN_STR_(x)  #x
#define KN_STR(x)   KN_STR_(x)
#define SONAME(lib) "lib" lib ".so." KN_STR(CUBLAS_VER_MAJOR)

enum { LIB_BLAS, LIB_LT, N_LIBS };

static const char *const g_sonames[N_LIBS] = {SONAME("cublas"), SONAME("cublasLt")};

/* The forwarded functions: (return type, failure value, library, name,
 * parameters, arguments). */
#define KN_BLAS_FUNCS(X)                                                                           \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasCreate_v2,                      \
    (cublasHandle_t * h), (h))                                                                     \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasDestroy_v2, (cublasHandle_t h), \
    (h))                                                                                           \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasSetStream_v2,                   \
    (cublasHandle_t h, cudaStream_t s), (h, s))                                                    \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasSetWorkspace_v2,                \
    (cublasHandle_t h, void *w, size_t n), (h, w, n))                                              \
  X(const char *, "cuBLAS is not loaded", LIB_BLAS, cublasGetStatusString, (cublasStatus_t s),     \
    (s))                                                                                           \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasSgemm_v2,                       \
    (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,            \
     const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,      \
     float *C, int ldc),                                                                           \
    (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))                                     \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_BLAS, cublasGemmEx,                         \
    (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,            \
     const void *alpha, const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt,   \
     int ldb, const void *beta, void *C, cudaDataType Ct, int ldc, cublasComputeType_t ct,         \
     cublasGemmAlgo_t algo),                                                                       \
    (h, ta, tb, m, n, k, alpha, A, At, lda, B, Bt, ldb, beta, C, Ct, ldc, ct, algo))               \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtCreate, (cublasLtHandle_t * h), \
    (h))                                                                                           \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtDestroy, (cublasLtHandle_t h),  \
    (h))                                                                                           \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatmulDescCreate,               \
    (cublasLtMatmulDesc_t * d, cublasComputeType_t ct, cudaDataType_t st), (d, ct, st))            \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatmulDescDestroy,              \
    (cublasLtMatmulDesc_t d), (d))                                                                 \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatmulDescSetAttribute,         \
    (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n),         \
    (d, a, buf, n))                                                                                \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatrixLayoutCreate,             \
    (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),        \
    (l, t, rows, cols, ld))                                                                        \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatrixLayoutDestroy,            \
    (cublasLtMatrixLayout_t l), (l))                                                               \
  X(cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, LIB_LT, cublasLtMatmul,                         \
    (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,                 \
     cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,        \
     const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,                 \
     const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn, cudaStream_t s),                      \
    (h, d, alpha, A, Ad, B, Bd, beta, C, Cd, D, Dd, algo, ws, wsn, s))

#define KN_BLAS_PTR(RET, FAIL, LIB, NAME, PARAMS, ARGS) static __typeof__(NAME) *p_##NAME;
KN_BLAS_FUNCS(KN_BLAS_PTR)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ready;
static char g_why[320];

static void load(void) {
  void *lib[N_LIBS];
  for (int i = 0; i < N_LIBS; i++)
    if (!(lib[i] = dlopen(g_sonames[i], RTLD_NOW | RTLD_LOCAL))) {
      const char *e = dlerror();
      snprintf(g_why, sizeof(g_why), "cannot load %s: %s", g_sonames[i], e ? e : "?");
      return;
    }
#define KN_BLAS_SYM(RET, FAIL, LIB, NAME, PARAMS, ARGS)                                            \
  if (!(p_##NAME = (__typeof__(NAME) *)dlsym(lib[LIB], #NAME))) {                                  \
    snprintf(g_why, sizeof(g_why), "%s has no %s", g_sonames[LIB], #NAME);                         \
    return;                                                                                        \
  }
  KN_BLAS_FUNCS(KN_BLAS_SYM)
  g_ready = 1; /* the libraries stay loaded for the life of the process */
}

static int ready(void) {
  pthread_once(&g_once, load);
  return g_ready;
}

const char *kn_cuda_blas_error(void) {
  return ready() ? NULL : g_why;
}

#define KN_BLAS_DEF(RET, FAIL, LIB, NAME, PARAMS, ARGS)                                            \
  RET CUBLASWINAPI NAME PARAMS {                                                                   \
    return ready() ? p_##NAME ARGS : FAIL;                                                         \
  }
KN_BLAS_FUNCS(KN_BLAS_DEF)
