/* See nw_tls_pool.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "nw_tls_pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nw_limits.h"


/* A list of jobs, oldest first. */
typedef struct {
    nw_tls_job *head, *tail;
} job_list;

struct nw_tls_pool {
    pthread_mutex_t lock;           /* the lists and stop */
    pthread_cond_t  work;           /* todo has jobs, or stop */
    job_list todo, finished;
    int      stop;
    int      efd;                   /* readable while finished has jobs */
    int      n;
    pthread_t threads[NW_TLS_MAX_THREADS];
};

static void push(job_list *l, nw_tls_job *j)
{
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static nw_tls_job *pop(job_list *l)
{
    nw_tls_job *j = l->head;
    if (j && !(l->head = j->next))
        l->tail = NULL;
    return j;
}

/* The owner's descriptor readable (an eventfd's counter stays far from
 * its limit: write cannot fail). */
static void wake(int efd)
{
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof one);
    (void)n;
}

static void *run(void *arg)
{
    struct nw_tls_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && !p->todo.head)
            pthread_cond_wait(&p->work, &p->lock);
        if (p->stop)
            break;
        nw_tls_job *j = pop(&p->todo);
        pthread_mutex_unlock(&p->lock);
        j->step = nw_tls_handshake(j->tls);
        pthread_mutex_lock(&p->lock);
        int was_empty = !p->finished.head;
        push(&p->finished, j);
        if (was_empty)
            wake(p->efd);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

struct nw_tls_pool *nw_tls_pool_new(int n, char *err, size_t errlen)
{
    struct nw_tls_pool *p = calloc(1, sizeof *p);
    if (n < 1 || n > NW_TLS_MAX_THREADS) {
        snprintf(err, errlen, "handshake threads: %d is not between 1 and %d", n,
                 NW_TLS_MAX_THREADS);
        free(p);
        return NULL;
    }
    if (!p || (p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        snprintf(err, errlen, "handshake threads: %s", strerror(p ? errno : ENOMEM));
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    /* (the threads take no signal: the manager's signalfd has them all) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (; p->n < n; p->n++) {
        int e = pthread_create(&p->threads[p->n], NULL, run, p);
        if (e) {
            snprintf(err, errlen, "handshake threads: %s", strerror(e));
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            nw_tls_pool_free(p);
            return NULL;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

int nw_tls_pool_fd(const struct nw_tls_pool *p)
{
    return p->efd;
}

void nw_tls_pool_submit(struct nw_tls_pool *p, nw_tls_job *j)
{
    pthread_mutex_lock(&p->lock);
    push(&p->todo, j);
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
}

nw_tls_job *nw_tls_pool_done(struct nw_tls_pool *p)
{
    uint64_t count;
    pthread_mutex_lock(&p->lock);
    if (read(p->efd, &count, sizeof count) < 0)
        count = 0;      /* (EAGAIN: nothing signalled since the last call) */
    nw_tls_job *jobs = p->finished.head;
    p->finished.head = p->finished.tail = NULL;
    pthread_mutex_unlock(&p->lock);
    return jobs;
}

void nw_tls_pool_free(struct nw_tls_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    close(p->efd);
    free(p);
}
