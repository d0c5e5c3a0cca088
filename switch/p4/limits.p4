/* NetReduce v1model program: its limits and its contract with the controller.
 *
 * The one place these numbers are stated. switch/p4/program.py reads every
 * `#define NR_<NAME> <integer>` line of this file (derived values, in parentheses, are
 * not read); tests/test_p4_program.py checks the Python side and switch/p4/README.md
 * against them. Change a limit here and nowhere else. Its Python twin is nr_contract/spec.py
 * (what hosts and the software target agree on).
 */
#ifndef NR_LIMITS_P4
#define NR_LIMITS_P4

/* ---- limits ------------------------------------------------------------------------ */
#define NR_MAX_RINGS        4       // rings registered at the same time
#define NR_SLOTS            256     // aggregator slots per ring: a ring's N is a power of two <= this
#define NR_MAX_RANKS        32      // ranks per ring (the contribution bitmap is a bit<32>)
#define NR_MAX_ELEMS        64      // int32 payload elements per packet: 256 B, RoCE path MTU 256
#define NR_MAX_MACS         1024    // static L2 (MAC -> port) entries
#define NR_PORTS            512     // port counters (ports are bit<9>)
#define NR_MAX_LANES        8       // spine: ToRs per ring (a slot's bitmap has one bit per ToR)

/* ---- contract with switch/control/bmv2.py --------------------------------------------------- */
#define NR_FLOOD_GROUP      1       // multicast group with every port: unknown/group destinations
#define NR_RING_GROUP_BASE  16      // multicast group of ring index i: NR_RING_GROUP_BASE + i
#define NR_CONT_RID         0xFFFF  // replica id of the continuation copy in a ring's group
#define NR_FL_CONTINUE      1       // field list preserved by the continuation's recirculation
#define NR_INSTANCE_RECIRC  4       // BMv2 simple_switch instance_type of a recirculated packet

/* Counter ids. ring_ctr index = ring * NR_CTRS + id; conn_ctr index = conn * NR_CTRS + id
 * with conn = ring * NR_MAX_RANKS + rank. The names are the software target's counter
 * names (nr_contract/spec.py RING_COUNTERS, CONN_COUNTERS) in capitals. */
#define NR_CTRS                     18
#define NR_CTR_PACKETS              0
#define NR_CTR_MESSAGES             1
#define NR_CTR_AGGREGATED           2
#define NR_CTR_COMPLETED            3
#define NR_CTR_RESULTS_SENT         4
#define NR_CTR_RETRANSMITS_SERVED   5
#define NR_CTR_DROP_WRONG_PORT      6
#define NR_CTR_DROP_BAD_OPCODE      7
#define NR_CTR_DROP_BAD_LENGTH      8
#define NR_CTR_DROP_OVERRUN         9
#define NR_CTR_DROP_MISMATCH        10
#define NR_CTR_DROP_DUPLICATE       11
#define NR_CTR_DROP_STALE           12
#define NR_CTR_DROP_BAD_IPCSUM      13
#define NR_CTR_DROP_FRAGMENT        14
#define NR_CTR_DROP_BAD_ICRC        15
#define NR_CTR_EMPTIES_FORWARDED    16
#define NR_CTR_RECUTS               17

/* Spine counter ids (spine.p4; the software spine's names, nr_contract/spec.py
 * LANE_OUTCOMES and SpinePipeline's): spine_lane_ctr index = (ring * NR_MAX_LANES + lane)
 * * NR_LCTRS + NR_LCTR_<NAME>; spine_ring_ctr index = ring * NR_SCTRS + NR_SCTR_<NAME>;
 * spine_is_ctr index = NR_ISCTR_<NAME> (the inter-switch drops, of no ring). */
#define NR_LCTRS                    8
#define NR_LCTR_PARTIALS            0
#define NR_LCTR_TOTALS_RESENT       1
#define NR_LCTR_DROP_DUPLICATE      2
#define NR_LCTR_DROP_MISMATCH       3
#define NR_LCTR_DROP_OVERRUN        4
#define NR_LCTR_DROP_STALE          5
#define NR_LCTR_DROP_WRONG_PORT     6
#define NR_SCTRS                    2
#define NR_SCTR_COMPLETED           0
#define NR_SCTR_TOTALS_SENT         1
#define NR_ISCTRS                   4
#define NR_ISCTR_DROP_CORRUPT       0
#define NR_ISCTR_DROP_UNKNOWN_RING  1
#define NR_ISCTR_DROP_UNKNOWN_TOR   2
#define NR_ISCTR_DROP_SPOOFED_TRANSIT 3
#define NR_MAX_TRANSIT      256     // spine: connections between racks (transit entries)

/* ToR (tor.p4; the software ToR's names, nr_contract/spec.py TOR_COUNTERS and
 * TRANSIT_COUNTERS): tor_ctr index = ring * NR_TCTRS + NR_TCTR_<NAME> (slots_skipped is
 * the register tor_skipped: it grows by more than one per pass); tor_transit_ctr index =
 * ring * NR_XCTRS + NR_XCTR_<NAME> (one entering connection per ring); tor_is_ctr index =
 * NR_ISCTR_DROP_CORRUPT or NR_ISCTR_DROP_UNKNOWN_RING. A ring's multicast group at a ToR
 * has, besides its result replicas (rid = lane) and the continuation, the replicas below. */
#define NR_TCTRS                    8
#define NR_TCTR_PARTIALS_SENT       0
#define NR_TCTR_PARTIALS_RESENT     1
#define NR_TCTR_TOTALS              2
#define NR_TCTR_DROP_TOTAL_UNEXPECTED   3
#define NR_TCTR_DROP_TOTAL_DUPLICATE    4
#define NR_TCTR_DROP_TOTAL_LENGTH       5
#define NR_TCTR_DROP_TOTAL_HEADERS      6
#define NR_TCTR_DROP_TOTAL_MISDIRECTED  7
#define NR_XCTRS                    2
#define NR_XCTR_FORWARDED           0
#define NR_XCTR_DROP_WRONG_PORT     1
#define NR_PART_A_RID       0xFFFE  // the partial of next_emit, resent (uplink)
#define NR_PART_B_RID       0xFFFD  // the partial of the packet's k (uplink)
#define NR_FWD_RID          0xFFFC  // a transit packet, to its responder's port
#define NR_TOR_STEPS        4       // ToR: slots rule 7 passes (emits or empties) per pass

/* ---- derived sizes ------------------------------------------------------------------ */
#define NR_RING_SLOTS       (NR_MAX_RINGS * NR_SLOTS)       // slots of all rings
#define NR_CONNS            (NR_MAX_RINGS * NR_MAX_RANKS)   // connections of all rings
#define NR_CONTRIBS         (NR_RING_SLOTS * NR_MAX_RANKS)  // (slot, rank) pairs
#define NR_SUM_WORDS        (NR_RING_SLOTS * NR_MAX_ELEMS)  // int32 sums of all slots
#define NR_MAX_PL_BYTES     (NR_MAX_ELEMS * 4)              // a power of two (parser mask)
#define NR_LANE_SLOTS       (NR_RING_SLOTS * NR_MAX_LANES)  // spine: (slot, lane) pairs

#endif  /* NR_LIMITS_P4 */
