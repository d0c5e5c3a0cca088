/* Rules 2-6 of docs/pipeline.md for one packet of a registered connection, in the software
 * target's order: port, IPv4 checksum, fragment, opcode, length, ICRC (verify before
 * adding). Shared by the single switch (aggregate.p4) and the ToR (tor_ingress.p4).
 *
 * Needs meta.in_port (conn_table) and meta.words, meta.len_ok (parser). `drop` is the
 * NR_CTR_* id of the first check the packet fails, or NR_CTR_PACKETS (0) when it passes
 * them all: only then may rule 7 add it to, or serve it from, its slot.
 */
#ifndef NR_VERIFY_P4
#define NR_VERIFY_P4

#include "headers.p4"
#include "icrc.p4"

control NrVerify(in headers_t hdr, in meta_t meta, in standard_metadata_t sm,
                 out bit<32> drop) {
    NrIcrc() icrc;

    apply {
        drop = NR_CTR_PACKETS;
        bit<8> op = hdr.bth.opcode;
        if (sm.ingress_port != meta.in_port) {
            drop = NR_CTR_DROP_WRONG_PORT;
        } else if (sm.checksum_error == 1) {
            drop = NR_CTR_DROP_BAD_IPCSUM;
        } else if (hdr.ipv4.flags[0:0] == 1 || hdr.ipv4.frag != 0) {   // MF, fragment offset
            drop = NR_CTR_DROP_FRAGMENT;
        } else if (op < OP_WRITE_FIRST || op > OP_WRITE_ONLY_IMM) {
            drop = NR_CTR_DROP_BAD_OPCODE;
        } else if (meta.len_ok == 0 || sm.parser_error != error.NoError) {
            drop = NR_CTR_DROP_BAD_LENGTH;
        } else {
            bit<32> icrc_want;
            icrc.apply(hdr, meta.words, icrc_want);
            if (icrc_want != hdr.icrc.v) {
                drop = NR_CTR_DROP_BAD_ICRC;
            }
        }
    }
}

#endif  /* NR_VERIFY_P4 */
