/* Monotonic time for timeouts and measurements. */
#ifndef CM_TIME_H
#define CM_TIME_H

#include <stdint.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
uint64_t cm_time_ns(void);

/* Seconds on CLOCK_MONOTONIC, as a double (for benchmarks). */
double cm_time_s(void);

/* Sleep for ns nanoseconds (restarts after signals). */
void cm_time_sleep_ns(uint64_t ns);

#endif /* CM_TIME_H */
