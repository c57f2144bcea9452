/* The worker's deadline list (see nw_deadlines.h). */
#include "nw_deadlines.h"

void nw_deadlines_init(nw_deadlines *d)
{
    for (int k = 0; k < NW_DEADLINE_KINDS; k++)
        d->at[k] = 0;
}
