/* The connection manager's channels (docs/PROTOCOL.md): the control
 * socket from the master, and the handoff queue, where every worker sends
 * HANDOFF frames (a connection, perhaps with the rest of its response)
 * and CUSTODY frames. A channel gets at most NW_MANAGER_FRAMES_PER_WAKE
 * frames read per wake-up; level-triggered epoll brings the loop back for
 * the rest, so one chatty worker cannot starve the others. */
#ifndef NW_MGR_CHANNELS_H
#define NW_MGR_CHANNELS_H

#include "nw_frame.h"
#include "nw_mgr_custody.h"
#include "nw_mgr_heads.h"
#include "nw_mgr_offload.h"

typedef struct {
    nw_mgr_heads *heads;            /* where a HANDOFF goes */
    nw_mgr_offload *offload;        /* ...one with OUTPUT */
    nw_mgr_custody *custody;        /* where a CUSTODY goes */
    int     control;                /* the master's */
    int     handoff_queue;          /* HANDOFF and CUSTODY frames from every worker */
    char   *frame_data;             /* NW_FRAME_MAX_DATA bytes to receive a frame into */
    volatile int64_t *handoff_queued;   /* the board's count of HANDOFF frames, or NULL */
    int     bad_frame_said;         /* the first malformed frame was logged */
    uint64_t received;              /* HANDOFF frames taken, total */
} nw_mgr_channels;

void nw_mgr_channels_init(nw_mgr_channels *ch, nw_mgr_heads *heads, nw_mgr_offload *offload,
                          nw_mgr_custody *custody, int control, int handoff_queue,
                          char *frame_data, volatile int64_t *handoff_queued);

/* The handoff queue is readable: up to NW_MANAGER_FRAMES_PER_WAKE frames.
 * 1: it stopped with frames perhaps still waiting. */
int nw_mgr_channels_handoffs(nw_mgr_channels *ch);
/* The control socket is readable. 1: the master is gone (end of stream
 * or a broken socket). */
int nw_mgr_channels_control(nw_mgr_channels *ch);

/* STATS to the master. A full control socket drops them: the next ones
 * follow, and the manager must never block. */
void nw_mgr_channels_send_stats(nw_mgr_channels *ch, const nw_manager_stats *st);

/* Which channel fd is (NW_MGR_NOT_A_CHANNEL: neither). */
enum { NW_MGR_NOT_A_CHANNEL = 0, NW_MGR_CONTROL, NW_MGR_HANDOFFS };
int nw_mgr_channels_which(const nw_mgr_channels *ch, int fd);

void nw_mgr_channels_count(const nw_mgr_channels *ch, nw_manager_stats *st);
/* Close both channels. */
void nw_mgr_channels_close(nw_mgr_channels *ch);

#endif
