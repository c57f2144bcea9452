/* Custody's wait list (see nw_custody_wait.h). */
#include "nw_custody_wait.h"

void nw_custody_wait_init(nw_custody_wait *cw, int queue, nw_deadlines *deadlines)
{
    cw->count = 0;
    cw->queue = queue;
    cw->pid = 0;
    cw->deadlines = deadlines;
}

void nw_custody_wait_flush(nw_custody_wait *cw)
{
    for (int i = 0; i < cw->count; i++) {
        nw_wconn *wc = cw->conn[i];
        wc->custody_wait = 0;
        if (wc->c->fd >= 0 && !wc->c->custody)
            nw_conn_custody(wc->c, cw->queue, cw->pid);
    }
    cw->count = 0;
    nw_deadlines_set(cw->deadlines, NW_DEADLINE_CUSTODY, 0);
}

void nw_custody_wait_forget(nw_custody_wait *cw, nw_wconn *wc)
{
    int i = wc->custody_wait - 1;
    nw_wconn *last = cw->conn[--cw->count];
    cw->conn[i] = last;
    last->custody_wait = i + 1;
    wc->custody_wait = 0;
    if (cw->count == 0)
        nw_deadlines_set(cw->deadlines, NW_DEADLINE_CUSTODY, 0);
}

void nw_custody_wait_add(nw_custody_wait *cw, nw_wconn *wc, nw_msec now)
{
    if (wc->c->custody || wc->custody_wait || cw->queue < 0 || cw->pid <= 0)
        return;
    if (cw->count == NW_CUSTODY_WAIT_MAX)
        nw_custody_wait_flush(cw);
    if (cw->count == 0)
        nw_deadlines_set(cw->deadlines, NW_DEADLINE_CUSTODY, now + NW_CUSTODY_DELAY_MS);
    cw->conn[cw->count++] = wc;
    wc->custody_wait = cw->count;
}

void nw_custody_wait_drop(nw_custody_wait *cw)
{
    while (cw->count)
        nw_custody_wait_forget(cw, cw->conn[cw->count - 1]);
}
