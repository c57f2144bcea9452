/* The scoreboard (see nw_scoreboard.h). */
#include "nw_scoreboard.h"

#include <string.h>
#include <sys/mman.h>

static size_t board_bytes(uint32_t nslots)
{
    return sizeof(nw_scoreboard) + (size_t)nslots * sizeof(nw_score_slot);
}

nw_scoreboard *nw_scoreboard_create(uint32_t nslots)
{
    void *p = mmap(NULL, board_bytes(nslots), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    nw_scoreboard *b = p;           /* zeroed by the kernel: every slot free */
    b->nslots = nslots;
    return b;
}

void nw_scoreboard_destroy(nw_scoreboard *b)
{
    if (b)
        munmap(b, board_bytes(b->nslots));
}

void nw_scoreboard_claim(nw_score_slot *s, int pid)
{
    memset((void *)s, 0, sizeof *s);
    s->pid = pid;
    s->state = NW_WORKER_STARTING;
}

void nw_scoreboard_request_begin(nw_score_slot *s, const char *method, size_t method_len,
                                 const char *target, size_t target_len, nw_msec now)
{
    size_t room = sizeof s->request;
    if (method_len > room - 1)
        method_len = room - 1;
    memcpy(s->request, method, method_len);
    size_t n = method_len;
    if (n < room - 1) {
        s->request[n++] = ' ';
        if (target_len > room - n)
            target_len = room - n;
        memcpy(s->request + n, target, target_len);
        n += target_len;
    }
    s->request_len = (uint32_t)n;
    s->since = now;
    s->started++;
    s->state = NW_WORKER_BUSY;
}

void nw_scoreboard_request_end(nw_score_slot *s)
{
    s->served++;
    s->state = NW_WORKER_IDLE;
}
