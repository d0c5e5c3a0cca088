/* Rules 2-7 of docs/pipeline.md for one packet of a registered connection: checks (port,
 * IPv4 checksum and fragment, opcode, length, ICRC: verify before adding), then the
 * packet's slot (k mod N) takes its contribution, serves it as a retransmission, or
 * drops it. Counts every outcome in ring_ctr and conn_ctr, exactly as the software
 * target's AggregationPipeline.process does.
 *
 * Needs meta.ring, rank, psn0, in_port, out_port (conn_table) and epoch, slot_mask
 * (ring_table). Leaves meta.served = 1 when the packet goes back out as a served
 * retransmission (egress_spec set, payload replaced by the sums); any other packet is
 * consumed (contributed or dropped) and, if it was parsed whole, free to carry an
 * emission (NrEmit).
 */
#ifndef NR_AGGREGATE_P4
#define NR_AGGREGATE_P4

#include "state.p4"
#include "payload.p4"
#include "icrc.p4"

control NrAggregate(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrIcrc() icrc;

    /* One outcome of the packet: counted for its ring and its connection. */
    action bump(bit<32> id) {
        ring_ctr.count((bit<32>)meta.ring * NR_CTRS + id);
        conn_ctr.count(meta.conn * NR_CTRS + id);
    }

    apply {
        meta.conn = (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.rank;
        conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_PACKETS);
        bit<8> op = hdr.bth.opcode;
        bool verified = false;     // passed rules 2-6: rule 7 decides what its slot does
        if (sm.ingress_port != meta.in_port) {
            bump(NR_CTR_DROP_WRONG_PORT);
        } else if (sm.checksum_error == 1) {
            bump(NR_CTR_DROP_BAD_IPCSUM);
        } else if (hdr.ipv4.flags[0:0] == 1 || hdr.ipv4.frag != 0) {   // MF, fragment offset
            bump(NR_CTR_DROP_FRAGMENT);
        } else if (op < OP_WRITE_FIRST || op > OP_WRITE_ONLY_IMM) {
            bump(NR_CTR_DROP_BAD_OPCODE);
        } else if (meta.len_ok == 0 || sm.parser_error != error.NoError) {
            bump(NR_CTR_DROP_BAD_LENGTH);
        } else {
            bit<32> icrc_want;
            icrc.apply(hdr, meta.words, icrc_want);
            if (icrc_want != hdr.icrc.v) {
                bump(NR_CTR_DROP_BAD_ICRC);
            } else {
                verified = true;
            }
        }
        if (verified) {
            bit<24> k = hdr.bth.psn - meta.psn0;
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
            bool contribute = false;
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
                    contribute = true;
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
                    contribute = true;
                } else if (ahead < PSN_HALF) {
                    bump(NR_CTR_DROP_OVERRUN);
                } else {
                    bump(NR_CTR_DROP_STALE);
                }
            }

            if (contribute) {
                bit<32> acc;
                bit<32> keep = 32w0xFFFFFFFF;
                if (meta.fresh == 1) {
                    keep = 0;
                }
                NR_FOR_EACH_ELEM(NR_ADD_ELEM)
                slot_bitmap.write(gslot, bitmap | me);
                bit<32> c = gslot * NR_MAX_RANKS + (bit<32>)meta.rank;
                contrib_eth.write(c, hdr.eth.dst ++ hdr.eth.src);
                contrib_ip.write(c, hdr.ipv4.tos ++ hdr.ipv4.id ++ hdr.ipv4.flags
                                    ++ hdr.ipv4.frag ++ hdr.ipv4.ttl);
                contrib_udp.write(c, hdr.udp.sport);
                contrib_bth.write(c, hdr.bth.se ++ hdr.bth.mig ++ hdr.bth.pad ++ hdr.bth.tver
                                     ++ hdr.bth.pkey ++ hdr.bth.fb ++ hdr.bth.ackreq
                                     ++ hdr.bth.resv7);
                if (hdr.reth.isValid()) {
                    bit<128> reth = hdr.reth.va ++ hdr.reth.rkey ++ hdr.reth.dma_len;
                    contrib_reth.write(c, reth);
                    /* a FIRST or ONLY opens a message */
                    conn_reth.write(meta.conn, reth);
                    conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_MESSAGES);
                }
                if (hdr.immdt.isValid()) {
                    contrib_imm.write(c, hdr.immdt.imm);
                }
                bump(NR_CTR_AGGREGATED);
            }
        }
    }
}

#endif  /* NR_AGGREGATE_P4 */
