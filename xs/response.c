/* PSGI responses into the C writer (src/worker/nw_conn.c, src/shared/nw_response.c):
 * the app's status, header array and body pieces become one head and, for
 * an array body, one writev; for a plain file handle, sendfile. */
#include "narwhal_xs.h"
#include "perliol.h"

#include <strings.h>
#include <sys/stat.h>

#define SMALL_PIECES 16   /* body pieces handled without a heap array */

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
        if (kl == 12 && !strncasecmp(kp, "X-Request-Id", 12)) {   /* for the access log */
            c->request_id_len = vl < NW_REQUEST_ID_MAX ? (unsigned)vl : NW_REQUEST_ID_MAX;
            memcpy(c->request_id, vp, c->request_id_len);
        }
    }
    return 0;
}

int nw_response_start(pTHX_ nw_conn *c, int status, SV *headers_rv,
                      int64_t known_length, int may_keep_alive)
{
    nw_app_headers seen;
    memset(&seen, 0, sizeof seen);
    if (status < 100 || status > 999 || !SvROK(headers_rv)
        || SvTYPE(SvRV(headers_rv)) != SVt_PVAV)
        return NW_RESPONSE_INVALID;
    seen.bodiless = status < 200 || status == 204;
    seen.http10 = c->req.minor_version == 0;
    c->out.len = 0;
    if (nw_head_status(&c->out, c->req.minor_version, status) < 0
        || head_from_av(aTHX_ c, (AV *)SvRV(headers_rv), &seen) < 0) {
        c->out.len = 0;
        return NW_RESPONSE_INVALID;
    }
    /* --max-keepalive-reqs is checked here rather than by the
     * worker calling Narwhal::Conn::requests before every response */
    nw_conn_reclaim(c);     /* the app may have had the socket, blocking */
    int ka = may_keep_alive && c->framing.keep_alive
             && (c->cfg.max_keepalive_reqs <= 0 || c->requests < c->cfg.max_keepalive_reqs)
             && !nw_conn_server_closing();   /* draining: clients move on now */
    int f = nw_head_finish(&c->out, &seen, c->req.minor_version, status,
                           c->is_head_method, known_length, &ka);
    if (f < 0) {
        c->out.len = 0;
        return NW_RESPONSE_INVALID;
    }
    nw_conn_head_ready(c, f, seen.has_content_length ? seen.content_length
                                                     : known_length, ka);
    c->status = status;
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
int nw_response_write_array(pTHX_ nw_conn *c, int status, SV *headers, AV *body,
                            int may_keep_alive)
{
    struct iovec small[SMALL_PIECES], *v = small;
    SSize_t n = av_len(body) + 1;
    int64_t total;
    int ret = NW_RESPONSE_INVALID;
    if (n > SMALL_PIECES)
        Newx(v, n, struct iovec);
    int k = pieces_from_av(aTHX_ body, v, &total);
    if (nw_response_start(aTHX_ c, status, headers, total, may_keep_alive) >= 0) {
        /* the whole body is here: what the socket does not take now may
         * be left to the manager (DESIGN.md, "Slow readers") */
        c->offload_response = c->cfg.offload;
        nw_conn_write_body(c, v, k);
        ret = nw_conn_end_body(c);
        c->offload_response = 0;
    }
    if (v != small)
        Safefree(v);
    return ret;
}

/* Whether every layer of f passes bytes through as they are in the file
 * (unix, perlio, stdio; no :utf8, :crlf, :encoding, ...): the file may then
 * be sent with sendfile. */
static int plain_layers(pTHX_ PerlIO *f)
{
    if (!PerlIOValid(f))
        return 0;
    for (PerlIOl *l = *f; l; l = l->next) {
        const char *name = l->tab ? l->tab->name : NULL;
        if (!name || (l->flags & PERLIO_F_UTF8)
            || !(strEQ(name, "unix") || strEQ(name, "perlio") || strEQ(name, "stdio")))
            return 0;
    }
    return 1;
}

/* Whether body is a handle that may be sent with sendfile: a glob (of
 * any class) open on a regular file with plain layers, not tied. Its
 * descriptor, the offset reached (what the app read is not sent again)
 * and the bytes left. The one test for both paths: the common case here
 * and the worker's respond (Narwhal::Conn::sendfile_source). */
GV *nw_response_file_source(pTHX_ SV *body, int *fd, off_t *offset, int64_t *left)
{
    if (!SvROK(body))
        return NULL;
    GV *gv = (GV *)SvRV(body);
    if (SvTYPE(gv) != SVt_PVGV || !isGV_with_GP(gv) || SvMAGICAL(gv))
        return NULL;
    IO *io = GvIO(gv);
    PerlIO *fp = io && !SvMAGICAL(io) ? IoIFP(io) : NULL;
    struct stat st;
    if (!fp || !plain_layers(aTHX_ fp) || (*fd = PerlIO_fileno(fp)) < 0
        || fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode))
        return NULL;
    Off_t at = PerlIO_tell(fp);
    *offset = at > 0 ? (off_t)at : 0;
    *left = st.st_size > *offset ? (int64_t)(st.st_size - *offset) : 0;
    return gv;
}

/* The common case's file body: a source as above that is an unblessed
 * glob or an IO::File (a class of its own may mean its own close, which
 * the worker's respond calls). */
static GV *file_body(pTHX_ SV *body, int *fd, off_t *offset, int64_t *left)
{
    SV *gv = SvRV(body);
    if (SvOBJECT(gv)) {
        const char *class = HvNAME_get(SvSTASH(gv));
        if (!class || strcmp(class, "IO::File") != 0)
            return NULL;
    }
    return nw_response_file_source(aTHX_ body, fd, offset, left);
}

/* A file body's response: the head, then sendfile (what the socket does
 * not take now may be left to the manager, as for an array body), then the
 * handle is closed, as PSGI asks of the server. */
static int write_file(pTHX_ nw_conn *c, int status, SV *headers, GV *gv, int fd,
                      off_t offset, int64_t left, int may_keep_alive)
{
    if (nw_response_start(aTHX_ c, status, headers, left, may_keep_alive) < 0)
        return NW_RESPONSE_INVALID;
    nw_conn_send_file(c, fd, offset, (size_t)left);
    (void)do_close(gv, TRUE);
    return nw_conn_end_body(c);
}

int nw_response_write_common(pTHX_ nw_conn *c, SV *res, int may_keep_alive)
{
    AV *av, *body;
    SV **e;
    if (!(SvROK(res) && SvTYPE(av = (AV *)SvRV(res)) == SVt_PVAV && !SvOBJECT(av)
          && !SvMAGICAL(av) && AvFILLp(av) == 2 && (e = AvARRAY(av)) && e[0] && e[1] && e[2]
          && !SvGMAGICAL(e[2]) && SvROK(e[2])))
        return NW_RESPONSE_OTHER_SHAPE;
    if (SvTYPE(body = (AV *)SvRV(e[2])) == SVt_PVAV && !SvOBJECT(body))
        return nw_response_write_array(aTHX_ c, (int)SvIV(e[0]), e[1], body, may_keep_alive);
    int fd;
    off_t offset;
    int64_t left;
    GV *gv = file_body(aTHX_ e[2], &fd, &offset, &left);
    if (gv)
        return write_file(aTHX_ c, (int)SvIV(e[0]), e[1], gv, fd, offset, left, may_keep_alive);
    return NW_RESPONSE_OTHER_SHAPE;
}

int nw_response_informational(pTHX_ nw_conn *c, int status, SV *headers)
{
    nw_app_headers seen;
    int sent = 0;
    memset(&seen, 0, sizeof seen);
    seen.bodiless = 1;
    if (status < 100 || status >= 200 || c->req.minor_version < 1
        || !SvROK(headers) || SvTYPE(SvRV(headers)) != SVt_PVAV)
        return 0;
    nw_buf b = { 0 };
    if (nw_head_status(&b, 1, status) == 0
        && head_from_av(aTHX_ c, (AV *)SvRV(headers), &seen) == 0) {
        /* head_from_av wrote into c->out; move it after the status line */
        nw_buf_append(&b, c->out.data, c->out.len);
        nw_buf_append(&b, "\r\n", 2);
        sent = nw_conn_send_raw(c, b.data, b.len) == NW_IO_OK;
    }
    c->out.len = 0;
    nw_buf_free(&b);
    return sent;
}
