/* The worker's deadline list (see nw_deadlines.h). */
#include "nw_deadlines.h"

void nw_deadlines_init(nw_deadlines *d)
{
    for (int k = 0; k < NW_DEADLINE_KINDS; k++)
        d->at[k] = 0;
}

nw_msec nw_deadlines_nearest(const nw_deadlines *d)
{
    nw_msec nearest = 0;
    for (int k = 0; k < NW_DEADLINE_KINDS; k++)
        if (d->at[k] && (!nearest || d->at[k] < nearest))
            nearest = d->at[k];
    return nearest;
}

int nw_deadlines_wait_ms(const nw_deadlines *d, nw_msec now, nw_msec until)
{
    nw_msec nearest = nw_deadlines_nearest(d);
    nw_msec wake = nearest && nearest < until ? nearest : until;
    return wake > now ? (int)(wake - now) : 0;
}
