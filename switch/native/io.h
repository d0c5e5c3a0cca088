/* Internals shared by xsk.c (AF_XDP ports), afpacket.c (the fallback) and main.c (workers).
 *
 * Frame ownership (AF_XDP): every UMEM chunk of a worker is in exactly one state -
 * FREE (on the worker's free stack), KERNEL_RX (on a fill ring or in an RX ring),
 * APP (a received frame being handled), KERNEL_TX (on a TX ring until its completion).
 * Transitions: FREE->KERNEL_RX (fill), KERNEL_RX->APP (rx), APP->FREE (consumed),
 * APP->KERNEL_TX (forwarded as received), FREE->APP->KERNEL_TX (a frame built for TX),
 * KERNEL_TX->FREE (completion). chunk_move() checks each one; a violation is counted
 * (nrio_worker_stats.ownership_errors), never silently fixed. No malloc after setup.
 */
#ifndef NRIO_IO_H
#define NRIO_IO_H

#include <stdint.h>
#include <stddef.h>
#include <linux/if_xdp.h>
#include "nrio.h"

#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)       /* linux/if_xdp.h of kernels >= 6.6 */
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif

#define NRIO_CHUNK 4096u          /* UMEM chunk: the kernel's largest (PAGE_SIZE) */
#define NRIO_MAX_PIECES 4         /* chunks per frame: 9216 B frames + headroom */
#define NRIO_MAX_BATCH 256

/* 64-bit counters: one writer (the worker), relaxed stores so readers never tear. */
#define CNT_ADD(c, v) __atomic_store_n(&(c), (c) + (v), __ATOMIC_RELAXED)

enum chunk_state { CH_FREE = 0, CH_KERNEL_RX = 1, CH_APP = 2, CH_KERNEL_TX = 3 };

struct umem_pool {                /* one worker's UMEM and its free stacks */
    uint8_t *area;
    uint64_t nchunks;             /* nrx receive chunks, then TX buffers of txspan chunks */
    uint64_t nrx;
    uint32_t txspan;
    uint64_t *free;               /* stack of free receive chunks (addresses) */
    uint64_t nfree;
    uint64_t *txfree;             /* stack of free TX buffers (their first chunk's address) */
    uint64_t ntxfree;
    uint8_t *state;               /* enum chunk_state per chunk */
    uint64_t errors;              /* ownership violations */
    struct xsk_umem *umem;
};

/* A received frame: contiguous data, and the chunks it came in (AF_XDP) or its place
 * in the TPACKET_V3 block (AF_PACKET, where `pieces` is 0). */
struct rx_frame {
    uint8_t *data;
    uint32_t len;
    uint32_t npieces;
    uint64_t piece[NRIO_MAX_PIECES];
    uint32_t piece_len[NRIO_MAX_PIECES];
};

struct port;
struct port_ops {
    /* Up to max frames; a multi-chunk frame's data is NULL until xsk_rx_gather. */
    uint32_t (*rx)(struct port *p, struct rx_frame *out, uint32_t max);
    /* Every frame rx returned was handled: release what is still the ring's. */
    void (*rx_done)(struct port *p, struct rx_frame *f, uint32_t n);
    /* Send len bytes at data (a copy is made); 0, or -1 counted as tx_errors. */
    int (*tx_copy)(struct port *p, const uint8_t *data, uint32_t len);
    /* Send a received frame as it is; ownership passes (AF_XDP: its chunks). */
    int (*tx_frame)(struct port *p, struct port *from, struct rx_frame *f);
    /* Kick the kernel for what was queued, reap completions, refill. */
    void (*flush)(struct port *p);
    void (*close)(struct port *p);
    int (*fd)(struct port *p);
    void (*read_kernel_stats)(struct port *p);
};

struct port {
    uint32_t number, worker;
    char ifname[NRIO_IFNAME];
    int ifindex;
    const struct port_ops *ops;
    struct nrio_port_counters c;
    struct umem_pool *pool;       /* AF_XDP: the worker's */
    void *impl;                   /* struct xsk_port / struct afp_port */
    uint32_t batch, ring_size, max_frame;
};

/* xsk.c */
int umem_pool_init(struct umem_pool *pool, uint64_t nrx, uint64_t ntx, uint32_t txspan,
                   char *err, size_t errlen);
/* A free TX buffer (txspan contiguous chunks) and its UMEM address, or NULL if none. */
uint8_t *umem_tx_buffer(struct umem_pool *pool, uint64_t *addr);
void umem_tx_buffer_put(struct umem_pool *pool, uint64_t addr);
/* A multi-chunk frame made contiguous in scratch (max_frame bytes), just before it is
 * handled (so the copy is still in cache when process() reads it): f->data, counted as
 * rx_gathered. Its chunks stay the frame's. */
void xsk_rx_gather(struct port *p, struct rx_frame *f, uint8_t *scratch);
/* Sends len bytes of the TX buffer at addr from AF_XDP port p (ownership passes). */
int xsk_tx_buffer(struct port *p, uint64_t addr, uint32_t len);
void umem_pool_free(struct umem_pool *pool);
int xsk_port_open(struct port *p, struct umem_pool *pool, int kind, char *err, size_t errlen);
extern const struct port_ops xsk_port_ops;

/* afpacket.c */
int afp_port_open(struct port *p, char *err, size_t errlen);
extern const struct port_ops afp_port_ops;

#endif
