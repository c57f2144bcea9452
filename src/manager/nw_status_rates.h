/* The status pages' rates (/status, /status.json): requests per second
 * and mean response times, the server's and each worker's, from samples
 * of the scoreboard's counts that the manager keeps between renders. */
#ifndef NW_STATUS_RATES_H
#define NW_STATUS_RATES_H

#include <stddef.h>
#include <stdint.h>
#include "nw_scoreboard.h"

/* Requests per second and the mean response time are rates: counts now
 * less counts at an earlier sample, over the time between. The manager
 * keeps two samples; /status and /status.json take one when the last is
 * 1 s old or more, and measure from the one before it, so the window is
 * at least 1 s and about one refresh of the page. With no earlier sample
 * (the first render, or a worker newer than the sample) the rates are
 * the means since the server (the worker) started. */
#define NW_STATUS_SAMPLE_US 1000000
typedef struct {
    int32_t  pid;           /* the worker in that slot then (0: none) */
    uint64_t served, duration_us;
} nw_status_slot_sample;

typedef struct {
    uint64_t at_us;         /* when (monotonic; 0: never taken) */
    uint64_t served, duration_us;
    nw_status_slot_sample slot[NW_SCOREBOARD_SLOTS];
} nw_status_sample;

typedef struct {
    nw_status_sample older, last;
} nw_status_rates;

/* One worker's counts the rates are taken from (in), and its rates (out). */
typedef struct {
    int slot, pid;
    uint64_t served, duration_us, last_end_us;
    double age_s, last_s;               /* its age; its last request's time (-1: none) */
    double rps, mean_s;                 /* out; mean_s -1: no request yet */
} nw_status_worker_rate;

/* The whole server's rates. */
typedef struct {
    double rps, mean_s, last_s;         /* -1: no request yet */
    double window_s;                    /* what the rates are over; 0: since the start */
} nw_status_total_rate;

/* Take a sample when the last is NW_STATUS_SAMPLE_US old (rates may be
 * NULL: none kept), then measure the server's rates (t: its counts) and
 * each worker's from the one before it. */
void nw_status_rates_apply(nw_status_rates *rates, nw_status_worker_rate *w, size_t n,
                           const nw_score_counts *t, uint64_t now_us, double uptime_s,
                           nw_status_total_rate *out);

#endif
