/* fe-main.h — entry point of the frontend role, called by tools/lmserve.c. */
#ifndef LMSERVE_FE_MAIN_H
#define LMSERVE_FE_MAIN_H

int fe_frontend_main(int argc, char **argv);

/* 1 when json is what --default-chat-template-kwargs takes: a JSON object whose
 * enable_thinking, if there, is a boolean. */
int fe_main_template_kwargs_ok(const char *json);

/* --limit-mm-per-prompt's help, the same on serve and frontend (both check the
 * spec with fe-mm.h's fe_mm_parse_limit). */
#define FE_MAIN_LIMIT_MM_ARG "image=N,audio=M"
#define FE_MAIN_LIMIT_MM_HELP                                                                      \
  "images and audio clips per prompt at most (image=16,audio=16; 0 turns a modality off); "        \
  "JSON {\"image\": N, \"audio\": M} too"

#endif
