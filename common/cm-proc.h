/* cm-proc.h — running another program without a shell.
 *
 * For the few places where lmserve itself starts a helper program (the tokenizer
 * benchmark's JavaScript reference): posix_spawnp with an argv, never a command line
 * that a shell would parse, and its output read through a pipe. */
#ifndef LMSERVE_CM_PROC_H
#define LMSERVE_CM_PROC_H

#include <stddef.h>

/* Runs argv[0] (looked up on PATH) with argv, stdin from /dev/null, stdout and stderr
 * into one pipe. Keeps the first out_cap - 1 bytes of that output in out (always
 * NUL-terminated; the rest is read and dropped so the child never blocks) and waits for
 * the child. Returns its exit status (0..255), 128 + signal if it was killed, or a
 * negative cm-err code if it could not be started (CM_ERR_NOENT: no such program). */
int cm_run_capture(char *const argv[], char *out, size_t out_cap);

#endif
