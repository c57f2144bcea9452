/* The status pages' rates (see nw_status_rates.h). */
#include "nw_status_rates.h"

#include <string.h>

static void sample_take(nw_status_sample *smp, const nw_status_worker_rate *rows, size_t n,
                        const nw_score_counts *t, uint64_t now_us)
{
    memset(smp->slot, 0, sizeof smp->slot);
    smp->at_us = now_us;
    smp->served = t->served;
    smp->duration_us = t->duration_us;
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot < NW_SCOREBOARD_SLOTS)
            smp->slot[rows[i].slot] = (nw_status_slot_sample){ rows[i].pid, rows[i].served,
                                                               rows[i].duration_us };
}

/* The rate of served over secs and the mean duration of those requests
 * (-1 when there were none). */
static void rate_of(uint64_t served, uint64_t duration_us, double secs, double *rps,
                    double *mean_s)
{
    *rps = secs > 0 ? (double)served / secs : 0;
    *mean_s = served ? (double)duration_us / (double)served / 1e6 : -1;
}

static void rates_rows(const nw_status_sample *base, nw_status_worker_rate *rows, size_t n,
                       uint64_t now_us)
{
    for (size_t i = 0; i < n; i++) {
        nw_status_worker_rate *w = &rows[i];
        const nw_status_slot_sample *was = base && w->slot < NW_SCOREBOARD_SLOTS
                                         ? &base->slot[w->slot] : NULL;
        if (was && was->pid == w->pid && w->served >= was->served)
            rate_of(w->served - was->served, w->duration_us - was->duration_us,
                    (double)(now_us - base->at_us) / 1e6, &w->rps, &w->mean_s);
        else
            rate_of(w->served, w->duration_us, w->age_s, &w->rps, &w->mean_s);
    }
}

void nw_status_rates_apply(nw_status_rates *rates, nw_status_worker_rate *rows, size_t n,
                           const nw_score_counts *t, uint64_t now_us, double uptime_s,
                           nw_status_total_rate *out)
{
    if (rates && (!rates->last.at_us || now_us - rates->last.at_us >= NW_STATUS_SAMPLE_US)) {
        rates->older = rates->last;
        sample_take(&rates->last, rows, n, t, now_us);
    }
    const nw_status_sample *base = rates && rates->older.at_us && now_us > rates->older.at_us
                                 && t->served >= rates->older.served ? &rates->older : NULL;
    out->window_s = base ? (double)(now_us - base->at_us) / 1e6 : 0;
    if (base)
        rate_of(t->served - base->served, t->duration_us - base->duration_us, out->window_s,
                &out->rps, &out->mean_s);
    else
        rate_of(t->served, t->duration_us, uptime_s, &out->rps, &out->mean_s);
    rates_rows(base, rows, n, now_us);
    uint64_t last_end = 0;
    out->last_s = -1;
    for (size_t i = 0; i < n; i++)
        if (rows[i].last_end_us > last_end) {
            last_end = rows[i].last_end_us;
            out->last_s = rows[i].last_s;
        }
}
