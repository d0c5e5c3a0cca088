/* ToR ingress (tor.p4): the ToR role of a two-tier fabric, as switch/dataplane/tor.py
 * (TorPipeline.process, RackPool), rule for rule (docs/multirack.md, "Rules"):
 *   a packet of a local requester (conn_table): the host-facing checks (NrVerify), then its
 *   slot (k mod N): contribute (NrContribute; the last local contribution sends the partial
 *   up, partials_sent), serve a retransmission once the total is here (rule 4, even before
 *   the slot's emission), a duplicate without total resends the partials of next_emit and of
 *   k (rule 3), drop_mismatch / drop_stale; a k >= next_emit + N first sets the horizon
 *   k - 2W and passes over the slots every host is past (rule 7, NrTorAdvance), then is
 *   taken (a ToR never counts an overrun but where a pass runs out of steps, see
 *   switch/p4/README.md);
 *   a message (UDP 4792): NrIsVerify (drop_corrupt), its ring tag (drop_unknown_ring),
 *   uplink, kind total and this ToR's id (drop_total_misdirected), then rule 5: the slot
 *   holds k, locally complete (drop_total_unexpected), no total yet (drop_total_duplicate),
 *   the slot's length (drop_total_length), exactly the entering connection's header of the
 *   slot's opcode (drop_total_headers); taken (totals): the total becomes the slot's sums,
 *   the carried header the entering lane's contrib_* entries, the slot READY; emitted in
 *   order (NrTorAdvance), or, a gap, next_emit's partial resent;
 *   a packet of an entering connection (tor_transit): from the uplink forwarded untouched
 *   (forwarded) and the partials of next_emit and k resent (rule 6); from a host port
 *   dropped (the transit's drop_wrong_port);
 *   everything else: static L2, flood.
 * What leaves: a served retransmission is a unicast (as the single switch's); anything else
 * a pass sends (its emission's results, partials, the transit packet) goes to the ring's
 * multicast group, whose egress keeps the replicas meta asks for (tor_egress.p4). An
 * emission's total is put into the packet here, before replication, as the single switch
 * does (after the packet's own words were added: the total is kept apart, tor_total); a
 * partial's sums are read in egress from slot_sum, which only a re-opening changes.
 *
 * Tables (programmed by switch/control/bmv2_tor.py):
 *   conn_table  <src_ip, dst_ip, dest_qp> -> set_conn(ring, rank = lane, psn0, in_port, out_port)
 *   tor_transit <src_ip, dst_ip, dest_qp> -> set_transit(ring, psn0, out_port)
 *   tor_tags    <tag>                     -> set_tag(ring)
 *   ring_table  <ring>                    -> set_ring(epoch, slot_mask, full, w2, tor_id,
 *                  uplink, tag, me_mac, me_ip, spine_mac, spine_ip, has_leave, leave_lane,
 *                  leave_rank, has_enter, enter_lane, enter_rank)
 *   l2          <dst_mac>                 -> l2_forward(port); miss: flood
 */
#ifndef NR_TOR_INGRESS_P4
#define NR_TOR_INGRESS_P4

#include "tor_state.p4"
#include "payload.p4"
#include "verify.p4"
#include "contribute.p4"
#include "iscrc.p4"
#include "tor_advance.p4"
#include "recut.p4"

/* A total's word i becomes the slot's total i (base = gslot * NR_MAX_ELEMS). */
#define NR_TOR_STORE_ELEM(i)                                            \
    tor_total.write(base + i, NR_BSWAP32(hdr.pl[i].v));

/* The slot's total i into word i of the packet (a served retransmission, an emission). */
#define NR_TOR_LOAD_ELEM(i)                                             \
    tor_total.read(hdr.pl[i].v, base + i);                              \
    hdr.pl[i].v = NR_BSWAP32(hdr.pl[i].v);

control NrTorIngress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrVerify() checks;
    NrContribute() contribute;
    NrRecut() recut;
    NrIsVerify() is_verify;
    NrTorAdvance() advance;
    NrTorRecover() recover;
    NrTorRecover() recover_gap;
    NrTorRecover() recover_transit;
#include "generated/pl_valid.p4"

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

    action set_transit(bit<8> ring, bit<24> psn0, bit<9> out_port) {
        meta.ring = ring;
        meta.psn0 = psn0;
        meta.out_port = out_port;
    }

    table tor_transit {
        key = {
            hdr.ipv4.src: exact @name("src_ip");
            hdr.ipv4.dst: exact @name("dst_ip");
            hdr.bth.dqpn: exact @name("dest_qp");
        }
        actions = { set_transit; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS;
    }

    action set_tag(bit<8> ring) {
        meta.ring = ring;
    }

    table tor_tags {
        key = { hdr.nr_is.ring: exact @name("tag"); }
        actions = { set_tag; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS;
    }

    action set_ring(bit<16> epoch, bit<24> slot_mask, bit<32> full, bit<24> w2,
                    bit<8> tor_id, bit<9> uplink, bit<32> tag, bit<48> me_mac, bit<32> me_ip,
                    bit<48> spine_mac, bit<32> spine_ip, bit<1> has_leave, bit<8> leave_lane,
                    bit<16> leave_rank, bit<1> has_enter, bit<8> enter_lane,
                    bit<16> enter_rank) {
        meta.epoch = epoch;
        meta.slot_mask = slot_mask;
        meta.full = full;
        meta.w2 = w2;
        meta.tor_id = tor_id;
        meta.uplink = uplink;
        meta.tag = tag;
        meta.me_mac = me_mac;
        meta.me_ip = me_ip;
        meta.spine_mac = spine_mac;
        meta.spine_ip = spine_ip;
        meta.has_leave = has_leave;
        meta.leave_lane = leave_lane;
        meta.leave_rank = leave_rank;
        meta.has_enter = has_enter;
        meta.enter_lane = enter_lane;
        meta.enter_rank = enter_rank;
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

    /* One outcome of a local requester's packet: counted for its ring and its lane. */
    action bump(bit<32> id) {
        ring_ctr.count((bit<32>)meta.ring * NR_CTRS + id);
        conn_ctr.count(meta.conn * NR_CTRS + id);
    }

    action tor_bump(bit<32> id) {
        tor_ctr.count((bit<32>)meta.ring * NR_TCTRS + id);
    }

    apply {
        bool ring_pkt = false;        // a local requester's packet
        bool transit = false;
        bool message = false;
        if (sm.instance_type == NR_INSTANCE_RECIRC) {
            meta.mode = MODE_CONTINUE;
        } else {
            port_rx.count((bit<32>)sm.ingress_port);
            if (hdr.udp.isValid() && hdr.udp.dport == ROCE_UDP_PORT) {
                port_roce.count((bit<32>)sm.ingress_port);
            }
            message = hdr.udp.isValid() && hdr.udp.dport == IS_UDP_PORT;
            if (hdr.bth.isValid()) {
                if (conn_table.apply().hit) {
                    ring_pkt = true;
                } else if (tor_transit.apply().hit) {
                    transit = true;
                }
            }
        }
        bool whole = meta.len_ok == 1 && sm.parser_error == error.NoError;   // a WRITE's
        bit<24> k = hdr.bth.psn - meta.psn0;
        bit<32> gslot = 0;
        bit<64> head = 0;
        bit<32> bitmap = 0;
        bit<40> nxt = 0;
        bit<24> ne = 0;

        /* the ring: the continuation's (preserved), the connection's, the message's tag */
        bit<2> verdict = IS_OK;
        bool found = meta.mode == MODE_CONTINUE || ring_pkt || transit;
        if (message) {
            is_verify.apply(hdr, meta, sm, verdict);
            if (verdict != IS_CORRUPT) {
                found = tor_tags.apply().hit;
            }
        }
        if (found) {
            found = ring_table.apply().hit;   // installed before the ring's other entries
        }

        if (meta.mode == MODE_CONTINUE) {
            if (found) {
                advance.apply(meta);
            }
        } else if (ring_pkt && found) {
            meta.mode = MODE_RING;
            meta.conn = (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.rank;
            conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_PACKETS);
            bit<32> drop;
            checks.apply(hdr, meta, sm, drop);
            bit<1> empty = 0;
            if (drop != NR_CTR_PACKETS) {
                bump(drop);
            } else {
                recut.apply(hdr, meta, k, empty);
            }
            if (empty == 1) {       // rule 7a: a re-cut's empty packet goes on untouched
                sm.egress_spec = meta.out_port;
                meta.served = 1;
                bump(NR_CTR_EMPTIES_FORWARDED);
            } else if (drop == NR_CTR_PACKETS) {
                gslot = (bit<32>)meta.ring * NR_SLOTS + (bit<32>)(k & meta.slot_mask);
                slot_head.read(head, gslot);
                slot_bitmap.read(bitmap, gslot);
                ring_next.read(nxt, (bit<32>)meta.ring);
                if (nxt[39:24] == meta.epoch) {
                    ne = nxt[23:0];
                }
                bit<32> me = 32w1 << meta.rank;
                bit<16> shape = hdr.bth.opcode ++ meta.words;
                bool add = false;
                if (tor_holds(head, k, ne, meta.epoch, meta.slot_mask)) {
                    if (head[39:24] != shape) {
                        bump(NR_CTR_DROP_MISMATCH);
                    } else if ((bitmap & me) != 0) {
                        if (head[47:40] != SLOT_OPEN) {     // rule 4: the total is here
                            bit<32> base = gslot * NR_MAX_ELEMS;
                            NR_FOR_EACH_ELEM(NR_TOR_LOAD_ELEM)
                            hdr.udp.csum = 0;          // as rxe sends it; the ICRC masks it
                            sm.egress_spec = meta.out_port;
                            meta.served = 1;
                            meta.fix_icrc = 1;
                            bump(NR_CTR_RETRANSMITS_SERVED);
                        } else {                            // rule 3
                            bump(NR_CTR_DROP_DUPLICATE);
                            recover.apply(meta, k);
                        }
                    } else {
                        add = true;
                    }
                } else {
                    bit<24> ahead = k - ne;
                    if (ahead > meta.slot_mask && ahead < PSN_HALF) {
                        /* rule 7: its sender had k - W acknowledged, so every host is past
                         * k - 2W; the horizon only moves forward */
                        bit<24> last = k - meta.w2;
                        bit<40> hz;
                        tor_horizon.read(hz, (bit<32>)meta.ring);
                        if (hz[39:24] != meta.epoch || last - hz[23:0] < PSN_HALF) {
                            tor_horizon.write((bit<32>)meta.ring, meta.epoch ++ last);
                        }
                        advance.apply(meta);
                        ring_next.read(nxt, (bit<32>)meta.ring);
                        if (nxt[39:24] == meta.epoch) {
                            ne = nxt[23:0];
                        }
                        ahead = k - ne;
                    }
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
                    if (meta.has_leave == 1 && meta.rank == meta.leave_lane) {
                        tor_lv_base.write(gslot, hdr.eth.dst ++ hdr.eth.src ++ hdr.eth.ether_type
                            ++ hdr.ipv4.version ++ hdr.ipv4.ihl ++ hdr.ipv4.tos
                            ++ hdr.ipv4.total_len ++ hdr.ipv4.id ++ hdr.ipv4.flags
                            ++ hdr.ipv4.frag ++ hdr.ipv4.ttl ++ hdr.ipv4.protocol
                            ++ hdr.ipv4.csum ++ hdr.ipv4.src ++ hdr.ipv4.dst
                            ++ hdr.udp.sport ++ hdr.udp.dport ++ hdr.udp.len ++ 16w0
                            ++ hdr.bth.opcode ++ hdr.bth.se ++ hdr.bth.mig ++ hdr.bth.pad
                            ++ hdr.bth.tver ++ hdr.bth.pkey ++ hdr.bth.fb ++ hdr.bth.dqpn
                            ++ hdr.bth.ackreq ++ hdr.bth.resv7 ++ hdr.bth.psn);
                        if (hdr.reth.isValid()) {
                            tor_lv_e16.write(gslot, hdr.reth.va ++ hdr.reth.rkey
                                                    ++ hdr.reth.dma_len);
                        }
                        if (hdr.immdt.isValid()) {
                            tor_lv_e4.write(gslot, hdr.immdt.imm);
                        }
                    }
                    bump(NR_CTR_AGGREGATED);
                    if ((bitmap | me) == meta.full) {       // rule 2: the partial goes up
                        meta.part_b = 1;
                        meta.part_b_k = k;
                        meta.mcast = 1;
                        tor_bump(NR_TCTR_PARTIALS_SENT);
                    }
                }
            }
        } else if (transit && found) {
            meta.mode = MODE_RING;
            if (sm.ingress_port != meta.uplink) {
                tor_transit_ctr.count((bit<32>)meta.ring * NR_XCTRS + NR_XCTR_DROP_WRONG_PORT);
            } else {
                tor_transit_ctr.count((bit<32>)meta.ring * NR_XCTRS + NR_XCTR_FORWARDED);
                if (whole) {          // rule 6: a served retransmission, our total may be lost
                    /* rule 7a: its ToR verified a re-cut's empty packet before sending it
                     * up; the entering lane's shift follows it here */
                    meta.conn = (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.enter_lane;
                    bit<1> empty;
                    recut.apply(hdr, meta, k, empty);
                    recover_transit.apply(meta, k);
                }
                if (meta.mcast == 1) {
                    meta.fwd = 1;
                } else {
                    sm.egress_spec = meta.out_port;
                    meta.served = 1;
                }
            }
        } else if (message) {
            meta.mode = MODE_RING;
            if (verdict == IS_CORRUPT) {
                tor_is_ctr.count(NR_ISCTR_DROP_CORRUPT);
            } else if (!found) {
                tor_is_ctr.count(NR_ISCTR_DROP_UNKNOWN_RING);
            } else if (sm.ingress_port != meta.uplink || hdr.nr_is.kind != IS_TOTAL
                       || hdr.nr_is.tor != meta.tor_id) {
                tor_bump(NR_TCTR_DROP_TOTAL_MISDIRECTED);
            } else {                                  // rule 5
                bit<24> tk = hdr.nr_is.k[23:0];
                gslot = (bit<32>)meta.ring * NR_SLOTS + (bit<32>)(tk & meta.slot_mask);
                slot_head.read(head, gslot);
                slot_bitmap.read(bitmap, gslot);
                ring_next.read(nxt, (bit<32>)meta.ring);
                if (nxt[39:24] == meta.epoch) {
                    ne = nxt[23:0];
                }
                bit<8> op = head[39:32];
                bit<16> hlen = 54;                    // the carried header a WRITE has
                if (op == OP_WRITE_FIRST || op == OP_WRITE_ONLY) {
                    hlen = 70;
                } else if (op == OP_WRITE_ONLY_IMM) {
                    hlen = 74;
                } else if (op == OP_WRITE_LAST_IMM) {
                    hlen = 58;
                }
                bool headers_ok = hdr.nr_is.carried == 0;
                if (meta.has_enter == 1) {
                    headers_ok = hdr.nr_carried.isValid() && hdr.rh_base.isValid()
                                 && hdr.nr_carried.rank == meta.enter_rank
                                 && hdr.nr_carried.hlen == hlen && hdr.rh_base.b[95:88] == op;
                }
                if (!tor_holds(head, tk, ne, meta.epoch, meta.slot_mask)
                        || bitmap != meta.full) {
                    tor_bump(NR_TCTR_DROP_TOTAL_UNEXPECTED);
                } else if (head[47:40] != SLOT_OPEN) {
                    tor_bump(NR_TCTR_DROP_TOTAL_DUPLICATE);
                } else if (hdr.nr_is.length != (bit<16>)head[31:24] << 2) {
                    tor_bump(NR_TCTR_DROP_TOTAL_LENGTH);
                } else if (verdict == IS_UNSUPPORTED || !headers_ok) {
                    tor_bump(NR_TCTR_DROP_TOTAL_HEADERS);
                } else {
                    bit<32> base = gslot * NR_MAX_ELEMS;
                    NR_FOR_EACH_ELEM(NR_TOR_STORE_ELEM)
                    if (meta.has_enter == 1) {        // the entering lane's result header
                        bit<432> b = hdr.rh_base.b;
                        bit<32> c = gslot * NR_MAX_RANKS + (bit<32>)meta.enter_lane;
                        contrib_eth.write(c, b[431:336]);
                        contrib_ip.write(c, b[311:304] ++ b[287:272] ++ b[271:256] ++ b[255:248]);
                        contrib_udp.write(c, b[159:144]);
                        contrib_bth.write(c, b[87:80] ++ b[79:64] ++ b[63:56] ++ b[31:24]);
                        if (hdr.rh_e16.isValid()) {
                            contrib_reth.write(c, hdr.rh_e16.b);
                        }
                        if (hdr.rh_e4.isValid()) {
                            contrib_imm.write(c, hdr.rh_e4.b);
                        }
                    }
                    slot_head.write(gslot, head[63:48] ++ SLOT_READY ++ head[39:0]);
                    bit<32> rd;
                    tor_ready.read(rd, (bit<32>)meta.ring);
                    bit<16> ready = 0;
                    if (rd[31:16] == meta.epoch) {
                        ready = rd[15:0];
                    }
                    tor_ready.write((bit<32>)meta.ring, meta.epoch ++ (ready + 1));
                    tor_bump(NR_TCTR_TOTALS);
                    if (tk != ne) {                   // a gap: next_emit's total may be lost
                        recover_gap.apply(meta, ne);
                    }
                    advance.apply(meta);
                }
            }
        }

        if (meta.emit == 1) {
            meta.mcast = 1;
            pl_valid.apply();          // the first emit_words words valid, the others not
            bit<32> base = meta.emit_gslot * NR_MAX_ELEMS;
            NR_FOR_EACH_ELEM(NR_TOR_LOAD_ELEM)
        }
        if (meta.mcast == 1) {
            sm.mcast_grp = NR_RING_GROUP_BASE + (bit<16>)meta.ring;
        } else if (meta.mode != MODE_L2 && meta.served == 0) {
            mark_to_drop(sm);
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

#endif  /* NR_TOR_INGRESS_P4 */
