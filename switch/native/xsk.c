/* AF_XDP ports (libxdp's xsk API): one socket per switch port on queue 0, every socket of
 * a worker sharing that worker's UMEM (XDP_SHARED_UMEM), so a frame received on one port
 * leaves by another without a copy. Copy mode (XDP_COPY: veth and tap have no zero-copy)
 * with multi-buffer frames (XDP_USE_SG: a chunk is at most PAGE_SIZE, a path MTU 4096
 * frame needs two). Each port runs an XDP program of its own (xdp_prog_attach: five
 * instructions redirecting every frame of queue 0 to the socket), loaded as frags-aware
 * (BPF_F_XDP_HAS_FRAGS): veth then takes it in driver mode at any MTU, and generic mode
 * does not linearise a frame first. libxdp only makes the socket (its program load
 * inhibited), so no bpffs is needed (switch/native/README.md).
 *
 * UMEM layout of a worker: chunks [0, nrx) are received into (the fill rings' supply);
 * chunks [nrx, nchunks) form TX buffers of `txspan` contiguous chunks each, which frames
 * built by the switch (results, copies) are written into. io.h states the ownership
 * invariant every chunk keeps.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/bpf.h>
#include <linux/if_link.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <xdp/xsk.h>

#include "io.h"

#define HEADROOM 0u

struct xsk_port {
    struct xsk_socket *xsk;
    int map_fd, prog_fd;          /* the port's XSKMAP and XDP program, -1: none */
    uint32_t xdp_flags;           /* how the program is attached (0: not attached) */
    struct xsk_ring_cons rx, cq;
    struct xsk_ring_prod tx, fq;
    uint32_t tx_pending;          /* descriptors submitted since the last kick */
};

static inline uint64_t chunk_of(uint64_t addr) { return addr & ~(uint64_t)(NRIO_CHUNK - 1); }

/* The one place a chunk changes hands; a wrong `from` is counted, the move still made
 * (the chunk's new owner is the truth from now on). */
static inline void chunk_move(struct umem_pool *pool, uint64_t chunk, int from, int to)
{
    uint8_t *s = &pool->state[chunk / NRIO_CHUNK];
    if (*s != from)
        pool->errors++;
    *s = (uint8_t)to;
}

int umem_pool_init(struct umem_pool *pool, uint64_t nrx, uint64_t ntx, uint32_t txspan,
                   char *err, size_t errlen)
{
    memset(pool, 0, sizeof(*pool));
    pool->nrx = nrx;
    pool->txspan = txspan;
    pool->nchunks = nrx + ntx * txspan;
    size_t size = pool->nchunks * NRIO_CHUNK;
    pool->area = mmap(NULL, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (pool->area == MAP_FAILED) {
        snprintf(err, errlen, "UMEM of %zu MiB: %s", size >> 20, strerror(errno));
        pool->area = NULL;
        return -1;
    }
    pool->free = calloc(nrx, sizeof(uint64_t));
    pool->txfree = calloc(ntx ? ntx : 1, sizeof(uint64_t));
    pool->state = calloc(pool->nchunks, 1);
    if (!pool->free || !pool->txfree || !pool->state) {
        snprintf(err, errlen, "out of memory for the UMEM's bookkeeping");
        return -1;
    }
    for (uint64_t i = 0; i < nrx; i++)
        pool->free[pool->nfree++] = (nrx - 1 - i) * NRIO_CHUNK;
    for (uint64_t i = 0; i < ntx; i++)
        pool->txfree[pool->ntxfree++] = (nrx + (ntx - 1 - i) * txspan) * NRIO_CHUNK;
    return 0;
}

void umem_pool_free(struct umem_pool *pool)
{
    if (pool->umem)
        xsk_umem__delete(pool->umem);
    if (pool->area)
        munmap(pool->area, pool->nchunks * NRIO_CHUNK);
    free(pool->free);
    free(pool->txfree);
    free(pool->state);
    memset(pool, 0, sizeof(*pool));
}

uint8_t *umem_tx_buffer(struct umem_pool *pool, uint64_t *addr)
{
    if (!pool->ntxfree)
        return NULL;
    *addr = pool->txfree[--pool->ntxfree];
    chunk_move(pool, *addr, CH_FREE, CH_APP);
    return pool->area + *addr;
}

void umem_tx_buffer_put(struct umem_pool *pool, uint64_t addr)
{
    chunk_move(pool, addr, CH_APP, CH_FREE);
    pool->txfree[pool->ntxfree++] = addr;
}

static void chunk_free(struct umem_pool *pool, uint64_t chunk, int from)
{
    chunk_move(pool, chunk, from, CH_FREE);
    pool->free[pool->nfree++] = chunk;
}

/* A completed TX descriptor: its chunk goes back to the stack it came from (a TX buffer
 * by its first chunk; its other chunks' completions carry nothing). */
static void tx_completed(struct umem_pool *pool, uint64_t addr)
{
    uint64_t chunk = chunk_of(addr);
    if (chunk < pool->nrx * NRIO_CHUNK) {
        chunk_free(pool, chunk, CH_KERNEL_TX);
    } else if ((chunk / NRIO_CHUNK - pool->nrx) % pool->txspan == 0) {
        chunk_move(pool, chunk, CH_KERNEL_TX, CH_FREE);
        pool->txfree[pool->ntxfree++] = chunk;
    }
}

static void refill(struct port *p)
{
    struct xsk_port *x = p->impl;
    struct umem_pool *pool = p->pool;
    uint32_t want = xsk_prod_nb_free(&x->fq, p->ring_size);
    if (want > pool->nfree)
        want = (uint32_t)pool->nfree;
    uint32_t idx;
    if (!want || xsk_ring_prod__reserve(&x->fq, want, &idx) != want)
        return;
    for (uint32_t i = 0; i < want; i++) {
        uint64_t chunk = pool->free[--pool->nfree];
        chunk_move(pool, chunk, CH_FREE, CH_KERNEL_RX);
        *xsk_ring_prod__fill_addr(&x->fq, idx + i) = chunk;
    }
    xsk_ring_prod__submit(&x->fq, want);
}

static void reap(struct port *p)
{
    struct xsk_port *x = p->impl;
    uint32_t idx, n = xsk_ring_cons__peek(&x->cq, p->ring_size, &idx);
    for (uint32_t i = 0; i < n; i++)
        tx_completed(p->pool, *xsk_ring_cons__comp_addr(&x->cq, idx + i));
    if (n)
        xsk_ring_cons__release(&x->cq, n);
}

/* Copy mode sends in the sendto(2) itself, at most 32 descriptors a call (the kernel's
 * TX_BATCH_SIZE, -EAGAIN while more wait): kick until the ring is taken, reaping
 * completions when the kernel finds the completion ring full. */
static void kick(struct port *p)
{
    struct xsk_port *x = p->impl;
    int fd = xsk_socket__fd(x->xsk);
    for (uint32_t rounds = x->tx_pending / 32 + 2; rounds; rounds--) {
        if (sendto(fd, NULL, 0, MSG_DONTWAIT, NULL, 0) >= 0)
            break;
        if (errno != EAGAIN && errno != EBUSY && errno != ENOBUFS)
            break;
        reap(p);
    }
    x->tx_pending = 0;
}

static uint32_t xsk_rx(struct port *p, struct rx_frame *out, uint32_t max)
{
    struct xsk_port *x = p->impl;
    struct umem_pool *pool = p->pool;
    uint32_t idx, got = xsk_ring_cons__peek(&x->rx, max * NRIO_MAX_PIECES, &idx);
    uint32_t n = 0, used = 0, i = 0;
    while (i < got && n < max) {
        struct rx_frame *f = &out[n];
        uint32_t start = i, len = 0, pieces = 0;
        int complete = 0, oversize = 0;
        while (i < got) {
            const struct xdp_desc *d = xsk_ring_cons__rx_desc(&x->rx, idx + i++);
            if (pieces < NRIO_MAX_PIECES) {
                f->piece[pieces] = d->addr;
                f->piece_len[pieces] = d->len;
            } else {
                oversize = 1;
            }
            pieces++;
            len += d->len;
            if (!(d->options & XDP_PKT_CONTD)) {
                complete = 1;
                break;
            }
        }
        if (!complete) {                 /* the rest of it is not in the ring yet */
            i = start;
            break;
        }
        used = i;
        for (uint32_t k = start; k < i; k++)
            chunk_move(pool, chunk_of(xsk_ring_cons__rx_desc(&x->rx, idx + k)->addr),
                       CH_KERNEL_RX, CH_APP);
        if (oversize || len > p->max_frame) {
            CNT_ADD(p->c.rx_oversize, 1);
            for (uint32_t k = start; k < i; k++)
                chunk_free(pool, chunk_of(xsk_ring_cons__rx_desc(&x->rx, idx + k)->addr),
                           CH_APP);
            continue;
        }
        f->npieces = pieces;
        f->len = len;
        f->data = pieces == 1 ? xsk_umem__get_data(pool->area, f->piece[0]) : NULL;
        n++;
    }
    if (used)
        xsk_ring_cons__release(&x->rx, used);
    if (got > used)
        xsk_ring_cons__cancel(&x->rx, got - used);
    return n;
}

void xsk_rx_gather(struct port *p, struct rx_frame *f, uint8_t *scratch)
{
    for (uint32_t k = 0, off = 0; k < f->npieces; off += f->piece_len[k++])
        memcpy(scratch + off, xsk_umem__get_data(p->pool->area, f->piece[k]), f->piece_len[k]);
    f->data = scratch;
    CNT_ADD(p->c.rx_gathered, 1);
}

static void xsk_rx_done(struct port *p, struct rx_frame *f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t k = 0; k < f[i].npieces; k++)
            chunk_free(p->pool, chunk_of(f[i].piece[k]), CH_APP);
        f[i].npieces = 0;
    }
}

/* Queue `pieces` descriptors on p's TX ring; ownership of their chunks passes to the
 * kernel. -1 (nothing queued) when the ring has no room even after a kick. */
static int tx_descs(struct port *p, const uint64_t *addr, const uint32_t *len, uint32_t pieces)
{
    struct xsk_port *x = p->impl;
    uint32_t idx;
    if (xsk_ring_prod__reserve(&x->tx, pieces, &idx) != pieces) {
        kick(p);
        reap(p);
        if (xsk_ring_prod__reserve(&x->tx, pieces, &idx) != pieces)
            return -1;
    }
    for (uint32_t k = 0; k < pieces; k++) {
        struct xdp_desc *d = xsk_ring_prod__tx_desc(&x->tx, idx + k);
        d->addr = addr[k];
        d->len = len[k];
        d->options = k + 1 < pieces ? XDP_PKT_CONTD : 0;
        chunk_move(p->pool, chunk_of(addr[k]), CH_APP, CH_KERNEL_TX);
    }
    xsk_ring_prod__submit(&x->tx, pieces);
    x->tx_pending += pieces;
    CNT_ADD(p->c.tx_packets, 1);
    return 0;
}

/* A TX buffer (from umem_tx_buffer) holding `len` bytes, sent from p: split in chunk-sized
 * descriptors over its contiguous chunks. */
int xsk_tx_buffer(struct port *p, uint64_t addr, uint32_t len)
{
    uint64_t a[NRIO_MAX_PIECES];
    uint32_t l[NRIO_MAX_PIECES], pieces = 0;
    for (uint32_t off = 0; off < len || pieces == 0; off += NRIO_CHUNK, pieces++) {
        a[pieces] = addr + off;
        l[pieces] = len - off < NRIO_CHUNK ? len - off : NRIO_CHUNK;
        if (pieces)               /* the buffer's other chunks follow its first */
            p->pool->state[chunk_of(a[pieces]) / NRIO_CHUNK] = CH_APP;
    }
    if (tx_descs(p, a, l, pieces) < 0) {
        for (uint32_t k = 1; k < pieces; k++)
            p->pool->state[chunk_of(a[k]) / NRIO_CHUNK] = CH_FREE;
        umem_tx_buffer_put(p->pool, addr);
        CNT_ADD(p->c.tx_errors, 1);
        return -1;
    }
    CNT_ADD(p->c.tx_bytes, len);
    return 0;
}

static int xsk_tx_copy(struct port *p, const uint8_t *data, uint32_t len)
{
    uint64_t addr;
    uint8_t *buf = len <= p->pool->txspan * NRIO_CHUNK ? umem_tx_buffer(p->pool, &addr) : NULL;
    if (!buf) {
        CNT_ADD(p->c.tx_errors, 1);
        return -1;
    }
    memcpy(buf, data, len);
    CNT_ADD(p->c.tx_copied, 1);
    return xsk_tx_buffer(p, addr, len);
}

static int xsk_tx_frame(struct port *p, struct port *from, struct rx_frame *f)
{
    if (from->pool != p->pool || !f->npieces)
        return xsk_tx_copy(p, f->data, f->len);
    if (tx_descs(p, f->piece, f->piece_len, f->npieces) < 0) {
        CNT_ADD(p->c.tx_errors, 1);
        return -1;                    /* the frame stays the caller's: rx_done frees it */
    }
    CNT_ADD(p->c.tx_bytes, f->len);
    f->npieces = 0;
    return 0;
}

static void xsk_flush(struct port *p)
{
    struct xsk_port *x = p->impl;
    if (x->tx_pending)
        kick(p);
    reap(p);
    refill(p);
}

/* Queue 0's frames to the socket in the XSKMAP (else the stack): r2 = ctx->rx_queue_index;
 * return bpf_redirect_map(map, r2, XDP_PASS). Loaded frags-aware, attached in `xdp_flags`'
 * mode; the map and program fds in x. 0, or -1 with the reason in err. */
static int xdp_prog_attach(struct xsk_port *x, int ifindex, uint32_t xdp_flags, char *err,
                           size_t errlen)
{
    x->map_fd = bpf_map_create(BPF_MAP_TYPE_XSKMAP, "nrio_xsks", 4, 4, 1, NULL);
    if (x->map_fd < 0) {
        snprintf(err, errlen, "XSKMAP: %s", strerror(errno));
        return -1;
    }
    struct bpf_insn insns[] = {
        {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_1,
         .off = offsetof(struct xdp_md, rx_queue_index)},
        {.code = BPF_LD | BPF_DW | BPF_IMM, .dst_reg = BPF_REG_1,
         .src_reg = BPF_PSEUDO_MAP_FD, .imm = x->map_fd},
        {0},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_3, .imm = XDP_PASS},
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_redirect_map},
        {.code = BPF_JMP | BPF_EXIT},
    };
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .prog_flags = BPF_F_XDP_HAS_FRAGS);
    x->prog_fd = bpf_prog_load(BPF_PROG_TYPE_XDP, "nrio_xsk", "GPL", insns,
                               sizeof insns / sizeof insns[0], &opts);
    if (x->prog_fd < 0) {
        snprintf(err, errlen, "XDP program: %s", strerror(errno));
        return -1;
    }
    int r = bpf_xdp_attach(ifindex, x->prog_fd, xdp_flags, NULL);
    if (r < 0) {
        snprintf(err, errlen, "XDP attach (%s mode): %s",
                 xdp_flags & XDP_FLAGS_DRV_MODE ? "driver" : "generic", strerror(-r));
        return -1;
    }
    x->xdp_flags = xdp_flags;
    return 0;
}

/* Undoes xdp_prog_attach and the socket (each part that exists). */
static void xsk_release(struct xsk_port *x, int ifindex)
{
    if (x->xsk)
        xsk_socket__delete(x->xsk);
    if (x->xdp_flags)
        bpf_xdp_detach(ifindex, x->xdp_flags, NULL);
    if (x->prog_fd >= 0)
        close(x->prog_fd);
    if (x->map_fd >= 0)
        close(x->map_fd);
    free(x);
}

static void xsk_close(struct port *p)
{
    if (p->impl)
        xsk_release(p->impl, p->ifindex);
    p->impl = NULL;
}

static int xsk_fd(struct port *p) { return xsk_socket__fd(((struct xsk_port *)p->impl)->xsk); }

static void xsk_read_kernel_stats(struct port *p)
{
    struct xdp_statistics st;
    socklen_t len = sizeof(st);
    if (getsockopt(xsk_fd(p), SOL_XDP, XDP_STATISTICS, &st, &len) == 0) {
        __atomic_store_n(&p->c.rx_dropped, st.rx_dropped + st.rx_ring_full, __ATOMIC_RELAXED);
        __atomic_store_n(&p->c.rx_fill_empty, st.rx_fill_ring_empty_descs, __ATOMIC_RELAXED);
    }
}

/* Opens p as an AF_XDP socket in `kind` (NRIO_XSK_DRV or NRIO_XSK_SKB) on pool's UMEM
 * (created with the first socket). 0, or -1 with the reason in err. */
int xsk_port_open(struct port *p, struct umem_pool *pool, int kind, char *err, size_t errlen)
{
    struct xsk_port *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    x->map_fd = x->prog_fd = -1;
    uint32_t xdp_flags = kind == NRIO_XSK_DRV ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
    char why[160];
    if (xdp_prog_attach(x, p->ifindex, xdp_flags, why, sizeof why) < 0) {
        snprintf(err, errlen, "%s: %s", p->ifname, why);
        xsk_release(x, p->ifindex);
        return -1;
    }
    int r = 0, created = !pool->umem;
    if (created) {
        struct xsk_umem_config uc = {
            .fill_size = p->ring_size, .comp_size = p->ring_size,
            .frame_size = NRIO_CHUNK, .frame_headroom = HEADROOM, .flags = 0,
        };
        r = xsk_umem__create(&pool->umem, pool->area, pool->nchunks * NRIO_CHUNK,
                             &x->fq, &x->cq, &uc);
        if (r) {
            snprintf(err, errlen, "xsk_umem__create: %s", strerror(-r));
            pool->umem = NULL;
            xsk_release(x, p->ifindex);
            return -1;
        }
    }
    struct xsk_socket_config sc = {
        .rx_size = p->ring_size, .tx_size = p->ring_size,
        .libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD, .xdp_flags = xdp_flags,
        .bind_flags = XDP_COPY | XDP_USE_SG,
    };
    /* A socket closed on this queue just before (a failed driver-mode try) frees it from
     * a workqueue: EBUSY until then. */
    for (int tries = 0; tries < 100; tries++) {
        r = xsk_socket__create_shared(&x->xsk, p->ifname, 0, pool->umem, &x->rx, &x->tx,
                                      &x->fq, &x->cq, &sc);
        if (r != -EBUSY)
            break;
        usleep(10000);
    }
    if (r) {
        snprintf(err, errlen, "%s: AF_XDP socket (%s XDP): %s", p->ifname,
                 kind == NRIO_XSK_DRV ? "driver" : "generic", strerror(-r));
        if (created) {            /* its rings were set up on the failed socket: start over */
            xsk_umem__delete(pool->umem);
            pool->umem = NULL;
        }
        x->xsk = NULL;
        xsk_release(x, p->ifindex);
        return -1;
    }
    int zero = 0, fd = xsk_socket__fd(x->xsk);
    if (bpf_map_update_elem(x->map_fd, &zero, &fd, 0) < 0) {
        snprintf(err, errlen, "%s: XSKMAP entry: %s", p->ifname, strerror(errno));
        xsk_release(x, p->ifindex);      /* the UMEM stays the pool's (umem_pool_free) */
        return -1;
    }
    p->impl = x;
    p->pool = pool;
    p->ops = &xsk_port_ops;
    p->c.kind = (uint64_t)kind;
    refill(p);
    return 0;
}

const struct port_ops xsk_port_ops = {
    .rx = xsk_rx, .rx_done = xsk_rx_done, .tx_copy = xsk_tx_copy, .tx_frame = xsk_tx_frame,
    .flush = xsk_flush, .close = xsk_close, .fd = xsk_fd,
    .read_kernel_stats = xsk_read_kernel_stats,
};
