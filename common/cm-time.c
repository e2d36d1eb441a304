/* cm-time.c — clock_gettime wrappers. */
#include "common/cm-time.h"

#include <errno.h>
#include <time.h>

static uint64_t ts_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t cm_time_ns(void) { return ts_ns(CLOCK_MONOTONIC); }
uint64_t cm_time_wall_ns(void) { return ts_ns(CLOCK_REALTIME); }
double cm_time_s(void) { return (double)cm_time_ns() * 1e-9; }

void cm_time_sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
