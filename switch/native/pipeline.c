/* The native single-switch aggregation pipeline: rules 1-8 of docs/pipeline.md, following
 * switch/dataplane/pipeline.py (AggregationPipeline, AggregatorPool, Recut) step by step.
 *
 * Invariants (the Python pool's): slot i holds relative PSN tag[i] (≡ i mod N) or is empty
 * (-1); bitmap[i] names the ranks whose contribution it holds, each added once: the
 * header (UDP checksum 0) in the rank's lane buffer, right before the fixed offset
 * PAYLOAD_OFF (16-byte aligned), the payload added into the slot's wrapping int32 sum (the
 * first one copied); ready[i]: every contribution is in the sum; emitted[i] is set only
 * once every slot before tag[i] was emitted; next_emit is the first relative PSN not
 * emitted. A result is the lane's header (its PSN psn0 + shift + k) with the sum written
 * after it at PAYLOAD_OFF and its ICRC, and leaves from there; the sum's CRC is computed
 * once per slot and joined to each lane's header CRC (nrdp_crc32_shift).
 * Only a packet with a valid IPv4 checksum and ICRC that is not a fragment is added or
 * served. The connection tables are open-addressed, linear probing, fixed capacity (twice
 * the pipe's max_conns), deleted by backward shift: a packet only looks up.
 */
#include "pipeline.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "packet.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "int32 payloads are summed in place");

#define PAYLOAD_OFF 80                 /* >= NRDP_MAX_HDR, 16-byte aligned */
#define EMPTY (-1)

struct conn {
    int ring;                          /* -1: free */
    uint32_t rank, src_ip, dst_ip, src_qpn, dst_qpn, psn0, in_port, out_port;
    struct nrdp_conn_stats st;
};

struct ring {
    int used;
    char id[64];
    uint32_t world, mtu, slots, mask, full, next_emit, stride;
    uint64_t completed, results_sent;
    int conn[NRDP_MAX_RANKS];
    uint32_t out_port[NRDP_MAX_RANKS], psn0[NRDP_MAX_RANKS];
    uint32_t shift[NRDP_MAX_RANKS], at[NRDP_MAX_RANKS];   /* rule 7a: re-cuts so far, last */
    int32_t *tag;
    uint32_t *bitmap, *plen;
    uint8_t *emitted, *ready, *opcode, *hdr_end;
    uint8_t *bufs;                     /* slots x world lane buffers of `stride` bytes */
    uint32_t *sums;                    /* slots x mtu/4 */
    uint32_t xpow_len, xpow;           /* nrdp_crc32_xpow(xpow_len), cached */
};

struct entry {
    uint64_t addrs;
    uint32_t dqp;
    int32_t conn;                      /* -1: empty */
};

struct nrdp_pipe {
    pthread_mutex_t lock;
    uint32_t max_rings, max_conns, tcap;
    struct ring *rings;
    struct conn *conns;
    struct entry *req, *resp;          /* by the requester's key, by its responder's */
    struct nrdp_l2 l2;                 /* for the I/O layer only (nrdp_l2_of) */
    nrdp_tx_alloc_fn tx_alloc;         /* results built in the I/O layer's buffers, or NULL */
    void *tx_ctx;
    struct nrdp_router *router;        /* one-armed mode (router.h), for the I/O layer only */
    uint8_t scratch[PAYLOAD_OFF + NRDP_MAX_MTU + NRDP_ICRC_LEN];
};

static const char *const counter_names[NRDP_N_COUNTERS] = {
    "aggregated", "retransmits_served", "empties_forwarded", "drop_wrong_port",
    "drop_bad_ipcsum", "drop_fragment", "drop_bad_opcode", "drop_bad_length",
    "drop_bad_icrc", "drop_overrun", "drop_mismatch", "drop_duplicate", "drop_stale",
    "messages", "recuts"};

const char *nrdp_counter_name(uint32_t index)
{
    return index < NRDP_N_COUNTERS ? counter_names[index] : NULL;
}

void nrdp_abi_sizes(size_t sizes[5])
{
    sizes[0] = sizeof(struct nrdp_out_batch);
    sizes[1] = sizeof(struct nrdp_conn_desc);
    sizes[2] = sizeof(struct nrdp_ring_desc);
    sizes[3] = sizeof(struct nrdp_ring_stats);
    sizes[4] = sizeof(struct nrdp_conn_stats);
}

/* ---- connection table ---------------------------------------------------------------- */

static uint32_t key_hash(struct nrdp_key k, uint32_t cap)
{
    uint64_t h = (k.addrs ^ (uint64_t)k.dqp << 40 ^ k.dqp) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & (cap - 1);
}

static int key_eq(const struct entry *e, struct nrdp_key k)
{
    return e->addrs == k.addrs && e->dqp == k.dqp;
}

static int table_find(const struct entry *t, uint32_t cap, struct nrdp_key k)
{
    for (uint32_t i = key_hash(k, cap);; i = (i + 1) & (cap - 1)) {
        if (t[i].conn == EMPTY)
            return EMPTY;
        if (key_eq(&t[i], k))
            return t[i].conn;
    }
}

static void table_put(struct entry *t, uint32_t cap, struct nrdp_key k, int conn)
{
    uint32_t i = key_hash(k, cap);
    while (t[i].conn != EMPTY)
        i = (i + 1) & (cap - 1);
    t[i] = (struct entry){k.addrs, k.dqp, conn};
}

static void table_del(struct entry *t, uint32_t cap, struct nrdp_key k)
{
    uint32_t i = key_hash(k, cap);
    while (t[i].conn != EMPTY && !key_eq(&t[i], k))
        i = (i + 1) & (cap - 1);
    if (t[i].conn == EMPTY)
        return;
    /* backward shift: move later entries of the run into the hole when their home allows */
    for (uint32_t j = (i + 1) & (cap - 1); t[j].conn != EMPTY; j = (j + 1) & (cap - 1)) {
        uint32_t home = key_hash((struct nrdp_key){t[j].addrs, t[j].dqp}, cap);
        if (((j - home) & (cap - 1)) >= ((j - i) & (cap - 1))) {
            t[i] = t[j];
            i = j;
        }
    }
    t[i].conn = EMPTY;
}

static struct nrdp_key req_key(const struct conn *c)
{
    return (struct nrdp_key){(uint64_t)c->src_ip << 32 | c->dst_ip, c->dst_qpn};
}

static struct nrdp_key resp_key(const struct conn *c)
{
    return (struct nrdp_key){(uint64_t)c->dst_ip << 32 | c->src_ip, c->src_qpn};
}

/* ---- the pool ------------------------------------------------------------------------ */

static uint8_t *lane_buf(const struct ring *r, uint32_t i, uint32_t lane)
{
    return r->bufs + ((size_t)i * r->world + lane) * r->stride;
}

static uint8_t *sum_of(const struct ring *r, uint32_t i)
{
    return (uint8_t *)(r->sums + (size_t)i * (r->mtu >> 2));
}

static void put_out(struct nrdp_out_batch *out, uint32_t port, uint32_t len,
                    const uint8_t *data)
{
    out->out[out->n++] = (struct nrdp_out){port, len, data};
}

/* x^(8 plen) for the CRC concatenation: cached per ring (plen is the MTU but for last
 * packets of a message). */
static uint32_t xpow_of(struct ring *r, uint32_t plen)
{
    if (r->xpow_len != plen) {
        r->xpow = nrdp_crc32_xpow(plen);
        r->xpow_len = plen;
    }
    return r->xpow;
}

/* sum[0:n) += the n little-endian int32 at p (any alignment), wrapping. */
static void add_into(uint32_t *restrict sum, const uint8_t *restrict p, uint32_t n)
{
    uint32_t j = 0;
#ifdef __SSE2__
    for (; j + 16 <= n; j += 16) {
        __m128i *s = (__m128i *)(sum + j);
        const __m128i *q = (const __m128i *)(p + 4 * j);
        __m128i a0 = _mm_add_epi32(_mm_load_si128(s), _mm_loadu_si128(q));
        __m128i a1 = _mm_add_epi32(_mm_load_si128(s + 1), _mm_loadu_si128(q + 1));
        __m128i a2 = _mm_add_epi32(_mm_load_si128(s + 2), _mm_loadu_si128(q + 2));
        __m128i a3 = _mm_add_epi32(_mm_load_si128(s + 3), _mm_loadu_si128(q + 3));
        _mm_store_si128(s, a0);
        _mm_store_si128(s + 1, a1);
        _mm_store_si128(s + 2, a2);
        _mm_store_si128(s + 3, a3);
    }
#endif
    for (; j < n; j++) {
        uint32_t v;
        memcpy(&v, p + 4 * j, 4);
        sum[j] += v;
    }
}

/* Send next_emit and every ready slot that follows it without a gap. */
static void emit_in_order(struct nrdp_pipe *pipe, struct ring *r, struct nrdp_out_batch *out)
{
    uint32_t k = r->next_emit, i = k & r->mask;
    while (r->tag[i] == (int32_t)k && r->ready[i] && !r->emitted[i]) {
        uint32_t plen = r->plen[i], he = r->hdr_end[i];
        const uint8_t *sum = sum_of(r, i);
        uint32_t sum_crc = nrdp_crc32(0, sum, plen), xn = xpow_of(r, plen);
        for (uint32_t lane = 0; lane < r->world; lane++) {
            uint8_t *f = lane_buf(r, i, lane) + PAYLOAD_OFF - he;
            uint32_t psn = (r->psn0[lane] + r->shift[lane] + k) & NRDP_PSN_MASK;
            uint8_t *dst = pipe->tx_alloc ? pipe->tx_alloc(pipe->tx_ctx, r->out_port[lane],
                                                           he + plen + NRDP_ICRC_LEN) : NULL;
            if (dst) {                 /* the lane's header, the result after it, there */
                memcpy(dst, f, he);
                f = dst;
            }
            memcpy(f + he, sum, plen);
            f[NRDP_PSN_OFF] = (uint8_t)(psn >> 16);
            f[NRDP_PSN_OFF + 1] = (uint8_t)(psn >> 8);
            f[NRDP_PSN_OFF + 2] = (uint8_t)psn;
            nrdp_put_le32(f + he + plen,
                          nrdp_crc32_shift(nrdp_icrc(f, he), xn) ^ sum_crc);
            put_out(out, r->out_port[lane], he + plen + NRDP_ICRC_LEN, f);
        }
        r->emitted[i] = 1;
        r->completed++;
        r->results_sent += r->world;
        k = (k + 1) & NRDP_PSN_MASK;
        i = k & r->mask;
    }
    r->next_emit = k;
}

/* Rule 7 for verified packet k of `rank`: the outcome it counts. */
static int offer(struct nrdp_pipe *pipe, struct ring *r, uint32_t rank, uint32_t k,
                 const uint8_t *frame, uint32_t he, uint32_t plen, uint32_t opcode,
                 struct nrdp_out_batch *out)
{
    uint32_t i = k & r->mask;
    if (r->tag[i] == (int32_t)k) {
        if (plen != r->plen[i] || opcode != r->opcode[i])
            return NRDP_DROP_MISMATCH;
        if (r->bitmap[i] >> rank & 1) {
            if (!r->emitted[i])
                return NRDP_DROP_DUPLICATE;
            uint8_t *f = pipe->scratch;        /* the retransmission's header, the result */
            memcpy(f, frame, he);
            f[NRDP_UDP_CSUM_OFF] = f[NRDP_UDP_CSUM_OFF + 1] = 0;
            memcpy(f + he, sum_of(r, i), plen);
            nrdp_put_le32(f + he + plen, nrdp_icrc(f, he + plen));
            put_out(out, r->out_port[rank], he + plen + NRDP_ICRC_LEN, f);
            return NRDP_RETRANSMITS_SERVED;
        }
    } else {
        uint32_t ahead = (k - r->next_emit) & NRDP_PSN_MASK;
        if (ahead >= r->slots)             /* outside [next_emit, next_emit + N) */
            return ahead < NRDP_PSN_HALF ? NRDP_DROP_OVERRUN : NRDP_DROP_STALE;
        r->tag[i] = (int32_t)k;            /* whatever slot i held was emitted */
        r->bitmap[i] = 0;
        r->emitted[i] = r->ready[i] = 0;
        r->plen[i] = plen;
        r->opcode[i] = (uint8_t)opcode;
        r->hdr_end[i] = (uint8_t)he;
    }
    uint8_t *f = lane_buf(r, i, rank) + PAYLOAD_OFF - he;
    memcpy(f, frame, he);
    f[NRDP_UDP_CSUM_OFF] = f[NRDP_UDP_CSUM_OFF + 1] = 0;
    if (r->bitmap[i])
        add_into(r->sums + (size_t)i * (r->mtu >> 2), frame + he, plen >> 2);
    else
        memcpy(sum_of(r, i), frame + he, plen);
    r->bitmap[i] |= 1u << rank;
    if (r->bitmap[i] == r->full) {
        r->ready[i] = 1;
        if (k == r->next_emit)
            emit_in_order(pipe, r, out);
    }
    return NRDP_AGGREGATED;
}

/* Rule 7a: an empty WRITE_ONLY at relative PSN j re-cuts the lane's stream (1), unless
 * it repeats or precedes the last re-cut (0). */
static int follow_recut(struct ring *r, uint32_t lane, uint32_t j)
{
    uint32_t d = (j - r->at[lane]) & NRDP_PSN_MASK;
    if (r->shift[lane] && !(0 < d && d < NRDP_PSN_HALF))
        return 0;
    r->shift[lane] = (r->shift[lane] + 1) & NRDP_PSN_MASK;
    r->at[lane] = j;
    return 1;
}

static int process_locked(struct nrdp_pipe *pipe, uint32_t in_port, const uint8_t *frame,
                          uint32_t len, const struct nrdp_fields *f,
                          struct nrdp_out_batch *out)
{
    int ci = table_find(pipe->req, pipe->tcap, f->key);
    if (ci == EMPTY) {
        int ai = table_find(pipe->resp, pipe->tcap, f->key);
        if (ai == EMPTY || in_port == pipe->conns[ai].out_port)
            return NRDP_NOT_MINE;          /* rule 1, or a response from the responder (2r) */
        pipe->conns[ai].st.counts[NRDP_DROP_WRONG_PORT]++;
        return 0;
    }
    struct conn *c = &pipe->conns[ci];
    struct ring *r = &pipe->rings[c->ring];
    int outcome;
    if (in_port != c->in_port) {
        outcome = NRDP_DROP_WRONG_PORT;
    } else if (!nrdp_ipv4_ok(frame)) {
        outcome = NRDP_DROP_BAD_IPCSUM;
    } else if (nrdp_is_fragment(f->frag)) {
        outcome = NRDP_DROP_FRAGMENT;
    } else if (!nrdp_is_write(f->opcode)) {
        outcome = NRDP_DROP_BAD_OPCODE;
    } else {
        uint32_t ext = nrdp_ext_len(f->opcode), he = NRDP_EXT_OFF + ext;
        int64_t plen = (int64_t)f->udp_len - NRDP_UDP_OVERHEAD - ext - f->pad;
        if (f->pad || plen & 3 || plen < 0 || plen > r->mtu
            || NRDP_UDP_OFF + f->udp_len > len) {
            outcome = NRDP_DROP_BAD_LENGTH;
        } else if (nrdp_icrc(frame, he + (uint32_t)plen)
                   != nrdp_get_le32(frame + he + plen)) {
            outcome = NRDP_DROP_BAD_ICRC;
        } else if (plen == 0 && nrdp_is_only_write(f->opcode)) {   /* rule 7a: passed on */
            put_out(out, c->out_port, len, frame);
            c->st.counts[NRDP_RECUTS] +=
                follow_recut(r, c->rank, (f->psn - c->psn0) & NRDP_PSN_MASK);
            outcome = NRDP_EMPTIES_FORWARDED;
        } else {
            uint32_t k = (f->psn - c->psn0 - r->shift[c->rank]) & NRDP_PSN_MASK;
            outcome = offer(pipe, r, c->rank, k, frame, he, (uint32_t)plen, f->opcode, out);
            if (outcome == NRDP_AGGREGATED && nrdp_is_message_start(f->opcode)) {
                const uint8_t *p = frame + NRDP_EXT_OFF;
                c->st.counts[NRDP_MESSAGES]++;
                c->st.has_reth = 1;
                c->st.va = (uint64_t)nrdp_get_be(p, 4) << 32 | nrdp_get_be(p + 4, 4);
                c->st.rkey = nrdp_get_be(p + 8, 4);
                c->st.dma_len = nrdp_get_be(p + 12, 4);
            }
        }
    }
    c->st.counts[outcome]++;
    return (int)out->n;
}

int nrdp_process(struct nrdp_pipe *pipe, uint32_t in_port, const uint8_t *frame,
                 uint32_t len, struct nrdp_out_batch *out)
{
    struct nrdp_fields f;
    out->n = 0;
    if (!nrdp_parse(frame, len, &f))
        return NRDP_NOT_MINE;
    pthread_mutex_lock(&pipe->lock);
    int n = process_locked(pipe, in_port, frame, len, &f, out);
    pthread_mutex_unlock(&pipe->lock);
    return n;
}

/* ---- control ------------------------------------------------------------------------- */

struct nrdp_pipe *nrdp_create(uint32_t max_rings, uint32_t max_conns)
{
    if (!max_rings || !max_conns || max_conns > (1u << 24) || max_rings > (1u << 20)) {
        errno = EINVAL;
        return NULL;
    }
    struct nrdp_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->max_rings = max_rings;
    p->max_conns = max_conns;
    p->tcap = 2;
    while (p->tcap < 2 * max_conns)
        p->tcap <<= 1;
    p->rings = calloc(max_rings, sizeof *p->rings);
    p->conns = calloc(max_conns, sizeof *p->conns);
    p->req = malloc(p->tcap * sizeof *p->req);
    p->resp = malloc(p->tcap * sizeof *p->resp);
    if (!p->rings || !p->conns || !p->req || !p->resp || pthread_mutex_init(&p->lock, NULL)) {
        free(p->rings);
        free(p->conns);
        free(p->req);
        free(p->resp);
        free(p);
        errno = ENOMEM;
        return NULL;
    }
    for (uint32_t i = 0; i < max_conns; i++)
        p->conns[i].ring = EMPTY;
    for (uint32_t i = 0; i < p->tcap; i++)
        p->req[i].conn = p->resp[i].conn = EMPTY;
    return p;
}

static void free_ring(struct ring *r)
{
    free(r->tag);
    free(r->bitmap);
    free(r->plen);
    free(r->emitted);
    free(r->ready);
    free(r->opcode);
    free(r->hdr_end);
    free(r->bufs);
    free(r->sums);
    memset(r, 0, sizeof *r);
}

void nrdp_destroy(struct nrdp_pipe *pipe)
{
    if (!pipe)
        return;
    for (uint32_t i = 0; i < pipe->max_rings; i++)
        if (pipe->rings[i].used)
            free_ring(&pipe->rings[i]);
    pthread_mutex_destroy(&pipe->lock);
    free(pipe->rings);
    free(pipe->conns);
    free(pipe->req);
    free(pipe->resp);
    free(pipe);
}

void nrdp_set_tx_alloc(struct nrdp_pipe *pipe, nrdp_tx_alloc_fn fn, void *ctx)
{
    pthread_mutex_lock(&pipe->lock);
    pipe->tx_alloc = fn;
    pipe->tx_ctx = ctx;
    pthread_mutex_unlock(&pipe->lock);
}

void nrdp_set_l2(struct nrdp_pipe *pipe, const struct nrdp_l2 *l2)
{
    pthread_mutex_lock(&pipe->lock);
    pipe->l2 = *l2;
    pthread_mutex_unlock(&pipe->lock);
}

const struct nrdp_l2 *nrdp_l2_of(struct nrdp_pipe *pipe)
{
    return &pipe->l2;
}

void nrdp_set_router(struct nrdp_pipe *pipe, struct nrdp_router *router)
{
    pthread_mutex_lock(&pipe->lock);
    pipe->router = router;
    pthread_mutex_unlock(&pipe->lock);
}

struct nrdp_router *nrdp_router_of(struct nrdp_pipe *pipe)
{
    return pipe->router;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *ip_str(uint32_t ip, char *buf)
{
    struct in_addr a = {htonl(ip)};
    return inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN);
}

static int alloc_ring(struct ring *r)
{
    size_t cells = (size_t)r->slots * r->world;
    r->tag = malloc(r->slots * sizeof *r->tag);
    r->bitmap = calloc(r->slots, sizeof *r->bitmap);
    r->plen = calloc(r->slots, sizeof *r->plen);
    r->emitted = calloc(r->slots, 1);
    r->ready = calloc(r->slots, 1);
    r->opcode = calloc(r->slots, 1);
    r->hdr_end = calloc(r->slots, 1);
    r->bufs = aligned_alloc(64, cells * r->stride);
    r->sums = aligned_alloc(64, (size_t)r->slots * r->mtu);
    if (!r->tag || !r->bitmap || !r->plen || !r->emitted || !r->ready || !r->opcode
        || !r->hdr_end || !r->bufs || !r->sums)
        return -1;
    for (uint32_t i = 0; i < r->slots; i++) {
        r->tag[i] = EMPTY;
        r->plen[i] = r->mtu;
    }
    memset(r->bufs, 0, cells * r->stride);      /* touched now: no page faults on the data path */
    memset(r->sums, 0, (size_t)r->slots * r->mtu);
    r->xpow_len = r->mtu;
    r->xpow = nrdp_crc32_xpow(r->mtu);
    return 0;
}

/* The new connections' keys clash with each other or the table: an error message. */
static int check_keys(const struct nrdp_pipe *pipe, const struct nrdp_ring_desc *ring,
                      const struct conn *c, uint32_t n, char *err, size_t errlen)
{
    char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < i; j++) {
            struct nrdp_key ri = resp_key(&c[i]), rj = resp_key(&c[j]);
            struct nrdp_key qi = req_key(&c[i]), qj = req_key(&c[j]);
            if (ri.addrs == rj.addrs && ri.dqp == rj.dqp)
                return fail(err, errlen, "ring %s: two connections from %s QPN %u to %s",
                            ring->ring_id, ip_str(c[i].src_ip, a), c[i].src_qpn,
                            ip_str(c[i].dst_ip, b));
            if (qi.addrs == qj.addrs && qi.dqp == qj.dqp)
                return fail(err, errlen, "ring %s: two connections share ⟨SrcIP, DstIP, "
                            "DestQP⟩", ring->ring_id);
        }
    for (uint32_t i = 0; i < n; i++) {
        int t = table_find(pipe->req, pipe->tcap, req_key(&c[i]));
        if (t == EMPTY)
            t = table_find(pipe->resp, pipe->tcap, resp_key(&c[i]));
        if (t != EMPTY) {
            const struct conn *o = &pipe->conns[t];
            return fail(err, errlen, "connection %s -> %s (QPN %u -> DestQP %u) is already "
                        "registered by ring %s", ip_str(o->src_ip, a), ip_str(o->dst_ip, b),
                        o->src_qpn, o->dst_qpn, pipe->rings[o->ring].id);
        }
    }
    return 0;
}

int nrdp_register_ring(struct nrdp_pipe *pipe, const struct nrdp_ring_desc *ring,
                       const struct nrdp_conn_desc *conns, char *err, size_t errlen)
{
    const char *id = ring->ring_id;
    uint32_t w = ring->world_size, n = ring->slots;
    if (memchr(id, 0, sizeof ring->ring_id) == NULL)
        return fail(err, errlen, "ring id not terminated within %zu bytes",
                    sizeof ring->ring_id);
    if (w < 2 || w > NRDP_MAX_RANKS)
        return fail(err, errlen, "ring %s: %u ranks, need 2..%d", id, w, NRDP_MAX_RANKS);
    if (ring->mtu < 256 || ring->mtu > NRDP_MAX_MTU || ring->mtu & (ring->mtu - 1))
        return fail(err, errlen, "ring %s: path MTU %u is not a power of two in 256..%d",
                    id, ring->mtu, NRDP_MAX_MTU);
    if (!n || n > NRDP_MAX_SLOTS || n & (n - 1))
        return fail(err, errlen, "ring %s: %u slots, need a power of two <= %d", id, n,
                    NRDP_MAX_SLOTS);
    struct conn c[NRDP_MAX_RANKS];
    for (uint32_t i = 0; i < w; i++) {
        const struct nrdp_conn_desc *d = &conns[i];
        if (d->rank != i)
            return fail(err, errlen, "ring %s: connection %u is rank %u's", id, i, d->rank);
        if (d->psn0 > NRDP_PSN_MASK || d->dst_qpn > NRDP_PSN_MASK
            || d->src_qpn > NRDP_PSN_MASK)
            return fail(err, errlen, "ring %s: rank %u: psn0 %u / QPNs %u, %u not 24-bit",
                        id, i, d->psn0, d->src_qpn, d->dst_qpn);
        c[i] = (struct conn){.ring = EMPTY, .rank = i, .src_ip = d->src_ip,
                             .dst_ip = d->dst_ip, .src_qpn = d->src_qpn,
                             .dst_qpn = d->dst_qpn, .psn0 = d->psn0,
                             .in_port = d->in_port, .out_port = d->out_port};
    }
    pthread_mutex_lock(&pipe->lock);
    int rc = check_keys(pipe, ring, c, w, err, errlen);
    int ri = EMPTY, slot[NRDP_MAX_RANKS];
    uint32_t found = 0;
    for (uint32_t i = 0; !rc && i < pipe->max_rings && ri == EMPTY; i++)
        if (!pipe->rings[i].used)
            ri = (int)i;
    for (uint32_t i = 0; !rc && i < pipe->max_conns && found < w; i++)
        if (pipe->conns[i].ring == EMPTY)
            slot[found++] = (int)i;
    if (!rc && (ri == EMPTY || found < w))
        rc = fail(err, errlen, "ring %s: no room (%u rings, %u connections at most)", id,
                  pipe->max_rings, pipe->max_conns);
    struct ring *r = ri == EMPTY ? NULL : &pipe->rings[ri];
    if (!rc) {
        *r = (struct ring){.used = 1, .world = w, .mtu = ring->mtu, .slots = n,
                           .mask = n - 1, .full = w == 32 ? 0xFFFFFFFFu : (1u << w) - 1,
                           .stride = (PAYLOAD_OFF + ring->mtu + NRDP_ICRC_LEN + 63) & ~63u};
        snprintf(r->id, sizeof r->id, "%s", id);
        if (alloc_ring(r)) {
            free_ring(r);
            rc = fail(err, errlen, "ring %s: out of memory for %u slots", id, n);
        }
    }
    if (!rc) {
        for (uint32_t i = 0; i < w; i++) {
            c[i].ring = ri;
            pipe->conns[slot[i]] = c[i];
            r->conn[i] = slot[i];
            r->out_port[i] = c[i].out_port;
            r->psn0[i] = c[i].psn0;
            table_put(pipe->req, pipe->tcap, req_key(&c[i]), slot[i]);
            table_put(pipe->resp, pipe->tcap, resp_key(&c[i]), slot[i]);
        }
        rc = ri;
    }
    pthread_mutex_unlock(&pipe->lock);
    return rc;
}

static struct ring *ring_of(struct nrdp_pipe *pipe, int handle)
{
    if (handle < 0 || (uint32_t)handle >= pipe->max_rings || !pipe->rings[handle].used)
        return NULL;
    return &pipe->rings[handle];
}

int nrdp_unregister_ring(struct nrdp_pipe *pipe, int handle)
{
    pthread_mutex_lock(&pipe->lock);
    struct ring *r = ring_of(pipe, handle);
    if (r) {
        for (uint32_t i = 0; i < r->world; i++) {
            struct conn *c = &pipe->conns[r->conn[i]];
            table_del(pipe->req, pipe->tcap, req_key(c));
            table_del(pipe->resp, pipe->tcap, resp_key(c));
            c->ring = EMPTY;
        }
        free_ring(r);
    }
    pthread_mutex_unlock(&pipe->lock);
    return r ? 0 : -1;
}

int nrdp_ring_stats(struct nrdp_pipe *pipe, int handle, struct nrdp_ring_stats *out)
{
    pthread_mutex_lock(&pipe->lock);
    struct ring *r = ring_of(pipe, handle);
    if (r)
        *out = (struct nrdp_ring_stats){r->world, r->slots, r->next_emit, r->completed,
                                        r->results_sent};
    pthread_mutex_unlock(&pipe->lock);
    return r ? 0 : -1;
}

int nrdp_conn_stats(struct nrdp_pipe *pipe, int handle, uint32_t rank,
                    struct nrdp_conn_stats *out)
{
    pthread_mutex_lock(&pipe->lock);
    struct ring *r = ring_of(pipe, handle);
    int ok = r && rank < r->world;
    if (ok)
        *out = pipe->conns[r->conn[rank]].st;
    pthread_mutex_unlock(&pipe->lock);
    return ok ? 0 : -1;
}
