/* cm-time.h — monotonic and wall-clock time in nanoseconds. */
#ifndef LMSERVE_CM_TIME_H
#define LMSERVE_CM_TIME_H
#include <stdint.h>

uint64_t cm_time_ns(void);       /* monotonic, ns; for durations and timeouts */
uint64_t cm_time_wall_ns(void);  /* since the Unix epoch, ns; for logs and "created" */
double cm_time_s(void);          /* monotonic, seconds */
void cm_time_sleep_ns(uint64_t ns);

#endif
