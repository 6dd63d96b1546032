/* Monotonic clock helpers. */
#include "common/cm_time.h"

#include <errno.h>
#include <time.h>

uint64_t cm_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double cm_time_s(void)
{
    return (double)cm_time_ns() * 1e-9;
}

void cm_time_sleep_ns(uint64_t ns)
{
    struct timespec req = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&req, &req) != 0 && errno == EINTR) {
    }
}
