/* The ToR's moves of next_emit (tor.p4): in-order emission (rule 5) and rule 7's passing
 * over slots every host is past, one emission per pass; and rule 3's partial resends.
 *
 * NrTorAdvance, from next_emit, at most NR_TOR_STEPS steps: a READY slot holding next_emit
 * is emitted (the pass carries it: meta.emit, the slot EMITTED); a second one stops the pass
 * and asks for the continuation (meta.cont: its recirculated pass goes on); a slot without
 * total at or before the horizon (tor_horizon) is passed over (slots_skipped), and when no
 * slot is READY at all, every k up to the horizon is passed over at once (a k 2^22 ahead
 * costs one step). Run by a pass that set the horizon, by an accepted total and by the
 * continuation; writes back next_emit, the READY count and slots_skipped, and counts the
 * emission (completed). A horizon next_emit has passed is cleared: a horizon is live only
 * while it is at or ahead of next_emit.
 * NrTorRecover(k): the partials of next_emit and of k (once if k is next_emit) go up again
 * if their slot is locally complete and has no total (part_a, part_b; partials_resent).
 * Needs meta.ring, epoch, slot_mask, full (ring_table).
 */
#ifndef NR_TOR_ADVANCE_P4
#define NR_TOR_ADVANCE_P4

#include "tor_state.p4"

/* One step at next_emit (ne). Needs ring, ne, horizon, behind, ready, skipped, go, g, h. */
#define NR_TOR_STEP                                                                     \
    if (go) {                                                                           \
        g = ring * NR_SLOTS + (bit<32>)(ne & meta.slot_mask);                           \
        slot_head.read(h, g);                                                           \
        if (h[63:48] == meta.epoch && h[47:40] == SLOT_READY && h[23:0] == ne) {        \
            if (meta.emit == 0) {                                                       \
                meta.emit = 1;                                                          \
                meta.emit_k = ne;                                                       \
                meta.emit_gslot = g;                                                    \
                meta.emit_opcode = h[39:32];                                            \
                meta.emit_words = h[31:24];                                             \
                slot_head.write(g, h[63:48] ++ SLOT_EMITTED ++ h[39:0]);                \
                ready = ready - 1;                                                      \
                ne = ne + 1;                                                            \
            } else {                                                                    \
                meta.cont = 1;                                                          \
                go = false;                                                             \
            }                                                                           \
        } else if (behind && horizon - ne < PSN_HALF) {                                 \
            if (ready == 0) {                                                           \
                skipped = skipped + (bit<32>)(horizon + 1 - ne);                        \
                ne = horizon + 1;                                                       \
                go = false;                                                             \
            } else {                                                                    \
                skipped = skipped + 1;                                                  \
                ne = ne + 1;                                                            \
            }                                                                           \
        } else {                                                                        \
            go = false;                                                                 \
        }                                                                               \
    }

control NrTorAdvance(inout meta_t meta) {
    apply {
        bit<32> ring = (bit<32>)meta.ring;
        bit<40> nxt;
        ring_next.read(nxt, ring);
        bit<24> ne = 0;
        if (nxt[39:24] == meta.epoch) {
            ne = nxt[23:0];
        }
        bit<40> hz;
        tor_horizon.read(hz, ring);
        bool behind = hz[39:24] == meta.epoch;
        bit<24> horizon = hz[23:0];
        bit<32> rd;
        tor_ready.read(rd, ring);
        bit<16> ready = 0;
        if (rd[31:16] == meta.epoch) {
            ready = rd[15:0];
        }
        bit<48> sk;
        tor_skipped.read(sk, ring);
        bit<32> skipped = 0;
        if (sk[47:32] == meta.epoch) {
            skipped = sk[31:0];
        }
        bit<32> skipped0 = skipped;
        bit<24> ne0 = ne;
        bool go = true;
        bit<32> g;
        bit<64> h;
        NR_TOR_STEP NR_TOR_STEP NR_TOR_STEP NR_TOR_STEP     // NR_TOR_STEPS (limits.p4)
        if (go && meta.emit == 1) {
            meta.cont = 1;             // steps left to take: the continuation goes on
        }
        if (ne != ne0) {
            ring_next.write(ring, meta.epoch ++ ne);
        }
        if (meta.emit == 1) {
            tor_ready.write(ring, meta.epoch ++ ready);
            ring_ctr.count(ring * NR_CTRS + NR_CTR_COMPLETED);
        }
        if (skipped != skipped0) {
            tor_skipped.write(ring, meta.epoch ++ skipped);
        }
        if (behind && horizon - ne >= PSN_HALF) {
            /* next_emit is past the horizon: forget it (epoch 0 is no ring's), or 2^23 k
             * later the modular comparisons would take it for a horizon ahead again */
            tor_horizon.write(ring, 0);
        }
    }
}

/* Slot x holds k, every local requester's contribution and no total. */
#define NR_TOR_PARTIALLED(x)                                                            \
    g = (bit<32>)meta.ring * NR_SLOTS + (bit<32>)((x) & meta.slot_mask);                \
    slot_head.read(h, g);                                                               \
    slot_bitmap.read(bm, g);                                                            \
    waiting = h[63:48] == meta.epoch && h[47:40] == SLOT_OPEN && h[23:0] == (x)         \
              && bm == meta.full;

control NrTorRecover(inout meta_t meta, in bit<24> k) {
    apply {
        bit<40> nxt;
        ring_next.read(nxt, (bit<32>)meta.ring);
        bit<24> ne = 0;
        if (nxt[39:24] == meta.epoch) {
            ne = nxt[23:0];
        }
        bit<32> g;
        bit<64> h;
        bit<32> bm;
        bool waiting;
        NR_TOR_PARTIALLED(ne)
        if (waiting) {
            meta.part_a = 1;
            meta.part_a_k = ne;
            meta.mcast = 1;
            tor_ctr.count((bit<32>)meta.ring * NR_TCTRS + NR_TCTR_PARTIALS_RESENT);
        }
        if (k != ne && k - ne <= meta.slot_mask) {
            NR_TOR_PARTIALLED(k)
            if (waiting) {
                meta.part_b = 1;
                meta.part_b_k = k;
                meta.mcast = 1;
                tor_ctr.count((bit<32>)meta.ring * NR_TCTRS + NR_TCTR_PARTIALS_RESENT);
            }
        }
    }
}

#endif  /* NR_TOR_ADVANCE_P4 */
