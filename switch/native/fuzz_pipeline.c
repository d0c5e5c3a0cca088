/* libFuzzer target of the native pipeline: `make -C switch/native fuzz` builds fuzz_pipeline
 * (clang -fsanitize=fuzzer,address,undefined). tests/test_native_pipeline.py seeds it from
 * the conformance vectors' frames.
 *
 * Input: u8 rings; per ring u8 world, u8 mtu shift (256 << s), u8 slots shift (1 << s),
 * then per rank u32 src_ip, dst_ip, src_qpn, dst_qpn, psn0 (big-endian), u8 in_port,
 * out_port; then frames: u8 in_port, u16 length (big-endian), the frame's bytes. A short
 * tail ends the input. Checked on every output: its length fits the frame layout, its port
 * is a registered one, and its ICRC is right (the pipeline re-signs every frame it builds).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packet.h"
#include "pipeline.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader rd = {data, size};
    uint8_t nrings, ports[256] = {0};
    struct nrdp_pipe *pipe = nrdp_create(2, 2 * NRDP_MAX_RANKS);
    if (!pipe)
        abort();
    if (!take(&rd, &nrings, 1))
        goto done;
    for (uint32_t k = 0; k < nrings % 3; k++) {
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
        nrdp_register_ring(pipe, &ring, conns, err, sizeof err);
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
        int n = nrdp_process(pipe, h[0], frame, len, &batch);
        for (int i = 0; i < n; i++) {
            const struct nrdp_out *o = &batch.out[i];
            if (o->port > 255 || !ports[o->port])
                abort();
            if (o->data == frame)
                continue;                         /* forwarded as received */
            if (o->len < NRDP_MIN_FRAME || o->len > NRDP_MAX_HDR + NRDP_MAX_MTU + 4
                || nrdp_icrc(o->data, o->len - 4) != nrdp_get_le32(o->data + o->len - 4))
                abort();
        }
        free(frame);
    }
done:
    nrdp_destroy(pipe);
    return 0;
}
