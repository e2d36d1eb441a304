/* wk-main.h — entry point of the worker role, called by tools/lmserve.c. */
#ifndef LMSERVE_WK_MAIN_H
#define LMSERVE_WK_MAIN_H

int wk_worker_main(int argc, char **argv);

#endif
