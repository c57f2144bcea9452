/* See nw_mgr_shed.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* memmem */
#endif
#include "nw_mgr_shed.h"
#include "nw_scoreboard.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TICK_MAX_MS 50  /* look at the oldest request this often, at least */

void nw_mgr_shed_init(nw_mgr_shed *d, nw_mgr_table *t, const nw_mgr_clock *clock,
                      nw_mgr_handover *handover, int serve_reader, nw_msec max_wait,
                      char *frame_data, volatile int64_t *serve_queued,
                      const nw_scoreboard *board)
{
    memset(d, 0, sizeof *d);
    d->table = t;
    d->clock = clock;
    d->handover = handover;
    d->serve_reader = serve_reader;
    d->max_wait = max_wait;
    d->frame_data = frame_data;
    d->serve_queued = serve_queued;
    d->board = board;
}

static int waited_too_long(const nw_mgr_shed *d, uint32_t ready_ms)
{
    return (uint32_t)((uint32_t)nw_mgr_now(d->clock) - ready_ms) >= (uint32_t)d->max_wait;
}

/* The request line in a head's bytes (after a PROXY header, if any), for
 * the log: printable characters only, at most cap - 1 of them. */
static void request_line(const char *head, size_t len, char *out, size_t cap)
{
    size_t at = 0;
    while (at < len) {
        const char *nl = memchr(head + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - head) : len;
        const char *http = end - at > 9 ? memmem(head + at, end - at, " HTTP/1.", 8) : NULL;
        if (http) {
            size_t n = 0;
            for (size_t i = at; i < end && n + 1 < cap; i++)
                if (head[i] >= 0x20 && head[i] < 0x7f)
                    out[n++] = head[i];
            out[n] = 0;
            return;
        }
        at = end + 1;
    }
    snprintf(out, cap, "a request");
}

/* One line for the first 503 of NW_LOG_LIMIT_MS, naming the request; the
 * rest counted and summed up (nw_log_limited_flush_all, also at the stop). */
static void shed_one(nw_mgr_shed *d, int fd, const char *head, size_t len)
{
    char line[200];
    request_line(head, len, line, sizeof line);
    nw_log_limited(&d->said, nw_mgr_now(d->clock), "warn",
                   "shed %s: it waited over --max-queue-wait %u ms for a worker; answered 503",
                   line, (unsigned)d->max_wait);
    nw_mgr_answer(fd, 503);
    close(fd);
    d->shed++;
}

/* Whether a frame's descriptor would have room in the manager's table: a
 * frame taken without would come without it (MSG_CTRUNC) and its
 * connection be lost. (The manager may be at its open-file limit.) */
static int room_for_one(const nw_mgr_shed *d)
{
    int fd = fcntl(d->serve_reader, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* A frame taken back from the serve queue that has not waited too long
 * after all (a worker took the older one in between): it goes back. */
static void put_back(nw_mgr_shed *d, int fd, const nw_frame *f)
{
    nw_mgr_slot *s = nw_mgr_handover_adopt(d->handover, fd, f);
    if (!s)
        return;
    s->ready_ms = f->ready_ms;
    s->flags |= NW_MGR_F_LINE_SEEN;
    nw_mgr_handover_queue_up(d->handover, fd, d->frame_data, f->data_len);
}

/* The oldest frame on the serve queue, taken off the workers' end (it
 * leaves the board's count; put back, it counts again): its client's
 * descriptor, or -1 when there was none to take, or it was no SERVE. */
static int take_oldest(nw_mgr_shed *d, nw_frame *f)
{
    int fd;
    if (nw_frame_recv(d->serve_reader, f, d->frame_data, NW_FRAME_MAX_DATA, &fd) <= 0)
        return -1;
    nw_scoreboard_queued_add(d->serve_queued, -1);
    if (fd >= 0 && f->type != NW_FRAME_SERVE) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The oldest frames on the serve queue, taken off the workers' end. */
static void shed_serve_queue(nw_mgr_shed *d)
{
    for (int i = 0; d->serve_reader >= 0 && i < NW_MANAGER_FRAMES_PER_WAKE; i++) {
        nw_frame f;
        int fd;
        if (recv(d->serve_reader, &f, sizeof f, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof f
            || !waited_too_long(d, f.ready_ms) || !room_for_one(d))
            break;
        if ((fd = take_oldest(d, &f)) < 0)
            continue;
        if (waited_too_long(d, f.ready_ms))
            shed_one(d, fd, d->frame_data, f.data_len);
        else
            put_back(d, fd, &f);
    }
}

/* The oldest connections in the manager's own queue. */
static void shed_own_queue(nw_mgr_shed *d)
{
    int fd;
    while ((fd = nw_mgr_table_first(d->table, NW_MGR_QUEUED)) != NW_MGR_NONE
           && waited_too_long(d, nw_mgr_table_slot(d->table, fd)->ready_ms)) {
        nw_mgr_table_delist(d->table, fd);
        char line[200];
        nw_mgr_slot *s = nw_mgr_table_slot(d->table, fd);
        request_line(s->head ? s->head : "", s->head ? s->head_len : 0, line, sizeof line);
        nw_mgr_table_release(d->table, fd);
        shed_one(d, fd, line, strlen(line));
    }
    nw_mgr_handover_queue_shrank(d->handover);
}

/* A wake-up lost: the oldest frame on the serve queue has waited
 * NW_SERVE_REPOST_MS, and at two looks in a row (NW_SERVE_REPOST_MS / 2
 * apart) it was the same one and a worker was idle. It goes back to the
 * manager's queue, which sends it again (behind what the serve queue
 * holds now), waking a worker that watches the queue; the one that could
 * not take it is out of epoll for a while. Said once, then rate-limited. */
static void repost_serve_queue(nw_mgr_shed *d, nw_msec now)
{
    nw_frame f;
    int fd;
    if (now < d->next_repost)
        return;
    d->next_repost = now + NW_SERVE_REPOST_MS / 2;
    uint32_t seen = d->stalled_ready;
    d->stalled_ready = 0;
    if (d->serve_reader < 0 || !d->board || !d->serve_queued
        || __atomic_load_n(d->serve_queued, __ATOMIC_ACQUIRE) <= 0
        || recv(d->serve_reader, &f, sizeof f, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof f
        || f.type != NW_FRAME_SERVE || !nw_scoreboard_other_idle(d->board, NULL))
        return;
    d->stalled_ready = f.ready_ms | 1;      /* (never 0: none) */
    if (seen != d->stalled_ready || (uint32_t)((uint32_t)now - f.ready_ms) < NW_SERVE_REPOST_MS
        || !room_for_one(d))
        return;
    d->stalled_ready = 0;
    if ((fd = take_oldest(d, &f)) < 0)
        return;
    d->reposted++;
    nw_log_limited(&d->repost_said, now, "warn",
                   "a request waited %u ms on the serve queue while a worker was idle (one at its "
                   "open-file limit?): sent again", (unsigned)((uint32_t)now - f.ready_ms));
    put_back(d, fd, &f);
}

void nw_mgr_shed_look(nw_mgr_shed *d)
{
    nw_msec now = nw_mgr_now(d->clock);
    repost_serve_queue(d, now);
    if (!d->max_wait || now < d->next)
        return;
    nw_msec tick = d->max_wait / 4;
    d->next = now + (tick < 1 ? 1 : tick > TICK_MAX_MS ? TICK_MAX_MS : tick);
    shed_serve_queue(d);
    shed_own_queue(d);
}

nw_msec nw_mgr_shed_next(const nw_mgr_shed *d, nw_msec next)
{
    if (d->serve_queued && __atomic_load_n(d->serve_queued, __ATOMIC_ACQUIRE) > 0
        && d->next_repost < next)
        next = d->next_repost;
    return d->max_wait && d->next < next ? d->next : next;
}

void nw_mgr_shed_count(const nw_mgr_shed *d, nw_manager_stats *st)
{
    st->shed += d->shed;
}

void nw_mgr_shed_close(nw_mgr_shed *d)
{
    nw_log_limited_unlist(&d->said);
    nw_log_limited_unlist(&d->repost_said);
}
