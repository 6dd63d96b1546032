/* "host:port" parsing and resolution, shared by the data-plane server and client. */
#include "common/cm_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cm_net_split(const char *addr, char *host, size_t hostlen, unsigned *port_p)
{
    const char *colon, *hs = addr, *he;
    if (addr == NULL)
        return false;
    if (addr[0] == '[') {
        he = strchr(addr, ']');
        if (he == NULL || he[1] != ':')
            return false;
        hs = addr + 1;
        colon = he + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL)
            return false;
        he = colon;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= hostlen)
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port > 65535)
        return false;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port_p = (unsigned)port;
    return true;
}

ri_status_t cm_net_parse_numeric(const char *addr, struct sockaddr_storage *ss, char *host, size_t hostlen,
                                 unsigned *port_p, bool *ipv6_p)
{
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
    unsigned port;

    memset(ss, 0, sizeof(*ss));
    if (!cm_net_split(addr, host, hostlen, &port))
        return RI_ERR_INVALID;
    *port_p = port;
    if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *ipv6_p = false;
        return RI_OK;
    }
    if (inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *ipv6_p = true;
        return RI_OK;
    }
    return RI_ERR_UNSUPPORTED;
}

bool cm_net_host_is_wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

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
