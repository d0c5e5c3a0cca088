/* L2 forwarding for the frames no pipeline claims (the stub's only rule; with the real
 * pipeline, what main.c does with NRDP_NOT_MINE): a known unicast destination MAC leaves by
 * its port (never back where it came from), anything else floods to every other port.
 * `struct nrdp_l2` is nrio.py's StubPipe field for field.
 */
#ifndef NRDP_L2_H
#define NRDP_L2_H

#include <stdint.h>
#include <string.h>

#define NRDP_L2_MAX_MACS 256
#define NRDP_L2_MAX_PORTS 64

struct nrdp_l2 {
    uint32_t nmacs;
    uint8_t mac[NRDP_L2_MAX_MACS][6];
    uint32_t port[NRDP_L2_MAX_MACS];
    uint32_t nports;
    uint32_t ports[NRDP_L2_MAX_PORTS];
};

/* An output: `data` is the input frame itself (sent as received) or a buffer of the
 * pipeline's; `port` where it leaves. */
struct nrdp_out {
    uint32_t port, len;
    const uint8_t *data;
};

/* The frame's L2 outputs (data = frame) in out[0..cap): their number. */
static inline uint32_t nrdp_l2_forward(const struct nrdp_l2 *l2, uint32_t in_port,
                                       const uint8_t *frame, uint32_t len,
                                       struct nrdp_out *out, uint32_t cap)
{
    uint32_t n = 0;
    if (len < 14)
        return 0;
    if (!(frame[0] & 1)) {
        for (uint32_t i = 0; i < l2->nmacs && i < NRDP_L2_MAX_MACS; i++) {
            if (memcmp(l2->mac[i], frame, 6) == 0) {
                if (l2->port[i] != in_port && cap)
                    out[n++] = (struct nrdp_out){l2->port[i], len, frame};
                return n;
            }
        }
    }
    for (uint32_t i = 0; i < l2->nports && i < NRDP_L2_MAX_PORTS && n < cap; i++)
        if (l2->ports[i] != in_port)
            out[n++] = (struct nrdp_out){l2->ports[i], len, frame};
    return n;
}

#endif
