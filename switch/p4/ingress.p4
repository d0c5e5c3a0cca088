/* Ingress: port counters, the connection lookup (rule 1), checks and aggregation (rules 2-7),
 * emission (rule 8) and L2 forwarding for everything else.
 *
 * Tables (programmed by switch/control/bmv2.py):
 *   conn_table   <src_ip, dst_ip, dest_qp> -> set_conn(ring, rank, psn0, in_port, out_port)
 *   response_table <src_ip, dst_ip, dest_qp> -> set_response(ring, rank, port): the key of
 *                the answers (ACK/NAK, ...) a connection's responder sends its requester
 *                (responder's IP, requester's IP, requester's QPN), and the responder's port
 *   ring_table   <ring>                     -> set_ring(epoch, slot_mask, full)
 *   l2           <dst_mac>                  -> l2_forward(port); miss: flood
 * Invariants: a frame never leaves by the port it came in on (L2); a packet of a
 * registered connection is never forwarded by L2 (it contributes, is served, carries an
 * emission or is dropped; the controller installs a ring's ring_table entry before its
 * connections and removes it after them); a response to a registered connection's
 * requester leaves only if it came in on its responder's port (rule 2r, else it is dropped
 * and counted drop_wrong_port on the connection); a continuation (recirculated) is never
 * counted as received.
 */
#ifndef NR_INGRESS_P4
#define NR_INGRESS_P4

#include "aggregate.p4"
#include "emit.p4"

control NrIngress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrAggregate() aggregate;
    NrEmit() emission;

    action set_conn(bit<8> ring, bit<8> rank, bit<24> psn0, bit<9> in_port, bit<9> out_port) {
        meta.ring = ring;
        meta.rank = rank;
        meta.psn0 = psn0;
        meta.in_port = in_port;
        meta.out_port = out_port;
    }

    table conn_table {
        key = {
            hdr.ipv4.src: exact @name("src_ip");
            hdr.ipv4.dst: exact @name("dst_ip");
            hdr.bth.dqpn: exact @name("dest_qp");
        }
        actions = { set_conn; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_CONNS;
    }

    action set_response(bit<8> ring, bit<8> rank, bit<9> port) {
        meta.ring = ring;
        meta.rank = rank;
        meta.out_port = port;
    }

    table response_table {
        key = {
            hdr.ipv4.src: exact @name("src_ip");
            hdr.ipv4.dst: exact @name("dst_ip");
            hdr.bth.dqpn: exact @name("dest_qp");
        }
        actions = { set_response; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_CONNS;
    }

    /* Rule 2r: a response from another port than its connection's responder's. */
    action drop_response() {
        meta.conn = (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.rank;
        conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_PACKETS);
        conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_DROP_WRONG_PORT);
        ring_ctr.count((bit<32>)meta.ring * NR_CTRS + NR_CTR_DROP_WRONG_PORT);
        meta.mode = MODE_DROP;
        mark_to_drop(sm);
    }

    action set_ring(bit<16> epoch, bit<24> slot_mask, bit<32> full) {
        meta.epoch = epoch;
        meta.slot_mask = slot_mask;
        meta.full = full;
    }

    table ring_table {
        key = { meta.ring: exact @name("ring"); }
        actions = { set_ring; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS;
    }

    action l2_forward(bit<9> port) {
        sm.egress_spec = port;
    }

    action l2_flood() {
        sm.mcast_grp = NR_FLOOD_GROUP;
        meta.flood = 1;
    }

    table l2 {
        key = { hdr.eth.dst: exact @name("dst_mac"); }
        actions = { l2_forward; l2_flood; }
        default_action = l2_flood();
        size = NR_MAX_MACS;
    }

    apply {
        if (sm.instance_type == NR_INSTANCE_RECIRC) {
            meta.mode = MODE_CONTINUE;
        } else {
            port_rx.count((bit<32>)sm.ingress_port);
            if (hdr.udp.isValid() && hdr.udp.dport == ROCE_UDP_PORT) {
                port_roce.count((bit<32>)sm.ingress_port);
            }
            if (hdr.bth.isValid()) {
                if (conn_table.apply().hit) {
                    meta.mode = MODE_RING;
                } else if (response_table.apply().hit) {
                    if (sm.ingress_port != meta.out_port) {
                        drop_response();
                    }
                }
            }
        }

        if (meta.mode == MODE_RING || meta.mode == MODE_CONTINUE) {
            if (ring_table.apply().hit) {
                if (meta.mode == MODE_RING) {
                    aggregate.apply(hdr, meta, sm);
                }
                /* Only a packet parsed whole can carry an emission: egress rebuilds every
                 * byte of it then, none of its own is left behind its new payload. */
                if (meta.served == 0 && (meta.mode == MODE_CONTINUE
                        || (meta.len_ok == 1 && sm.parser_error == error.NoError))) {
                    emission.apply(hdr, meta, sm);
                }
                if (meta.served == 0 && meta.emit == 0) {
                    mark_to_drop(sm);
                }
            } else if (meta.mode == MODE_CONTINUE) {
                mark_to_drop(sm);          // its ring was unregistered meanwhile
            } else {
                meta.mode = MODE_L2;       // the controller installs a ring before its connections
            }
        }

        if (meta.mode == MODE_L2) {
            if (hdr.eth.dst[40:40] == 1) {
                l2_flood();                // broadcast and multicast destinations
            } else {
                l2.apply();
            }
            if (meta.flood == 1) {
                port_flooded.count((bit<32>)sm.ingress_port);
            } else if (sm.egress_spec == sm.ingress_port) {
                mark_to_drop(sm);
            }
        }
    }
}

#endif  /* NR_INGRESS_P4 */
