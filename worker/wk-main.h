/* wk-main.h — entry point of the worker role, called by tools/lmserve.c. */
#ifndef LMSERVE_WK_MAIN_H
#define LMSERVE_WK_MAIN_H

int wk_worker_main(int argc, char **argv);

/* The --dtype, --kv-dtype and --quantization arguments of a command (who:
 * "lmserve worker") into *bf16, *kv_dtype and *quant: 0, or -1 with the
 * reason on stderr. */
int wk_dtype_args(const char *who, const char *dtype, const char *kv_dtype, const char *quant,
                  int *bf16, int *kv_dtype_out, int *quant_out);

#endif
