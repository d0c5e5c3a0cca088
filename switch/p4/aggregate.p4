/* Rules 2-7 of docs/pipeline.md for one packet of a registered connection: checks (port,
 * IPv4 checksum and fragment, opcode, length, ICRC: verify before adding), then an empty
 * ONLY re-cuts the stream and goes on untouched (rule 7a, NrRecut), and any other packet's
 * slot (k mod N) takes its contribution, serves it as a retransmission, or drops it.
 * Counts every outcome in ring_ctr and conn_ctr, exactly as the software target's
 * AggregationPipeline.process does.
 *
 * The checks are NrVerify's (verify.p4), the addition NrContribute's (contribute.p4).
 * Needs meta.ring, rank, psn0, in_port, out_port (conn_table) and epoch, slot_mask
 * (ring_table). Leaves meta.served = 1 when the packet goes back out as a served
 * retransmission (egress_spec set, payload replaced by the sums) or a re-cut's empty
 * packet (egress_spec set, untouched); any other packet is consumed (contributed or
 * dropped) and, if it was parsed whole, free to carry an emission (NrEmit).
 */
#ifndef NR_AGGREGATE_P4
#define NR_AGGREGATE_P4

#include "state.p4"
#include "payload.p4"
#include "verify.p4"
#include "contribute.p4"
#include "recut.p4"

control NrAggregate(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrVerify() checks;
    NrContribute() contribute;
    NrRecut() recut;

    /* One outcome of the packet: counted for its ring and its connection. */
    action bump(bit<32> id) {
        ring_ctr.count((bit<32>)meta.ring * NR_CTRS + id);
        conn_ctr.count(meta.conn * NR_CTRS + id);
    }

    apply {
        meta.conn = (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.rank;
        conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_PACKETS);
        bit<32> drop;
        checks.apply(hdr, meta, sm, drop);
        bit<24> k = 0;
        bit<1> empty = 0;
        if (drop != NR_CTR_PACKETS) {
            bump(drop);
        } else {
            recut.apply(hdr, meta, k, empty);
        }
        if (empty == 1) {
            /* rule 7a: a re-cut's empty packet goes on to the responder untouched */
            sm.egress_spec = meta.out_port;
            meta.served = 1;
            bump(NR_CTR_EMPTIES_FORWARDED);
        } else if (drop == NR_CTR_PACKETS) {
            /* passed rules 2-6: rule 7 decides what its slot does */
            bit<8> op = hdr.bth.opcode;
            bit<32> gslot = (bit<32>)meta.ring * NR_SLOTS + (bit<32>)(k & meta.slot_mask);
            bit<32> base = gslot * NR_MAX_ELEMS;
            bit<64> head;
            slot_head.read(head, gslot);
            bit<32> bitmap;
            slot_bitmap.read(bitmap, gslot);
            bit<32> me = 32w1 << meta.rank;
            bit<16> shape = op ++ meta.words;
            bool live = head[63:48] == meta.epoch && head[47:40] != SLOT_EMPTY;
            bool emitted = head[47:40] == SLOT_EMITTED;
            bit<24> tag = head[23:0];
            bool add = false;
            if (live && tag == k) {
                if (head[39:24] != shape) {
                    bump(NR_CTR_DROP_MISMATCH);
                } else if ((bitmap & me) != 0) {
                    if (emitted) {
                        NR_FOR_EACH_ELEM(NR_LOAD_ELEM)
                        hdr.udp.csum = 0;              // as rxe sends it; the ICRC masks it
                        sm.egress_spec = meta.out_port;
                        meta.served = 1;
                        meta.fix_icrc = 1;
                        bump(NR_CTR_RETRANSMITS_SERVED);
                    } else {
                        bump(NR_CTR_DROP_DUPLICATE);
                    }
                } else {
                    add = true;
                }
            } else {
                /* A new k opens its slot only inside [next_emit, next_emit + N): whatever
                 * the slot held before precedes next_emit, so it was emitted. */
                bit<40> nxt;
                ring_next.read(nxt, (bit<32>)meta.ring);
                bit<24> ne = 0;
                if (nxt[39:24] == meta.epoch) {
                    ne = nxt[23:0];
                }
                bit<24> ahead = k - ne;
                if (ahead <= meta.slot_mask) {
                    slot_head.write(gslot, meta.epoch ++ SLOT_OPEN ++ shape ++ k);
                    bitmap = 0;
                    meta.fresh = 1;
                    add = true;
                } else if (ahead < PSN_HALF) {
                    bump(NR_CTR_DROP_OVERRUN);
                } else {
                    bump(NR_CTR_DROP_STALE);
                }
            }

            if (add) {
                contribute.apply(hdr, meta, gslot, bitmap);
                bump(NR_CTR_AGGREGATED);
            }
        }
    }
}

#endif  /* NR_AGGREGATE_P4 */
