/* A stand-in for pipeline.h with the same function shape, for building and testing the
 * packet I/O alone: process() forwards every frame by L2 (l2.h) and aggregates nothing.
 * Built only with -DNRIO_PIPELINE_STUB (io.mk: `make -f io.mk stub`).
 */
#ifndef NRIO_PIPELINE_STUB_H
#define NRIO_PIPELINE_STUB_H

#include <stdint.h>

#include "l2.h"

#define STUB_MAX_OUT 64
#define NRDP_NOT_MINE (-1)             /* never returned by the stub */

struct nrdp_pipe {
    struct nrdp_l2 l2;
};

struct nrdp_out_batch {
    uint32_t n;
    struct nrdp_out out[STUB_MAX_OUT];
};

static inline int nrdp_process(struct nrdp_pipe *pipe, uint32_t in_port, const uint8_t *frame,
                               uint32_t len, struct nrdp_out_batch *out)
{
    out->n = nrdp_l2_forward(&pipe->l2, in_port, frame, len, out->out, STUB_MAX_OUT);
    return (int)out->n;
}

static inline const struct nrdp_l2 *nrdp_l2_of(struct nrdp_pipe *pipe)
{
    return &pipe->l2;
}

static inline void *nrdp_router_of(struct nrdp_pipe *pipe)
{
    (void)pipe;                       /* the stub has no one-armed mode */
    return NULL;
}

typedef uint8_t *(*nrdp_tx_alloc_fn)(void *ctx, uint32_t port, uint32_t len);
static inline void nrdp_set_tx_alloc(struct nrdp_pipe *pipe, nrdp_tx_alloc_fn fn, void *ctx)
{
    (void)pipe, (void)fn, (void)ctx;  /* the stub builds no frames */
}

#endif
