/* tl-main.h — entry points of the tools subcommands, called by tools/lmserve.c. */
#ifndef LMSERVE_TL_MAIN_H
#define LMSERVE_TL_MAIN_H

int tl_serve_main(int argc, char **argv);
int tl_bench_main(int argc, char **argv);
int tl_make_tiny_model_main(int argc, char **argv);

int tl_bench_serve_main(int argc, char **argv);

#endif
