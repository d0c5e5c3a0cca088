/* The native single-switch aggregation pipeline (docs/pipeline.md), byte for byte the
 * software target's (switch/dataplane/pipeline.py is the executable spec).
 *
 * Data path: nrdp_process(). Control: create/destroy, register/unregister a ring, read
 * counters. A pipe's mutex serialises both, so the controller may register while a worker
 * processes. Everything a ring needs (slots, contribution buffers, sums) is allocated at
 * register time; the connection table is fixed-size at create time (a registered ring
 * needs room, a packet never inserts). Outputs point into the pipe (slot buffers, one
 * scratch frame) or at the input frame; they stay valid until the next call on the pipe.
 */
#ifndef NRDP_PIPELINE_H
#define NRDP_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "l2.h"

#define NRDP_MAX_RANKS 32
#define NRDP_MAX_SLOTS 1024
#define NRDP_MAX_MTU 4096
#define NRDP_MAX_OUT (NRDP_MAX_SLOTS * NRDP_MAX_RANKS + 1)
#define NRDP_NOT_MINE (-1)             /* nrdp_process: forward the frame by L2 */

/* Per-connection counters: the outcomes (nr_contract.spec.OUTCOMES, in its order; one per
 * packet), then messages and recuts. nrdp_counter_name(i) names index i. */
enum nrdp_counter {
    NRDP_AGGREGATED, NRDP_RETRANSMITS_SERVED, NRDP_EMPTIES_FORWARDED,
    NRDP_DROP_WRONG_PORT, NRDP_DROP_BAD_IPCSUM, NRDP_DROP_FRAGMENT, NRDP_DROP_BAD_OPCODE,
    NRDP_DROP_BAD_LENGTH, NRDP_DROP_BAD_ICRC, NRDP_DROP_OVERRUN, NRDP_DROP_MISMATCH,
    NRDP_DROP_DUPLICATE, NRDP_DROP_STALE,
    NRDP_N_OUTCOMES,
    NRDP_MESSAGES = NRDP_N_OUTCOMES, NRDP_RECUTS,
    NRDP_N_COUNTERS
};

struct nrdp_pipe;

struct nrdp_out_batch {
    uint32_t n;
    struct nrdp_out out[NRDP_MAX_OUT];
};

/* One connection of a ring: rank's requester (src) to its responder (dst), IPv4 addresses
 * in host order, and the switch ports of both. */
struct nrdp_conn_desc {
    uint32_t rank, src_ip, dst_ip, src_qpn, dst_qpn, psn0, in_port, out_port;
};

struct nrdp_ring_desc {
    char ring_id[64];                  /* for error messages only */
    uint32_t world_size, mtu, slots;   /* connections: world_size, rank r at index r */
};

struct nrdp_ring_stats {
    uint32_t world_size, slots, next_emit;
    uint64_t completed, results_sent;
};

struct nrdp_conn_stats {
    uint64_t counts[NRDP_N_COUNTERS];
    uint32_t has_reth;                 /* the current message's RETH seen */
    uint64_t va;
    uint32_t rkey, dma_len;
};

/* Rules 1-8 for one frame: NRDP_NOT_MINE (not a registered connection's, or a response
 * from its responder's port: the caller forwards it by L2), else the number of outputs in
 * `out` (0: dropped or held). */
int nrdp_process(struct nrdp_pipe *pipe, uint32_t in_port, const uint8_t *frame,
                 uint32_t len, struct nrdp_out_batch *out);

/* A pipe with room for `max_rings` rings and `max_conns` connections in all; NULL and
 * errno on failure. */
struct nrdp_pipe *nrdp_create(uint32_t max_rings, uint32_t max_conns);
void nrdp_destroy(struct nrdp_pipe *pipe);

/* Install a ring (conns[r] is rank r's): its handle (>= 0), or -1 with `err` saying why
 * (bad shape, no room, a connection or response key already registered). */
int nrdp_register_ring(struct nrdp_pipe *pipe, const struct nrdp_ring_desc *ring,
                       const struct nrdp_conn_desc *conns, char *err, size_t errlen);
/* Remove ring `handle`: its connections' frames are NOT_MINE from then on. 0, or -1. */
int nrdp_unregister_ring(struct nrdp_pipe *pipe, int handle);
/* A ring's state and counters, and connection `rank`'s. 0, or -1 (no such ring/rank). */
int nrdp_ring_stats(struct nrdp_pipe *pipe, int handle, struct nrdp_ring_stats *out);
int nrdp_conn_stats(struct nrdp_pipe *pipe, int handle, uint32_t rank,
                    struct nrdp_conn_stats *out);
const char *nrdp_counter_name(uint32_t index);
/* The L2 table the I/O layer forwards NOT_MINE frames by (main.c): set it before the
 * pipe's worker starts; nrdp_l2_of reads it without the lock. */
void nrdp_set_l2(struct nrdp_pipe *pipe, const struct nrdp_l2 *l2);
const struct nrdp_l2 *nrdp_l2_of(struct nrdp_pipe *pipe);
/* One-armed mode (router.h): the I/O layer sends every frame through nrdp_route with this
 * router instead of nrdp_process and L2. Set like nrdp_set_l2 (NULL: off); the router
 * outlives the pipe's worker. */
struct nrdp_router;
void nrdp_set_router(struct nrdp_pipe *pipe, struct nrdp_router *router);
struct nrdp_router *nrdp_router_of(struct nrdp_pipe *pipe);
/* Where results are built (the I/O layer's send buffers, so a result leaves without a
 * copy): fn(ctx, port, len) gives a buffer of len bytes the output then points at, whose
 * ownership passes to the caller with the output; NULL: the pipe's own buffer. Set (or
 * cleared with fn NULL) while no process() runs, like nrdp_set_l2. */
typedef uint8_t *(*nrdp_tx_alloc_fn)(void *ctx, uint32_t port, uint32_t len);
void nrdp_set_tx_alloc(struct nrdp_pipe *pipe, nrdp_tx_alloc_fn fn, void *ctx);
/* For bindings: sizes[0..4) = sizeof nrdp_out_batch, nrdp_conn_desc, nrdp_ring_desc,
 * nrdp_ring_stats; sizes[4] = sizeof nrdp_conn_stats. */
void nrdp_abi_sizes(size_t sizes[5]);

#endif
