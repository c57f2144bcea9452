/* The connection manager's custody of the workers' parked connections
 * (DESIGN.md, "Custody of parked connections"): a copy of each (a CUSTODY
 * frame), held, watched for its hang-up only, never read, until the
 * worker closes the connection (its shutdown hangs ours up), hands it
 * here, lends it to the app, or ends; and a pidfd for each worker that
 * has some, so that the copies of one that died are taken over as idle
 * connections (nw_mgr_heads). */
#ifndef NW_MGR_CUSTODY_H
#define NW_MGR_CUSTODY_H

#include "nw_custody.h"
#include "nw_frame.h"
#include "nw_log.h"
#include "nw_mgr_clock.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_table.h"
#include "nw_scoreboard.h"
#include "nw_status.h"

typedef struct {
    nw_mgr_table *table;
    const nw_mgr_clock *clock;
    nw_mgr_heads *heads;            /* where a dead worker's connections go */
    const nw_scoreboard *board;     /* what a worker said of its end, or NULL */
    nw_custody_index index;         /* cookie -> our copy's fd */
    int    *worker_fds;             /* the pidfds watched (NW_MGR_WORKER records) */
    size_t  nworkers, workers_cap;
    uint64_t taken;                 /* taken over from a worker that died, total */
    uint64_t lost;                  /* closed because the worker died serving them, total */
    nw_log_limit said;              /* "a worker ended holding ..." lines */
} nw_mgr_custody;

void nw_mgr_custody_init(nw_mgr_custody *c, nw_mgr_table *t, const nw_mgr_clock *clock,
                         nw_mgr_heads *heads, const nw_scoreboard *board);

/* CUSTODY: hold the copy fd (or, with RELEASE, let ours go). -1: the
 * frame does not hold what it says (fd closed). */
int nw_mgr_custody_frame(nw_mgr_custody *c, const nw_frame *f, int fd, const char *data);
/* A connection a worker handed here: if we held a copy of it, that copy
 * is not needed any more (this one is the connection now). */
void nw_mgr_custody_handed(nw_mgr_custody *c, int fd);
/* A copy's worker or client hung up: the copy goes. */
void nw_mgr_custody_hung_up(nw_mgr_custody *c, int fd);
/* A worker we hold copies for ended (its pidfd is readable). What it
 * sent before it ended must be read from the handoff queue first. */
void nw_mgr_custody_worker_ended(nw_mgr_custody *c, int pidfd);

/* Its numbers on a status page (sm->board filled in already). */
void nw_mgr_custody_numbers(const nw_mgr_custody *c, nw_status_manager *sm);
void nw_mgr_custody_close(nw_mgr_custody *c);

#endif
