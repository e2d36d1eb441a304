/* fe-main.h — entry point of the frontend role, called by tools/lmserve.c. */
#ifndef LMSERVE_FE_MAIN_H
#define LMSERVE_FE_MAIN_H

int fe_frontend_main(int argc, char **argv);

#endif
