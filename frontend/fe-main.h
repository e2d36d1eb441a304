/* fe-main.h — entry points of the frontend subcommands, called by tools/lmserve.c. */
#ifndef LMSERVE_FE_MAIN_H
#define LMSERVE_FE_MAIN_H

int fe_frontend_main(int argc, char **argv);
int fe_tokenize_main(int argc, char **argv);
int fe_detokenize_main(int argc, char **argv);

int fe_bench_tokenizer_main(int argc, char **argv);

#endif
