/* The handshake threads (docs/DESIGN.md, "HTTPS"): a TLS handshake's
 * steps cost 0.4-0.8 ms of CPU each (the key exchange and the
 * signature), so the TLS part runs them in threads of their own, one per
 * CPU, while the manager's thread goes on with everything else: relays,
 * plain connections, hand-offs. A job is one step of one connection's
 * handshake (nw_tls_handshake); a connection is in at most one job at a
 * time and its owner does not touch it meanwhile. The owner gives a job
 * (submit), is woken through the pool's descriptor when jobs are done,
 * and takes them back (done), in its own thread. No allocation per job:
 * the job lives in the owner's record of the connection. */
#ifndef NW_TLS_POOL_H
#define NW_TLS_POOL_H

#include <stddef.h>
#include "nw_tls.h"

typedef struct nw_tls_job {
    struct nw_tls_conn *tls;    /* the connection whose next step to run */
    enum nw_tls_step step;      /* done: what the step came to */
    struct nw_tls_job *next;    /* (the pool's lists) */
} nw_tls_job;

struct nw_tls_pool;

/* A pool of n threads (1 or more). NULL with the reason in err. */
struct nw_tls_pool *nw_tls_pool_new(int n, char *err, size_t errlen);

/* Readable (an eventfd) while done jobs wait to be taken. */
int nw_tls_pool_fd(const struct nw_tls_pool *p);

/* Run the next handshake step of j->tls in a thread. */
void nw_tls_pool_submit(struct nw_tls_pool *p, nw_tls_job *j);

/* The jobs done since the last call, oldest first (NULL: none). */
nw_tls_job *nw_tls_pool_done(struct nw_tls_pool *p);

/* Stops the threads once the steps they run are over (jobs still
 * waiting are not run), and frees the pool; the jobs stay the owner's. */
void nw_tls_pool_free(struct nw_tls_pool *p);

#endif
