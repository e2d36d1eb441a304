/* kn-cpu-avx512.h — the target attribute of the AVX-512 (F/DQ/BW/VL) kernels,
 * for the files that hold some (kn-cpu-avx512.c, the attention's wide tiles in
 * kn-cpu-attn-avx2.c). Include only in files whose kernels run after a CPU
 * check. */
#ifndef LMSERVE_KN_CPU_AVX512_H
#define LMSERVE_KN_CPU_AVX512_H

#define KN_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")))

#endif
