/* Every limit Narwhal enforces, in one place.
 * The ones an operator may need to change are also options (see the POD of
 * Narwhal, "LIMITS"); these are their defaults. */
#ifndef NW_LIMITS_H
#define NW_LIMITS_H

/* Request head. */
#define NW_DEFAULT_MAX_REQUEST_LINE   8192    /* bytes, method SP target SP version; over it: 414 */
#define NW_DEFAULT_MAX_HEADER_BYTES   65536   /* bytes, the whole head; over it: 431 */
#define NW_DEFAULT_MAX_HEADERS        100     /* header fields; over it: 431 */
#define NW_MAX_HEADERS_HARD           1024    /* the option cannot go above this */
#define NW_MIN_REQUEST_LINE           64      /* --max-request-line cannot go below this */
/* --max-header-bytes cannot go above NW_FRAME_MAX_DATA (nw_frame.h): a head
 * the manager holds must fit in one frame to a worker. */
#define NW_MAX_METHOD_LEN             32      /* longer methods are rejected with 400 */

/* Request body. */
#define NW_DEFAULT_MAX_REQUEST_BODY   (64 * 1024 * 1024) /* bytes; over it: 413. A limit by
                                               * default, so no client can make a worker
                                               * spool gigabytes to $TMPDIR; 0 (the option)
                                               * means none */
#define NW_DEFAULT_BODY_IN_MEMORY     (1024 * 1024) /* larger bodies spill to a temp file */
#define NW_DEFAULT_MAX_OFFLOAD_BYTES  (16 * 1024 * 1024)  /* a response's unsent rest the manager
                                                          * may finish (DESIGN.md, "Slow readers") */
#define NW_DEFAULT_MAX_OFFLOAD_TOTAL  (256 * 1024 * 1024) /* ...all such rests together */
#define NW_MAX_CHUNK_LINE             4096    /* chunk-size line with extensions */
#define NW_CHUNK_OVERHEAD_ALLOWANCE   16384   /* framing bytes allowed beyond the payload size */

/* Connection buffers. */
#define NW_READ_CHUNK                 16384   /* bytes asked of each read(2) */
#define NW_WRITE_BUFFER_INITIAL       4096    /* status line + headers are built here */
#define NW_IOV_BATCH                  64      /* iovecs per writev(2); well under IOV_MAX */
#define NW_SPARE_BUFFER_SETS          8       /* idle connections' buffers kept for the next reads */

/* Timeouts, in seconds (fractions allowed). All are deadlines. */
#define NW_DEFAULT_TIMEOUT            300     /* one read or write making no progress */
#define NW_DEFAULT_READ_TIMEOUT       20      /* a whole request head, from its first byte: a head
                                               * trickled in slowly holds a --max-connections
                                               * slot no longer than this */
#define NW_DEFAULT_KEEPALIVE_TIMEOUT  5       /* idle time between requests */
#define NW_DEFAULT_MAX_KEEPALIVE_REQS 1000    /* requests on one connection */
#define NW_DEFAULT_READ_TIMEOUT_MAX   60      /* a head still arriving fast enough gets up to this */
#define NW_DEFAULT_MIN_HEAD_RATE      500     /* bytes a second: each this many bytes of a head
                                               * move its deadline one second on (0: never) */
#define NW_MAX_SECONDS                2000000 /* a timeout's bound: deadlines travel to and
                                               * from the manager as int32 milliseconds */

/* The connection manager keeps this many descriptors of its open-file
 * limit for itself (worker channels, epoll, signalfd, stdio, status
 * clients); the rest is --max-connections' default. */
#define NW_MANAGER_RESERVED_FDS 256
/* Frames the manager reads from one channel per wake-up (epoll is
 * level-triggered: the rest wait for the next), and how long it drains a
 * half-closed connection before it closes it. */
#define NW_MANAGER_FRAMES_PER_WAKE    64
#define NW_MANAGER_LINGER_MS          1000
#define NW_TLS_MAX_THREADS            64      /* handshake threads: one per CPU counted, at most */
#define NW_TLS_FINISH_MS              10000   /* on a stop, the manager relays the TLS connections
                                                 * the workers still answer this long at most */

/* Listeners a server can have: each worker watches them all (epoll data
 * 0..62; 63 is its signalfd), and the manager gets a copy of each. */
#define NW_MAX_LISTENERS              63
/* --listen-queues' default is the accepting workers, at most this many
 * sockets (accept queues) per TCP address (DESIGN.md, "Listen queues"). */
#define NW_LISTEN_QUEUES_DEFAULT_MAX  4

/* A stuck pool (DESIGN.md, "When every worker is busy"): when no worker is
 * free and each has been on its request this long, the manager takes new
 * connections from the listeners itself, so that they wait where they are
 * measured and --max-queue-wait can shed them. The manager looks at the
 * pool this often while any worker is busy, and less often while none is. */
#define NW_POOL_STUCK_MS              20
#define NW_POOL_LOOK_MS               10
#define NW_POOL_LOOK_IDLE_MS          100
#define NW_MANAGER_ACCEPT_BATCH       64      /* connections taken per wake-up */
/* The elastic pool (--min-workers): the master adds a worker when, since
 * its last look, requests waited longer than this (at least one, and at
 * least NW_POOL_GROW_SHARE percent of those that began), or when the pool
 * is stuck (NW_POOL_STUCK_MS). */
#define NW_POOL_GROW_WAIT_MS          10
#define NW_POOL_GROW_SHARE            1
/* ... and, while some workers stand by (--accepting-workers), waits longer
 * than this: a client that reaches a standby worker has waited for the
 * manager's look (NW_POOL_STUCK_MS, then up to NW_POOL_LOOK_MS), which is
 * not a pool too small. A bound of the scoreboard's wait buckets. */
#define NW_POOL_GROW_STANDBY_WAIT_MS  50
/* ... and, while the workers' requests block (nw_block_meter.h), waits
 * longer than this: a worker more then serves at no cost to the CPUs, and
 * a wait of a 1 ms request's length doubles what its client feels. A
 * bound of the scoreboard's wait buckets. */
#define NW_POOL_GROW_BLOCKING_WAIT_MS 1

/* Parking: a worker holds connections it just served, waiting for their
 * next request alongside new work, before handing them to the manager. */
#define NW_MAX_PARKED 4096
#define NW_PARK_SLOW_REQUEST_MS       50      /* a request that took longer is slow; */
#define NW_PARK_PAUSE_MS              5000    /* two within this pause parking this long */
#define NW_FD_ROOM_RETRY_MS           50      /* a worker at its open-file limit leaves the
                                               * serve queue unwatched this long, then tries
                                               * again (nw_sources.c, room_for_one) */
#define NW_SERVE_REPOST_MS            100     /* a frame older than this, the oldest on the
                                               * serve queue at two looks half this apart with
                                               * a worker idle at both, lost its wake-up (the
                                               * worker it woke could not take it): the
                                               * manager takes it back and sends it again
                                               * (nw_mgr_shed.c, repost_serve_queue) */
/* Requests that block (DESIGN.md, "Requests that block"): a worker whose
 * requests spend most of their time asleep (a database, a sleep) hands its
 * kept-alive clients to the manager instead of parking them, and a standby
 * one accepts, so that the whole pool serves. */
#define NW_BLOCK_MEASURE_US           500     /* a request this long is measured, and arms the next */
#define NW_BLOCK_SHARE_ON             50      /* % of a request's time asleep, on average: blocking */
#define NW_BLOCK_SHARE_OFF            25      /* ... and under this: not any more */
#define NW_BLOCK_HOLD_MS              1000    /* not blocking this long after the last that did */
#define NW_PARK_EVICT_RETRY_MS        10      /* the park watcher met a full manager queue: retry then */
#define NW_HANDOFF_PATIENCE_MS        200     /* a full queue to the manager is waited for this long */
#define NW_HANDOFF_RETRY_MS           2       /* ...and a hand-off the kernel refuses for a while
                                               * (ETOOMANYREFS) is tried again this often */
/* Custody (DESIGN.md): a parked connection's copy goes to the manager this
 * long after its first park, so that a short keep-alive connection, closed
 * by its client meanwhile, never pays for it; sooner when the worker is
 * about to wait, or when this many wait. */
#define NW_CUSTODY_DELAY_MS           10
/* A worker or the manager stopped by a signal that is not the master's
 * (Ctrl-C and systemd signal the whole process group) gives the master
 * this long to begin a stop of its own (the board says so) before it
 * takes the signal as meant for it alone. */
#define NW_GROUP_STOP_WAIT_MS         500
#define NW_CUSTODY_WAIT_MAX           64
#define NW_PARK_CLOSE_LINGER_MS       500     /* a stopping worker drains parked ones this long */
/* Recycling (DESIGN.md, "Retirement"): a worker at its count whose
 * replacement is still starting serves on, this long at most, so that its
 * parked connections go to a worker that is there to take them. */
#define NW_RECYCLE_SUCCESSOR_WAIT_MS  2000
/* ... and the recycling turn it took to ask for that replacement is
 * another worker's to take after this at the latest: its holder is stuck
 * on a request that does not end (or stopped), which would keep every
 * other worker from being recycled. Three times the master's
 * REPLACE_LINGER, after which a holder that does not reach its count is
 * retired (tests set less with NARWHAL_TEST_RECYCLE_TURN_MS). */
#define NW_RECYCLE_TURN_MAX_MS        30000
#define NW_ADOPT_BUSY_WAIT_MS         2       /* a busy worker adopts a waiting batch after this */
#define NW_ADOPT_OVER_MEAN_WAIT_MS    200     /* ... or after this, when it holds more parked
                                               * connections than the pool's mean */
#define NW_ADOPT_LOOK_AGAIN_MS        10      /* ... one over the mean looks again after this
                                               * (the mean moves as the others take) */
#define NW_SHARE_LOOK_MS              2       /* the pool's parked counts are compared again
                                               * after this, at the soonest */
#define NW_ACCEPT_OVER_MEAN_WAIT_MS   5       /* a busy worker over the pool's mean leaves
                                               * new clients to the others this long */
#define NW_ADOPT_FRAMES               8       /* a leaving worker's parked set is split in about
                                               * this many batches, to be shared out */
#define NW_PASS_ON_MAX                16      /* frames (and, from each of the serve queue and a
                                               * listener, connections) a leaving worker passes
                                               * on, at most (the adopt queue holds about ten:
                                               * net.unix.max_dgram_qlen) */
#define NW_ADOPT_FD_RESERVE           256     /* descriptors a worker keeps below its open-file
                                               * limit (the app's) when it adopts connections */
#define NW_STOP_SERVE_MS              200     /* a stopping worker or manager still answers, with
                                               * Connection: close, the idle connections whose
                                               * next request comes this soon (then FIN) */
#define NW_STOP_WRITE_MS              5000    /* ...and a stopping manager goes on writing the responses
                                               * it finishes for slow readers, and handing the requests
                                               * in its queue to the workers, up to this much longer */
#define NW_CRASH_LOCK_TRIES           500     /* a crashing worker waits up to 50 ms for the parked set */

/* The operator layer (DESIGN.md). */
#define NW_RSS_LOOK_MS                1000    /* --max-worker-rss: /proc/self/statm at most this often,
                                               * once the peak size passed the limit */

/* Signals a worker defers until it is between requests. */
#define NW_SIGNAL_LOOK_MS             50      /* a worker that never waits looks for them this often */

#endif
