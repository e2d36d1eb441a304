/* sch-main.h — entry points of the scheduler subcommands, called by tools/lmserve.c. */
#ifndef LMSERVE_SCH_MAIN_H
#define LMSERVE_SCH_MAIN_H

int sch_main(int argc, char **argv);

#endif
