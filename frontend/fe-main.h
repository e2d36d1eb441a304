/* fe-main.h — entry point of the frontend role, called by tools/lmserve.c. */
#ifndef LMSERVE_FE_MAIN_H
#define LMSERVE_FE_MAIN_H

int fe_frontend_main(int argc, char **argv);

/* 1 when json is what --default-chat-template-kwargs takes: a JSON object whose
 * enable_thinking, if there, is a boolean. */
int fe_main_template_kwargs_ok(const char *json);

#endif
