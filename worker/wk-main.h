/* wk-main.h — entry points of the worker subcommands, called by tools/lmserve.c. */
#ifndef LMSERVE_WK_MAIN_H
#define LMSERVE_WK_MAIN_H

int wk_worker_main(int argc, char **argv);
int wk_generate_main(int argc, char **argv);

int wk_bench_model_main(int argc, char **argv);

#endif
