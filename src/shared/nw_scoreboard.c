/* The scoreboard (see nw_scoreboard.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_scoreboard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

size_t nw_scoreboard_bytes(uint32_t nslots)
{
    return sizeof(nw_scoreboard) + (size_t)nslots * sizeof(nw_score_slot);
}

nw_scoreboard *nw_scoreboard_create(uint32_t nslots, int *fd_out)
{
    size_t bytes = nw_scoreboard_bytes(nslots);
    int fd = memfd_create("narwhal-scoreboard", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    nw_scoreboard *b = p;           /* zeroed by the kernel: every slot free */
    b->h.magic = NW_SCOREBOARD_MAGIC;
    b->h.nslots = nslots;
    *fd_out = fd;
    return b;
}

const nw_scoreboard *nw_scoreboard_map(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return NULL;
    if ((size_t)st.st_size < sizeof(nw_scoreboard)) {
        errno = EINVAL;
        return NULL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    const nw_scoreboard *b = p;
    if (b->h.magic != NW_SCOREBOARD_MAGIC
        || nw_scoreboard_bytes(b->h.nslots) > (size_t)st.st_size) {
        munmap(p, (size_t)st.st_size);
        errno = EINVAL;
        return NULL;
    }
    return b;
}

int nw_scoreboard_offload_reserve(volatile int64_t *counter, uint64_t n, uint64_t cap)
{
    int64_t after = __atomic_add_fetch(counter, (int64_t)n, __ATOMIC_RELAXED);
    if (after > (int64_t)cap) {
        __atomic_sub_fetch(counter, (int64_t)n, __ATOMIC_RELAXED);
        return -1;
    }
    return 0;
}

void nw_scoreboard_offload_release(volatile int64_t *counter, uint64_t n)
{
    __atomic_sub_fetch(counter, (int64_t)n, __ATOMIC_RELAXED);
}

/* The header's first page(s) mapped writable, for the manager's words alone. */
static size_t shared_map_bytes(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t end = offsetof(nw_score_header, handoff_queued) + sizeof(int64_t);
    return (end + page - 1) / page * page;
}

nw_score_header *nw_scoreboard_map_shared(int fd)
{
    void *p = mmap(NULL, shared_map_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    nw_score_header *h = p;
    if (h->magic != NW_SCOREBOARD_MAGIC) {
        munmap(p, shared_map_bytes());
        errno = EINVAL;
        return NULL;
    }
    return h;
}

void nw_scoreboard_unmap_shared(nw_score_header *h)
{
    if (h)
        munmap(h, shared_map_bytes());
}

void nw_scoreboard_unmap(const nw_scoreboard *b)
{
    if (b)
        munmap((void *)b, nw_scoreboard_bytes(b->h.nslots));
}

void nw_scoreboard_claim(nw_score_slot *s, int pid, int generation, int standby, nw_msec now)
{
    memset((void *)s, 0, sizeof *s);
    s->generation = generation;
    s->standby = standby ? 1 : 0;
    s->born = now;
    s->state = NW_WORKER_STARTING;
    s->pid = pid;
}

static void add_counts(nw_score_counts *to, const nw_score_counts *from)
{
    to->served += from->served;
    for (int i = 0; i < NW_SCORE_CLASSES; i++)
        to->by_class[i] += from->by_class[i];
    for (int i = 0; i < NW_SCORE_BUCKETS; i++)
        to->bucket[i] += from->bucket[i];
    to->duration_us += from->duration_us;
    to->adopted += from->adopted;
    for (int i = 0; i < NW_PROXY_REJECTS; i++)
        to->proxy_rejected[i] += from->proxy_rejected[i];
    for (int i = 0; i < NW_SCORE_BUCKETS; i++)
        to->queue_bucket[i] += from->queue_bucket[i];
    to->queue_us += from->queue_us;
    to->spool_failed += from->spool_failed;
    to->fd_limit += from->fd_limit;
    to->crash_refused += from->crash_refused;
    to->bytes_sent += from->bytes_sent;
    to->handoff_refused += from->handoff_refused;
}

void nw_scoreboard_proxy_rejected(nw_score_slot *s, int reason, const struct sockaddr *peer,
                                  unsigned peer_len, nw_msec now)
{
    if (!s || reason < 0 || reason >= NW_PROXY_REJECTS)
        return;
    s->counts.proxy_rejected[reason]++;
    char text[NW_SCOREBOARD_PEER] = "unknown", addr[INET6_ADDRSTRLEN];
    if (peer && peer_len >= sizeof(struct sockaddr_in) && peer->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)peer;
        if (inet_ntop(AF_INET, &in->sin_addr, addr, sizeof addr))
            snprintf(text, sizeof text, "%s:%u", addr, (unsigned)ntohs(in->sin_port));
    } else if (peer && peer_len >= sizeof(struct sockaddr_in6) && peer->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)peer;
        if (inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof addr))
            snprintf(text, sizeof text, "[%s]:%u", addr, (unsigned)ntohs(in6->sin6_port));
    } else if (peer && peer->sa_family == AF_UNIX) {
        snprintf(text, sizeof text, "a unix socket peer");
    }
    memcpy(s->proxy_last_peer, text, sizeof text);
    s->proxy_last_reason = reason;
    __atomic_store_n(&s->proxy_last_ms, now ? now : 1, __ATOMIC_RELEASE);
}

void nw_scoreboard_fold(nw_scoreboard *b, nw_score_slot *s)
{
    __atomic_add_fetch(&b->h.seq, 1, __ATOMIC_SEQ_CST);     /* odd: folding */
    add_counts(&b->h.gone, &s->counts);
    if (s->pid) {
        /* its recycling turn, if it holds it, is free (one another
         * worker took over from it is that worker's) */
        uint64_t held = __atomic_load_n(&b->h.recycling, __ATOMIC_ACQUIRE);
        if (held && NW_TURN_PID(held) == s->pid)
            __atomic_compare_exchange_n(&b->h.recycling, &held, 0, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        nw_score_end *e = &b->h.ends[b->h.ends_next++ % NW_SCOREBOARD_ENDS];
        e->pid = s->pid;
        e->parked_released = s->parked_released;
        e->serving_cookie = s->serving_cookie;
    }
    memset((void *)s, 0, sizeof *s);
    __atomic_add_fetch(&b->h.seq, 1, __ATOMIC_SEQ_CST);     /* even: done */
}

static int worker_end_once(const nw_scoreboard *b, int pid, uint64_t *cookie, int *released)
{
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        if (s->pid == pid) {
            *cookie = s->serving_cookie;
            *released = (int)s->parked_released;
            return 1;
        }
    }
    for (int i = 0; i < NW_SCOREBOARD_ENDS; i++) {
        const nw_score_end *e = &b->h.ends[i];
        if (e->pid == pid) {
            *cookie = e->serving_cookie;
            *released = (int)e->parked_released;
            return 1;
        }
    }
    return 0;
}

int nw_scoreboard_worker_end(const nw_scoreboard *b, int pid, uint64_t *serving_cookie,
                             int *parked_released)
{
    for (int tries = 0; tries < NW_SCOREBOARD_READ_TRIES; tries++) {
        uint32_t seq = __atomic_load_n(&b->h.seq, __ATOMIC_ACQUIRE);
        if (seq & 1)
            continue;           /* the master is folding a slot */
        int found = worker_end_once(b, pid, serving_cookie, parked_released);
        if (__atomic_load_n(&b->h.seq, __ATOMIC_ACQUIRE) == seq)
            return found;
    }
    return 0;
}

void nw_scoreboard_request_begin(nw_score_slot *s, const char *method, size_t method_len,
                                 const char *target, size_t target_len, uint64_t now_us,
                                 const struct sockaddr *client, unsigned client_len)
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
    if (client_len > sizeof s->client)      /* only AF_UNIX's is longer: its family will do */
        client_len = sizeof client->sa_family;
    if (client)
        memcpy(&s->client, client, client_len);
    s->client_len = client ? client_len : 0;
    s->since_us = now_us;
    s->started++;
    s->state = NW_WORKER_BUSY;
}

int nw_scoreboard_pool_stuck(const nw_scoreboard *b, uint64_t now_us, uint64_t min_us,
                             int accepting_only, int *any_busy)
{
    int busy = 0, stuck = 1, able = 0, spare = 0;
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        int state = s->state;
        if (accepting_only && s->standby) {
            spare |= state == NW_WORKER_IDLE;   /* (it takes what the manager queues) */
            continue;
        }
        if (state == NW_WORKER_IDLE) {
            stuck = 0;
            able = 1;
        } else if (state == NW_WORKER_STARTING) {
            busy = 1;
            stuck = 0;          /* (one is coming: at a start, or after a crash) */
        } else if (state == NW_WORKER_BUSY) {
            busy = 1;
            uint64_t since = s->since_us;
            if (since + min_us > now_us) {
                stuck = 0;      /* (a request that began a moment ago) */
                able = 1;
            }
        }
    }
    /* No accepting worker can take a new client now (none idle, none on a
     * fresh request: they are starting, leaving, stuck or gone, as after
     * a crash, a failed start or a reload's standby worker ready first)
     * while a standby one is idle: new clients would wait for it unseen. */
    if (accepting_only && spare && !able)
        stuck = busy = 1;
    if (any_busy)
        *any_busy = busy;
    return stuck && busy;
}

int nw_scoreboard_standby_unused(const nw_scoreboard *b)
{
    int spare = 0, blocked = 0;
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        int state = s->state;
        if (s->standby) {
            spare |= state == NW_WORKER_IDLE;
        } else if (state == NW_WORKER_IDLE || state == NW_WORKER_STARTING) {
            return 0;
        } else if (state == NW_WORKER_BUSY) {
            blocked |= s->blocking != 0;
        }
    }
    return spare && blocked;
}

int nw_scoreboard_other_idle(const nw_scoreboard *b, const nw_score_slot *self)
{
    for (uint32_t i = 0; i < b->h.nslots; i++)
        if (&b->slot[i] != self && b->slot[i].state == NW_WORKER_IDLE)
            return 1;
    return 0;
}

void nw_scoreboard_waits(const nw_scoreboard *b, uint64_t over_us, uint64_t *all, uint64_t *over)
{
    nw_score_counts t;
    nw_scoreboard_totals(b, &t);
    int first_over = nw_scoreboard_bucket(over_us) + 1;
    *all = *over = 0;
    for (int i = 0; i < NW_SCORE_BUCKETS; i++) {
        *all += t.queue_bucket[i];
        if (i >= first_over)
            *over += t.queue_bucket[i];
    }
}

static void read_connections(const nw_scoreboard *b, nw_score_conns *c)
{
    memset(c, 0, sizeof *c);
    int64_t served = __atomic_load_n(&b->h.serve_queued, __ATOMIC_ACQUIRE);
    int64_t handed = __atomic_load_n(&b->h.handoff_queued, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        int state = s->state;
        if (!s->pid || state <= NW_WORKER_FREE || state > NW_WORKER_STOPPING)
            continue;
        uint32_t conns = s->conns, parked = s->parked;
        c->parked += parked;
        c->in_workers += conns > parked ? conns - parked : 0;
    }
    /* (a worker's frame taken before its sender counted it: an instant below 0) */
    c->serve_queued = served > 0 ? (uint64_t)served : 0;
    c->handoff_queued = handed > 0 ? (uint64_t)handed : 0;
}

void nw_scoreboard_connections(const nw_scoreboard *b, nw_score_conns *out)
{
    nw_score_conns again;
    read_connections(b, out);
    for (int tries = 0; tries < 16; tries++) {
        read_connections(b, &again);
        if (!memcmp(&again, out, sizeof again))
            return;
        *out = again;
    }
}

int nw_scoreboard_at_most_mean_parked(const nw_scoreboard *b, uint32_t parked)
{
    uint64_t sum = 0, n = 0;
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        int state = s->state;
        /* (parked_released: its parked set is on its way to the others,
         * from its crash handler or an app's exit too, where the slot
         * still says busy or idle) */
        if (s->pid && state >= NW_WORKER_STARTING && state <= NW_WORKER_BUSY
            && !s->parked_released && !s->standby) {
            sum += s->parked;
            n++;
        }
    }
    return (uint64_t)parked * n <= sum || n == 0;
}

static int on_board(const nw_scoreboard *b, int32_t pid)
{
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        if (b->slot[i].pid == pid && b->slot[i].state != NW_WORKER_FREE)
            return 1;
    }
    return 0;
}

int nw_scoreboard_take_recycle_turn(nw_scoreboard *b, int32_t pid, nw_msec now, nw_msec max_ms)
{
    uint64_t held = __atomic_load_n(&b->h.recycling, __ATOMIC_ACQUIRE);
    int32_t holder = held ? NW_TURN_PID(held) : 0;
    if (holder == pid && pid)
        return 1;
    /* (its age modulo 2^32 ms: right for any hold under 49 days) */
    uint32_t age = (uint32_t)now - NW_TURN_MS(held);
    if (holder && on_board(b, holder) && age < max_ms)
        return 0;
    uint64_t mine = (uint64_t)(uint32_t)pid << 32 | (uint32_t)now;
    return __atomic_compare_exchange_n(&b->h.recycling, &held, mine, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int nw_scoreboard_ready_since(const nw_scoreboard *b, int32_t generation, nw_msec since)
{
    for (uint32_t i = 0; i < b->h.nslots; i++) {
        const nw_score_slot *s = &b->slot[i];
        int state = s->state;
        if ((state == NW_WORKER_IDLE || state == NW_WORKER_BUSY) && s->generation == generation
            && s->born >= since)
            return 1;
    }
    return 0;
}

int nw_scoreboard_bucket(uint64_t duration_us)
{
    int i = 0;
    while (i < NW_SCORE_BUCKETS - 1 && duration_us > nw_score_bounds_us[i])
        i++;
    return i;
}

void nw_scoreboard_request_end(nw_score_slot *s, int status, uint64_t bytes, uint64_t now_us)
{
    uint64_t d = now_us > s->since_us ? now_us - s->since_us : 0;
    s->last_us = d;
    s->last_end_us = now_us;
    s->counts.bytes_sent += bytes;
    int class = status / 100 - 1;
    if (class >= 0 && class < NW_SCORE_CLASSES)
        s->counts.by_class[class]++;
    s->counts.bucket[nw_scoreboard_bucket(d)]++;
    s->counts.duration_us += d;
    s->counts.served++;
    if (s->state == NW_WORKER_BUSY)
        s->state = NW_WORKER_IDLE;
}

void nw_scoreboard_queue_wait(nw_score_slot *s, uint64_t wait_us)
{
    s->counts.queue_bucket[nw_scoreboard_bucket(wait_us)]++;
    s->counts.queue_us += wait_us;
}

void nw_scoreboard_count_error(nw_score_slot *s, int status)
{
    int class = status / 100 - 1;
    if (class >= 0 && class < NW_SCORE_CLASSES)
        s->counts.by_class[class]++;
    s->counts.bucket[0]++;
    s->counts.served++;
}

/* The master folds a worker in rarely (when it reaps one) and quickly, so
 * a reader retries until it read between two folds; it yields after a
 * few tries, and after very many takes what it read rather than zeros (a
 * counter must never seem to go back to 0). */
void nw_scoreboard_totals(const nw_scoreboard *b, nw_score_counts *out)
{
    for (int tries = 0;; tries++) {
        uint32_t seq = __atomic_load_n(&b->h.seq, __ATOMIC_ACQUIRE);
        nw_score_counts t = b->h.gone;
        for (uint32_t i = 0; i < b->h.nslots; i++)
            if (b->slot[i].pid)
                add_counts(&t, &b->slot[i].counts);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((!(seq & 1) && __atomic_load_n(&b->h.seq, __ATOMIC_ACQUIRE) == seq)
            || tries >= NW_SCOREBOARD_READ_TRIES) {
            *out = t;
            return;
        }
        if (tries >= 8)
            sched_yield();
    }
}

/* ---- routes that kill workers (--crash-backoff) ----------------------- */

static uint64_t fnv(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t nw_route_hash(const char *method, size_t method_len, const char *target, size_t target_len)
{
    const char *q = target_len ? memchr(target, '?', target_len) : NULL;
    uint64_t h = fnv(0xcbf29ce484222325ull, method, method_len);
    h = fnv(h, " ", 1);
    h = fnv(h, target, q ? (size_t)(q - target) : target_len);
    return h ? h : 1;
}

uint64_t nw_route_hash_request(const char *request, size_t len)
{
    const char *sp = memchr(request, ' ', len);
    if (!sp)
        return nw_route_hash(request, len, "", 0);
    return nw_route_hash(request, (size_t)(sp - request), sp + 1, len - (size_t)(sp - request) - 1);
}

int nw_scoreboard_watch_route(nw_scoreboard *b, uint64_t route)
{
    int free_one = -1;
    for (int i = 0; i < NW_CRASH_ROUTES; i++) {
        if (b->h.crash_route[i].hash == route)
            return i;
        if (free_one < 0 && !b->h.crash_route[i].hash)
            free_one = i;
    }
    if (free_one < 0)
        return -1;
    nw_crash_route *e = &b->h.crash_route[free_one];
    e->until = 0;
    e->started = 0;
    e->hash = route;        /* (last: a worker never sees a half-made entry) */
    b->h.crash_routes++;
    return free_one;
}

void nw_scoreboard_block_route(nw_scoreboard *b, int entry, nw_msec until)
{
    if (entry >= 0 && entry < NW_CRASH_ROUTES)
        b->h.crash_route[entry].until = until;
}

void nw_scoreboard_unwatch_route(nw_scoreboard *b, int entry)
{
    if (entry < 0 || entry >= NW_CRASH_ROUTES || !b->h.crash_route[entry].hash)
        return;
    b->h.crash_route[entry].hash = 0;
    b->h.crash_routes--;
}
