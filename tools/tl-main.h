/* tl-main.h — entry points of the tools subcommands, called by tools/lmserve.c. */
#ifndef LMSERVE_TL_MAIN_H
#define LMSERVE_TL_MAIN_H

int tl_serve_main(int argc, char **argv);
int tl_bench_main(int argc, char **argv);
int tl_make_tiny_model_main(int argc, char **argv);
int tl_export_gguf_main(int argc, char **argv); /* tl-export-gguf.c */
int tl_quantize_main(int argc, char **argv);    /* tl-export-gguf.c */

int tl_bench_serve_main(int argc, char **argv);
int tl_bench_model_main(int argc, char **argv);     /* tl-bench-model.c */
int tl_bench_tokenizer_main(int argc, char **argv); /* tl-bench-tok.c */
int tl_bench_coll_main(int argc, char **argv);      /* tl-bench-coll.c */
int tl_bench_soak_main(int argc, char **argv);      /* tl-bench-soak.c */
int tl_bench_vision_main(int argc, char **argv);    /* tl-bench-vision.c */
int tl_bench_grammar_main(int argc, char **argv);   /* tl-bench-grammar.c */
int tl_bench_matmul_main(int argc, char **argv);    /* tl-bench-matmul.c */

int tl_generate_main(int argc, char **argv);   /* tl-generate.c */
int tl_run_batch_main(int argc, char **argv);  /* tl-run-batch.c */
int tl_tokenize_main(int argc, char **argv);   /* tl-tokenize.c */
int tl_detokenize_main(int argc, char **argv); /* tl-tokenize.c */

/* cm_args_parse of a subcommand's flags, argv[1..) (no positional arguments): -1 when
 * the subcommand goes on, else the code it exits with: 0 after --help (the usage
 * printed), 2 after a mistake (the problem printed). tl-args.c */
struct cm_opt;
int tl_args_parse(const char *prog, const char *summary, const struct cm_opt *opts, int argc,
                  char **argv);

/* qsort's comparison of two doubles, ascending (the benchmarks' medians). tl-args.c */
int tl_cmp_double(const void *a, const void *b);

#endif
