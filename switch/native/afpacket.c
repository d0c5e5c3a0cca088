/* The fallback port: AF_PACKET with a TPACKET_V3 mapped receive ring (the kernel copies
 * each frame once, into a block of the ring; the worker reads it in place and hands the
 * block back once every frame in it was handled) and send(2) per frame out. A port gets
 * it when AF_XDP cannot be had on its interface (no XDP_SOCKETS, no XDP at all, too old a
 * kernel); main.c logs that and sets the port's `fallback` counter: never silent.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "io.h"

#define BLOCK_SIZE (1u << 20)
#define FRAME_HINT 2048u          /* TPACKET_V3 packs frames; this only sizes tp_frame_nr */
#define RETIRE_MS 1u              /* a partly filled block is handed over after this long */
#define SNDBUF_BYTES (4u << 20)   /* frames the kernel may hold queued for this socket */
#define TX_WAITS 8                /* a full send queue is waited for this many times ... */
#define TX_WAIT_MS 1              /* ... of up to this long before the frame counts as lost */

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

struct afp_port {
    int fd;
    uint8_t *ring;
    uint32_t nblocks, block;      /* the block being read */
    uint32_t pkt_left;            /* its frames not returned yet (once it is the user's) */
    uint8_t *next_pkt;
    uint32_t walked;              /* blocks fully returned by rx, to hand back in rx_done */
    uint64_t drops;               /* PACKET_STATISTICS (reset by each read) summed */
};

static struct tpacket_block_desc *block_at(struct afp_port *a, uint32_t i)
{
    return (struct tpacket_block_desc *)(a->ring + (size_t)i * BLOCK_SIZE);
}

static uint32_t afp_rx(struct port *p, struct rx_frame *out, uint32_t max)
{
    struct afp_port *a = p->impl;
    uint32_t n = 0;
    while (n < max) {
        struct tpacket_block_desc *bd = block_at(a, (a->block + a->walked) % a->nblocks);
        if (!a->next_pkt) {
            if (!(__atomic_load_n(&bd->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER))
                break;
            a->pkt_left = bd->hdr.bh1.num_pkts;
            a->next_pkt = (uint8_t *)bd + bd->hdr.bh1.offset_to_first_pkt;
        }
        while (a->pkt_left && n < max) {
            struct tpacket3_hdr *h = (struct tpacket3_hdr *)a->next_pkt;
            a->pkt_left--;
            a->next_pkt += h->tp_next_offset;
            if (h->tp_snaplen != h->tp_len || h->tp_len > p->max_frame) {
                CNT_ADD(p->c.rx_oversize, 1);
                continue;
            }
            out[n].data = (uint8_t *)h + h->tp_mac;
            out[n].len = h->tp_snaplen;
            out[n].npieces = 0;
            n++;
        }
        if (a->pkt_left)
            break;
        a->next_pkt = NULL;
        a->walked++;
    }
    return n;
}

static void afp_rx_done(struct port *p, struct rx_frame *f, uint32_t n)
{
    (void)f;
    (void)n;
    struct afp_port *a = p->impl;
    for (; a->walked; a->walked--) {
        __atomic_store_n(&block_at(a, a->block)->hdr.bh1.block_status, TP_STATUS_KERNEL,
                         __ATOMIC_RELEASE);
        a->block = (a->block + 1) % a->nblocks;
    }
}

/* A frame the kernel cannot queue yet (EAGAIN, ENOBUFS: the socket's send queue is full,
 * e.g. a veth peer's backlog under a burst of results) is sent again after waiting for
 * room, a bounded number of times: a frame lost here costs its RC sender a retry timeout
 * (tens of ms) and, past the retry budget, a transport fault; a wait costs microseconds. */
static int afp_tx_copy(struct port *p, const uint8_t *data, uint32_t len)
{
    struct afp_port *a = p->impl;
    ssize_t sent = send(a->fd, data, len, MSG_DONTWAIT);
    for (int waits = 0; sent < 0 && (errno == EAGAIN || errno == ENOBUFS) && waits < TX_WAITS;
         waits++) {
        struct pollfd pfd = {.fd = a->fd, .events = POLLOUT};
        if (poll(&pfd, 1, TX_WAIT_MS) < 0 && errno != EINTR)
            break;
        sent = send(a->fd, data, len, MSG_DONTWAIT);
    }
    if (sent != (ssize_t)len) {
        CNT_ADD(p->c.tx_errors, 1);
        return -1;
    }
    CNT_ADD(p->c.tx_packets, 1);
    CNT_ADD(p->c.tx_bytes, len);
    CNT_ADD(p->c.tx_copied, 1);
    return 0;
}

static int afp_tx_frame(struct port *p, struct port *from, struct rx_frame *f)
{
    (void)from;
    return afp_tx_copy(p, f->data, f->len);
}

static void afp_flush(struct port *p) { (void)p; }

static void afp_close(struct port *p)
{
    struct afp_port *a = p->impl;
    if (!a)
        return;
    if (a->ring)
        munmap(a->ring, (size_t)a->nblocks * BLOCK_SIZE);
    if (a->fd >= 0)
        close(a->fd);
    free(a);
    p->impl = NULL;
}

static int afp_fd(struct port *p) { return ((struct afp_port *)p->impl)->fd; }

static void afp_read_kernel_stats(struct port *p)
{
    struct afp_port *a = p->impl;
    struct tpacket_stats_v3 st;
    socklen_t len = sizeof(st);
    if (getsockopt(a->fd, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0) {
        a->drops += st.tp_drops;
        __atomic_store_n(&p->c.rx_dropped, a->drops, __ATOMIC_RELAXED);
    }
}

/* Opened for no protocol and bound to the interface for ETH_P_ALL (so it never queues
 * another interface's frames), outgoing frames ignored, the ring sized to hold the
 * port's ring_size frames of max_frame bytes. 0, or -1 with the reason in err. */
int afp_port_open(struct port *p, char *err, size_t errlen)
{
    struct afp_port *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a->fd = socket(AF_PACKET, SOCK_RAW, 0);
    int v3 = TPACKET_V3, one = 1;
    size_t bytes = (size_t)p->ring_size * (p->max_frame + 64);
    a->nblocks = (uint32_t)((bytes + BLOCK_SIZE - 1) / BLOCK_SIZE);
    if (a->nblocks < 4)
        a->nblocks = 4;
    struct tpacket_req3 req = {
        .tp_block_size = BLOCK_SIZE, .tp_block_nr = a->nblocks, .tp_frame_size = FRAME_HINT,
        .tp_frame_nr = a->nblocks * (BLOCK_SIZE / FRAME_HINT), .tp_retire_blk_tov = RETIRE_MS,
    };
    struct sockaddr_ll sll = {
        .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = p->ifindex,
    };
    const char *what = "socket(AF_PACKET)";
    if (a->fd < 0)
        goto fail;
    what = "PACKET_VERSION TPACKET_V3";
    if (setsockopt(a->fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof(v3)) < 0)
        goto fail;
    what = "PACKET_IGNORE_OUTGOING";
    if (setsockopt(a->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0)
        goto fail;
    what = "PACKET_RX_RING";
    if (setsockopt(a->fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) < 0)
        goto fail;
    what = "mmap of the ring";
    a->ring = mmap(NULL, (size_t)a->nblocks * BLOCK_SIZE, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, a->fd, 0);
    if (a->ring == MAP_FAILED) {
        a->ring = NULL;
        goto fail;
    }
    what = "bind";
    if (bind(a->fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
        goto fail;
    /* root may exceed net.core.wmem_max (FORCE); else the sysctl's cap is what we get */
    int sndbuf = SNDBUF_BYTES;
    if (setsockopt(a->fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) < 0)
        (void)setsockopt(a->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    p->impl = a;
    p->ops = &afp_port_ops;
    p->c.kind = NRIO_AFPACKET;
    return 0;
fail:
    snprintf(err, errlen, "%s: AF_PACKET %s: %s", p->ifname, what, strerror(errno));
    p->impl = a;
    afp_close(p);
    return -1;
}

const struct port_ops afp_port_ops = {
    .rx = afp_rx, .rx_done = afp_rx_done, .tx_copy = afp_tx_copy, .tx_frame = afp_tx_frame,
    .flush = afp_flush, .close = afp_close, .fd = afp_fd,
    .read_kernel_stats = afp_read_kernel_stats,
};
