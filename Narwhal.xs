/* The thin glue between Perl and Narwhal's C core (src/).
 * Two classes: Narwhal::Acceptor (listeners, accept4) and Narwhal::Conn
 * (one client connection: read a request into a PSGI $env, write a
 * response). Everything protocol-shaped lives in src/; this file only moves
 * values between C structs and Perl data. */
#define PERL_NO_GET_CONTEXT
#include "EXTERN.h"
#include "perl.h"
#include "XSUB.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "src/nw_conn.h"
#include "src/nw_frame.h"
#include "src/nw_park.h"

#define MAX_LISTENERS 64
#define SMALL_PIECES  16   /* body pieces handled without a heap array */

typedef struct env_recycler env_recycler;

typedef struct {
    int fd;
    int is_tcp;
    env_recycler *env;  /* its $env template and spare */
} nw_listener;

typedef struct {
    nw_listener listeners[MAX_LISTENERS];
    int count;
    int next;
    int epfd;
    int from_manager;   /* to-workers, shared by all workers: SERVE frames; -1 without a manager */
    int to_manager;     /* to-manager, shared: HANDOFF frames */
    int took_served;    /* the last connection came from to-workers */
    char *frame_data;   /* NW_FRAME_MAX_DATA bytes for incoming frames */
    nw_conn_config cfg;
    nw_park park;       /* just-served connections waiting here briefly (items: SV *) */
    int took_parked;    /* the last connection was a parked one */
    nw_msec park_ms;    /* how long a connection may stay parked (--keepalive-wait) */
    nw_msec no_park_until; /* parking paused after a slow request */
    uint64_t listener_ready;  /* bit i: listener i may have a client (epoll said so, or not tried yet) */
    int queue_ready;          /* the to-workers queue may hold a connection */
    nw_msec last_poll;        /* when epoll was last asked */

    /* The park watcher: see "Fairness and slow apps" in docs/DESIGN.md.
     * The main thread holds park_lock whenever it is inside the acceptor. */
    int has_watcher;
    pthread_t watcher;
    pthread_mutex_t park_lock;
    pthread_cond_t park_wake;
    int watcher_idle;         /* waiting for the first parked connection */
    int main_holds;           /* the main thread holds park_lock */
    int fork_locked;          /* the fork handler took park_lock */
    nw_msec evict_gave_up;    /* out_since of a round the watcher gave up on */
    int watcher_quit;         /* set to make the watcher return */
    nw_msec out_since;        /* the main thread went out to serve then; 0: inside */
    SV *evicted[NW_MAX_PARKED]; /* handed off by the watcher, for the main thread to drop */
    int nevicted;
} nw_xs_acceptor;

#define FROM_MANAGER_EVENT MAX_LISTENERS   /* epoll data for the to-workers queue */
#define PARKED_EVENT (MAX_LISTENERS + 1)   /* epoll data for parked slot i: PARKED_EVENT + i */
#define EVENTS_MAX (MAX_LISTENERS + 1 + NW_MAX_PARKED)

typedef struct {
    nw_conn *c;
    env_recycler *env;  /* its listener's */
    SV *remote_addr;
    SV *remote_port;
    SV *io;             /* psgix.io, made the first time an app looks */
    nw_msec started;    /* when the current request's head was complete */
    nw_park_watch watch; /* its registration in the acceptor's epoll set (see park) */
    int peer_closed;    /* its peer's FIN was reported while parked (see park) */
} nw_xs_conn;

/* $env keys whose hashes are computed once. */
enum {
    K_REQUEST_METHOD, K_REQUEST_URI, K_PATH_INFO, K_QUERY_STRING,
    K_SERVER_PROTOCOL, K_REMOTE_ADDR, K_REMOTE_PORT, K_CONTENT_LENGTH,
    K_CONTENT_TYPE, K_PSGI_INPUT, K_HTTP_TRANSFER_ENCODING, K_CLEANUP_HANDLERS,
    K_PSGIX_IO, K_HARAKIRI_COMMIT, K_COUNT
};
static struct { const char *name; I32 len; U32 hash; } keys[K_COUNT] = {
    { "REQUEST_METHOD", 14, 0 }, { "REQUEST_URI", 11, 0 },
    { "PATH_INFO", 9, 0 }, { "QUERY_STRING", 12, 0 },
    { "SERVER_PROTOCOL", 15, 0 }, { "REMOTE_ADDR", 11, 0 },
    { "REMOTE_PORT", 11, 0 }, { "CONTENT_LENGTH", 14, 0 },
    { "CONTENT_TYPE", 12, 0 }, { "psgi.input", 10, 0 },
    { "HTTP_TRANSFER_ENCODING", 22, 0 }, { "psgix.cleanup.handlers", 22, 0 },
    { "psgix.io", 8, 0 }, { "psgix.harakiri.commit", 21, 0 },
};
static HV *input_stash;
static HV *conn_stash, *acceptor_stash;   /* for the typemap's quick check */

static void env_put(pTHX_ HV *env, int k, SV *val)
{
    (void)hv_store(env, keys[k].name, keys[k].len, val, keys[k].hash);
}

static double hv_num(pTHX_ HV *hv, const char *key, double dflt)
{
    SV **sv = hv_fetch(hv, key, (I32)strlen(key), 0);
    return (sv && SvOK(*sv)) ? SvNV(*sv) : dflt;
}

static void config_from_hash(pTHX_ HV *hv, nw_conn_config *cfg)
{
    cfg->parse.max_request_line = (size_t)hv_num(aTHX_ hv, "max_request_line",
                                                 NW_DEFAULT_MAX_REQUEST_LINE);
    cfg->parse.max_header_bytes = (size_t)hv_num(aTHX_ hv, "max_header_bytes",
                                                 NW_DEFAULT_MAX_HEADER_BYTES);
    cfg->parse.max_headers = (size_t)hv_num(aTHX_ hv, "max_headers",
                                            NW_DEFAULT_MAX_HEADERS);
    if (cfg->parse.max_headers < 1 || cfg->parse.max_headers > NW_MAX_HEADERS_HARD)
        croak("max_headers must be between 1 and %d", NW_MAX_HEADERS_HARD);
    cfg->max_request_body = (uint64_t)hv_num(aTHX_ hv, "max_request_body",
                                             NW_DEFAULT_MAX_REQUEST_BODY);
    cfg->body_in_memory = (size_t)hv_num(aTHX_ hv, "body_in_memory",
                                         NW_DEFAULT_BODY_IN_MEMORY);
    cfg->timeout = hv_num(aTHX_ hv, "timeout", NW_DEFAULT_TIMEOUT);
    cfg->read_timeout = hv_num(aTHX_ hv, "read_timeout", NW_DEFAULT_READ_TIMEOUT);
    cfg->keepalive_timeout = hv_num(aTHX_ hv, "keepalive_timeout",
                                    NW_DEFAULT_KEEPALIVE_TIMEOUT);
    cfg->max_keepalive_reqs = hv_num(aTHX_ hv, "max_keepalive_reqs", 0);
}

/* psgix.io costs a dup and PerlIO's probes (nine system calls), so it is
 * made only when the app reads $env->{'psgix.io'}: the value carries get
 * magic that asks Narwhal::Worker::_io_handle for the handle once per
 * connection. */
static SV *make_io_handle(pTHX_ SV *conn_rv)
{
    dSP;
    SV *ret = NULL;
    ENTER;
    SAVETMPS;
    PUSHMARK(SP);
    XPUSHs(conn_rv);
    PUTBACK;
    if (call_pv("Narwhal::Worker::_io_handle", G_SCALAR) == 1) {
        SPAGAIN;
        ret = newSVsv(POPs);
        PUTBACK;
    }
    FREETMPS;
    LEAVE;
    return ret ? ret : newSV(0);
}

static int io_magic_get(pTHX_ SV *sv, MAGIC *mg)
{
    if (!mg->mg_obj)
        return 0;
    nw_xs_conn *xc = INT2PTR(nw_xs_conn *, SvIV(SvRV(mg->mg_obj)));
    if (!xc->io)
        xc->io = make_io_handle(aTHX_ mg->mg_obj);
    sv_setsv_nomg(sv, xc->io);
    return 0;
}

static MGVTBL io_magic_vtbl = { io_magic_get, NULL, NULL, NULL, NULL, NULL, NULL, NULL };

#define ENV_BIG_BYTES   65536 /* a larger string buffer in $env is freed, not kept */
#define ENV_BUCKETS_MAX 256   /* a $env grown past this many buckets is not reused */

static void io_magic_attach(pTHX_ SV *val, SV *self_rv)
{
    SV *rv = newRV_inc(SvRV(self_rv));
    sv_magicext(val, rv, PERL_MAGIC_ext, &io_magic_vtbl, NULL, 0);
    SvREFCNT_dec(rv);
}

static SV *env_lazy_io(pTHX_ SV *self_rv)
{
    SV *val = newSV(0);
    io_magic_attach(aTHX_ val, self_rv);
    return val;
}

/* A spare $env's psgix.io: pointed at this request's connection. */
static void env_lazy_io_again(pTHX_ SV *val, SV *self_rv)
{
    MAGIC *mg = SvTYPE(val) >= SVt_PVMG ? mg_findext(val, PERL_MAGIC_ext, &io_magic_vtbl) : NULL;
    if (!mg) {
        io_magic_attach(aTHX_ val, self_rv);
        return;
    }
    SvREFCNT_dec(mg->mg_obj);
    mg->mg_obj = newRV_inc(SvRV(self_rv));
    mg->mg_flags |= MGf_REFCOUNTED;
}

/* At the end of a request: keep psgix.io's scalar for the next one if it
 * has nothing but its own magic, letting go of the connection and handle
 * (a spare $env must not keep a finished connection open). */
static int env_lazy_io_release(pTHX_ SV *val)
{
    if (SvREFCNT(val) != 1 || SvREADONLY(val) || SvTYPE(val) != SVt_PVMG
        || SvLEN(val) > ENV_BIG_BYTES)
        return 0;           /* (only a PVMG has a magic chain to look at) */
    MAGIC *mg = SvMAGIC(val);
    if (!mg || mg->mg_moremagic || mg->mg_type != PERL_MAGIC_ext || mg->mg_virtual != &io_magic_vtbl)
        return 0;
    if (SvOBJECT(val))
        return 0;
    SvREFCNT_dec(mg->mg_obj);
    mg->mg_obj = NULL;
    if (SvOK(val))
        sv_setsv(val, &PL_sv_undef);
    return 1;
}

/* The spare $env (see "The $env" in docs/DESIGN.md): at the end of a
 * request the hash is cleaned back to its template, when nothing else holds
 * it, and the next request on the listener fills it in instead of copying
 * the template again. */
#define ENV_OWNED_MAX   64    /* keys Narwhal owns in one listener's $env */
#define ENV_OWNED_SLOTS 128   /* the open-addressing table over them (a power of 2) */
#define ENV_DOOMED_MAX  256   /* keys one clean may delete; more and the hash is let go */
#define ENV_KEY_MAX     256   /* longest key a clean deletes from a stack copy */
#define ENV_STALE_MAX   32    /* header entries a clean keeps for the next request to reuse */
#define ENV_STALE_BYTES 1024  /* the largest header value buffer kept so */

typedef struct {
    const char *name;
    I32 len;
    U32 hash;
    SV *value;          /* the template's value; NULL for a per-request key */
    int fixed;          /* for a per-request key, its K_ index; else -1 */
    HEK *hek;           /* its shared key (held by key_holder): compared by address */
} env_key;

struct env_recycler {
    int refcnt;                 /* the acceptor and each connection of the listener */
    HV *template;
    HV *spare;                  /* a cleaned $env for the next request, or NULL */
    HV *key_holder;             /* holds the shared keys of key[] */
    SV *fixed_sv[K_COUNT];      /* in spare: the scalar of each per-request key */
    int nkeys;
    env_key key[ENV_OWNED_MAX];
    unsigned char slot[ENV_OWNED_SLOTS];   /* index into key + 1; 0: empty */
    HE *stale[ENV_STALE_MAX];   /* in spare: last request's header entries (plain strings) */
    int nstale;
};

/* The keys whose values read_request writes into a spare $env. */
static const int env_fixed_keys[] = {
    K_REQUEST_METHOD, K_REQUEST_URI, K_PATH_INFO, K_QUERY_STRING,
    K_SERVER_PROTOCOL, K_REMOTE_ADDR, K_REMOTE_PORT, K_CLEANUP_HANDLERS, K_PSGIX_IO,
};

/* Which owned key this is, or -1 (used while the table is built). */
static int env_find_key(const env_recycler *r, U32 hash, const char *name, I32 len)
{
    for (unsigned s = hash & (ENV_OWNED_SLOTS - 1);; s = (s + 1) & (ENV_OWNED_SLOTS - 1)) {
        int j = r->slot[s] - 1;
        if (j < 0)
            return -1;
        const env_key *k = &r->key[j];
        if (k->hash == hash && k->len == len && memEQ(k->name, name, len))
            return j;
    }
}

/* The same lookup on the hot path (about 25 per request): keys are shared
 * strings, so the owned one is almost always found by its address first.
 * Kept apart from env_find_key because merging the two cost 300
 * instructions per request (callgrind). */
static int env_owned_index(const env_recycler *r, const HEK *hek)
{
    U32 hash = HEK_HASH(hek);
    for (unsigned s = hash & (ENV_OWNED_SLOTS - 1);; s = (s + 1) & (ENV_OWNED_SLOTS - 1)) {
        int j = r->slot[s] - 1;
        if (j < 0)
            return -1;
        const env_key *k = &r->key[j];
        if (k->hek == hek)
            return j;
        if (k->hash == hash && k->len == HEK_LEN(hek) && !HEK_UTF8(hek) && !HEK_WASUTF8(hek)
            && memEQ(k->name, HEK_KEY(hek), k->len))
            return j;
    }
}

static void env_own(env_recycler *r, const char *name, I32 len, U32 hash,
                    SV *value, int fixed)
{
    if (r->nkeys == ENV_OWNED_MAX || env_find_key(r, hash, name, len) >= 0)
        return;
    int j = r->nkeys++;
    r->key[j] = (env_key){ name, len, hash, value, fixed, NULL };
    unsigned s = hash & (ENV_OWNED_SLOTS - 1);
    while (r->slot[s])
        s = (s + 1) & (ENV_OWNED_SLOTS - 1);
    r->slot[s] = (unsigned char)(j + 1);
}

static env_recycler *env_recycler_new(pTHX_ HV *template)
{
    env_recycler *r;
    Newxz(r, 1, env_recycler);
    r->refcnt = 1;
    r->template = (HV *)SvREFCNT_inc_simple_NN((SV *)template);
    for (size_t i = 0; i < sizeof env_fixed_keys / sizeof env_fixed_keys[0]; i++) {
        int k = env_fixed_keys[i];
        env_own(r, keys[k].name, keys[k].len, keys[k].hash, NULL, k);
    }
    HE *he;
    hv_iterinit(template);
    while ((he = hv_iternext(template)))
        if (HeKLEN(he) >= 0 && !HeKUTF8(he))
            env_own(r, HeKEY(he), HeKLEN(he), HeHASH(he), HeVAL(he), -1);
    r->key_holder = newHV();
    for (int j = 0; j < r->nkeys; j++) {
        env_key *k = &r->key[j];
        HE *held = (HE *)hv_common(r->key_holder, NULL, k->name, (STRLEN)k->len, 0,
                                   HV_FETCH_ISSTORE, newSV(0), k->hash);
        k->hek = held ? HeKEY_hek(held) : NULL;
    }
    return r;
}

static void env_recycler_unref(pTHX_ env_recycler *r)
{
    if (!r || --r->refcnt > 0)
        return;
    SvREFCNT_dec((SV *)r->spare);
    SvREFCNT_dec((SV *)r->key_holder);
    SvREFCNT_dec((SV *)r->template);
    Safefree(r);
}

/* A value Narwhal may write into: nobody else holds it and nothing is
 * attached to it. */
__attribute__((always_inline)) static inline int env_value_reusable(pTHX_ SV *v)
{
    /* the same test as a few flag masks (it runs ~25 times a request):
     * refcount 1, not magical, read-only, blessed or a weak reference; a
     * scalar up to PVMG with at most ENV_BIG_BYTES of buffer, or a fake glob */
    U32 f = SvFLAGS(v);
    if (SvREFCNT(v) != 1
        || (f & (SVs_GMG | SVs_SMG | SVs_RMG | SVf_READONLY | SVf_PROTECT | SVs_OBJECT))
        || (f & (SVf_ROK | SVprv_WEAKREF)) == (SVf_ROK | SVprv_WEAKREF))
        return 0;
    if ((f & SVTYPEMASK) <= SVt_PVMG)
        return (f & SVTYPEMASK) < SVt_PV || SvLEN(v) <= ENV_BIG_BYTES;
    return isGV_with_GP(v) && SvFAKE(v);
}

#define ENV_VALUE_FLAGS (SVf_IOK | SVf_NOK | SVf_POK | SVf_ROK | SVp_IOK | SVp_NOK \
                         | SVp_POK | SVf_UTF8 | SVf_IVisUV)

/* Whether v still holds the template value t (then it is left as it is). */
__attribute__((always_inline)) static inline int env_same_value(pTHX_ SV *v, SV *t)
{
    if (isGV_with_GP(t))
        return isGV_with_GP(v) && GvGP(v) == GvGP(t);
    if (isGV_with_GP(v) || ((SvFLAGS(v) ^ SvFLAGS(t)) & ENV_VALUE_FLAGS)
        || SvIsBOOL(v) != SvIsBOOL(t))
        return 0;
    if (SvROK(t))
        return SvRV(v) == SvRV(t);
    if (SvPOK(t) && (SvCUR(v) != SvCUR(t)    /* a shared (COW) buffer is equal */
                     || (SvPVX(v) != SvPVX(t) && memNE(SvPVX(v), SvPVX(t), SvCUR(t)))))
        return 0;
    if (SvIOK(t) && SvIVX(v) != SvIVX(t))
        return 0;
    if (SvNOK(t) && SvNVX(v) != SvNVX(t))
        return 0;
    return 1;
}

/* Put owned key j's value back the way a fresh $env has it. */
static void env_clean_value(pTHX_ env_recycler *r, int j, SV *v)
{
    const env_key *k = &r->key[j];
    if (k->value) {
        if (!env_same_value(aTHX_ v, k->value))
            sv_setsv(v, k->value);
        return;
    }
    if (k->fixed == K_CLEANUP_HANDLERS && SvROK(v)) {
        AV *av = (AV *)SvRV(v);
        if (SvTYPE(av) == SVt_PVAV && SvREFCNT(av) == 1 && !SvMAGICAL(av) && !SvOBJECT(av)
            && !SvREADONLY(av))
            av_clear(av);               /* the handlers go now, as they always did */
        else
            sv_setsv(v, &PL_sv_undef);
    } else if (SvROK(v) || isGV_with_GP(v)) {
        sv_setsv(v, &PL_sv_undef);      /* what it referred to goes now (a glob's too) */
    }
    r->fixed_sv[k->fixed] = v;
}

static int env_may_recycle(pTHX_ HV *env)
{
    return SvREFCNT(env) == 1 && !SvMAGICAL(env) && !SvREADONLY(env) && !SvOBJECT(env)
        && HvARRAY(env) && HvMAX(env) < ENV_BUCKETS_MAX    /* a clean walks every bucket */
        && !(SvOOK(env) && HvAUX(env)->xhv_backreferences);
}

/* A header's entry ("HTTP_*", CONTENT_LENGTH, CONTENT_TYPE) holding a
 * plain string: kept in a clean $env for the next request, which writes
 * its own value into it if it has that header and deletes it if not. */
static int env_stale_header(pTHX_ env_recycler *r, HE *he)
{
    SV *v = HeVAL(he);
    I32 len = HeKLEN(he);
    const char *key = HeKEY(he);
    if (r->nstale == ENV_STALE_MAX || len > ENV_KEY_MAX || !env_value_reusable(aTHX_ v) || SvROK(v)
        || isGV_with_GP(v) || SvTYPE(v) < SVt_PV || SvLEN(v) > ENV_STALE_BYTES
        || HeKUTF8(he) || HeKWASUTF8(he))
        return 0;
    if (!((len > 5 && memEQ(key, "HTTP_", 5))
          || (len == 14 && memEQ(key, "CONTENT_LENGTH", 14))
          || (len == 12 && memEQ(key, "CONTENT_TYPE", 12))))
        return 0;
    r->stale[r->nstale++] = he;
    return 1;
}

static void env_delete_entry(pTHX_ HV *env, HE *he)
{
    char key[ENV_KEY_MAX];
    I32 len = HeKLEN(he);
    U32 hash = HeHASH(he);
    int flags = HeKUTF8(he) ? HVhek_UTF8 : 0;
    memcpy(key, HeKEY(he), (size_t)len);
    (void)hv_common(env, NULL, key, (STRLEN)len, flags, G_DISCARD | HV_DELETE, NULL, hash);
}

/* The end of a request: clean env and keep it as the spare, if it is
 * Narwhal's alone. Deletes what the request added, puts the template's
 * values back, re-adds owned keys the app deleted. */
static void env_recycle(pTHX_ env_recycler *r, HV *env)
{
    if (r->spare || !env_may_recycle(aTHX_ env))
        return;
    r->nstale = 0;
    unsigned char seen[ENV_OWNED_MAX];
    HE *doomed[ENV_DOOMED_MAX];
    int nd = 0;
    memset(seen, 0, (size_t)r->nkeys);
    HE **array = HvARRAY(env);
    for (STRLEN b = 0; b <= HvMAX(env); b++) {
        for (HE *he = array[b]; he; he = HeNEXT(he)) {
            SV *v = HeVAL(he);
            int j = HeKLEN(he) >= 0 ? env_owned_index(r, HeKEY_hek(he)) : -1;
            int kept = 0;
            if (j >= 0 && r->key[j].fixed == K_PSGIX_IO) {
                if ((kept = env_lazy_io_release(aTHX_ v)))
                    r->fixed_sv[K_PSGIX_IO] = v;
            } else if (j >= 0 && env_value_reusable(aTHX_ v)) {
                env_clean_value(aTHX_ r, j, v);
                kept = 1;
            } else if (j < 0 && HeKLEN(he) >= 0 && env_stale_header(aTHX_ r, he)) {
                continue;
            }
            if (kept) {
                seen[j] = 1;
                continue;
            }
            if (nd == ENV_DOOMED_MAX || HeKLEN(he) < 0 || HeKLEN(he) > ENV_KEY_MAX)
                return;     /* more than a clean is for: the hash is freed as usual */
            doomed[nd++] = he;
        }
    }
    for (int i = 0; i < nd; i++)
        env_delete_entry(aTHX_ env, doomed[i]);
    for (int j = 0; j < r->nkeys; j++) {
        if (seen[j])
            continue;
        const env_key *k = &r->key[j];
        SV *v = k->value ? newSVsv(k->value) : newSV(0);
        (void)hv_common(env, NULL, k->name, (STRLEN)k->len, 0, HV_FETCH_ISSTORE, v, k->hash);
        if (k->fixed >= 0)
            r->fixed_sv[k->fixed] = v;
    }
    if (SvOOK(env))
        hv_iterinit(env);       /* no each() left half-way */
    r->spare = (HV *)SvREFCNT_inc_simple_NN((SV *)env);
}

/* Write bytes into a reused scalar: a plain byte string whatever it was. */
static char *env_bytes(pTHX_ SV *sv, STRLEN len)
{
    /* a plain string scalar with room (the usual spare value):
     * no sv_setpvn round trip */
    if (SvTYPE(sv) >= SVt_PV && SvTYPE(sv) <= SVt_PVMG && SvLEN(sv) > len
        && !(SvFLAGS(sv) & (SVf_THINKFIRST | SVs_GMG | SVs_SMG | SVs_RMG | SVf_OOK))) {
        (void)SvPOK_only(sv);       /* also clears UTF8, IOK, NOK */
        return SvPVX(sv);
    }
    sv_setpvn(sv, "", 0);
    SvUTF8_off(sv);
    return SvGROW(sv, len + 1);
}

static void env_set(pTHX_ SV *sv, const char *p, STRLEN len)
{
    char *d = env_bytes(aTHX_ sv, len);
    memcpy(d, p, len);
    d[len] = '\0';
    SvCUR_set(sv, len);
}

/* REMOTE_ADDR / REMOTE_PORT; IPv4-mapped IPv6 shows as plain IPv4. */
static void peer_to_sv(pTHX_ nw_xs_conn *xc, const struct sockaddr_storage *ss,
                       unsigned len)
{
    char host[INET6_ADDRSTRLEN] = "";
    int port = 0;
    if (len > 0 && ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)ss;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (len > 0 && ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof host);
        else
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    xc->remote_addr = newSVpv(host, 0);
    xc->remote_port = newSViv(port);
}

static nw_xs_conn *conn_wrap(pTHX_ nw_xs_acceptor *a, int index, int fd,
                             const struct sockaddr_storage *peer, unsigned plen)
{
    nw_listener *l = &a->listeners[index];
    nw_conn *c = nw_conn_new(fd, l->is_tcp, &a->cfg);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->listener = index;
    nw_xs_conn *xc;
    Newxz(xc, 1, nw_xs_conn);
    xc->c = c;
    xc->env = l->env;
    xc->env->refcnt++;
    peer_to_sv(aTHX_ xc, peer, plen);
    return xc;
}

/* Try each listener that may have a client once, starting after the last
 * one that gave a client. A listener that has none is not tried again
 * until epoll reports it readable: an accept4 that fails costs as much as
 * one that succeeds. */
static nw_xs_conn *accept_ready(pTHX_ nw_xs_acceptor *a)
{
    for (int i = 0; i < a->count; i++) {
        int idx = (a->next + i) % a->count;
        if (!(a->listener_ready & ((uint64_t)1 << idx)))
            continue;
        nw_listener *l = &a->listeners[idx];
        struct sockaddr_storage peer;
        unsigned plen = sizeof peer;
        int fd = nw_io_accept(l->fd, l->is_tcp, (struct sockaddr *)&peer, &plen);
        if (fd >= 0) {
            a->next = idx + 1;
            return conn_wrap(aTHX_ a, idx, fd, &peer, plen);
        }
        a->listener_ready &= ~((uint64_t)1 << idx);
    }
    return NULL;
}

/* A connection the manager hands over (SERVE): the bytes it read become
 * the start of our buffer, its request count carries on. */
static nw_xs_conn *conn_from_frame(pTHX_ nw_xs_acceptor *a, const nw_frame *f, int fd)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (f->type != NW_FRAME_SERVE || f->listener >= a->count) {
        close(fd);
        return NULL;
    }
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
        plen = 0;   /* (the socket is non-blocking already: that flag travels with it) */
    nw_xs_conn *xc = conn_wrap(aTHX_ a, f->listener, fd, &peer, plen);
    if (!xc)
        return NULL;
    if (nw_buf_append(&xc->c->in, a->frame_data, f->data_len) < 0) {
        xc->c->fd = -1;
        close(fd);
    }
    xc->c->requests = f->requests;
    return xc;
}

/* The next connection on the shared to-workers queue, if any: whichever
 * free worker looks first gets it. */
static nw_xs_conn *take_served(pTHX_ nw_xs_acceptor *a)
{
    while (a->from_manager >= 0 && a->queue_ready) {
        nw_frame f;
        int fd;
        int r = nw_frame_recv(a->from_manager, &f, a->frame_data, NW_FRAME_MAX_DATA, &fd);
        if (r <= 0) {
            a->queue_ready = 0;  /* nothing waiting (another worker took it), or a bad frame */
            return NULL;
        }
        if (fd < 0)
            continue;
        nw_xs_conn *xc = conn_from_frame(aTHX_ a, &f, fd);
        if (xc)
            return xc;
    }
    return NULL;
}

/* The listeners and the to-workers queue take turns, so that connections
 * circulating through the manager cannot starve new ones in the listen
 * queue, nor the other way round. */
static nw_xs_conn *take_next(pTHX_ nw_xs_acceptor *a)
{
    nw_xs_conn *xc;
    if (a->took_served) {
        if ((xc = accept_ready(aTHX_ a)))
            a->took_served = 0;
        else if ((xc = take_served(aTHX_ a)))
            a->took_served = 1;
    } else {
        if ((xc = take_served(aTHX_ a)))
            a->took_served = 1;
        else if ((xc = accept_ready(aTHX_ a)))
            a->took_served = 0;
    }
    return xc;
}

/* Parking (src/nw_park.c): a connection whose next request is not there
 * yet stays in this worker's epoll set for up to park_ms, so the worker
 * serves whatever is ready meanwhile (another parked connection, the
 * to-workers queue, a new client) instead of paying a hand-off per request.
 * Past park_ms it goes to the manager, which holds idle connections for as
 * long as they like. The set holds a reference to each Narwhal::Conn. */
static nw_xs_conn *xs_conn_of(SV *sv)
{
    dTHX;
    return INT2PTR(nw_xs_conn *, SvIV(SvRV(sv)));
}

/* Take a connection out of this worker's epoll set before it leaves the
 * worker: the registration is keyed by (file, fd) and the file lives on in
 * the manager, so a stale one would refuse the same connection if it came
 * back under the same fd number. */
static void unwatch(nw_xs_acceptor *a, nw_xs_conn *xc)
{
    if (xc->watch.registered && xc->c->fd >= 0)
        epoll_ctl(a->epfd, EPOLL_CTL_DEL, xc->c->fd, NULL);
    xc->watch.registered = 0;
}

/* Hand a connection to the manager, waiting up to wait_ms for room in the
 * queue. Returns 0, or -1 (still ours). */
static int hand_off(nw_xs_acceptor *a, nw_xs_conn *xc, int wait_ms)
{
    if (a->to_manager < 0 || xc->c->fd < 0)
        return -1;
    unwatch(a, xc);
    return nw_conn_handoff_patiently(xc->c, a->to_manager, wait_ms);
}

/* The park watcher (a thread; see "Fairness and slow apps" in
 * docs/DESIGN.md). It never calls Perl: it reads the connection objects'
 * C side only, and leaves their Perl side to the main thread. */

/* Hand every parked connection to the manager, without waiting for room
 * in its queue. Returns 0; -1 when the queue was full (the rest stay
 * parked: none is closed here, readable ones hold a request; try again
 * soon); -2 on another error (the manager is gone: leave them). */
static int evict_parked(nw_xs_acceptor *a)
{
    SV *sv;
    nw_msec now = nw_now_ms();
    while ((sv = (SV *)nw_park_take_expired(&a->park, now, 1))) {
        nw_xs_conn *xc = INT2PTR(nw_xs_conn *, SvIVX(SvRV(sv)));
        xc->watch.registered = 0;     /* it left the epoll set */
        if (xc->c->fd >= 0 && nw_conn_handoff(xc->c, a->to_manager) < 0) {
            int full = errno == EAGAIN || errno == EWOULDBLOCK;
            if (nw_park_add(&a->park, xc->c->fd, sv, now + a->park_ms, 0, &xc->watch) < 0) {
                close(xc->c->fd);     /* cannot be watched any more */
                xc->c->fd = -1;
                a->evicted[a->nevicted++] = sv;
            }
            return full ? -1 : -2;
        }
        a->evicted[a->nevicted++] = sv;
    }
    return 0;
}

/* Wait on park_wake until the monotonic millisecond `until`. */
static void watcher_sleep(nw_xs_acceptor *a, nw_msec until)
{
    struct timespec ts = { (time_t)(until / 1000), (long)(until % 1000) * 1000000L };
    pthread_cond_timedwait(&a->park_wake, &a->park_lock, &ts);
}

static void *park_watcher(void *arg)
{
    nw_xs_acceptor *a = arg;
    pthread_mutex_lock(&a->park_lock);
    while (!a->watcher_quit) {
        if (a->park.count == 0) {
            a->watcher_idle = 1;
            pthread_cond_wait(&a->park_wake, &a->park_lock);
            a->watcher_idle = 0;
            continue;
        }
        nw_msec now = nw_now_ms();
        int r;
        if (!a->out_since || a->out_since == a->evict_gave_up)
            watcher_sleep(a, now + NW_PARK_SLOW_REQUEST_MS);
        else if (now - a->out_since < NW_PARK_SLOW_REQUEST_MS)
            watcher_sleep(a, a->out_since + NW_PARK_SLOW_REQUEST_MS);
        else if ((r = evict_parked(a)) == -1)
            watcher_sleep(a, now + NW_PARK_EVICT_RETRY_MS);
        else if (r == -2)
            a->evict_gave_up = a->out_since;
    }
    pthread_mutex_unlock(&a->park_lock);
    return NULL;
}

static nw_xs_acceptor *watched_acceptor;   /* this process's, for fork */

/* A fork by the app: the parked set must not be half-way through an
 * eviction, so the lock is taken around it (unless the main thread holds
 * it already). The child has no watcher thread: it starts afresh, without. */
static void watcher_before_fork(void)
{
    nw_xs_acceptor *a = watched_acceptor;
    if (a && a->has_watcher && !a->main_holds) {
        pthread_mutex_lock(&a->park_lock);
        a->fork_locked = 1;
    }
}

static void watcher_after_fork_parent(void)
{
    nw_xs_acceptor *a = watched_acceptor;
    if (a && a->fork_locked) {
        a->fork_locked = 0;
        pthread_mutex_unlock(&a->park_lock);
    }
}

static void watcher_after_fork_child(void)
{
    nw_xs_acceptor *a = watched_acceptor;
    if (a && a->has_watcher) {
        a->has_watcher = 0;
        a->fork_locked = 0;
        a->main_holds = 0;
        pthread_mutex_init(&a->park_lock, NULL);
        pthread_cond_init(&a->park_wake, NULL);
    }
    watched_acceptor = NULL;
}

/* Start the watcher with every signal blocked in it, so that Perl's
 * handlers run only in the main thread. */
static void watcher_start(nw_xs_acceptor *a)
{
    static int atfork_done;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->park_wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&a->park_lock, NULL);
    pthread_mutex_lock(&a->park_lock);          /* the main thread is inside */
    a->main_holds = 1;
    if (!atfork_done && pthread_atfork(watcher_before_fork, watcher_after_fork_parent,
                                       watcher_after_fork_child) == 0)
        atfork_done = 1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    a->has_watcher = atfork_done && pthread_create(&a->watcher, NULL, park_watcher, a) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (a->has_watcher)
        watched_acceptor = a;
    else
        pthread_mutex_unlock(&a->park_lock);
}

static void watcher_stop(nw_xs_acceptor *a)
{
    if (!a->has_watcher)
        return;
    a->watcher_quit = 1;
    pthread_cond_signal(&a->park_wake);
    a->main_holds = 0;
    pthread_mutex_unlock(&a->park_lock);
    pthread_join(a->watcher, NULL);
    a->has_watcher = 0;
    watched_acceptor = NULL;
}

static void acceptor_leave(nw_xs_acceptor *a)
{
    if (!a->has_watcher || !a->main_holds)
        return;
    a->out_since = nw_now_ms();
    if (a->watcher_idle && a->park.count)
        pthread_cond_signal(&a->park_wake);
    a->main_holds = 0;
    pthread_mutex_unlock(&a->park_lock);
}

static void acceptor_leave_on_unwind(pTHX_ void *a)
{
    acceptor_leave((nw_xs_acceptor *)a);
}

/* Every Narwhal::Acceptor method that touches the parked set runs inside
 * ACCEPTOR_SCOPE ... ACCEPTOR_SCOPE_END: the lock is released when the
 * scope ends, also when Perl code run inside (a DESTROY, freeing a
 * connection) leaves it by die or exit. */
static void acceptor_enter(pTHX_ nw_xs_acceptor *a)
{
    if (!a->has_watcher)
        return;
    pthread_mutex_lock(&a->park_lock);
    a->main_holds = 1;
    a->out_since = 0;
    SAVEDESTRUCTOR_X(acceptor_leave_on_unwind, a);
    while (a->nevicted > 0)
        SvREFCNT_dec(a->evicted[--a->nevicted]);   /* its socket went to the manager */
}

#define ACCEPTOR_SCOPE(a) ENTER; acceptor_enter(aTHX_ (a))
#define ACCEPTOR_SCOPE_END LEAVE

/* Stop the park watcher before Perl's global destruction frees the
 * connection objects it reads (called from an END block). */
static void acceptor_stop_watcher(pTHX_ nw_xs_acceptor *a)
{
    if (!a || !a->has_watcher)
        return;
    ACCEPTOR_SCOPE(a);
    watcher_stop(a);
    ACCEPTOR_SCOPE_END;
}

/* Hand the parked connections whose time is up (all, with everything) to
 * the manager. If the manager does not take one within the patience, the
 * rest of this round are not waited for: they are closed (a parked
 * connection has nothing unread, so a plain close is a clean FIN). */
static void park_expire(pTHX_ nw_xs_acceptor *a, nw_msec now, int everything)
{
    SV *sv;
    int patience = NW_HANDOFF_PATIENCE_MS;
    while ((sv = nw_park_take_expired(&a->park, now, everything))) {
        nw_xs_conn *xc = xs_conn_of(sv);
        xc->watch.registered = 0;  /* nw_park_take_expired took it out of epoll */
        if (xc->c->fd >= 0 && hand_off(a, xc, patience) < 0)
            patience = 0;    /* SvREFCNT_dec below closes it */
        SvREFCNT_dec(sv);
    }
}

/* Wait up to timeout_ms for events and note which parked connections
 * became readable. Returns how many events were work for this worker (a
 * listener, the queue, a parked connection now readable; not an event for
 * a connection away being served), or -1 with errno. */
static int poll_events(nw_xs_acceptor *a, int timeout_ms)
{
    struct epoll_event ev[EVENTS_MAX];
    int n = epoll_wait(a->epfd, ev, EVENTS_MAX, timeout_ms);
    int ready_before = a->park.ready_count, sources = 0;
    for (int k = 0; k < n; k++) {
        uint64_t data = ev[k].data.u64;
        if (data < MAX_LISTENERS) {
            a->listener_ready |= (uint64_t)1 << data;
            sources++;
        } else if (data == FROM_MANAGER_EVENT) {
            a->queue_ready = 1;
            sources++;
        } else {
            nw_park_event(&a->park, data, ev[k].events);
        }
    }
    a->last_poll = nw_now_ms();
    return n < 0 ? -1 : sources + (a->park.ready_count - ready_before);
}

/* Whether a listener or the to-workers queue may have something. */
static int sources_ready(const nw_xs_acceptor *a)
{
    return a->listener_ready || a->queue_ready;
}

/* Close every parked connection the way a stopping server should: a FIN to
 * all at once, then read and drop what they still send until each closes
 * too or NW_PARK_CLOSE_LINGER_MS passes, so that none is reset. Waits with
 * poll on the parked fds alone: the epoll set also holds listeners whose
 * fds may be closed already and that would keep reporting readiness. */
static void park_close_all(pTHX_ nw_xs_acceptor *a)
{
    nw_msec until = nw_now_ms() + NW_PARK_CLOSE_LINGER_MS, now;
    SV *held[NW_MAX_PARKED], *sv;
    struct pollfd pf[NW_MAX_PARKED];
    int n = 0;
    while ((sv = nw_park_take_expired(&a->park, 0, 1))) {
        nw_xs_conn *xc = xs_conn_of(sv);
        xc->watch.registered = 0;
        if (xc->c->fd < 0) {
            SvREFCNT_dec(sv);
            continue;
        }
        shutdown(xc->c->fd, SHUT_WR);
        pf[n].fd = xc->c->fd;
        pf[n].events = POLLIN;
        held[n++] = sv;
    }
    int open_count = n;
    while (open_count > 0 && (now = nw_now_ms()) < until) {
        if (poll(pf, (nfds_t)n, (int)(until - now)) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (pf[k].fd < 0 || !pf[k].revents)
                continue;
            char drop[4096];
            ssize_t r = read(pf[k].fd, drop, sizeof drop);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                pf[k].fd = -1;          /* poll skips it from now on */
                open_count--;
            }
        }
    }
    for (int k = 0; k < n; k++)
        SvREFCNT_dec(held[k]);          /* closes the socket */
}

/* Park conn_sv's connection. Returns 1 when parked, 0 when the caller
 * should hand it off instead (parking paused or full, or bytes of the next
 * request already read). A request that took NW_PARK_SLOW_REQUEST_MS or
 * more pauses parking: with a slow app, a connection parked here could
 * wait behind this worker's next slow request while another worker is free. */
static int park(pTHX_ nw_xs_acceptor *a, SV *conn_sv, nw_xs_conn *xc)
{
    nw_msec now = nw_now_ms();
    if (xc->started && now - xc->started >= NW_PARK_SLOW_REQUEST_MS)
        a->no_park_until = now + NW_PARK_PAUSE_MS;
    xc->started = 0;
    if (a->park_ms <= 0 || now < a->no_park_until || xc->c->in.len > 0 || xc->c->fd < 0)
        return 0;
    SV *sv = newSVsv(conn_sv);
    /* Not drained if psgix.io may have read from the socket behind our
     * back, or if a FIN came with the last bytes (it raised no edge of
     * its own): then the watch is re-armed, which reports it. */
    int drained = xc->c->drained && !xc->peer_closed && !xc->io;
    if (nw_park_add(&a->park, xc->c->fd, sv, now + a->park_ms, drained, &xc->watch) < 0) {
        SvREFCNT_dec(sv);
        return 0;
    }
    return 1;
}

/* A readable parked connection, or NULL. */
static SV *take_parked(nw_xs_acceptor *a)
{
    int hangup;
    SV *sv = (SV *)nw_park_take_ready(&a->park, &hangup);
    if (sv && hangup)
        xs_conn_of(sv)->peer_closed = 1;
    return sv;
}

static SV *conn_sv(pTHX_ nw_xs_conn *xc)
{
    SV *sv = newSV(0);
    sv_setref_pv(sv, "Narwhal::Conn", (void *)xc);
    return sv;
}

/* The next connection to serve: parked ones that are readable take turns
 * with the rest (the to-workers queue and the listeners). */
static SV *next_ready(pTHX_ nw_xs_acceptor *a)
{
    nw_xs_conn *xc;
    if (a->park.ready_count && !a->took_parked) {
        a->took_parked = 1;
        return take_parked(a);
    }
    /* The listeners' and the queue's turn, but epoll has not reported
     * them lately: ask it again (one call for all of them), at most once
     * per millisecond while parked connections keep the worker busy. */
    if (!sources_ready(a) && a->park.ready_count && nw_now_ms() != a->last_poll)
        poll_events(a, 0);
    if ((xc = take_next(aTHX_ a))) {
        a->took_parked = 0;
        return conn_sv(aTHX_ xc);
    }
    a->took_parked = 1;
    return take_parked(a);
}

/* "Content-Type" -> CONTENT_TYPE, others -> HTTP_UPPER_NAME. */
static size_t env_key_for(const nw_header *h, char *out)
{
    static const char http[] = "HTTP_";
    size_t n = 0;
    int bare = (h->name_len == 12 && nw_header_is(h, "content-type", 12))
               || (h->name_len == 14 && nw_header_is(h, "content-length", 14));
    if (!bare) {
        memcpy(out, http, 5);
        n = 5;
    }
    for (size_t i = 0; i < h->name_len; i++) {
        char ch = h->name[i];
        out[n++] = ch == '-' ? '_' : toUPPER(ch);
    }
    return n;
}

/* The request's headers into $env. In a spare $env, an entry left from the
 * last request (stale) takes this request's value, or goes. */
static void env_headers(pTHX_ HV *env, const nw_request *req, env_recycler *stale)
{
    char small[256];
    for (size_t i = 0; i < req->num_headers; i++) {
        const nw_header *h = &req->headers[i];
        char *key = h->name_len + 5 <= sizeof small ? small : NULL;
        if (!key)
            Newx(key, h->name_len + 5, char);
        size_t klen = env_key_for(h, key);
        /* last request's entry for this header, found by its
         * key's bytes (what hv_fetch would find: keys are unique and the
         * stale ones are plain byte keys), saving the hash and lookup */
        int s = stale ? stale->nstale - 1 : -1;
        while (s >= 0 && !(HeKLEN(stale->stale[s]) == (I32)klen
                           && memEQ(HeKEY(stale->stale[s]), key, klen)))
            s--;
        SV **old = s >= 0 ? &HeVAL(stale->stale[s]) : hv_fetch(env, key, (I32)klen, 0);
        if (s >= 0) {
            env_set(aTHX_ *old, h->value, h->value_len);
            stale->stale[s] = stale->stale[--stale->nstale];
        } else if (old) {
            sv_catpvs(*old, ", ");
            sv_catpvn(*old, h->value, h->value_len);
        } else {
            (void)hv_store(env, key, (I32)klen, newSVpvn(h->value, h->value_len), 0);
        }
        if (key != small)
            Safefree(key);
    }
    if (stale) {
        while (stale->nstale > 0)
            env_delete_entry(aTHX_ env, stale->stale[--stale->nstale]);
    }
}

/* A unix socket has no name or port of its own: take them from Host. */
static void env_server_from_host(pTHX_ HV *env, const nw_request *r)
{
    for (size_t i = 0; i < r->num_headers; i++) {
        const nw_header *h = &r->headers[i];
        if (h->name_len != 4 || !nw_header_is(h, "host", 4) || h->value_len == 0)
            continue;
        const char *v = h->value, *end = v + h->value_len, *colon = NULL;
        const char *name_end = end;
        if (*v == '[') {
            const char *close = memchr(v, ']', h->value_len);
            if (close && close + 1 < end && close[1] == ':')
                colon = close + 1;
            if (close)
                name_end = close + 1;
        } else {
            colon = memchr(v, ':', h->value_len);
        }
        if (colon) {
            name_end = colon;
            (void)hv_stores(env, "SERVER_PORT", newSVpvn(colon + 1, (STRLEN)(end - colon - 1)));
        }
        (void)hv_stores(env, "SERVER_NAME", newSVpvn(v, (STRLEN)(name_end - v)));
        return;
    }
}

/* The per-request values, written into the spare $env's own scalars. */
static HV *env_from_spare(pTHX_ nw_xs_conn *xc, SV *self_rv)
{
    env_recycler *rec = xc->env;
    HV *env = rec->spare;
    if (!env)
        return NULL;
    rec->spare = NULL;
    if (SvREFCNT(env) != 1) {       /* somebody took hold of it after all */
        rec->nstale = 0;
        SvREFCNT_dec((SV *)env);
        return NULL;
    }
    const nw_request *r = &xc->c->req;
    SV **f = rec->fixed_sv;
    env_set(aTHX_ f[K_REQUEST_METHOD], r->method, r->method_len);
    env_set(aTHX_ f[K_REQUEST_URI], r->target, r->target_len);
    char *path = env_bytes(aTHX_ f[K_PATH_INFO], r->path_len);
    size_t path_len = nw_percent_decode(r->path, r->path_len, path);
    path[path_len] = '\0';
    SvCUR_set(f[K_PATH_INFO], path_len);
    env_set(aTHX_ f[K_QUERY_STRING], r->query ? r->query : "", r->query ? r->query_len : 0);
    env_set(aTHX_ f[K_SERVER_PROTOCOL], r->minor_version ? "HTTP/1.1" : "HTTP/1.0", 8);
    /* usually the same connection as last time: no copy */
    if (!env_same_value(aTHX_ f[K_REMOTE_ADDR], xc->remote_addr))
        sv_setsv(f[K_REMOTE_ADDR], xc->remote_addr);
    if (!env_same_value(aTHX_ f[K_REMOTE_PORT], xc->remote_port))
        sv_setsv(f[K_REMOTE_PORT], xc->remote_port);
    SV *handlers = f[K_CLEANUP_HANDLERS];
    if (!SvROK(handlers) || SvTYPE(SvRV(handlers)) != SVt_PVAV) {
        SV *rv = newRV_noinc((SV *)newAV());
        sv_setsv(handlers, rv);
        SvREFCNT_dec(rv);
    }
    env_lazy_io_again(aTHX_ f[K_PSGIX_IO], self_rv);
    return env;
}

static HV *env_fresh(pTHX_ nw_xs_conn *xc, SV *self_rv)
{
    const nw_request *r = &xc->c->req;
    HV *env = newHVhv(xc->env->template);
    env_put(aTHX_ env, K_REQUEST_METHOD, newSVpvn(r->method, r->method_len));
    env_put(aTHX_ env, K_REQUEST_URI, newSVpvn(r->target, r->target_len));
    SV *path = newSV(r->path_len + 1);
    SvPOK_on(path);
    SvCUR_set(path, nw_percent_decode(r->path, r->path_len, SvPVX(path)));
    *SvEND(path) = '\0';
    env_put(aTHX_ env, K_PATH_INFO, path);
    env_put(aTHX_ env, K_QUERY_STRING,
            r->query ? newSVpvn(r->query, r->query_len) : newSVpvs(""));
    env_put(aTHX_ env, K_SERVER_PROTOCOL,
            r->minor_version ? newSVpvs("HTTP/1.1") : newSVpvs("HTTP/1.0"));
    env_put(aTHX_ env, K_REMOTE_ADDR, newSVsv(xc->remote_addr));
    env_put(aTHX_ env, K_REMOTE_PORT, newSVsv(xc->remote_port));
    env_put(aTHX_ env, K_CLEANUP_HANDLERS, newRV_noinc((SV *)newAV()));
    env_put(aTHX_ env, K_PSGIX_IO, env_lazy_io(aTHX_ self_rv));
    return env;
}

static HV *build_env(pTHX_ nw_xs_conn *xc, SV *self_rv)
{
    HV *env = env_from_spare(aTHX_ xc, self_rv);
    env_recycler *stale = env ? xc->env : NULL;
    if (!env)
        env = env_fresh(aTHX_ xc, self_rv);
    env_headers(aTHX_ env, &xc->c->req, stale);
    if (!xc->c->is_tcp)
        env_server_from_host(aTHX_ env, &xc->c->req);
    return env;
}

/* psgi.input for a body held in memory: a Narwhal::Input [buffer, pos]. */
static SV *input_object(pTHX_ nw_conn *c)
{
    AV *obj = newAV();
    av_push(obj, newSVpvn(c->body.data ? c->body.data : "", c->body.len));
    av_push(obj, newSViv(0));
    return sv_bless(newRV_noinc((SV *)obj), input_stash);
}

static void env_body(pTHX_ HV *env, nw_conn *c)
{
    if (c->framing.body == NW_BODY_CHUNKED) {
        (void)hv_delete(env, keys[K_HTTP_TRANSFER_ENCODING].name,
                        keys[K_HTTP_TRANSFER_ENCODING].len, G_DISCARD);
        env_put(aTHX_ env, K_CONTENT_LENGTH, newSVuv(c->body_len));
    }
    if (c->body_fd >= 0)
        env_put(aTHX_ env, K_PSGI_INPUT, newSV(0));   /* Perl opens the temp file */
    else if (c->body_len > 0)
        env_put(aTHX_ env, K_PSGI_INPUT, input_object(aTHX_ c));
}

/* Copy the app's header pairs into the head. Returns -1 when invalid. */
static int head_from_av(pTHX_ nw_conn *c, AV *headers, nw_app_headers *seen)
{
    SSize_t n = av_len(headers) + 1;
    if (n % 2)
        return -1;
    for (SSize_t i = 0; i < n; i += 2) {
        SV **k = av_fetch(headers, i, 0), **v = av_fetch(headers, i + 1, 0);
        if (!k || !v || !SvOK(*k))
            return -1;
        STRLEN kl, vl;
        const char *kp = SvPV(*k, kl);
        const char *vp = SvOK(*v) ? SvPV(*v, vl) : (vl = 0, "");
        if (nw_head_app_header(&c->out, seen, kp, kl, vp, vl) < 0)
            return -1;
    }
    return 0;
}

static int start_head(pTHX_ nw_conn *c, int status, SV *headers_rv,
                      int64_t known_length, int may_keep_alive)
{
    nw_app_headers seen;
    memset(&seen, 0, sizeof seen);
    if (status < 100 || status > 999 || !SvROK(headers_rv)
        || SvTYPE(SvRV(headers_rv)) != SVt_PVAV)
        return -1;
    c->out.len = 0;
    if (nw_head_status(&c->out, c->req.minor_version, status) < 0
        || head_from_av(aTHX_ c, (AV *)SvRV(headers_rv), &seen) < 0) {
        c->out.len = 0;
        return -1;
    }
    /* --max-keepalive-reqs is checked here rather than by the
     * worker calling Narwhal::Conn::requests before every response */
    int ka = may_keep_alive && c->framing.keep_alive
             && (c->cfg.max_keepalive_reqs <= 0 || c->requests < c->cfg.max_keepalive_reqs);
    int f = nw_head_finish(&c->out, &seen, c->req.minor_version, status,
                           c->is_head_method, known_length, &ka);
    if (f < 0) {
        c->out.len = 0;
        return -1;
    }
    nw_conn_head_ready(c, f, seen.has_content_length ? seen.content_length
                                                     : known_length, ka);
    return f;
}

/* Gather an array body into iovecs; returns the count, total via *total. */
static int pieces_from_av(pTHX_ AV *body, struct iovec *v, int64_t *total)
{
    SSize_t n = av_len(body) + 1;
    int k = 0;
    *total = 0;
    for (SSize_t i = 0; i < n; i++) {
        SV **e = av_fetch(body, i, 0);
        if (!e || !SvOK(*e))
            continue;
        STRLEN len;
        const char *p = SvPV(*e, len);
        if (len == 0)
            continue;
        v[k].iov_base = (void *)p;
        v[k].iov_len = len;
        *total += (int64_t)len;
        k++;
    }
    return k;
}

/* An array body's response in one writev: head, then the pieces. */
static int write_array_response(pTHX_ nw_xs_conn *self, int status, SV *headers, AV *body,
                                int may_keep_alive)
{
    struct iovec small[SMALL_PIECES], *v = small;
    SSize_t n = av_len(body) + 1;
    int64_t total;
    int ret = -1;
    if (n > SMALL_PIECES)
        Newx(v, n, struct iovec);
    int k = pieces_from_av(aTHX_ body, v, &total);
    if (start_head(aTHX_ self->c, status, headers, total, may_keep_alive) >= 0) {
        nw_conn_write_body(self->c, v, k);
        ret = nw_conn_end_body(self->c);
    }
    if (v != small)
        Safefree(v);
    return ret;
}

/* Whether the end of a request must go through the worker's
 * _after_response (cleanup handlers, psgix.harakiri.commit), or might: 1
 * unless env is a plain hash whose handlers are a plain empty array (or
 * not an array) and which has no psgix.harakiri.commit. Anything unusual
 * (tied, locked, magical values) answers 1, and the worker then decides
 * in Perl, inside its eval, as it always did. */
static int env_needs_after(pTHX_ SV *env_rv)
{
    if (!SvROK(env_rv) || SvTYPE(SvRV(env_rv)) != SVt_PVHV)
        return 1;
    HV *env = (HV *)SvRV(env_rv);
    if (SvMAGICAL(env) || SvREADONLY(env))
        return 1;
    if (hv_common(env, NULL, keys[K_HARAKIRI_COMMIT].name, (STRLEN)keys[K_HARAKIRI_COMMIT].len,
                  0, HV_FETCH_ISEXISTS, NULL, keys[K_HARAKIRI_COMMIT].hash))
        return 1;
    SV **h = (SV **)hv_common(env, NULL, keys[K_CLEANUP_HANDLERS].name,
                              (STRLEN)keys[K_CLEANUP_HANDLERS].len, 0, HV_FETCH_JUST_SV, NULL,
                              keys[K_CLEANUP_HANDLERS].hash);
    if (!h)
        return 0;
    SV *hv = *h;
    if (SvMAGICAL(hv))
        return 1;
    if (!SvROK(hv))
        return 0;
    AV *av = (AV *)SvRV(hv);
    if (SvTYPE(av) != SVt_PVAV || SvOBJECT(av))
        return 0;                   /* ref $h ne 'ARRAY' */
    return SvMAGICAL(av) || AvFILLp(av) >= 0;
}

MODULE = Narwhal    PACKAGE = Narwhal::Acceptor

PROTOTYPES: DISABLE

nw_xs_acceptor *
new(class, listeners, config, from_manager = -1, to_manager = -1)
    const char *class
    AV *listeners
    HV *config
    int from_manager
    int to_manager
  CODE:
    PERL_UNUSED_VAR(class);
    SSize_t n = av_len(listeners) + 1;
    if (n < 1 || n > MAX_LISTENERS - 1)
        croak("Narwhal::Acceptor needs 1 to %d listeners", MAX_LISTENERS);
    Newxz(RETVAL, 1, nw_xs_acceptor);
    config_from_hash(aTHX_ config, &RETVAL->cfg);
    RETVAL->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (RETVAL->epfd < 0)
        croak("epoll_create1: %s", strerror(errno));
    for (SSize_t i = 0; i < n; i++) {
        SV **e = av_fetch(listeners, i, 0);
        if (!e || !SvROK(*e) || SvTYPE(SvRV(*e)) != SVt_PVHV)
            croak("listener %d is not a hash", (int)i);
        HV *l = (HV *)SvRV(*e);
        SV **fd = hv_fetchs(l, "fd", 0), **tcp = hv_fetchs(l, "is_tcp", 0),
           **env = hv_fetchs(l, "env", 0);
        if (!fd || !env || !SvROK(*env) || SvTYPE(SvRV(*env)) != SVt_PVHV)
            croak("listener %d needs fd and env", (int)i);
        nw_listener *nl = &RETVAL->listeners[i];
        nl->fd = (int)SvIV(*fd);
        nl->is_tcp = tcp && SvTRUE(*tcp);
        nl->env = env_recycler_new(aTHX_ (HV *)SvRV(*env));
        nw_io_set_nonblocking(nl->fd);
        struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
                                  .data.u64 = (uint64_t)i };
        if (epoll_ctl(RETVAL->epfd, EPOLL_CTL_ADD, nl->fd, &ev) < 0)
            croak("epoll_ctl: %s", strerror(errno));
        RETVAL->count++;
    }
    RETVAL->listener_ready = n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;   /* not tried yet */
    RETVAL->queue_ready = 1;
    RETVAL->from_manager = from_manager;
    RETVAL->to_manager = to_manager;
    nw_park_init(&RETVAL->park, RETVAL->epfd, PARKED_EVENT);
    RETVAL->park_ms = (nw_msec)(hv_num(aTHX_ config, "keepalive_wait", 0) * 1000 + 0.5);
    if (from_manager >= 0) {
        Newx(RETVAL->frame_data, NW_FRAME_MAX_DATA, char);
        struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
                                  .data.u64 = FROM_MANAGER_EVENT };
        if (epoll_ctl(RETVAL->epfd, EPOLL_CTL_ADD, from_manager, &ev) < 0)
            croak("epoll_ctl: %s", strerror(errno));
    }
    if (to_manager >= 0 && RETVAL->park_ms > 0) {
        watcher_start(RETVAL);
        acceptor_leave(RETVAL);
    }
  OUTPUT:
    RETVAL

SV *
accept(self, timeout)
    nw_xs_acceptor *self
    double timeout
  CODE:
    ACCEPTOR_SCOPE(self);
    nw_msec now = nw_now_ms(), until = now + (nw_msec)(timeout * 1000);
    SV *got = NULL;
    if (self->park.count) {
        park_expire(aTHX_ self, now, 0);    /* even when there is work to do */
        if (!self->park.ready_count && sources_ready(self))
            poll_events(self, 0);    /* so that parked connections get their turn */
    }
    while (!(got = next_ready(aTHX_ self))) {
        park_expire(aTHX_ self, now, 0);
        nw_msec nearest = nw_park_nearest(&self->park);
        if (now >= until)
            break;
        nw_msec wake = nearest && nearest < until ? nearest : until;
        if (poll_events(self, (int)(wake - now)) < 0 && errno == EINTR)
            break;          /* a signal: let the worker look at its flags */
        now = nw_now_ms();
    }
    RETVAL = got ? got : &PL_sv_undef;
    ACCEPTOR_SCOPE_END;
  OUTPUT:
    RETVAL

int
park(self, conn)
    nw_xs_acceptor *self
    SV *conn
  CODE:
    nw_xs_conn *xc = INT2PTR(nw_xs_conn *, SvIV(SvRV(conn)));
    ACCEPTOR_SCOPE(self);
    RETVAL = park(aTHX_ self, conn, xc) || hand_off(self, xc, NW_HANDOFF_PATIENCE_MS) == 0;
    ACCEPTOR_SCOPE_END;
  OUTPUT:
    RETVAL

void
release_parked(self, to_manager)
    nw_xs_acceptor *self
    int to_manager
  CODE:
    ACCEPTOR_SCOPE(self);
    if (to_manager)
        park_expire(aTHX_ self, nw_now_ms(), 1);
    else
        park_close_all(aTHX_ self);
    ACCEPTOR_SCOPE_END;

int
park_idle(self, conn)
    nw_xs_acceptor *self
    SV *conn
  CODE:
    /* After a response: unless bytes of the next request are here already,
     * park the connection (or hand it off) without first trying a read
     * that, with a client waiting for the response, would find nothing. */
    nw_xs_conn *xc = INT2PTR(nw_xs_conn *, SvIV(SvRV(conn)));
    ACCEPTOR_SCOPE(self);
    RETVAL = xc->c->in.len == 0
        && (park(aTHX_ self, conn, xc) || hand_off(self, xc, NW_HANDOFF_PATIENCE_MS) == 0);
    ACCEPTOR_SCOPE_END;
  OUTPUT:
    RETVAL

int
handoff(self, conn)
    nw_xs_acceptor *self
    nw_xs_conn *conn
  CODE:
    ACCEPTOR_SCOPE(self);
    RETVAL = hand_off(self, conn, NW_HANDOFF_PATIENCE_MS) == 0;
    ACCEPTOR_SCOPE_END;
  OUTPUT:
    RETVAL

void
stop_park_watcher()
  CODE:
    /* From an END block: before global destruction frees what it reads. */
    acceptor_stop_watcher(aTHX_ watched_acceptor);

int
has_manager(self)
    nw_xs_acceptor *self
  CODE:
    RETVAL = self->from_manager >= 0 && self->to_manager >= 0;
  OUTPUT:
    RETVAL

int
others_waiting(self)
    nw_xs_acceptor *self
  CODE:
    /* through poll_events, which notes the parked connections' events
     * (they would be lost otherwise) and does not count this
     * connection's own */
    ACCEPTOR_SCOPE(self);
    RETVAL = self->park.ready_count || poll_events(self, 0) > 0;
    ACCEPTOR_SCOPE_END;
  OUTPUT:
    RETVAL

void
DESTROY(self)
    nw_xs_acceptor *self
  CODE:
    ACCEPTOR_SCOPE(self);
    watcher_stop(self);
    ACCEPTOR_SCOPE_END;
    for (int i = 0; i < self->count; i++)
        env_recycler_unref(aTHX_ self->listeners[i].env);
    SV *sv;
    while ((sv = nw_park_take_expired(&self->park, 0, 1)))
        SvREFCNT_dec(sv);
    close(self->epfd);
    Safefree(self->frame_data);
    Safefree(self);

MODULE = Narwhal    PACKAGE = Narwhal::Conn

SV *
read_request(self, tick, tick_partial = 0)
    nw_xs_conn *self
    double tick
    int tick_partial
  CODE:
    nw_conn *c = self->c;
    int r = c->fd < 0 ? NW_REQ_CLOSED : nw_conn_read_head(c, tick, tick_partial);
    if (r == NW_REQ_READY) {
        HV *env = build_env(aTHX_ self, ST(0));
        r = nw_conn_read_body(c);
        if (r == NW_REQ_READY) {
            self->started = nw_now_ms();
            env_body(aTHX_ env, c);
            RETVAL = newRV_noinc((SV *)env);
        } else {
            SvREFCNT_dec((SV *)env);
        }
    }
    if (r == NW_REQ_ERROR)
        nw_conn_send_error(c, c->error_status);
    if (r != NW_REQ_READY)
        RETVAL = newSViv(r);
  OUTPUT:
    RETVAL

int
error_status(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->error_status;
  OUTPUT:
    RETVAL

int
take_body_fd(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->body_fd;
    self->c->body_fd = -1;
  OUTPUT:
    RETVAL

int
write_response(self, status, headers, body, may_keep_alive)
    nw_xs_conn *self
    int status
    SV *headers
    AV *body
    int may_keep_alive
  CODE:
    RETVAL = write_array_response(aTHX_ self, status, headers, body, may_keep_alive);
  OUTPUT:
    RETVAL

int
write_common_response(self, res, may_keep_alive)
    nw_xs_conn *self
    SV *res
    int may_keep_alive
  CODE:
    /* The worker's common case in one call: res is
     * [status, headers, [pieces]] (plain arrays). Returns -2, having done
     * nothing, for any other shape (the worker's respond() handles it),
     * else what write_response returns. */
    AV *av, *body;
    SV **e;
    RETVAL = -2;
    if (SvROK(res) && SvTYPE(av = (AV *)SvRV(res)) == SVt_PVAV && !SvOBJECT(av)
        && !SvMAGICAL(av) && AvFILLp(av) == 2 && (e = AvARRAY(av)) && e[0] && e[1] && e[2]
        && !SvGMAGICAL(e[2]) && SvROK(e[2])
        && SvTYPE(body = (AV *)SvRV(e[2])) == SVt_PVAV && !SvOBJECT(body))
        RETVAL = write_array_response(aTHX_ self, (int)SvIV(e[0]), e[1], body, may_keep_alive);
  OUTPUT:
    RETVAL

int
start_response(self, status, headers, known_length, may_keep_alive)
    nw_xs_conn *self
    int status
    SV *headers
    double known_length
    int may_keep_alive
  CODE:
    RETVAL = start_head(aTHX_ self->c, status, headers, (int64_t)known_length,
                        may_keep_alive);
  OUTPUT:
    RETVAL

int
write_body(self, data)
    nw_xs_conn *self
    SV *data
  CODE:
    STRLEN len;
    struct iovec v;
    v.iov_base = (void *)SvPV(data, len);
    v.iov_len = len;
    RETVAL = nw_conn_write_body(self->c, &v, len ? 1 : 0) == NW_IO_OK;
  OUTPUT:
    RETVAL

int
send_file(self, fd, offset, len)
    nw_xs_conn *self
    int fd
    double offset
    double len
  CODE:
    RETVAL = nw_conn_send_file(self->c, fd, (off_t)offset, (size_t)len) == NW_IO_OK;
  OUTPUT:
    RETVAL

int
end_body(self)
    nw_xs_conn *self
  CODE:
    RETVAL = nw_conn_end_body(self->c);
  OUTPUT:
    RETVAL

int
informational(self, status, headers)
    nw_xs_conn *self
    int status
    SV *headers
  CODE:
    nw_conn *c = self->c;
    nw_app_headers seen;
    memset(&seen, 0, sizeof seen);
    RETVAL = 0;
    if (status >= 100 && status < 200 && c->req.minor_version >= 1
        && SvROK(headers) && SvTYPE(SvRV(headers)) == SVt_PVAV) {
        nw_buf b = { 0 };
        if (nw_head_status(&b, 1, status) == 0
            && head_from_av(aTHX_ c, (AV *)SvRV(headers), &seen) == 0) {
            /* head_from_av wrote into c->out; move it after the status line */
            nw_buf_append(&b, c->out.data, c->out.len);
            nw_buf_append(&b, "\r\n", 2);
            RETVAL = nw_conn_send_raw(c, b.data, b.len) == NW_IO_OK;
        }
        c->out.len = 0;
        nw_buf_free(&b);
    }
  OUTPUT:
    RETVAL

void
finish_request(self, env = NULL)
    nw_xs_conn *self
    SV *env
  CODE:
    nw_conn_finish_request(self->c);
    if (env && SvROK(env) && SvTYPE(SvRV(env)) == SVt_PVHV)
        env_recycle(aTHX_ self->env, (HV *)SvRV(env));

int
needs_after(env)
    SV *env
  CODE:
    RETVAL = env_needs_after(aTHX_ env);
  OUTPUT:
    RETVAL

void
recycle_env(self, env)
    nw_xs_conn *self
    SV *env
  CODE:
    if (SvROK(env) && SvTYPE(SvRV(env)) == SVt_PVHV)
        env_recycle(aTHX_ self->env, (HV *)SvRV(env));

void
send_error(self, status)
    nw_xs_conn *self
    int status
  CODE:
    if (self->c->fd >= 0)
        nw_conn_send_error(self->c, status);

int
response_started(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->responded;
  OUTPUT:
    RETVAL

int
fd(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->fd;
  OUTPUT:
    RETVAL

int
client_keep_alive(self)
    nw_xs_conn *self
  CODE:
    RETVAL = self->c->framing.keep_alive;
  OUTPUT:
    RETVAL

void
close_gently(self)
    nw_xs_conn *self
  CODE:
    nw_conn_close_gently(self->c);

void
close(self)
    nw_xs_conn *self
  CODE:
    if (self->c->fd >= 0) {
        close(self->c->fd);
        self->c->fd = -1;
    }

void
DESTROY(self)
    nw_xs_conn *self
  CODE:
    nw_conn_destroy(self->c);
    env_recycler_unref(aTHX_ self->env);
    SvREFCNT_dec(self->remote_addr);
    SvREFCNT_dec(self->remote_port);
    SvREFCNT_dec(self->io);
    Safefree(self);

MODULE = Narwhal    PACKAGE = Narwhal::Channel

SV *
recv_stats(control)
    int control
  CODE:
    nw_frame f;
    nw_manager_stats st;
    int fd, got = 0;
    while (nw_frame_recv(control, &f, &st, sizeof st, &fd) == 1) {
        if (fd >= 0)
            close(fd);
        if (f.type == NW_FRAME_STATS && f.data_len == sizeof st)
            got = 1;
    }
    RETVAL = &PL_sv_undef;
    if (got) {
        HV *hv = newHV();
        (void)hv_stores(hv, "idle", newSVuv(st.idle));
        (void)hv_stores(hv, "queued", newSVuv(st.queued));
        (void)hv_stores(hv, "handed_off", newSVuv(st.handed_off));
        (void)hv_stores(hv, "received", newSVuv(st.received));
        (void)hv_stores(hv, "closed_timeout", newSVuv(st.closed_timeout));
        (void)hv_stores(hv, "closed_full", newSVuv(st.closed_full));
        (void)hv_stores(hv, "closed_peer", newSVuv(st.closed_peer));
        (void)hv_stores(hv, "outbox_full", newSVuv(st.outbox_full));
        RETVAL = newRV_noinc((SV *)hv);
    }
  OUTPUT:
    RETVAL

MODULE = Narwhal    PACKAGE = Narwhal

BOOT:
    for (int i = 0; i < K_COUNT; i++)
        PERL_HASH(keys[i].hash, keys[i].name, keys[i].len);
    input_stash = gv_stashpvs("Narwhal::Input", GV_ADD);
    conn_stash = gv_stashpvs("Narwhal::Conn", GV_ADD);
    acceptor_stash = gv_stashpvs("Narwhal::Acceptor", GV_ADD);
