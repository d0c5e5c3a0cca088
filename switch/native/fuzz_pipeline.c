/* libFuzzer target of the native pipeline: `make -C switch/native fuzz` builds fuzz_pipeline
 * (clang -fsanitize=fuzzer,address,undefined). tests/test_native_pipeline.py seeds it from
 * the conformance vectors' frames.
 *
 * Input: u8 rings (bit 7: one-armed mode, router.h; rings = the rest mod 3); per ring u8 world, u8 mtu shift (256 << s), u8 slots shift (1 << s),
 * then per rank u32 src_ip, dst_ip, src_qpn, dst_qpn, psn0 (big-endian), u8 in_port,
 * out_port; then frames: u8 in_port, u16 length (big-endian), the frame's bytes. A short
 * tail ends the input. Checked on every output: its length fits the frame layout, its port
 * is a registered one, and its ICRC is right (the pipeline re-signs every frame it builds).
 * One-armed: the router's neighbours are the rings' ports (port p: MAC 02:00:00:00:00:p) and
 * their hosts' addresses; a frame whose in_port byte is odd is addressed to the server's MAC.
 * Checked besides: every output leaves port 1 addressed to a neighbour, from the server,
 * with a right IPv4 header checksum, and the router counts exactly its outputs as routed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packet.h"
#include "pipeline.h"
#include "router.h"

struct reader {
    const uint8_t *p;
    size_t left;
};

static int take(struct reader *r, void *out, size_t n)
{
    if (r->left < n)
        return 0;
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 1;
}

static uint32_t be32(const uint8_t *b)
{
    return nrdp_get_be(b, 4);
}

static struct nrdp_out_batch batch;
static const uint8_t server[6] = {0x02, 0x4e, 0x52, 0x00, 0x01, 0x01};

/* A routed output: from the server to a neighbour (02:00:00:00:00:xx), checksum right. */
static int routed_ok(const struct nrdp_out *o, const uint8_t *ports)
{
    static const uint8_t nb[5] = {0x02, 0, 0, 0, 0};
    if (o->port != NRDP_ROUTER_PORT || o->len < 34 || memcmp(o->data, nb, 5) ||
        !ports[o->data[5]] || memcmp(o->data + 6, server, 6))
        return 0;
    uint32_t ihl = (o->data[14] & 0xFu) * 4, sum = 0;
    if (o->len < 14 + ihl)
        return 0;
    for (uint32_t i = 0; i < ihl; i += 2)
        sum += (uint32_t)o->data[14 + i] << 8 | o->data[15 + i];
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    return sum == 0xFFFF;
}

/* The router's table: each ring port p is neighbour 02:00:00:00:00:p, each host IP's MAC
 * its port's. */
static void router_table(struct nrdp_router *r, const uint8_t *ports,
                         const struct nrdp_conn_desc *conns, uint32_t nconns)
{
    static struct nrdp_router_table t;
    memset(&t, 0, sizeof t);
    for (uint32_t p = 1; p < 256; p++) {
        if (!ports[p])
            continue;
        memcpy(t.mac[t.nmacs], (uint8_t[6]){0x02, 0, 0, 0, 0, (uint8_t)p}, 6);
        t.port[t.nmacs++] = p;
    }
    for (uint32_t i = 0; i < nconns && t.nips < NRDP_ROUTER_MAX; i++) {
        uint32_t ip = conns[i].src_ip;
        if (!ports[conns[i].in_port])
            continue;
        memcpy(t.ip[t.nips], (uint8_t[4]){ip >> 24, ip >> 16, ip >> 8, ip}, 4);
        memcpy(t.ip_mac[t.nips++], (uint8_t[6]){0x02, 0, 0, 0, 0, (uint8_t)conns[i].in_port}, 6);
    }
    if (nrdp_router_set(r, &t))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader rd = {data, size};
    uint8_t nrings, ports[256] = {0};
    struct nrdp_conn_desc all[2 * NRDP_MAX_RANKS];
    uint32_t nall = 0;
    uint64_t outputs = 0;
    struct nrdp_router *router = NULL;
    struct nrdp_pipe *pipe = nrdp_create(2, 2 * NRDP_MAX_RANKS);
    if (!pipe)
        abort();
    if (!take(&rd, &nrings, 1))
        goto done;
    for (uint32_t k = 0; k < (nrings & 0x7Fu) % 3; k++) {
        uint8_t h[3];
        struct nrdp_ring_desc ring = {.ring_id = "fuzz"};
        struct nrdp_conn_desc conns[NRDP_MAX_RANKS];
        if (!take(&rd, h, 3))
            goto done;
        ring.world_size = h[0] % (NRDP_MAX_RANKS + 1);
        ring.mtu = 256u << (h[1] % 5);
        ring.slots = 1u << (h[2] % 11);
        for (uint32_t i = 0; i < ring.world_size; i++) {
            uint8_t b[22];
            if (!take(&rd, b, sizeof b))
                goto done;
            conns[i] = (struct nrdp_conn_desc){i, be32(b), be32(b + 4), be32(b + 8),
                                               be32(b + 12), be32(b + 16), b[20], b[21]};
            ports[b[20]] = ports[b[21]] = 1;
        }
        char err[256];
        if (nrdp_register_ring(pipe, &ring, conns, err, sizeof err) >= 0)
            for (uint32_t i = 0; i < ring.world_size; i++)
                all[nall++] = conns[i];
    }
    if (nrings & 0x80) {
        ports[0] = 0;                 /* port 0: a source MAC that is no neighbour's */
        if (!(router = nrdp_router_create(server)))
            abort();
        router_table(router, ports, all, nall);
    }
    for (;;) {
        uint8_t h[3];
        if (!take(&rd, h, 3))
            break;
        uint32_t len = nrdp_get_be(h + 1, 2);
        if (len > rd.left)
            len = (uint32_t)rd.left;
        uint8_t *frame = malloc(len ? len : 1);   /* exactly len bytes: ASan sees overreads */
        memcpy(frame, rd.p, len);
        rd.p += len;
        rd.left -= len;
        if (router && (h[0] & 1) && len >= 6)
            memcpy(frame, server, 6);
        int n = router ? nrdp_route(router, pipe, frame, len, &batch)
                       : nrdp_process(pipe, h[0], frame, len, &batch);
        outputs += n > 0 ? (uint64_t)n : 0;
        for (int i = 0; i < n; i++) {
            const struct nrdp_out *o = &batch.out[i];
            if (router ? !routed_ok(o, ports) : o->port > 255 || !ports[o->port])
                abort();
            if (o->data == frame)
                continue;                         /* forwarded as received */
            if (o->len < NRDP_MIN_FRAME || o->len > NRDP_MAX_HDR + NRDP_MAX_MTU + 4
                || nrdp_icrc(o->data, o->len - 4) != nrdp_get_le32(o->data + o->len - 4))
                abort();
        }
        free(frame);
    }
    if (router) {
        struct nrdp_router_counters c;
        nrdp_router_counters(router, &c);
        if (c.routed != outputs)
            abort();
    }
done:
    nrdp_router_destroy(router);
    nrdp_destroy(pipe);
    return 0;
}
