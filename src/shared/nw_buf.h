/* A growable byte buffer. Growth doubles; a failed allocation leaves the
 * buffer as it was and returns -1, so callers can answer 500 and close. */
#ifndef NW_BUF_H
#define NW_BUF_H

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} nw_buf;

static inline int nw_buf_reserve(nw_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > ((size_t)-1) / 2)
            return -1;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int nw_buf_append(nw_buf *b, const char *s, size_t n)
{
    if (n == 0)
        return 0;       /* (an empty buffer has no data to copy to) */
    if (nw_buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

/* Drop the first n bytes, keeping the rest at the front. */
static inline void nw_buf_consume(nw_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

static inline void nw_buf_free(nw_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

#endif
