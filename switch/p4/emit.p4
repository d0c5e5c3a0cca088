/* Rule 8 of docs/pipeline.md, in-order emission, one slot per pass.
 *
 * If the ring's next_emit slot is complete (tag == next_emit, every rank's bit set, not
 * emitted yet) this pass emits it: marks it emitted, advances next_emit, turns the
 * packet's payload into the slot's sums and multicasts it to the ring's group, where
 * egress rebuilds every rank's result (egress.p4). A packet carries at most one slot, so
 * when the slot after it is complete too, meta.cont asks the group's continuation
 * replica (rid NR_CONT_RID) to recirculate; the recirculated pass runs this control
 * again. Idempotent: a pass that finds nothing complete changes nothing, so a lost
 * continuation is made good by the ring's next packet.
 */
#ifndef NR_EMIT_P4
#define NR_EMIT_P4

#include "state.p4"
#include "payload.p4"

/* The slot described by (head, bitmap) holds k, has every rank's contribution and was
 * not emitted yet. */
bool slot_ready(in bit<64> head, in bit<32> bitmap, in bit<24> k, in bit<16> epoch,
                in bit<32> full) {
    return head[63:48] == epoch && head[47:40] == SLOT_OPEN && head[23:0] == k
           && bitmap == full;
}

control NrEmit(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
#include "generated/pl_valid.p4"

    apply {
        bit<32> ring = (bit<32>)meta.ring;
        bit<40> nxt;
        ring_next.read(nxt, ring);
        bit<24> e = 0;
        if (nxt[39:24] == meta.epoch) {
            e = nxt[23:0];
        }
        bit<32> gslot = ring * NR_SLOTS + (bit<32>)(e & meta.slot_mask);
        bit<64> head;
        slot_head.read(head, gslot);
        bit<32> bitmap;
        slot_bitmap.read(bitmap, gslot);
        if (slot_ready(head, bitmap, e, meta.epoch, meta.full)) {
            slot_head.write(gslot, head[63:48] ++ SLOT_EMITTED ++ head[39:0]);
            ring_next.write(ring, meta.epoch ++ (e + 1));
            ring_ctr.count(ring * NR_CTRS + NR_CTR_COMPLETED);
            meta.emit = 1;
            meta.emit_k = e;
            meta.emit_gslot = gslot;
            meta.emit_opcode = head[39:32];
            meta.emit_words = head[31:24];
            bit<32> base = gslot * NR_MAX_ELEMS;
            pl_valid.apply();      // the first emit_words words valid, the others not
            NR_FOR_EACH_ELEM(NR_LOAD_ELEM)
            sm.mcast_grp = NR_RING_GROUP_BASE + (bit<16>)meta.ring;

            bit<24> e1 = e + 1;
            bit<32> gslot1 = ring * NR_SLOTS + (bit<32>)(e1 & meta.slot_mask);
            slot_head.read(head, gslot1);
            slot_bitmap.read(bitmap, gslot1);
            if (slot_ready(head, bitmap, e1, meta.epoch, meta.full)) {
                meta.cont = 1;
            }
        }
    }
}

#endif  /* NR_EMIT_P4 */
