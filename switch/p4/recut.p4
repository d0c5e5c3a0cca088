/* Rule 7a of docs/pipeline.md: a re-cut stream. After a retry race (docs/roce.md) rxe sends
 * a message again as one empty WRITE_ONLY(_WITH_IMMEDIATE) at the next PSN and every later
 * packet one PSN late. Shared by the single switch (aggregate.p4) and the ToR
 * (tor_ingress.p4, its transit path too), as the software target's Recut.follow and slot
 * mapping (switch/dataplane/pipeline.py).
 *
 * A verified packet of connection meta.conn at relative PSN j = PSN - psn0 is slot
 * k = j - shift; an empty ONLY (`empty` = 1; the caller passes it on untouched) adds one to
 * shift and becomes recut_at, unless j repeats or precedes recut_at (conn_recut, state.p4).
 * Needs meta.conn, psn0, epoch, words.
 */
#ifndef NR_RECUT_P4
#define NR_RECUT_P4

#include "state.p4"

control NrRecut(in headers_t hdr, in meta_t meta, out bit<24> k, out bit<1> empty) {
    apply {
        bit<24> j = hdr.bth.psn - meta.psn0;
        bit<64> rc;
        conn_recut.read(rc, meta.conn);
        bit<24> shift = 0;
        bit<24> at = 0;
        if (rc[63:48] == meta.epoch) {
            shift = rc[47:24];
            at = rc[23:0];
        }
        empty = 0;
        bit<8> op = hdr.bth.opcode;
        if (meta.words == 0 && (op == OP_WRITE_ONLY || op == OP_WRITE_ONLY_IMM)) {
            empty = 1;
            bit<24> ahead = j - at;
            if (shift == 0 || (ahead != 0 && ahead < PSN_HALF)) {
                conn_recut.write(meta.conn, meta.epoch ++ (shift + 1) ++ j);
                conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_RECUTS);
            }
        }
        k = j - shift;
    }
}

#endif  /* NR_RECUT_P4 */
