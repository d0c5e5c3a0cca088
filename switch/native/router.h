/* One-armed mode on the native data plane: the aggregation server with one port, reached
 * by routing. Byte for byte switch/dataplane/router.py (the executable spec; its module doc
 * says why): a frame not addressed to the server's MAC is not forwarded (the server's
 * kernel's); one that is goes to the pipeline from its source MAC's neighbour port, and
 * every output, or the frame itself if the pipeline does not take it, leaves the one port
 * (NRDP_ROUTER_PORT) as a router sends it: destination MAC the next hop's, source MAC the
 * server's, TTL one less, the IPv4 header checksum recomputed (the ICRC masks both). Not
 * IPv4, TTL <= 1 or no neighbour: dropped and counted, no ICMP.
 *
 * Invariants: the neighbour table is replaced whole (nrdp_router_set) under the router's
 * mutex, which nrdp_route also holds, so a frame sees one table; counters are written under
 * it. An output's header is rewritten where it lies: every buffer the pipeline emits is
 * built for that one output (a slot's lane buffer is emitted once, a retransmission is
 * rebuilt per output) or is the received frame, which nrdp_route owns. The I/O layer
 * gives a routed pipe no TX buffers (main.c: an output the router drops would leak one).
 */
#ifndef NRDP_ROUTER_H
#define NRDP_ROUTER_H

#include <stdint.h>

#include "pipeline.h"

#define NRDP_ROUTER_PORT 1            /* router.py's PHYSICAL_PORT */
#define NRDP_ROUTER_MAX 256           /* neighbour MACs, and neighbour IPv4 addresses */

/* The neighbour table, router.py's _mac_of and _ip_mac: port[i] is mac[i]'s port; ip[j]
 * (network order bytes) has MAC ip_mac[j]. */
struct nrdp_router_table {
    uint32_t nmacs;
    uint8_t mac[NRDP_ROUTER_MAX][6];
    uint32_t port[NRDP_ROUTER_MAX];
    uint32_t nips;
    uint8_t ip[NRDP_ROUTER_MAX][4];
    uint8_t ip_mac[NRDP_ROUTER_MAX][6];
};

/* router.py's RouterCounters, in its order. */
struct nrdp_router_counters {
    uint64_t routed, ttl_expired, no_route, not_routable, not_for_router;
};

struct nrdp_router;

/* A router for the server's MAC; NULL and errno on failure. */
struct nrdp_router *nrdp_router_create(const uint8_t own_mac[6]);
void nrdp_router_destroy(struct nrdp_router *r);
/* Replace the neighbour table: 0, or -1 if it holds more than NRDP_ROUTER_MAX entries. */
int nrdp_router_set(struct nrdp_router *r, const struct nrdp_router_table *t);
void nrdp_router_counters(struct nrdp_router *r, struct nrdp_router_counters *out);
/* One received frame in one-armed mode (module doc): the number of outputs in `out`, every
 * one for NRDP_ROUTER_PORT (0: dropped or held). `frame` may be rewritten and be one of
 * the outputs. */
int nrdp_route(struct nrdp_router *r, struct nrdp_pipe *pipe, uint8_t *frame, uint32_t len,
               struct nrdp_out_batch *out);
/* Is the frame addressed to the server's MAC (router.py's for_me)? No lock: the MAC is
 * fixed at create. */
int nrdp_router_for_me(const struct nrdp_router *r, const uint8_t *frame, uint32_t len);
/* For bindings: sizeof nrdp_router_table, nrdp_router_counters. */
void nrdp_router_abi_sizes(size_t sizes[2]);

#endif
