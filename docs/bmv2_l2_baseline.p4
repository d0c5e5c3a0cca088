/* The least a v1model program can do for benchmarks.bench_bmv2's forward mode (p4lang
 * tutorials' basic forwarding, by MAC): Ethernet parsed and deparsed, switch/p4's `l2`
 * table (same names, so Bmv2Target programs it). What BMv2 itself costs per frame, next to
 * switch/p4 (switch/p4/README.md, "Cost per packet"). Build:
 *   p4c --target bmv2 --arch v1model --p4runtime-files DIR/netreduce.p4info.txtpb -o DIR \
 *       docs/bmv2_l2_baseline.p4 && mv DIR/bmv2_l2_baseline.json DIR/netreduce.json
 */
#include <core.p4>
#include <v1model.p4>
header ethernet_t { bit<48> dst; bit<48> src; bit<16> ether_type; }
struct headers_t { ethernet_t eth; }
struct meta_t { bit<1> flood; }
parser NrParser(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start { pkt.extract(hdr.eth); transition accept; }
}
control NrVerifyChecksum(inout headers_t hdr, inout meta_t meta) { apply { } }
control NrIngress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    action l2_forward(bit<9> port) { sm.egress_spec = port; }
    action l2_flood() { sm.mcast_grp = 1; }
    table l2 {
        key = { hdr.eth.dst: exact @name("dst_mac"); }
        actions = { l2_forward; l2_flood; }
        default_action = l2_flood();
        size = 1024;
    }
    apply { l2.apply(); }
}
control NrEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) { apply { } }
control NrComputeChecksum(inout headers_t hdr, inout meta_t meta) { apply { } }
control NrDeparser(packet_out pkt, in headers_t hdr) { apply { pkt.emit(hdr.eth); } }
V1Switch(NrParser(), NrVerifyChecksum(), NrIngress(), NrEgress(), NrComputeChecksum(), NrDeparser()) main;
