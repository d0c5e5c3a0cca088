/* A stand-in for pipeline.h (the pipeline helper's) with the same function shape, for
 * building and testing the packet I/O alone: process() forwards every frame by L2 (static
 * MAC table; unknown or group destinations flood to every other port) and aggregates
 * nothing. Built only with -DNRIO_PIPELINE_STUB (io.mk: `make -f io.mk stub`).
 */
#ifndef NRIO_PIPELINE_STUB_H
#define NRIO_PIPELINE_STUB_H

#include <stdint.h>
#include <string.h>

#define STUB_MAX_MACS 256
#define STUB_MAX_OUT 64

struct nrdp_pipe {
    uint32_t nmacs;
    uint8_t mac[STUB_MAX_MACS][6];
    uint32_t port[STUB_MAX_MACS];
    uint32_t nports;
    uint32_t ports[64];
};

/* An output: `data` is the input frame itself (sent as received) or a buffer of the
 * batch's; `port` where it leaves. */
struct nrdp_out {
    uint32_t port, len;
    const uint8_t *data;
};

struct nrdp_out_batch {
    uint32_t n;
    struct nrdp_out out[STUB_MAX_OUT];
};

static inline int nrdp_process(struct nrdp_pipe *pipe, uint32_t in_port, const uint8_t *frame,
                               uint32_t len, struct nrdp_out_batch *out)
{
    out->n = 0;
    if (len < 14)
        return 0;
    if (!(frame[0] & 1)) {
        for (uint32_t i = 0; i < pipe->nmacs; i++) {
            if (memcmp(pipe->mac[i], frame, 6) == 0) {
                if (pipe->port[i] != in_port)
                    out->out[out->n++] = (struct nrdp_out){pipe->port[i], len, frame};
                return (int)out->n;
            }
        }
    }
    for (uint32_t i = 0; i < pipe->nports && out->n < STUB_MAX_OUT; i++)
        if (pipe->ports[i] != in_port)
            out->out[out->n++] = (struct nrdp_out){pipe->ports[i], len, frame};
    return (int)out->n;
}

#endif
