/* libFuzzer harness for the PROXY protocol parser (src/shared/nw_proxy.c). The
 * input is a connection's first bytes. Invariants, checked with abort():
 *  - a header that parses (DONE) is no longer than the input, and every
 *    shorter prefix of it asks for more (MORE): a header split anywhere
 *    is read the same;
 *  - BAD on a prefix stays BAD on any longer input (never a header after
 *    a refusal);
 *  - what the v2 encoder writes from the parsed addresses parses again to
 *    the same addresses.
 * Build and run: see fuzz/README.md (make -f fuzz.mk run-proxy). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "nw_proxy.h"

static int parse_exact(const uint8_t *data, size_t size, nw_proxy_info *info, size_t *used)
{
    char *copy = malloc(size ? size : 1);     /* exactly size bytes: any over-read is caught */
    if (!copy)
        abort();
    memcpy(copy, data, size);
    int r = nw_proxy_parse(copy, size, info, used);
    free(copy);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nw_proxy_info info, again;
    size_t used = 0, used2 = 0;
    int r = parse_exact(data, size, &info, &used);
    if (r != NW_PROXY_DONE && r != NW_PROXY_MORE && r != NW_PROXY_BAD)
        abort();
    if (r == NW_PROXY_DONE) {
        if (used == 0 || used > size)
            abort();
        for (size_t k = 0; k < used; k++)
            if (parse_exact(data, k, &again, &used2) != NW_PROXY_MORE)
                abort();
        if (parse_exact(data, used, &again, &used2) != NW_PROXY_DONE || used2 != used)
            abort();
        char out[NW_PROXY_V2_ROOM];
        size_t n = info.local ? nw_proxy_encode_v2(out, NULL, 0, NULL, 0)
                 : nw_proxy_encode_v2(out, (struct sockaddr *)&info.src, info.src_len,
                                      (struct sockaddr *)&info.dst, info.dst_len);
        if (nw_proxy_parse(out, n, &again, &used2) != NW_PROXY_DONE || used2 != n
            || again.local != (info.local || info.src_len == 0)
            || (!again.local && memcmp(&again.src, &info.src, info.src_len)))
            abort();
    }
    if (r == NW_PROXY_BAD && size > 0) {
        /* the shortest refused prefix: every longer one is refused too */
        size_t k = 1;
        while (k < size && parse_exact(data, k, &again, &used2) != NW_PROXY_BAD)
            k++;
        for (size_t j = k; j <= size; j++)
            if (parse_exact(data, j, &again, &used2) != NW_PROXY_BAD)
                abort();
    }
    return 0;
}
