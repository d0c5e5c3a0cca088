/* The spine's own state (spine.p4), beside state.p4's slot_head, slot_bitmap, slot_sum and
 * ring_next, which it shares with the single switch's layout:
 *   slot_head[gslot]   epoch(16) | state(8: SPINE_OPEN, SPINE_TOTALLED) | 0(8) | words(8) | k(24)
 *   slot_bitmap[gslot] one bit per lane (ToR of the ring) whose partial is in the sums
 *   slot_sum           as the single switch's: gslot * NR_MAX_ELEMS + element
 *   ring_next[ring]    epoch(16) | next_total(24)
 * Per (slot, lane) pair, c = gslot * NR_MAX_LANES + lane, the RoCE header routed TO that
 * lane's ToR that a partial of the slot carried (at most one per ToR: the controller
 * refuses rings that need more):
 *   spine_carried[c]   epoch(16) | k(24) | hlen(8) | rank(16)
 *   spine_rh_*[c]      its bytes, as parsed (base 54 B, RETH 16 B, ImmDt 4 B)
 * Invariant: an entry counts for a total only when its epoch and k are the ring's and the
 * total's (a partial of the slot's current k wrote it); otherwise the total carries none.
 */
#ifndef NR_SPINE_STATE_P4
#define NR_SPINE_STATE_P4

#include "state.p4"

const bit<8> SPINE_OPEN      = 1;   // collecting partials
const bit<8> SPINE_TOTALLED  = 2;   // every lane's partial is in: the total went down

register<bit<64>>(NR_LANE_SLOTS)  spine_carried;
register<bit<432>>(NR_LANE_SLOTS) spine_rh_base;
register<bit<128>>(NR_LANE_SLOTS) spine_rh_e16;
register<bit<32>>(NR_LANE_SLOTS)  spine_rh_e4;

counter(NR_MAX_RINGS * NR_MAX_LANES * NR_LCTRS, CounterType.packets) spine_lane_ctr;
counter(NR_MAX_RINGS * NR_SCTRS, CounterType.packets) spine_ring_ctr;
counter(NR_ISCTRS, CounterType.packets) spine_is_ctr;

#endif  /* NR_SPINE_STATE_P4 */
