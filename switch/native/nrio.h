/* The native data plane's packet I/O and worker threads: the C API the Python control
 * plane calls through ctypes (switch/native/README.md, "Packet I/O and workers").
 *
 * One nrio instance owns the switch's ports and W worker threads. Worker w polls the
 * ports given to it and runs every frame they receive through ITS OWN pipeline instance
 * (pipes[w] of nrio_start): all contributions of a ring must arrive on ports of one
 * worker, so every slot's contributions meet on one core (sharding by ring,
 * docs/hardware.md). Every field and counter below is plain data: the layout is mirrored
 * by switch/native/nrio.py (ctypes), keep both in step.
 */
#ifndef NRIO_H
#define NRIO_H

#include <stddef.h>
#include <stdint.h>

#define NRIO_MAX_PORTS 64
#define NRIO_MAX_WORKERS 16
#define NRIO_IFNAME 16
#define NRIO_MAX_FRAME 16384   /* no frame is longer (max_frame is at most this) */

/* How a port moves frames (nrio_port_counters.kind). */
enum nrio_kind {
    NRIO_XSK_DRV = 1,   /* AF_XDP, XDP program in the driver (copy mode unless zero-copy) */
    NRIO_XSK_SKB = 2,   /* AF_XDP, generic (skb) XDP: what a driver without XDP gets */
    NRIO_AFPACKET = 3,  /* the fallback: AF_PACKET, TPACKET_V3 mapped RX ring */
};

struct nrio_port_spec {
    uint32_t number;            /* the switch's port number (the pipeline's in_port) */
    uint32_t worker;            /* the worker that polls it, < nrio_config.workers */
    char ifname[NRIO_IFNAME];
};

struct nrio_config {
    uint32_t workers;           /* 1..NRIO_MAX_WORKERS */
    uint32_t batch;             /* frames per RX/TX burst (0: 64) */
    uint32_t ring_size;         /* per port: RX, TX, fill and completion ring entries (0: 4096; a power of 2) */
    uint32_t max_frame;         /* largest frame in bytes (0: 9216) */
    int32_t xdp_mode;           /* 0 auto (driver, then generic, then AF_PACKET), else an nrio_kind */
    int32_t cpu_base;           /* worker w is pinned to CPU (cpu_base + w) % ncpu; -1: not pinned */
    uint32_t idle_poll_us;      /* an idle worker sleeps in poll(2) this long (0: busy-polls) */
};

/* Per port; only grow. Written by its worker, read by anyone (64-bit loads). */
struct nrio_port_counters {
    uint64_t rx_packets, rx_bytes, tx_packets, tx_bytes;
    uint64_t tx_errors;         /* frames not sent: no TX buffer or ring room, or the kernel refused */
    uint64_t rx_dropped;        /* the kernel's drops before the switch saw them (XDP_STATISTICS rx_dropped + rx_ring_full, or PACKET_STATISTICS) */
    uint64_t rx_fill_empty;     /* frames the kernel had no fill buffer for (AF_XDP) */
    uint64_t rx_gathered;       /* frames received in more than one UMEM chunk, copied contiguous */
    uint64_t rx_oversize;       /* frames longer than max_frame: dropped */
    uint64_t tx_copied;         /* frames sent by copy rather than by handing over the RX chunk */
    uint64_t fallback;          /* 1: this port runs on AF_PACKET because AF_XDP failed (logged) */
    uint64_t kind;              /* an nrio_kind */
    uint64_t roce_packets;      /* RoCEv2 frames received (IPv4 IHL 5, UDP 4791: nrdp_parse; 0 in the stub build) */
};

struct nrio_worker_stats {
    uint64_t frames;            /* frames handled (received and run through the pipeline) */
    uint64_t outputs;           /* frames the pipeline emitted or forwarded */
    uint64_t cpu_ns;            /* the thread's CPU (user + system) up to its last busy round */
    uint64_t busy_until_ns;     /* CLOCK_MONOTONIC at the end of its last busy round */
    uint64_t started_ns;        /* CLOCK_MONOTONIC when it started polling */
    uint64_t ownership_errors;  /* UMEM chunks seen in a state they cannot be in (must stay 0) */
    uint64_t chunks_free, chunks_total;   /* its UMEM chunks held by the worker, of all */
    int32_t cpu;                /* the CPU it is pinned to, -1 if none */
    int32_t tid;                /* its thread id (for /proc/<pid>/task/<tid>) */
};

typedef struct nrio nrio_t;

/* Opens every port (AF_XDP by cfg->xdp_mode, falling back as documented). NULL on error,
 * with the reason in err. Workers are not running yet: frames queue in the RX rings. */
nrio_t *nrio_create(const struct nrio_port_spec *ports, uint32_t nports,
                    const struct nrio_config *cfg, char *err, size_t errlen);
/* Starts the workers; pipes[w] is worker w's pipeline (see pipeline.h). 0, or -errno. */
int nrio_start(nrio_t *io, void *const *pipes);
/* Stops and joins the workers (ports stay open; start again or destroy). */
int nrio_stop(nrio_t *io);
void nrio_destroy(nrio_t *io);
int nrio_port_counters(nrio_t *io, uint32_t port, struct nrio_port_counters *out);
int nrio_worker_stats(nrio_t *io, uint32_t worker, struct nrio_worker_stats *out);
/* Worker k (not running) notes its CPU time and the time when it has handled `frames`
 * frames (nrio_worker_stats cpu_ns, busy_until_ns): a benchmark's end without idle polls. */
int nrio_expect(nrio_t *io, uint32_t worker, uint64_t frames);
/* Waits until the workers together handled `frames` frames; 0, or -ETIMEDOUT. */
int nrio_wait_frames(nrio_t *io, uint64_t frames, uint32_t timeout_ms);
/* The worker of switch port `port`, or -1. */
int nrio_port_worker(nrio_t *io, uint32_t port);

#endif
