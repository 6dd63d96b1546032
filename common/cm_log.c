/* Logging implementation: formatted lines on stderr. */
#define _GNU_SOURCE
#include "common/cm_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int cm_log_level_current = CM_LOG_INFO;

static const char cm_log_letters[] = "EWIDT";
static const char *const cm_log_names[] = {"error", "warn", "info", "debug", "trace"};

cm_log_level_t cm_log_set_level(cm_log_level_t level)
{
    cm_log_level_t old = (cm_log_level_t)cm_log_level_current;
    if (level > CM_LOG_TRACE)
        level = CM_LOG_TRACE;
    cm_log_level_current = (int)level;
    return old;
}

ri_status_t cm_log_level_parse(const char *text, cm_log_level_t *level_p)
{
    if (text == NULL)
        return RI_ERR_INVALID;
    for (int i = 0; i <= CM_LOG_TRACE; i++) {
        if (strcasecmp(text, cm_log_names[i]) == 0 ||
            (text[0] == (char)('0' + i) && text[1] == '\0')) {
            *level_p = (cm_log_level_t)i;
            return RI_OK;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *level_p = CM_LOG_WARN;
        return RI_OK;
    }
    return RI_ERR_INVALID;
}

static const char *cm_log_basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

void cm_log_write(cm_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    int n;
    va_list ap;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %d/%ld %s:%d ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 ts.tv_nsec / 1000000, cm_log_letters[level <= CM_LOG_TRACE ? level : CM_LOG_TRACE],
                 (int)getpid(), (long)syscall(SYS_gettid), cm_log_basename(file), line);
    if (n < 0)
        return;
    va_start(ap, fmt);
    if ((size_t)n < sizeof(buf))
        n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    if ((size_t)n >= sizeof(buf) - 1)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    /* One write(2) per line keeps lines from different threads whole. */
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}
