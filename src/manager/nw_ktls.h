/* Whether the kernel offers its TLS (kTLS): the "tls" upper-layer
 * protocol a TCP socket can be given (setsockopt TCP_ULP), which would
 * let an established TLS connection's socket carry its record state from
 * process to process (docs/DESIGN.md, "HTTPS"). Narwhal relays either
 * way today; the start line says what the kernel offers. */
#ifndef NW_KTLS_H
#define NW_KTLS_H

#include <stddef.h>

/* 1 when a loopback TCP connection takes TCP_ULP "tls", else 0 with why
 * in why (up to len bytes, always terminated): the kernel's answer
 * (no module: ENOENT) or what kept the probe from asking it. */
int nw_ktls_offered(char *why, size_t len);

#endif
