/* The ToR's own state (tor.p4), beside state.p4's, whose slots it uses with one more state
 * (SLOT_READY: the spine's total is in the sums):
 *   slot_head[gslot]   epoch(16) | state(8: OPEN, READY, EMITTED) | opcode(8) | words(8) | k(24)
 *   slot_bitmap[gslot] one bit per local requester (lane) whose contribution is in the sums
 *   slot_sum           the rack's sums (what its partials carry)
 *   tor_total          the total, once READY (what its results and served retransmissions
 *                      carry): apart from the rack's sums, so that a partial (re)sent
 *                      before the total arrived, still queued for egress, keeps its payload
 *   ring_next[ring]    epoch(16) | next_emit(24)
 *   contrib_*[gslot * NR_MAX_RANKS + lane]  as the single switch's, per lane: the local
 *                      requesters' from their packets, the entering connection's from the
 *                      total's carried header
 * Per slot, the RoCE header of the leaving connection's packet (rides up in the partial):
 *   tor_lv_base/e16/e4[gslot]   its bytes, UDP checksum 0 (base 54 B, RETH 16 B, ImmDt 4 B)
 * Per ring (epoch(16) | value; another epoch's value counts as 0 / absent):
 *   tor_horizon   the last k every host is past (rule 7: set by a packet k >= next_emit + N
 *                 to k - 2W); slots up to it that have no total are passed over
 *   tor_ready     how many slots are READY (their total in, not emitted yet)
 *   tor_skipped   slots_skipped (a counter that grows by more than one in a pass)
 * Invariants: a slot is live while its epoch is the ring's and, OPEN or READY, its tag is in
 * [next_emit, next_emit + N), or, EMITTED, in [next_emit - N, next_emit): a slot rule 7
 * passed over (or re-used) is empty without being written; READY slots are never passed
 * over, so tor_ready counts exactly the READY live slots.
 */
#ifndef NR_TOR_STATE_P4
#define NR_TOR_STATE_P4

#include "state.p4"

register<bit<32>>(NR_SUM_WORDS)   tor_total;
register<bit<432>>(NR_RING_SLOTS) tor_lv_base;
register<bit<128>>(NR_RING_SLOTS) tor_lv_e16;
register<bit<32>>(NR_RING_SLOTS)  tor_lv_e4;
register<bit<40>>(NR_MAX_RINGS)   tor_horizon;
register<bit<32>>(NR_MAX_RINGS)   tor_ready;
register<bit<48>>(NR_MAX_RINGS)   tor_skipped;

counter(NR_MAX_RINGS * NR_TCTRS, CounterType.packets) tor_ctr;
counter(NR_MAX_RINGS * NR_XCTRS, CounterType.packets) tor_transit_ctr;
counter(NR_ISCTRS, CounterType.packets) tor_is_ctr;

/* Slot `head` (of the ring's epoch) holds k, live for next_emit ne (see above). */
bool tor_holds(in bit<64> head, in bit<24> k, in bit<24> ne, in bit<16> epoch,
               in bit<24> slot_mask) {
    bit<8> st = head[47:40];
    return head[63:48] == epoch && head[23:0] == k
           && ((st == SLOT_EMITTED && ne - 1 - k <= slot_mask)
               || ((st == SLOT_OPEN || st == SLOT_READY) && k - ne <= slot_mask));
}

#endif  /* NR_TOR_STATE_P4 */
