/* A connection inside a worker (see nw_wconn.h). */
#include "nw_wconn.h"

#include <stdlib.h>
#include <sys/epoll.h>

#include "nw_pool_place.h"

/* The connection whose request is running (the request watchdog's). */
static nw_wconn *volatile serving;

void nw_wconn_request_started(nw_wconn *wc)
{
    serving = wc;
    if (wc->place)
        nw_pool_place_request_started(wc->place);
    wc->started_us = nw_now_us();
    wc->started = (nw_msec)(wc->started_us / 1000);
    wc->ended = 0;
}

void nw_wconn_request_ended(nw_wconn *wc, uint64_t now_us)
{
    wc->ended = (nw_msec)(now_us / 1000);
    if (!wc->place || !wc->started_us)
        return;
    nw_pool_place_request_ended(wc->place, now_us > wc->started_us ? now_us - wc->started_us : 0,
                                wc->ended);
}

nw_wconn *nw_wconn_serving(void)
{
    return serving;
}

void nw_wconn_not_serving(nw_wconn *wc)
{
    if (serving == wc)
        serving = NULL;
}

void nw_wconn_unwatch(nw_wconn *wc, int epfd)
{
    if (wc->watch.registered && wc->c->fd >= 0)
        epoll_ctl(epfd, EPOLL_CTL_DEL, wc->c->fd, NULL);
    wc->watch.registered = 0;
}

void nw_wconn_drop(nw_wconn *wc, const nw_worker_owner_ops *ops)
{
    if (ops->drop && wc->owner)
        ops->drop(wc->owner);
    else
        nw_wconn_free(wc);
}

void nw_wconn_free(nw_wconn *wc)
{
    if (!wc)
        return;
    nw_wconn_not_serving(wc);
    if (wc->custody_wait && wc->custody_forget)
        wc->custody_forget(wc->custody, wc);
    nw_conn_destroy(wc->c);
    free(wc);
}
