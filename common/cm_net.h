/* Network addresses as our settings write them: "host:port" or "[v6]:port". */
#ifndef CM_NET_H
#define CM_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "retroinfer/status.h"

/*
 * Resolve text into *ss / *len_p (getaddrinfo, first result).  passive: for a
 * listener (AI_PASSIVE).  host (host_len bytes, may be NULL) gets the host part
 * without brackets.  Errors: RI_ERR_INVALID (malformed text), RI_ERR_NOT_FOUND
 * (the name does not resolve).  Outputs are written only on success.
 */
ri_status_t cm_net_resolve(const char *text, bool passive, struct sockaddr_storage *ss, socklen_t *len_p,
                           char *host, size_t host_len);

/* Split "host:port" or "[v6]:port" into host (no brackets, NUL-terminated,
 * hostlen bytes) and a port 0..65535.  false for anything else. */
bool cm_net_split(const char *addr, char *host, size_t hostlen, unsigned *port_p);

/* Parse "host:port" with a numeric IPv4 or IPv6 host (no name lookup) into
 * *ss (zeroed first); host (hostlen bytes) and *port_p as cm_net_split gives
 * them; *ipv6_p says which family.  RI_ERR_INVALID when the text is not
 * host:port, RI_ERR_UNSUPPORTED when the host is not numeric. */
ri_status_t cm_net_parse_numeric(const char *addr, struct sockaddr_storage *ss, char *host, size_t hostlen,
                                 unsigned *port_p, bool *ipv6_p);

/* Is host (as cm_net_split gives it) a wildcard that listens everywhere but
 * that no peer can connect to (0.0.0.0, ::)? */
bool cm_net_host_is_wildcard(const char *host);

#endif /* CM_NET_H */
