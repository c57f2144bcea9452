/* The handoff queue (see nw_handoff.h). */
#include "nw_handoff.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "nw_limits.h"
#include "nw_log.h"

void nw_handoff_init(nw_handoff *h, int queue_fd, int epfd)
{
    h->queue = queue_fd >= 0 ? fcntl(queue_fd, F_DUPFD_CLOEXEC, 3) : -1;
    h->epfd = epfd;
    h->counts = NULL;
}

void nw_handoff_count_in(nw_handoff *h, nw_score_counts *counts)
{
    h->counts = counts;
}

void nw_handoff_close(nw_handoff *h)
{
    if (h->queue >= 0)
        close(h->queue);
    h->queue = -1;
}

int nw_handoff_give(nw_handoff *h, nw_wconn *wc, int wait_ms)
{
    if (h->queue < 0 || wc->c->fd < 0)
        return -1;
    nw_wconn_unwatch(wc, h->epfd);
    return nw_conn_handoff_patiently(wc->c, h->queue, wait_ms);
}

void nw_handoff_refused(nw_handoff *h, int err, int asked)
{
    static nw_log_limit said;
    if (h->counts)
        h->counts->handoff_refused++;
    nw_log_limited(&said, nw_now_ms(), "error", "closed a connection%s: the connection manager "
                   "could not be given it (%s)", asked ? " with 503" : "", strerror(err));
}

void nw_handoff_let_go(nw_handoff *h, nw_wconn *wc)
{
    if (wc->c->fd >= 0 && nw_handoff_give(h, wc, NW_HANDOFF_PATIENCE_MS) < 0) {
        if (h->queue < 0) {
            nw_conn_close_gently(wc->c);
        } else {
            nw_handoff_refused(h, errno, 1);
            nw_conn_send_error(wc->c, 503);
        }
    }
    nw_wconn_free(wc);
}

int nw_handoff_rest(nw_handoff *h, nw_wconn *wc, int keep_alive)
{
    nw_conn *c = wc->c;
    if (h->queue >= 0 && c->fd >= 0 && !c->broken) {
        nw_wconn_unwatch(wc, h->epfd);
        if (nw_conn_handoff_output_patiently(c, h->queue, keep_alive,
                                             NW_HANDOFF_PATIENCE_MS) == 0)
            return 1;
    }
    nw_conn_finish_rest(c);
    return 0;
}
