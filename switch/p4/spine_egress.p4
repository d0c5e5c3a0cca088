/* Spine egress (spine.p4): each replica of a total becomes that ToR's total, as
 * interswitch.encode(spine, tor, TOTAL, tor id, ring, k, sums, routed headers) writes it:
 * Ethernet (ToR's MAC, the spine's), IPv4 (ToS 0, ID 0, DF, TTL 64, UDP; lengths; the
 * checksum recomputed by NrComputeChecksum), UDP 4792 -> 4792 with checksum 0, the header
 * (version 1, kind total, the ToR's id, carried 0 or 1, ring and k and length as the
 * partial's), the sums (put into the payload words in ingress), the RoCE header routed to
 * this ToR (kept for it per (slot, lane) in the spine_* registers by ingress), CRC32.
 * A ring's multicast group has one replica per lane (rid = lane); a resent total is a
 * unicast with meta.lane set in ingress.
 *
 * Table (programmed by switch/control/bmv2_spine.py):
 *   spine_lane_out <ring, lane> -> set_lane_out(tor_mac, tor_ip, tor_id, me_mac, me_ip)
 */
#ifndef NR_SPINE_EGRESS_P4
#define NR_SPINE_EGRESS_P4

#include "spine_state.p4"
#include "interswitch.p4"

control NrSpineEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrIsHeaders() headers;
    NrIsSign() sign;
    action set_lane_out(bit<48> tor_mac, bit<32> tor_ip, bit<8> tor_id, bit<48> me_mac,
                        bit<32> me_ip) {
        hdr.eth.dst = tor_mac;
        hdr.eth.src = me_mac;
        hdr.ipv4.src = me_ip;
        hdr.ipv4.dst = tor_ip;
        hdr.nr_is.tor = tor_id;
    }

    table spine_lane_out {
        key = {
            meta.ring: exact @name("ring");
            meta.lane: exact @name("lane");
        }
        actions = { set_lane_out; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS * NR_MAX_LANES;
    }

    apply {
        bool sent = true;
        if (meta.total == 1) {
            if (meta.resend == 0) {
                meta.lane = (bit<8>)sm.egress_rid;
            }
            if (spine_lane_out.apply().hit) {
                headers.apply(hdr, IS_TOTAL);
                bit<32> c = meta.emit_gslot * NR_MAX_LANES + (bit<32>)meta.lane;
                bit<64> held;
                spine_carried.read(held, c);
                bit<16> hlen = (bit<16>)held[23:16];
                if (held[63:48] == meta.epoch && held[47:24] == hdr.nr_is.k[23:0]) {
                    if (hlen != 0) {
                        hdr.nr_is.carried = 1;
                        hdr.nr_carried.setValid();
                        hdr.nr_carried.hlen = hlen;
                        hdr.nr_carried.rank = held[15:0];
                        hdr.rh_base.setValid();
                        spine_rh_base.read(hdr.rh_base.b, c);
                        if (hlen == 70 || hlen == 74) {
                            hdr.rh_e16.setValid();
                            spine_rh_e16.read(hdr.rh_e16.b, c);
                        }
                        if (hlen == 58 || hlen == 74) {
                            hdr.rh_e4.setValid();
                            spine_rh_e4.read(hdr.rh_e4.b, c);
                        }
                    }
                }
                sign.apply(hdr, meta, meta.words);
                spine_ring_ctr.count((bit<32>)meta.ring * NR_SCTRS + NR_SCTR_TOTALS_SENT);
            } else {
                mark_to_drop(sm);          // the ring was unregistered meanwhile
                sent = false;
            }
        } else if (meta.flood == 1 && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
            sent = false;
        }
        if (sent) {
            port_tx.count((bit<32>)sm.egress_port);
        }
    }
}

#endif  /* NR_SPINE_EGRESS_P4 */
