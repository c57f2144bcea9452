/* The worker's configuration from the option table (Narwhal::Options),
 * and the C limits the table reads. */
#include "narwhal_xs.h"

#include <stddef.h>

#include "src/shared/nw_frame.h"
#include "src/shared/nw_scoreboard.h"

/* The worker's configuration, filled from a list the option table
 * (Narwhal::Options::c_config) builds in the order of config_field: a
 * typed struct, never a hash read by string key. */
enum field_type { F_SIZE, F_U64, F_SECONDS, F_BOOL };
static const struct {
    const char *name;       /* the option's name in Narwhal::Options */
    enum field_type type;
    size_t offset;
} config_field[] = {
    { "max_request_line",   F_SIZE,    offsetof(nw_worker_config, conn.parse.max_request_line) },
    { "max_header_bytes",   F_SIZE,    offsetof(nw_worker_config, conn.parse.max_header_bytes) },
    { "max_headers",        F_SIZE,    offsetof(nw_worker_config, conn.parse.max_headers) },
    { "max_request_body",   F_U64,     offsetof(nw_worker_config, conn.max_request_body) },
    { "body_in_memory",     F_SIZE,    offsetof(nw_worker_config, conn.body_in_memory) },
    { "timeout",            F_SECONDS, offsetof(nw_worker_config, conn.timeout) },
    { "read_timeout",       F_SECONDS, offsetof(nw_worker_config, conn.read_timeout) },
    { "read_timeout_max",   F_SECONDS, offsetof(nw_worker_config, conn.read_timeout_max) },
    { "min_head_rate",      F_SECONDS, offsetof(nw_worker_config, conn.min_head_rate) },
    { "keepalive_timeout",  F_SECONDS, offsetof(nw_worker_config, conn.keepalive_timeout) },
    { "max_keepalive_reqs", F_SECONDS, offsetof(nw_worker_config, conn.max_keepalive_reqs) },
    { "keepalive_wait",     F_SECONDS, offsetof(nw_worker_config, keepalive_wait) },
    { "worker_slice",       F_SECONDS, offsetof(nw_worker_config, worker_slice) },
    { "proxy_protocol",     F_BOOL,    offsetof(nw_worker_config, conn.proxy_protocol) },
    { "custody",            F_BOOL,    offsetof(nw_worker_config, conn.custody) },
    { "max_offload_bytes",  F_U64,     offsetof(nw_worker_config, conn.max_offload_bytes) },
    { "max_offload_total",  F_U64,     offsetof(nw_worker_config, conn.max_offload_total) },
};
#define CONFIG_FIELDS (sizeof config_field / sizeof config_field[0])

size_t nw_config_field_count(void)
{
    return CONFIG_FIELDS;
}

const char *nw_config_field_name(size_t i)
{
    return i < CONFIG_FIELDS ? config_field[i].name : NULL;
}

void nw_config_from_av(pTHX_ AV *values, nw_worker_config *cfg)
{
    if (av_len(values) + 1 != (SSize_t)CONFIG_FIELDS)
        croak("the worker's configuration needs %d values", (int)CONFIG_FIELDS);
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < CONFIG_FIELDS; i++) {
        SV **v = av_fetch(values, (SSize_t)i, 0);
        char *at = (char *)cfg + config_field[i].offset;
        NV n = v && SvOK(*v) ? SvNV(*v) : 0;
        if (n < 0)
            croak("%s must not be negative", config_field[i].name);
        switch (config_field[i].type) {
        case F_SIZE:    *(size_t *)at = (size_t)n; break;
        case F_U64:     *(uint64_t *)at = (uint64_t)n; break;
        case F_SECONDS: *(double *)at = (double)n; break;
        case F_BOOL:    *(int *)at = n != 0; break;
        }
    }
    if (cfg->conn.parse.max_headers < 1 || cfg->conn.parse.max_headers > NW_MAX_HEADERS_HARD)
        croak("max_headers must be between 1 and %d", NW_MAX_HEADERS_HARD);
}

/* Limits Perl must not retype: the option table reads them from here. */
void nw_config_export_limits(pTHX)
{
    HV *stash = gv_stashpvs("Narwhal::Limits", GV_ADD);
    static const struct { const char *name; double value; } limit[] = {
        { "DEFAULT_MAX_REQUEST_LINE", NW_DEFAULT_MAX_REQUEST_LINE },
        { "DEFAULT_MAX_HEADER_BYTES", NW_DEFAULT_MAX_HEADER_BYTES },
        { "DEFAULT_MAX_HEADERS", NW_DEFAULT_MAX_HEADERS },
        { "MAX_HEADERS_HARD", NW_MAX_HEADERS_HARD },
        { "MIN_REQUEST_LINE", NW_MIN_REQUEST_LINE },
        { "MAX_HEADER_BYTES_HARD", NW_FRAME_MAX_DATA },
        { "DEFAULT_MAX_REQUEST_BODY", NW_DEFAULT_MAX_REQUEST_BODY },
        { "DEFAULT_BODY_IN_MEMORY", NW_DEFAULT_BODY_IN_MEMORY },
        { "DEFAULT_MAX_OFFLOAD_BYTES", NW_DEFAULT_MAX_OFFLOAD_BYTES },
        { "DEFAULT_MAX_OFFLOAD_TOTAL", NW_DEFAULT_MAX_OFFLOAD_TOTAL },
        { "DEFAULT_TIMEOUT", NW_DEFAULT_TIMEOUT },
        { "DEFAULT_READ_TIMEOUT", NW_DEFAULT_READ_TIMEOUT },
        { "DEFAULT_READ_TIMEOUT_MAX", NW_DEFAULT_READ_TIMEOUT_MAX },
        { "DEFAULT_MIN_HEAD_RATE", NW_DEFAULT_MIN_HEAD_RATE },
        { "DEFAULT_KEEPALIVE_TIMEOUT", NW_DEFAULT_KEEPALIVE_TIMEOUT },
        { "DEFAULT_MAX_KEEPALIVE_REQS", NW_DEFAULT_MAX_KEEPALIVE_REQS },
        { "MAX_SECONDS", NW_MAX_SECONDS },
        { "MAX_LISTENERS", NW_MAX_LISTENERS },
        { "LISTEN_QUEUES_DEFAULT_MAX", NW_LISTEN_QUEUES_DEFAULT_MAX },
        { "MAX_PARKED", NW_MAX_PARKED },
        { "MANAGER_RESERVED_FDS", NW_MANAGER_RESERVED_FDS },
        { "TLS_MAX_THREADS", NW_TLS_MAX_THREADS },
        { "PARK_SLOW_REQUEST_MS", NW_PARK_SLOW_REQUEST_MS },
        { "POOL_STUCK_MS", NW_POOL_STUCK_MS },
        { "POOL_GROW_WAIT_MS", NW_POOL_GROW_WAIT_MS },
        { "POOL_GROW_STANDBY_WAIT_MS", NW_POOL_GROW_STANDBY_WAIT_MS },
        { "POOL_GROW_BLOCKING_WAIT_MS", NW_POOL_GROW_BLOCKING_WAIT_MS },
        { "POOL_GROW_SHARE", NW_POOL_GROW_SHARE },
        { "PARK_PAUSE_MS", NW_PARK_PAUSE_MS },
        { "CUSTODY_DELAY_MS", NW_CUSTODY_DELAY_MS },
        { "GROUP_STOP_WAIT_MS", NW_GROUP_STOP_WAIT_MS },
        { "RECYCLE_SUCCESSOR_WAIT_MS", NW_RECYCLE_SUCCESSOR_WAIT_MS },
        { "SCOREBOARD_SLOTS", NW_SCOREBOARD_SLOTS },
        { "MANAGER_CONTROL_FD", NW_MANAGER_CONTROL_FD },
        { "MANAGER_HANDOFF_QUEUE_FD", NW_MANAGER_HANDOFF_QUEUE_FD },
        { "MANAGER_SERVE_QUEUE_FD", NW_MANAGER_SERVE_QUEUE_FD },
        { "MANAGER_SCOREBOARD_FD", NW_MANAGER_SCOREBOARD_FD },
        { "MANAGER_SERVE_READER_FD", NW_MANAGER_SERVE_READER_FD },
        { "MANAGER_STATUS_FD", NW_MANAGER_STATUS_FD },
        { "MANAGER_LISTENERS_FD", NW_MANAGER_LISTENERS_FD },
    };
    for (size_t i = 0; i < sizeof limit / sizeof limit[0]; i++)
        newCONSTSUB(stash, limit[i].name, newSVnv(limit[i].value));
}
