/* The PSGI $env: built from the listener's template for each request,
 * cleaned and reused when nothing else holds it ("The $env" in
 * docs/DESIGN.md), psgix.io made on first use. Perl-aware: the only file
 * that knows how Narwhal fills a hash. */
#include "narwhal_xs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>

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

void nw_env_boot(pTHX)
{
    for (int i = 0; i < K_COUNT; i++)
        PERL_HASH(keys[i].hash, keys[i].name, keys[i].len);
    input_stash = gv_stashpvs("Narwhal::Input", GV_ADD);
}

static void env_put(pTHX_ HV *env, int k, SV *val)
{
    (void)hv_store(env, keys[k].name, keys[k].len, val, keys[k].hash);
}

#define ENV_BIG_BYTES   65536 /* a larger string buffer in $env is freed, not kept */
#define ENV_BUCKETS_MAX 256   /* a $env grown past this many buckets is not reused */

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
#define ENV_ADDED_MAX   16    /* keys an app adds that a clean remembers, to find them again */

typedef struct {
    const char *name;
    I32 len;
    U32 hash;
    SV *value;          /* the template's value; NULL for a per-request key */
    int fixed;          /* for a per-request key, its K_ index; else -1 */
    HEK *hek;           /* its shared key (held by key_holder): compared by address */
    int kind;           /* how value is compared (ENV_SAME_*), found once */
    U32 value_flags;    /* value's ENV_VALUE_FLAGS */
} env_key;

#define ENV_VALUE_FLAGS (SVf_IOK | SVf_NOK | SVf_POK | SVf_ROK | SVp_IOK | SVp_NOK \
                         | SVp_POK | SVf_UTF8 | SVf_IVisUV)

/* How a template value is compared with what a $env holds at a clean: the
 * common kinds with the fewest tests, the rest by env_same_value. */
enum { ENV_SAME_ANY, ENV_SAME_REF, ENV_SAME_STRING, ENV_SAME_BOOL, ENV_SAME_INT };

struct env_recycler {
    int refcnt;                 /* the acceptor and each connection of the listener */
    HV *template;
    SV *io_maker;               /* makes psgix.io's handle from a Narwhal::Conn */
    HV *spare;                  /* a cleaned $env for the next request, or NULL */
    HV *key_holder;             /* holds the shared keys of key[] */
    SV *fixed_sv[K_COUNT];      /* in spare: the scalar of each per-request key */
    int nkeys;
    env_key key[ENV_OWNED_MAX];
    unsigned char slot[ENV_OWNED_SLOTS];   /* index into key + 1; 0: empty */
    HE *stale[ENV_STALE_MAX];   /* in spare: last request's header entries (plain strings) */
    int nstale;
    /* The header entries the last build stored in built_for (for the
     * quick check at its clean): their addresses and hashes; nbuilt -1
     * when there were more than recorded. */
    HV *built_for;
    HE *built[ENV_STALE_MAX];
    U32 built_hash[ENV_STALE_MAX];
    int nbuilt;
    /* The keys the app added that the last clean had to walk the buckets
     * to find (Plack::Request's plack.request.*, a middleware's own): the
     * next clean looks for these first, each in its own bucket chain. */
    HV *added_holder;           /* holds the shared keys of added[] */
    HEK *added[ENV_ADDED_MAX];
    int nadded;
};

/* The keys whose values read_request writes into a spare $env. */
static const int env_fixed_keys[] = {
    K_REQUEST_METHOD, K_REQUEST_URI, K_PATH_INFO, K_QUERY_STRING,
    K_SERVER_PROTOCOL, K_REMOTE_ADDR, K_REMOTE_PORT, K_CLEANUP_HANDLERS, K_PSGIX_IO,
};

/* psgix.io costs a dup and PerlIO's probes (nine system calls), so it is
 * made only when the app reads $env->{'psgix.io'}: the value carries get
 * magic that asks the listener's io_maker (given by the worker) for the
 * handle, once per connection. */
static SV *make_io_handle(pTHX_ nw_xs_conn *xc, SV *conn_rv)
{
    dSP;
    SV *ret = NULL;
    ENTER;
    SAVETMPS;
    PUSHMARK(SP);
    XPUSHs(conn_rv);
    PUTBACK;
    if (xc->env->io_maker && call_sv(xc->env->io_maker, G_SCALAR) == 1) {
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
    if (!xc->io) {
        xc->io = make_io_handle(aTHX_ xc, mg->mg_obj);
        /* The app gets the socket as other PSGI servers give it: blocking,
         * so a plain sysread after a 101 waits for data instead of failing
         * with EAGAIN. The flag is the socket's, shared with our fd: the
         * server makes it non-blocking again (nw_conn_reclaim) before it
         * writes a response or reads the next request. */
        if (xc->c->fd >= 0) {
            int fl = fcntl(xc->c->fd, F_GETFL);
            if (fl >= 0)
                fcntl(xc->c->fd, F_SETFL, fl & ~O_NONBLOCK);
        }
        xc->c->lent = 1;
        nw_worker_lend_socket(xc->wc);  /* its close must end the connection */
    }
    xc->wc->socket_lent = 1;    /* the app may read from it behind our back */
    sv_setsv_nomg(sv, xc->io);
    return 0;
}

static MGVTBL io_magic_vtbl = { io_magic_get, NULL, NULL, NULL, NULL, NULL, NULL, NULL };


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
    r->key[j] = (env_key){ name, len, hash, value, fixed, NULL, ENV_SAME_ANY, 0 };
    unsigned s = hash & (ENV_OWNED_SLOTS - 1);
    while (r->slot[s])
        s = (s + 1) & (ENV_OWNED_SLOTS - 1);
    r->slot[s] = (unsigned char)(j + 1);
}

static int env_same_kind(pTHX_ SV *t);

env_recycler *nw_env_recycler_new(pTHX_ HV *template, SV *io_maker)
{
    env_recycler *r;
    Newxz(r, 1, env_recycler);
    r->refcnt = 1;
    r->template = (HV *)SvREFCNT_inc_simple_NN((SV *)template);
    r->io_maker = io_maker && SvOK(io_maker) ? newSVsv(io_maker) : NULL;
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
        if (k->value) {
            k->kind = env_same_kind(aTHX_ k->value);
            k->value_flags = SvFLAGS(k->value) & ENV_VALUE_FLAGS;
        }
    }
    return r;
}

void nw_env_recycler_ref(env_recycler *r)
{
    r->refcnt++;
}

void nw_env_recycler_unref(pTHX_ env_recycler *r)
{
    if (!r || --r->refcnt > 0)
        return;
    SvREFCNT_dec((SV *)r->spare);
    SvREFCNT_dec((SV *)r->key_holder);
    SvREFCNT_dec((SV *)r->added_holder);
    SvREFCNT_dec((SV *)r->template);
    SvREFCNT_dec(r->io_maker);
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

static int env_same_kind(pTHX_ SV *t)
{
    U32 f = SvFLAGS(t) & ENV_VALUE_FLAGS;
    if (SvTYPE(t) > SVt_PVMG || SvMAGICAL(t))
        return ENV_SAME_ANY;
    if (f == (SVf_ROK))
        return ENV_SAME_REF;
    if (f == (SVf_POK | SVp_POK) && !SvIsBOOL(t))
        return ENV_SAME_STRING;
    if (SvIsBOOL(t))
        return ENV_SAME_BOOL;
    if (f == (SVf_IOK | SVp_IOK))
        return ENV_SAME_INT;
    return ENV_SAME_ANY;
}

/* env_same_value for template key k, by the kind found once: v is
 * reusable (env_value_reusable), so a scalar up to PVMG or a fake glob. */
__attribute__((always_inline)) static inline int env_same_template(pTHX_ const env_key *k, SV *v)
{
    SV *t = k->value;
    if (k->kind == ENV_SAME_ANY || SvTYPE(v) > SVt_PVMG)
        return env_same_value(aTHX_ v, t);
    if ((SvFLAGS(v) & ENV_VALUE_FLAGS) != k->value_flags)
        return 0;
    switch (k->kind) {
    case ENV_SAME_REF:
        return SvRV(v) == SvRV(t);
    case ENV_SAME_STRING:       /* a shared (COW) buffer is equal */
        return SvCUR(v) == SvCUR(t) && !SvIsBOOL(v)
            && (SvPVX(v) == SvPVX(t) || memEQ(SvPVX(v), SvPVX(t), SvCUR(t)));
    case ENV_SAME_BOOL:         /* the same static "1" or "" buffer: a boolean, and which */
        return SvPVX(v) == SvPVX(t) && SvIVX(v) == SvIVX(t);
    default:
        return SvIVX(v) == SvIVX(t);
    }
}

/* Put owned key j's value back the way a fresh $env has it. */
__attribute__((always_inline)) static inline void env_clean_value(pTHX_ env_recycler *r, int j,
                                                                  SV *v)
{
    const env_key *k = &r->key[j];
    if (k->value) {
        if (!env_same_template(aTHX_ k, v))
            sv_setsv(v, k->value);
        return;
    }
    if (k->fixed == K_CLEANUP_HANDLERS && SvROK(v)) {
        AV *av = (AV *)SvRV(v);
        if (SvTYPE(av) == SVt_PVAV && SvREFCNT(av) == 1 && !SvMAGICAL(av) && !SvOBJECT(av)
            && !SvREADONLY(av)) {
            if (AvFILLp(av) >= 0)
                av_clear(av);           /* the handlers go now, as they always did */
        }
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

/* Owned key j's value cleaned, or 0 when it cannot be kept (then it is
 * deleted). */
__attribute__((always_inline)) static inline int env_keep_owned(pTHX_ env_recycler *r, int j,
                                                               SV *v)
{
    if (r->key[j].fixed == K_PSGIX_IO) {
        if (!env_lazy_io_release(aTHX_ v))
            return 0;
        r->fixed_sv[K_PSGIX_IO] = v;
        return 1;
    }
    if (!env_value_reusable(aTHX_ v))
        return 0;
    env_clean_value(aTHX_ r, j, v);
    return 1;
}

/* The entry he, if it is in env's bucket for hash (he is not read
 * unless it is: an entry the app deleted is freed). */
static int env_holds_entry(HV *env, const HE *he, U32 hash)
{
    for (const HE *e = HvARRAY(env)[hash & HvMAX(env)]; e; e = HeNEXT(e))
        if (e == he)
            return 1;
    return 0;
}

/* Whether he is a header entry the last build stored. */
static int env_is_built(const env_recycler *r, const HE *he)
{
    for (int i = 0; i < r->nbuilt; i++)
        if (r->built[i] == he)
            return 1;
    return 0;
}

/* Whether he is one of the entries the quick check found: an owned key's
 * (by its shared key's address: the hash holds each key once, and the
 * owned ones were found by that address) or a header entry the build
 * stored. */
static int env_known_entry(const env_recycler *r, const HE *he)
{
    const HEK *hek = HeKEY_hek(he);
    for (unsigned s = HEK_HASH(hek) & (ENV_OWNED_SLOTS - 1);; s = (s + 1) & (ENV_OWNED_SLOTS - 1)) {
        int j = r->slot[s] - 1;
        if (j < 0)
            break;
        if (r->key[j].hek == hek)
            return 1;
    }
    return env_is_built(r, he);
}

/* The entry for the shared key hek in env, or NULL. */
static HE *env_entry_of(HV *env, const HEK *hek)
{
    HE *he = HvARRAY(env)[HEK_HASH(hek) & HvMAX(env)];
    while (he && HeKEY_hek(he) != hek)
        he = HeNEXT(he);
    return he;
}

/* Remember the keys of the n added entries (still in the hash: their
 * shared keys are alive) for the next clean. The holder keeps each shared
 * key alive, so that an address always names the same key. */
static void env_learn_added(pTHX_ env_recycler *r, HE **added, STRLEN n)
{
    if (!r->added_holder)
        r->added_holder = newHV();
    hv_clear(r->added_holder);
    r->nadded = 0;
    for (STRLEN i = 0; i < n && r->nadded < ENV_ADDED_MAX; i++) {
        HE *he = added[i];
        if (HeKUTF8(he) || HeKWASUTF8(he))
            continue;
        HE *held = (HE *)hv_common(r->added_holder, NULL, HeKEY(he), (STRLEN)HeKLEN(he), 0,
                                   HV_FETCH_ISSTORE, newSV(0), HeHASH(he));
        if (held)
            r->added[r->nadded++] = HeKEY_hek(held);
    }
}

/* The added entries found by the keys the last clean remembered: 1 when
 * they are all of them (then they are deleted). An entry for a remembered
 * key is never an owned one (owned keys are held too, so their addresses
 * differ) and is not a header entry the build stored (checked). */
static int env_delete_learned(pTHX_ env_recycler *r, HV *env, STRLEN added)
{
    const HEK *doomed[ENV_ADDED_MAX];
    STRLEN nd = 0;
    if (added > (STRLEN)r->nadded)
        return 0;
    for (int i = 0; i < r->nadded && nd < added; i++) {
        HE *he = env_entry_of(env, r->added[i]);
        if (he && !env_is_built(r, he))
            doomed[nd++] = r->added[i];
    }
    if (nd != added)
        return 0;
    /* deleted by key (held, so alive whatever a DESTROY does meanwhile) */
    for (STRLEN i = 0; i < nd; i++)
        (void)hv_common(env, NULL, HEK_KEY(doomed[i]), (STRLEN)HEK_LEN(doomed[i]), 0,
                        G_DISCARD | HV_DELETE, NULL, HEK_HASH(doomed[i]));
    return 1;
}

/* After the quick check: the added entries (there are `added` of them,
 * next to the ones it found) deleted, found by the keys remembered from
 * the last clean or else by a pass over the buckets (whose finds are then
 * remembered). 0 when one cannot be deleted (the full clean then
 * decides). */
static int env_delete_added(pTHX_ env_recycler *r, HV *env, STRLEN added)
{
    if (env_delete_learned(aTHX_ r, env, added))
        return 1;
    HE *doomed[ENV_DOOMED_MAX];
    STRLEN nd = 0;
    HE **array = HvARRAY(env);
    for (STRLEN b = 0; b <= HvMAX(env) && nd < added; b++)
        for (HE *he = array[b]; he; he = HeNEXT(he)) {
            if (env_known_entry(r, he))
                continue;
            if (nd == added || HeKLEN(he) < 0 || HeKLEN(he) > ENV_KEY_MAX)
                return 0;
            doomed[nd++] = he;
        }
    if (nd != added)
        return 0;
    env_learn_added(aTHX_ r, doomed, nd);
    for (STRLEN i = 0; i < nd; i++)
        env_delete_entry(aTHX_ env, doomed[i]);
    return 1;
}

/* The common case of a clean: the hash holds its owned keys, the header
 * entries the build stored, and maybe keys the app added (Plack::Request
 * adds its plack.request.* ones). See "The $env" in docs/DESIGN.md.
 * Cleans the values, deletes the added keys and answers 1; 0 when the
 * hash is not in that shape (what it cleaned by then, the full clean
 * would clean the same way). */
static int env_recycle_quick(pTHX_ env_recycler *r, HV *env)
{
    STRLEN known = (STRLEN)(r->nkeys + r->nbuilt);
    if (r->built_for != env || r->nbuilt < 0 || HvTOTALKEYS(env) < known
        || HvTOTALKEYS(env) - known > ENV_DOOMED_MAX)
        return 0;           /* keys deleted (or a great many added): not the common case */
    for (int j = 0; j < r->nkeys; j++) {
        HE *he = env_entry_of(env, r->key[j].hek);
        if (!he || !env_keep_owned(aTHX_ r, j, HeVAL(he)))
            return 0;
    }
    r->nstale = 0;
    for (int i = 0; i < r->nbuilt; i++)
        if (!env_holds_entry(env, r->built[i], r->built_hash[i])
            || !env_stale_header(aTHX_ r, r->built[i]))
            return 0;
    STRLEN added = HvTOTALKEYS(env) - known;
    return added == 0 || env_delete_added(aTHX_ r, env, added);
}

/* The full clean, entry by entry: deletes what the request added, puts
 * the template's values back, re-adds owned keys the app deleted. 0 when
 * the hash is more than a clean is for (it is then freed as usual). */
static int env_recycle_walk(pTHX_ env_recycler *r, HV *env)
{
    r->nstale = 0;
    unsigned char seen[ENV_OWNED_MAX];
    HE *doomed[ENV_DOOMED_MAX];
    int nd = 0;
    memset(seen, 0, (size_t)r->nkeys);
    HE **array = HvARRAY(env);
    for (STRLEN b = 0; b <= HvMAX(env); b++) {
        for (HE *he = array[b]; he; he = HeNEXT(he)) {
            int j = HeKLEN(he) >= 0 ? env_owned_index(r, HeKEY_hek(he)) : -1;
            if (j < 0 && HeKLEN(he) >= 0 && env_stale_header(aTHX_ r, he))
                continue;
            if (j >= 0 && env_keep_owned(aTHX_ r, j, HeVAL(he))) {
                seen[j] = 1;
                continue;
            }
            if (nd == ENV_DOOMED_MAX || HeKLEN(he) < 0 || HeKLEN(he) > ENV_KEY_MAX)
                return 0;
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
    return 1;
}

/* The end of a request: clean env and keep it as the spare, if it is
 * Narwhal's alone (the common case first, else the full walk). */
void nw_env_recycle(pTHX_ env_recycler *r, HV *env)
{
    if (r->spare || !env_may_recycle(aTHX_ env))
        return;
    int clean = env_recycle_quick(aTHX_ r, env) || env_recycle_walk(aTHX_ r, env);
    r->built_for = NULL;
    if (!clean)
        return;
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
void nw_env_peer(pTHX_ nw_xs_conn *xc, const struct sockaddr_storage *ss, unsigned len)
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

/* REQUEST_URI: the target as sent, or for an absolute-form target (RFC
 * 9112 3.2.2) its path and query only, as PSGI has it (no scheme, no host). */
static void env_request_uri(const nw_request *r, const char **p, STRLEN *len)
{
    *p = r->target;
    *len = r->target_len;
    if (r->authority) {
        *p = r->path;
        *len = (STRLEN)(r->target + r->target_len - r->path);
    }
}

/* A header entry the build stored, for the quick check at the clean. */
static void env_note_built(env_recycler *r, HE *he)
{
    if (r->nbuilt < 0)
        return;
    if (!he || r->nbuilt == ENV_STALE_MAX) {
        r->nbuilt = -1;
        return;
    }
    r->built[r->nbuilt] = he;
    r->built_hash[r->nbuilt++] = HeHASH(he);
}

/* The request's headers into $env. In a spare $env, an entry left from the
 * last request (stale) takes this request's value, or goes. */
static void env_headers(pTHX_ HV *env, const nw_request *req, env_recycler *rec,
                        env_recycler *stale)
{
    rec->built_for = env;
    rec->nbuilt = 0;
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
            env_note_built(rec, stale->stale[s]);
            stale->stale[s] = stale->stale[--stale->nstale];
        } else if (old) {
            sv_catpvs(*old, ", ");
            sv_catpvn(*old, h->value, h->value_len);
        } else {
            env_note_built(rec, (HE *)hv_common(env, NULL, key, klen, 0, HV_FETCH_ISSTORE,
                                                newSVpvn(h->value, h->value_len), 0));
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
    const char *uri;
    STRLEN uri_len;
    env_request_uri(r, &uri, &uri_len);
    env_set(aTHX_ f[K_REQUEST_URI], uri, uri_len);
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
    const char *uri;
    STRLEN uri_len;
    env_request_uri(r, &uri, &uri_len);
    env_put(aTHX_ env, K_REQUEST_URI, newSVpvn(uri, uri_len));
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

/* --proxy-protocol: the port the client reached the balancer on, when the
 * header gave one; else the listener's (a recycled $env may hold another
 * connection's). */
static void env_server_port_from_proxy(pTHX_ HV *env, nw_xs_conn *xc)
{
    const nw_proxy_info *p = &xc->c->proxy;
    int port = -1;
    if (!p->local && p->dst.ss_family == AF_INET)
        port = ntohs(((const struct sockaddr_in *)&p->dst)->sin_port);
    else if (!p->local && p->dst.ss_family == AF_INET6)
        port = ntohs(((const struct sockaddr_in6 *)&p->dst)->sin6_port);
    if (port >= 0) {
        (void)hv_stores(env, "SERVER_PORT", newSViv(port));
        return;
    }
    SV **t = hv_fetchs(xc->env->template, "SERVER_PORT", 0);
    if (t)
        (void)hv_stores(env, "SERVER_PORT", newSVsv(*t));
}

HV *nw_env_build(pTHX_ nw_xs_conn *xc, SV *self_rv)
{
    HV *env = env_from_spare(aTHX_ xc, self_rv);
    env_recycler *stale = env ? xc->env : NULL;
    if (!env)
        env = env_fresh(aTHX_ xc, self_rv);
    env_headers(aTHX_ env, &xc->c->req, xc->env, stale);
    if (xc->c->req.authority)       /* RFC 9112 3.2.2: the target's host wins over Host */
        (void)hv_stores(env, "HTTP_HOST",
                        newSVpvn(xc->c->req.authority, xc->c->req.authority_len));
    if (!xc->c->is_tcp)
        env_server_from_host(aTHX_ env, &xc->c->req);
    if (xc->c->cfg.proxy_protocol)
        env_server_port_from_proxy(aTHX_ env, xc);
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

/* A body spilled to a temp file: a Perl filehandle on it, as
 * open(my $fh, '+<&=', $fd) made one (binary; read, seek; the handle owns
 * the descriptor from now on). */
static SV *spilled_input(pTHX_ nw_conn *c)
{
    int fd = c->body_fd;
    c->body_fd = -1;
    PerlIO *f = PerlIO_fdopen(fd, "r+b");
    if (!f) {
        int e = errno;
        close(fd);
        croak("cannot open the request body: %s", strerror(e));
    }
    GV *gv = newGVgen("Narwhal::Input");
    IO *io = GvIOn(gv);
    IoIFP(io) = IoOFP(io) = f;
    IoTYPE(io) = IoTYPE_RDWR;
    SV *rv = newRV_inc((SV *)gv);
    /* an anonymous glob, as Symbol::gensym makes: no name keeps it alive */
    (void)hv_delete(GvSTASH(gv), GvNAME(gv), GvNAMELEN(gv), G_DISCARD);
    return rv;
}

void nw_env_body(pTHX_ HV *env, nw_conn *c)
{
    if (c->framing.body == NW_BODY_CHUNKED) {
        (void)hv_delete(env, keys[K_HTTP_TRANSFER_ENCODING].name,
                        keys[K_HTTP_TRANSFER_ENCODING].len, G_DISCARD);
        env_put(aTHX_ env, K_CONTENT_LENGTH, newSVuv(c->body_len));
    } else if (c->framing.length_padded) {  /* "005": the app sees 5 ("00" would be true) */
        env_put(aTHX_ env, K_CONTENT_LENGTH, newSVuv(c->body_len));
    }
    if (c->body_fd >= 0)
        env_put(aTHX_ env, K_PSGI_INPUT, spilled_input(aTHX_ c));
    else if (c->body_len > 0)
        env_put(aTHX_ env, K_PSGI_INPUT, input_object(aTHX_ c));
}

/* Whether the end of a request must go through the worker's
 * _after_response (cleanup handlers, psgix.harakiri.commit), or might: 1
 * unless env is a plain hash whose handlers are a plain empty array (or
 * not an array) and which has no psgix.harakiri.commit. Anything unusual
 * (tied, locked, magical values) answers 1, and the worker then decides
 * in Perl, inside its eval, as it always did. */
int nw_env_needs_after(pTHX_ SV *env_rv)
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
