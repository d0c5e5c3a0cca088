/* The native data plane's ports and worker threads behind the C API of nrio.h.
 *
 * Each worker is one pinned thread that alone touches its ports' rings, its UMEM and its
 * pipeline instance: per round it takes up to `batch` frames from each of its ports, runs
 * each through process(), queues what comes out on the TX rings, then kicks the kernel,
 * reaps completions and refills the fill rings (xsk.c). A frame bound for a port of
 * another worker leaves by that port's AF_PACKET socket (the kernel serialises senders):
 * only L2 traffic between rings' port groups takes that path, and it is counted
 * (nrio_worker_stats.outputs, port tx_copied). Counters are single-writer (io.h).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "io.h"
#ifdef NRIO_PIPELINE_STUB
#include "pipeline_stub.h"
#else
#include "pipeline.h"
#include "packet.h"
#include "router.h"
#endif

#define MAX_PORT_NUMBER 4096

struct worker {
    struct nrio *io;
    uint32_t index;
    pthread_t thread;
    int running;
    struct port *ports[NRIO_MAX_PORTS];
    uint32_t nports;
    struct umem_pool pool;
    int has_pool;
    uint8_t *scratch;             /* max_frame bytes: the multi-chunk frame being handled */
    struct rx_frame *frames;
    struct nrdp_pipe *pipe;
    struct nrdp_out_batch out;
    struct nrio_worker_stats st;
    uint64_t expect;              /* record cpu_ns / busy_until once frames reach it (0: never) */
};

struct nrio {
    struct nrio_config cfg;
    struct port ports[NRIO_MAX_PORTS];
    uint32_t nports;
    struct worker workers[NRIO_MAX_WORKERS];
    int16_t by_number[MAX_PORT_NUMBER];   /* port number -> index in ports, -1 */
    int slow_fd[NRIO_MAX_PORTS];          /* AF_PACKET senders for other workers' frames */
    volatile int stop;
    pthread_mutex_t stats_lock;           /* reads of the kernel's (resetting) statistics */
};

static uint64_t now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct port *nrio_port_by_number(struct nrio *io, uint32_t number)
{
    if (number >= MAX_PORT_NUMBER || io->by_number[number] < 0)
        return NULL;
    return &io->ports[io->by_number[number]];
}

/* The pipeline's nrdp_tx_alloc_fn: a result for one of w's AF_XDP ports is built straight
 * in a TX buffer of w's UMEM (FREE -> APP; nrio_send passes it to the kernel), else NULL. */
static uint8_t *worker_tx_alloc(void *ctx, uint32_t number, uint32_t len)
{
    struct worker *w = ctx;
    uint64_t addr;
    if (nrdp_router_of(w->pipe))      /* one-armed: the router may drop an output, so no */
        return NULL;                  /* TX buffer (it would leak): the pipe's own buffers */
    struct port *q = nrio_port_by_number(w->io, number);
    if (!q || q->worker != w->index || q->pool != &w->pool || !w->has_pool ||
        len > w->pool.txspan * NRIO_CHUNK)
        return NULL;
    return umem_tx_buffer(&w->pool, &addr);
}

/* Is data a TX buffer of w's UMEM (a result worker_tx_alloc gave)? */
static int in_tx_buffers(const struct worker *w, const uint8_t *data)
{
    const struct umem_pool *pool = &w->pool;
    return w->has_pool && data >= pool->area + pool->nrx * NRIO_CHUNK &&
           data < pool->area + pool->nchunks * NRIO_CHUNK;
}

/* Sends len bytes out of `port` for worker w: its own port's ring, or the slow path. */
static int nrio_send(struct worker *w, struct port *from, uint32_t number, const uint8_t *data,
              uint32_t len, struct rx_frame *whole)
{
    struct port *q = nrio_port_by_number(w->io, number);
    if (!q)
        return -1;
    CNT_ADD(w->st.outputs, 1);
    if (in_tx_buffers(w, data))          /* worker_tx_alloc checked q is w's AF_XDP port */
        return xsk_tx_buffer(q, (uint64_t)(data - w->pool.area), len);
    if (q->worker != w->index) {
        int fd = w->io->slow_fd[q - w->io->ports];
        return fd >= 0 && send(fd, data, len, MSG_DONTWAIT) == (ssize_t)len ? 0 : -1;
    }
    if (whole && whole->data == data)
        return q->ops->tx_frame(q, from, whole);
    return q->ops->tx_copy(q, data, len);
}

/* One received frame through the pipeline; what comes out is queued on its ports. */
static void process_frame(struct worker *w, struct port *p, struct rx_frame *f)
{
#ifndef NRIO_PIPELINE_STUB
    struct nrdp_fields roce;
    struct nrdp_router *router = nrdp_router_of(w->pipe);
    if ((!router || nrdp_router_for_me(router, f->data, f->len)) &&
        nrdp_parse(f->data, f->len, &roce))   /* the software switch's roce_packets */
        CNT_ADD(p->c.roce_packets, 1);
    int n = router ? nrdp_route(router, w->pipe, f->data, f->len, &w->out)   /* one-armed */
                   : nrdp_process(w->pipe, p->number, f->data, f->len, &w->out);
#else
    int n = nrdp_process(w->pipe, p->number, f->data, f->len, &w->out);
#endif
    if (n == NRDP_NOT_MINE) {         /* not an aggregated connection's: L2 (l2.h) */
        w->out.n = nrdp_l2_forward(nrdp_l2_of(w->pipe), p->number, f->data, f->len,
                                   w->out.out, sizeof w->out.out / sizeof w->out.out[0]);
        n = (int)w->out.n;
    }
    for (int i = 0; i < n; i++) {
        const struct nrdp_out *o = &w->out.out[i];
        /* the input itself goes as received to its last port, copies to the others */
        int last = o->data == f->data;
        for (int j = i + 1; last && j < n; j++)
            last = w->out.out[j].data != f->data;
        nrio_send(w, p, o->port, o->data, o->len, last ? f : NULL);
    }
}

static void run_round(struct worker *w, int *busy)
{
    uint32_t total = 0;
    for (uint32_t i = 0; i < w->nports; i++) {
        struct port *p = w->ports[i];
        uint32_t n = p->ops->rx(p, w->frames, p->batch);
        for (uint32_t k = 0; k < n; k++) {
            CNT_ADD(p->c.rx_packets, 1);
            CNT_ADD(p->c.rx_bytes, w->frames[k].len);
            if (!w->frames[k].data)
                xsk_rx_gather(p, &w->frames[k], w->scratch);
            process_frame(w, p, &w->frames[k]);
        }
        if (n)
            p->ops->rx_done(p, w->frames, n);
        total += n;
    }
    for (uint32_t i = 0; i < w->nports; i++)
        w->ports[i]->ops->flush(w->ports[i]);
    *busy = total > 0;
    if (total) {
        CNT_ADD(w->st.frames, total);
        if (w->expect && w->st.frames >= w->expect && !w->st.busy_until_ns) {
            __atomic_store_n(&w->st.cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID), __ATOMIC_RELAXED);
            __atomic_store_n(&w->st.busy_until_ns, now_ns(CLOCK_MONOTONIC), __ATOMIC_RELEASE);
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct nrio *io = w->io;
    w->st.tid = (int32_t)syscall(SYS_gettid);
    char name[16];
    snprintf(name, sizeof name, "nrio-w%u", w->index);
    pthread_setname_np(pthread_self(), name);         /* what perf and top show */
    w->st.cpu = -1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (io->cfg.cpu_base >= 0 && ncpu > 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        int cpu = (int)((io->cfg.cpu_base + (int)w->index) % ncpu);
        CPU_SET(cpu, &set);
        if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0)
            w->st.cpu = cpu;
    }
    struct pollfd fds[NRIO_MAX_PORTS];
    for (uint32_t i = 0; i < w->nports; i++)
        fds[i] = (struct pollfd){.fd = w->ports[i]->ops->fd(w->ports[i]), .events = POLLIN};
    __atomic_store_n(&w->st.started_ns, now_ns(CLOCK_MONOTONIC), __ATOMIC_RELEASE);
    while (!__atomic_load_n(&io->stop, __ATOMIC_ACQUIRE)) {
        int busy;
        run_round(w, &busy);
        if (!busy && io->cfg.idle_poll_us)
            poll(fds, w->nports, (int)((io->cfg.idle_poll_us + 999) / 1000));
    }
    if (!w->st.busy_until_ns)
        __atomic_store_n(&w->st.cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID), __ATOMIC_RELAXED);
    return NULL;
}

static int open_port(struct nrio *io, struct port *p, char *err, size_t errlen)
{
    struct worker *w = &io->workers[p->worker];
    char why[256] = "";
    int kinds[2], nk = 0;
    if (io->cfg.xdp_mode == 0 || io->cfg.xdp_mode == NRIO_XSK_DRV)
        kinds[nk++] = NRIO_XSK_DRV;
    if (io->cfg.xdp_mode == 0 || io->cfg.xdp_mode == NRIO_XSK_SKB)
        kinds[nk++] = NRIO_XSK_SKB;
    for (int k = 0; k < nk; k++) {
        if (xsk_port_open(p, &w->pool, kinds[k], why, sizeof(why)) == 0)
            return 0;
        fprintf(stderr, "nrio: port %u: %s\n", p->number, why);
    }
    if (afp_port_open(p, err, errlen) < 0)
        return -1;
    if (nk) {
        p->c.fallback = 1;
        fprintf(stderr, "nrio: port %u (%s): AF_XDP unavailable (%s): AF_PACKET fallback "
                "(TPACKET_V3 ring), counted as fallback=1\n", p->number, p->ifname, why);
    }
    return 0;
}

static int check_config(struct nrio_config *c, uint32_t nports, char *err, size_t errlen)
{
    if (!c->batch)
        c->batch = 64;
    if (!c->ring_size)
        c->ring_size = 4096;
    if (!c->max_frame)
        c->max_frame = 9216;
    if (!c->workers || c->workers > NRIO_MAX_WORKERS || !nports || nports > NRIO_MAX_PORTS ||
        c->batch > NRIO_MAX_BATCH || (c->ring_size & (c->ring_size - 1)) ||
        c->ring_size < 2 * c->batch || c->max_frame < 64 ||
        c->max_frame > NRIO_MAX_PIECES * NRIO_CHUNK - 512 || c->xdp_mode < 0 ||
        c->xdp_mode > NRIO_AFPACKET) {
        snprintf(err, errlen, "bad configuration: workers %u (1..%d), ports %u (1..%d), batch "
                 "%u (..%d), ring_size %u (a power of 2 >= 2 batch), max_frame %u (64..%u), "
                 "xdp_mode %d (0..3)", c->workers, NRIO_MAX_WORKERS, nports, NRIO_MAX_PORTS,
                 c->batch, NRIO_MAX_BATCH, c->ring_size, c->max_frame,
                 NRIO_MAX_PIECES * NRIO_CHUNK - 512, c->xdp_mode);
        return -1;
    }
    return 0;
}

static int open_slow_path(struct nrio *io, uint32_t i)
{
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = 0,
                              .sll_ifindex = io->ports[i].ifindex};
    io->slow_fd[i] = socket(AF_PACKET, SOCK_RAW, 0);
    if (io->slow_fd[i] < 0 || bind(io->slow_fd[i], (struct sockaddr *)&sll, sizeof(sll)) < 0)
        return -1;
    return 0;
}

nrio_t *nrio_create(const struct nrio_port_spec *specs, uint32_t nports,
                    const struct nrio_config *cfg, char *err, size_t errlen)
{
    struct nrio *io = calloc(1, sizeof(*io));
    if (!io) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    io->cfg = *cfg;
    memset(io->by_number, -1, sizeof(io->by_number));
    for (uint32_t i = 0; i < NRIO_MAX_PORTS; i++)
        io->slow_fd[i] = -1;
    pthread_mutex_init(&io->stats_lock, NULL);
    if (check_config(&io->cfg, nports, err, errlen) < 0)
        goto fail;
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);    /* without CAP_IPC_LOCK the UMEM counts here */
    for (uint32_t i = 0; i < nports; i++) {
        struct port *p = &io->ports[i];
        const struct nrio_port_spec *s = &specs[i];
        if (s->number >= MAX_PORT_NUMBER || io->by_number[s->number] >= 0 ||
            s->worker >= io->cfg.workers || !memchr(s->ifname, 0, NRIO_IFNAME)) {
            snprintf(err, errlen, "port %u (%.16s, worker %u): a number below %d used once, a "
                     "worker below %u, an interface name", s->number, s->ifname, s->worker,
                     MAX_PORT_NUMBER, io->cfg.workers);
            goto fail;
        }
        p->number = s->number;
        p->worker = s->worker;
        memcpy(p->ifname, s->ifname, NRIO_IFNAME);
        p->ifindex = (int)if_nametoindex(p->ifname);
        if (!p->ifindex) {
            snprintf(err, errlen, "port %u: no interface %s", p->number, p->ifname);
            goto fail;
        }
        p->batch = io->cfg.batch;
        p->ring_size = io->cfg.ring_size;
        p->max_frame = io->cfg.max_frame;
        io->by_number[p->number] = (int16_t)i;
        struct worker *w = &io->workers[p->worker];
        w->ports[w->nports++] = p;
    }
    io->nports = nports;
    uint32_t txspan = (io->cfg.max_frame + NRIO_CHUNK - 1) / NRIO_CHUNK;
    for (uint32_t k = 0; k < io->cfg.workers; k++) {
        struct worker *w = &io->workers[k];
        w->io = io;
        w->index = k;
        w->scratch = malloc(io->cfg.max_frame);
        w->frames = calloc(io->cfg.batch, sizeof(struct rx_frame));
        if (!w->scratch || !w->frames) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        memset(w->scratch, 0, io->cfg.max_frame);       /* no page faults later */
        if (w->nports && io->cfg.xdp_mode != NRIO_AFPACKET) {
            uint64_t nrx = (uint64_t)w->nports * io->cfg.ring_size * 2;
            uint64_t ntx = (uint64_t)w->nports * io->cfg.ring_size / 2;
            if (umem_pool_init(&w->pool, nrx, ntx, txspan, err, errlen) < 0)
                goto fail;
            w->has_pool = 1;
        }
        for (uint32_t i = 0; i < w->nports; i++)
            if (open_port(io, w->ports[i], err, errlen) < 0)
                goto fail;
    }
    for (uint32_t i = 0; io->cfg.workers > 1 && i < nports; i++) {
        if (open_slow_path(io, i) < 0) {
            snprintf(err, errlen, "%s: AF_PACKET sender: %s", io->ports[i].ifname,
                     strerror(errno));
            goto fail;
        }
    }
    return io;
fail:
    nrio_destroy(io);
    return NULL;
}

int nrio_start(nrio_t *io, void *const *pipes)
{
    if (io->workers[0].running)
        return -EBUSY;
    io->stop = 0;
    for (uint32_t k = 0; k < io->cfg.workers; k++) {
        struct worker *w = &io->workers[k];
        w->pipe = pipes[k];
        nrdp_set_tx_alloc(w->pipe, worker_tx_alloc, w);
        memset(&w->st, 0, sizeof(w->st));
        int r = pthread_create(&w->thread, NULL, worker_main, w);
        if (r) {
            nrdp_set_tx_alloc(w->pipe, NULL, NULL);
            nrio_stop(io);
            return -r;
        }
        w->running = 1;
    }
    return 0;
}

int nrio_stop(nrio_t *io)
{
    __atomic_store_n(&io->stop, 1, __ATOMIC_RELEASE);
    for (uint32_t k = 0; k < io->cfg.workers; k++) {
        struct worker *w = &io->workers[k];
        if (w->running) {
            pthread_join(w->thread, NULL);
            w->running = 0;
            nrdp_set_tx_alloc(w->pipe, NULL, NULL);    /* the pipe may outlive the ports */
        }
    }
    return 0;
}

void nrio_destroy(nrio_t *io)
{
    if (!io)
        return;
    nrio_stop(io);
    for (uint32_t i = 0; i < NRIO_MAX_PORTS; i++) {
        if (io->ports[i].impl)
            io->ports[i].ops->close(&io->ports[i]);
        if (io->slow_fd[i] >= 0)
            close(io->slow_fd[i]);
    }
    for (uint32_t k = 0; k < NRIO_MAX_WORKERS; k++) {
        struct worker *w = &io->workers[k];
        if (w->has_pool)
            umem_pool_free(&w->pool);
        free(w->scratch);
        free(w->frames);
    }
    pthread_mutex_destroy(&io->stats_lock);
    free(io);
}

int nrio_port_counters(nrio_t *io, uint32_t number, struct nrio_port_counters *out)
{
    struct port *p = nrio_port_by_number(io, number);
    if (!p)
        return -ENOENT;
    pthread_mutex_lock(&io->stats_lock);
    p->ops->read_kernel_stats(p);
    pthread_mutex_unlock(&io->stats_lock);
    uint64_t *dst = (uint64_t *)out;
    const uint64_t *src = (const uint64_t *)&p->c;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    return 0;
}

int nrio_worker_stats(nrio_t *io, uint32_t k, struct nrio_worker_stats *out)
{
    if (k >= io->cfg.workers)
        return -ENOENT;
    struct worker *w = &io->workers[k];
    *out = w->st;
    out->frames = __atomic_load_n(&w->st.frames, __ATOMIC_RELAXED);
    out->outputs = __atomic_load_n(&w->st.outputs, __ATOMIC_RELAXED);
    out->busy_until_ns = __atomic_load_n(&w->st.busy_until_ns, __ATOMIC_ACQUIRE);
    if (w->running && !out->busy_until_ns) {    /* not recorded: the thread's CPU so far */
        clockid_t clk;
        if (pthread_getcpuclockid(w->thread, &clk) == 0)
            out->cpu_ns = now_ns(clk);
    }
    if (w->has_pool) {                          /* exact once the worker is stopped */
        out->ownership_errors = w->pool.errors;
        out->chunks_free = w->pool.nfree + w->pool.ntxfree * w->pool.txspan;
        out->chunks_total = w->pool.nchunks;
    }
    return 0;
}

int nrio_expect(nrio_t *io, uint32_t k, uint64_t frames)
{
    if (k >= io->cfg.workers || io->workers[k].running)
        return -EINVAL;
    io->workers[k].expect = frames;
    return 0;
}

int nrio_wait_frames(nrio_t *io, uint64_t frames, uint32_t timeout_ms)
{
    uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        uint64_t sum = 0;
        for (uint32_t k = 0; k < io->cfg.workers; k++)
            sum += __atomic_load_n(&io->workers[k].st.frames, __ATOMIC_RELAXED);
        if (sum >= frames)
            return 0;
        if (now_ns(CLOCK_MONOTONIC) > deadline)
            return -ETIMEDOUT;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

int nrio_port_worker(nrio_t *io, uint32_t number)
{
    struct port *p = nrio_port_by_number(io, number);
    return p ? (int)p->worker : -1;
}
