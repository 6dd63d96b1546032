/* "host:port" parsing and resolution, shared by the data-plane server and client. */
#include "common/cm_net.h"

#include <netdb.h>
#include <stdio.h>
#include <string.h>

ri_status_t cm_net_resolve(const char *text, bool passive, struct sockaddr_storage *ss, socklen_t *len_p,
                           char *host, size_t host_len)
{
    const char *colon = text ? strrchr(text, ':') : NULL;
    char name[256], port[16];
    struct addrinfo hints = {0}, *res = NULL;
    size_t hl;

    if (colon == NULL || strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof(port))
        return RI_ERR_INVALID;
    hl = (size_t)(colon - text);
    if (hl >= 2 && text[0] == '[' && text[hl - 1] == ']') {
        text++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(name) || (host != NULL && hl >= host_len))
        return RI_ERR_INVALID;
    memcpy(name, text, hl);
    name[hl] = '\0';
    snprintf(port, sizeof(port), "%s", colon + 1);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    if (getaddrinfo(name, port, &hints, &res) != 0 || res == NULL)
        return RI_ERR_NOT_FOUND;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    if (host != NULL)
        memcpy(host, name, hl + 1);
    return RI_OK;
}
