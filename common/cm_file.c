/* Whole-file reads for small configuration inputs. */
#define _GNU_SOURCE
#include "common/cm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(cm_file_tag, "cm.file");

ri_status_t cm_file_read(const char *path, size_t max, char **buf_p, size_t *len_p)
{
    ri_status_t st = RI_OK;
    struct stat sb;
    char *buf = NULL;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cm_status_from_errno(errno);
    if (fstat(fd, &sb) != 0) {
        st = cm_status_from_errno(errno);
        goto err_close;
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > max) {
        st = RI_ERR_TOO_LARGE;
        goto err_close;
    }
    buf = cm_malloc(&cm_file_tag, (size_t)sb.st_size + 1);
    if (buf == NULL) {
        st = RI_ERR_NOMEM;
        goto err_close;
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = cm_status_from_errno(errno);
            goto err_free;
        }
        if (r == 0)
            break; /* the file shrank; take what is there */
        got += (size_t)r;
    }
    buf[got] = '\0';
    close(fd);
    *buf_p = buf;
    if (len_p != NULL)
        *len_p = got;
    return RI_OK;

err_free:
    cm_free(buf);
err_close:
    close(fd);
    return st;
}

ri_status_t cm_file_read_token(const char *path, char *buf, size_t len)
{
    char *text = NULL;
    ri_status_t st = cm_file_read(path, 64 * 1024, &text, NULL);
    if (st != RI_OK)
        return st;
    st = RI_ERR_FORMAT;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        line += strspn(line, " \t\r");
        if (line[0] == '\0' || line[0] == '#')
            continue;
        size_t n = strcspn(line, " \t\r");
        if (n + 1 > len) {
            st = RI_ERR_TOO_LARGE;
        } else {
            memcpy(buf, line, n);
            buf[n] = '\0';
            st = RI_OK;
        }
        break;
    }
    cm_free(text);
    return st;
}
