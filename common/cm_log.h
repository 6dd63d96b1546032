/*
 * Logging: one line per message on stderr (or a file), with UTC time, level,
 * pid/tid and source location.  The level (error, warn, info, debug, trace;
 * default info) is set by cm_log_set_level(): programs take it from their
 * --log-level / RI_LOG_LEVEL setting (cm_runtime.h); messages below it cost
 * one branch.
 * Thread-safe: each line is formatted into a local buffer and written once.
 */
#ifndef CM_LOG_H
#define CM_LOG_H

#include <stdbool.h>
#include "retroinfer/status.h"

typedef enum cm_log_level {
    CM_LOG_ERROR = 0,
    CM_LOG_WARN = 1,
    CM_LOG_INFO = 2,
    CM_LOG_DEBUG = 3,
    CM_LOG_TRACE = 4,
} cm_log_level_t;

extern int cm_log_level_current;

/* Set the level; returns the previous one. */
cm_log_level_t cm_log_set_level(cm_log_level_t level);

/* Parse "error|warn|info|debug|trace" (or 0-4) into *level_p. */
ri_status_t cm_log_level_parse(const char *text, cm_log_level_t *level_p);


/* Write one message; use the macros below. */
void cm_log_write(cm_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CM_LOG(level, ...)                                          \
    do {                                                            \
        if ((int)(level) <= cm_log_level_current)                   \
            cm_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define cm_error(...) CM_LOG(CM_LOG_ERROR, __VA_ARGS__)
#define cm_warn(...) CM_LOG(CM_LOG_WARN, __VA_ARGS__)
#define cm_info(...) CM_LOG(CM_LOG_INFO, __VA_ARGS__)
#define cm_debug(...) CM_LOG(CM_LOG_DEBUG, __VA_ARGS__)
#define cm_trace(...) CM_LOG(CM_LOG_TRACE, __VA_ARGS__)

#endif /* CM_LOG_H */
