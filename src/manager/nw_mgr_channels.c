/* See nw_mgr_channels.h. */
#include "nw_mgr_channels.h"
#include "nw_log.h"
#include "nw_scoreboard.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

void nw_mgr_channels_init(nw_mgr_channels *ch, nw_mgr_heads *heads, nw_mgr_offload *offload,
                          nw_mgr_custody *custody, int control, int handoff_queue,
                          char *frame_data, volatile int64_t *handoff_queued)
{
    memset(ch, 0, sizeof *ch);
    ch->heads = heads;
    ch->offload = offload;
    ch->custody = custody;
    ch->control = control;
    ch->handoff_queue = handoff_queue;
    ch->frame_data = frame_data;
    ch->handoff_queued = handoff_queued;
}

/* nw_frame_recv has closed any fd that came with it. A receive that ran
 * out of fds (RLIMIT_NOFILE) looks the same: the kernel truncates it. */
static void bad_frame(nw_mgr_channels *ch, const char *from)
{
    if (ch->bad_frame_said)
        return;
    ch->bad_frame_said = 1;
    nw_log("error", "dropped a malformed or truncated frame "
            "from %s (%s); further ones are dropped silently\n", from, strerror(errno));
}

static void close_fds(int *fds)
{
    for (int i = 0; i < NW_FRAME_MAX_FDS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static void handoff_frame(nw_mgr_channels *ch, const nw_frame *f, int *fds)
{
    if (f->type == NW_FRAME_HANDOFF)
        nw_scoreboard_queued_add(ch->handoff_queued, -1);   /* (its sender counted it) */
    if (f->type == NW_FRAME_CUSTODY && fds[1] < 0) {
        if (nw_mgr_custody_frame(ch->custody, f, fds[0], ch->frame_data) < 0)
            bad_frame(ch, "a worker");
        return;
    }
    if (f->type == NW_FRAME_HANDOFF && fds[0] >= 0)
        nw_mgr_custody_handed(ch->custody, fds[0]);
    if (f->type == NW_FRAME_HANDOFF && (f->flags & NW_FRAME_F_OUTPUT)) {
        if (nw_mgr_offload_take(ch->offload, fds, f, ch->frame_data) == 0) {
            ch->received++;
            return;
        }
        bad_frame(ch, "a worker");
    } else if (f->type == NW_FRAME_HANDOFF && fds[0] >= 0 && fds[1] < 0) {
        ch->received++;
        nw_mgr_heads_take(ch->heads, fds[0], f, ch->frame_data);
        return;
    }
    close_fds(fds);   /* fds a frame should not carry */
}

int nw_mgr_channels_handoffs(nw_mgr_channels *ch)
{
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE; i++) {
        nw_frame f;
        int fds[NW_FRAME_MAX_FDS];
        int r = nw_frame_recv_fds(ch->handoff_queue, &f, ch->frame_data, NW_FRAME_MAX_DATA, fds);
        if (r > 0) {
            handoff_frame(ch, &f, fds);
            continue;
        }
        if (r < 0 && errno == EBADMSG) {
            bad_frame(ch, "a worker");
            continue;
        }
        return 0; /* EAGAIN; end of stream cannot happen while the master holds the other end */
    }
    return 1;
}

int nw_mgr_channels_control(nw_mgr_channels *ch)
{
    for (int i = 0; i < NW_MANAGER_FRAMES_PER_WAKE; i++) {
        nw_frame f;
        int fd;
        int r = nw_frame_recv(ch->control, &f, ch->frame_data, NW_FRAME_MAX_DATA, &fd);
        if (r > 0) {
            if (fd >= 0)
                close(fd);   /* the master sends nothing the manager acts on */
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r < 0 && errno == EBADMSG) {
            bad_frame(ch, "the master");
            continue;
        }
        return 1;
    }
    return 0;
}

void nw_mgr_channels_send_stats(nw_mgr_channels *ch, const nw_manager_stats *st)
{
    nw_frame f;
    nw_frame_init(&f, NW_FRAME_STATS);
    f.data_len = sizeof *st;
    (void)nw_frame_send(ch->control, &f, st, -1);
}

int nw_mgr_channels_which(const nw_mgr_channels *ch, int fd)
{
    if (fd == ch->control)
        return NW_MGR_CONTROL;
    return fd == ch->handoff_queue ? NW_MGR_HANDOFFS : NW_MGR_NOT_A_CHANNEL;
}

void nw_mgr_channels_count(const nw_mgr_channels *ch, nw_manager_stats *st)
{
    st->received += ch->received;
}

void nw_mgr_channels_close(nw_mgr_channels *ch)
{
    if (ch->control >= 0)
        close(ch->control);
    if (ch->handoff_queue >= 0)
        close(ch->handoff_queue);
    ch->control = ch->handoff_queue = -1;
}
