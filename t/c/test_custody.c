/* Unit tests for src/manager/nw_custody.c (the manager's cookie -> descriptor
 * index of connections in custody), printing TAP; run through
 * t/06-c-units.t. The index is checked
 * against a plain array after every step of a long random mix of adds and
 * removes with colliding and sequential cookies, which is what the kernel
 * hands out; and a real socket's cookie is read
 * (nw_io_socket_cookie, by which the index is keyed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nw_custody.h"
#include "nw_io.h"
#include "tap.h"

#define KEYS 3000

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every key the model says is in is found with its fd; the rest are not. */
static int agrees(const nw_custody_index *x, const int *model)
{
    size_t in = 0;
    for (int k = 0; k < KEYS; k++) {
        int want = model[k];
        if (nw_custody_find(x, (uint64_t)k + 1000) != want)
            return 0;
        in += want >= 0;
    }
    return in == x->count;
}

int main(void)
{
    nw_custody_index x = { 0 };
    int model[KEYS];
    for (int k = 0; k < KEYS; k++)
        model[k] = -1;

    is(nw_custody_find(&x, 5), -1, "an empty index finds nothing");
    is(nw_custody_remove(&x, 5), -1, "and removes nothing");
    is(nw_custody_add(&x, 0, 3), -1, "cookie 0 (no cookie) is refused");

    for (int k = 0; k < KEYS; k++) {
        model[k] = k + 3;
        if (nw_custody_add(&x, (uint64_t)k + 1000, k + 3) < 0)
            break;
    }
    ok(agrees(&x, model), "3,000 sequential cookies, all found (it grew)");
    ok(x.count * 2 <= x.cap, "at most half full");

    uint64_t seed = 88172645463325252ull;
    int steps_ok = 1;
    for (int step = 0; step < 40000 && steps_ok; step++) {
        int k = (int)(next_random(&seed) % KEYS);
        if (model[k] >= 0) {
            steps_ok = nw_custody_remove(&x, (uint64_t)k + 1000) == model[k];
            model[k] = -1;
        } else {
            model[k] = step % 5000 + 3;
            steps_ok = nw_custody_add(&x, (uint64_t)k + 1000, model[k]) == 0;
        }
        if (step % 997 == 0)
            steps_ok = steps_ok && agrees(&x, model);
    }
    ok(steps_ok, "40,000 random adds and removes: each returned what the model said");
    ok(agrees(&x, model), "and the index agrees with the model at the end");

    for (int k = 0; k < KEYS; k++)
        if (model[k] >= 0)
            nw_custody_remove(&x, (uint64_t)k + 1000);
    is(x.count, 0, "all removed");
    is(nw_custody_find(&x, 1000), -1, "nothing left to find");
    nw_custody_free(&x);

    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    uint64_t a = nw_io_socket_cookie(sv[0]), b = nw_io_socket_cookie(sv[1]);
    int copy = dup(sv[0]);
    ok(a != 0 && b != 0 && a != b, "two sockets have two cookies");
    is(nw_io_socket_cookie(copy) == a, 1, "a copy of a socket has its cookie");
    int pipefd[2];
    if (pipe(pipefd) == 0)
        is(nw_io_socket_cookie(pipefd[0]), 0, "a pipe has none");
    close(copy);
    close(sv[0]);
    close(sv[1]);
    return done_testing();
}
