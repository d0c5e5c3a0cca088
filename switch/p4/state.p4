/* The program's state: registers and counters, declared at top level because ingress
 * writes what egress reads (a contribution's header, rebuilt per replica in egress).
 *
 * Indices:  gslot = ring * NR_SLOTS + (k mod N)            (k: relative PSN)
 *           contribution c = gslot * NR_MAX_RANKS + rank
 *           sum word = gslot * NR_MAX_ELEMS + element
 *           conn = ring * NR_MAX_RANKS + rank
 * Invariants: slot_head[gslot] and slot_bitmap[gslot] describe the slot only while the
 * head's epoch is the ring's (registration epochs make a re-used ring index start empty
 * without control-plane register writes); a (slot, rank) contribution register is read
 * only while that rank's bit is set in the slot's bitmap, i.e. after ingress wrote it for
 * the slot's current k. Ingress is one thread in BMv2: its read-modify-write sequences
 * are not interleaved with other ingress passes.
 */
#ifndef NR_STATE_P4
#define NR_STATE_P4

#include "headers.p4"

/* epoch(16) | state(8) | opcode(8) | words(8) | tag k(24) */
register<bit<64>>(NR_RING_SLOTS) slot_head;      // the spine's: epoch | state | words | k too
register<bit<32>>(NR_RING_SLOTS) slot_bitmap;
register<bit<32>>(NR_SUM_WORDS) slot_sum;      // int32 sums, wrapping
/* epoch(16) | next_emit(24): the first relative PSN of the ring not emitted yet (the
 * spine's: next_total, the first not totalled) */
register<bit<40>>(NR_MAX_RINGS) ring_next;

#ifndef NR_ROLE_SPINE
/* What differs per packet and per connection in a contribution, kept to rebuild that
 * rank's result in egress (everything else comes from the replica table or is constant). */
register<bit<96>>(NR_CONTRIBS)  contrib_eth;   // dst MAC | src MAC
register<bit<48>>(NR_CONTRIBS)  contrib_ip;    // TOS | identification | flags, fragment | TTL
register<bit<16>>(NR_CONTRIBS)  contrib_udp;   // source port (a result's UDP checksum is 0)
register<bit<40>>(NR_CONTRIBS)  contrib_bth;   // SE|M|Pad|TVer | P_Key | byte 4 | AckReq|resv7
register<bit<128>>(NR_CONTRIBS) contrib_reth;  // VA | R_Key | DMA length (FIRST, ONLY)
register<bit<32>>(NR_CONTRIBS)  contrib_imm;   // ImmDt (*_WITH_IMMEDIATE)

/* epoch(16) | shift(24) | recut_at(24) of each connection (recut.p4): valid while its epoch
 * is the ring's, so a re-registered connection starts with shift 0. */
register<bit<64>>(NR_CONNS) conn_recut;

/* Informational: the RETH of each connection's current message. */
register<bit<128>>(NR_CONNS) conn_reth;

counter(NR_MAX_RINGS * NR_CTRS, CounterType.packets) ring_ctr;
counter(NR_CONNS * NR_CTRS, CounterType.packets) conn_ctr;
#endif  /* the spine (spine_state.p4) keeps its own per (slot, ToR) state and counters */
counter(NR_PORTS, CounterType.packets_and_bytes) port_rx;
counter(NR_PORTS, CounterType.packets_and_bytes) port_tx;
counter(NR_PORTS, CounterType.packets) port_roce;
counter(NR_PORTS, CounterType.packets) port_flooded;

#endif  /* NR_STATE_P4 */
