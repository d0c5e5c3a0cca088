/* Spine ingress (spine.p4): the spine role of a two-tier fabric, as switch/dataplane/spine.py
 * (SpinePipeline.process, SpinePool.offer), checks in its order:
 *   an inter-switch message (UDP 4792): not whole, CRC32, version, reserved, kind, k,
 *   length, UDP length -> drop_corrupt; unknown ring tag -> drop_unknown_ring; a ToR not in
 *   the ring -> drop_unknown_tor; another port than the ToR's, or not a partial -> the lane's
 *   drop_wrong_port; a message this program cannot hold (payload above NR_MAX_PL_BYTES, more
 *   than one carried header, a carried header of another length), a carried rank with no
 *   route, or one routed to its own ToR -> drop_mismatch; then the slot
 *   (k mod N): open it inside [next_total, next_total + N) (else drop_overrun /
 *   drop_stale), a length unlike the slot's -> drop_mismatch, add once (partials) keeping
 *   its carried header for the ToR it is routed to, or drop_duplicate, or, the slot totalled, the
 *   total again to that ToR only (totals_resent); the last partial in -> the total to the
 *   ring's multicast group, one replica per lane (completed); next_total moves on.
 *   A RoCE frame of a registered connection between racks from another port than its
 *   requester's ToR -> drop_spoofed_transit. Everything else: static L2, flood.
 *
 * Tables (programmed by switch/control/bmv2_spine.py):
 *   spine_rings   <tag>               -> set_ring(ring, epoch, slot_mask, full)
 *   spine_lanes   <ring, tor>         -> set_lane(lane, port)
 *   spine_routes  <ring, rank>        -> set_route(to_lane)
 *   spine_transit <src_ip, dst_ip, dest_qp> -> set_transit(port)
 *   l2            <dst_mac>           -> l2_forward(port); miss: flood
 * Invariants: a partial is added to its slot at most once per lane (the bitmap); a slot is
 * re-opened only for a k inside the window, so what it held was totalled; the packet that
 * completes a slot carries its total (the sums are put into its payload words here,
 * before replication); a message is never forwarded by L2.
 */
#ifndef NR_SPINE_INGRESS_P4
#define NR_SPINE_INGRESS_P4

#include "spine_state.p4"
#include "payload.p4"
#include "iscrc.p4"

/* Add word i of the partial to the slot's sum and put the new sum back into the word
 * (base = gslot * NR_MAX_ELEMS; keep 0 when the partial opens its slot). A completing
 * partial so carries the total; any other is dropped. Needs bit<32> acc, base, keep. */
#define NR_SPINE_ADD_ELEM(i)                                            \
    slot_sum.read(acc, base + i);                                       \
    acc = (acc & keep) + NR_BSWAP32(hdr.pl[i].v);                       \
    slot_sum.write(base + i, acc);                                      \
    hdr.pl[i].v = NR_BSWAP32(acc);

/* One step of next_total (nt) over a totalled slot. A pass cannot loop: NR_SPINE_ADVANCE
 * takes at most NR_SPINE_STEPS of them (switch/p4/README.md, spine deviations). Needs
 * bit<24> nt, bool go, bit<64> h, bit<32> ring in scope. */
#define NR_SPINE_ADVANCE_STEP                                                           \
    if (go) {                                                                           \
        slot_head.read(h, ring * NR_SLOTS + (bit<32>)(nt & meta.slot_mask));            \
        if (h[63:48] == meta.epoch && h[47:40] == SPINE_TOTALLED && h[23:0] == nt) {    \
            nt = nt + 1;                                                                \
        } else {                                                                        \
            go = false;                                                                 \
        }                                                                               \
    }
#define NR_SPINE_STEPS 4
#define NR_SPINE_ADVANCE                                                                \
    NR_SPINE_ADVANCE_STEP NR_SPINE_ADVANCE_STEP NR_SPINE_ADVANCE_STEP NR_SPINE_ADVANCE_STEP

control NrSpineIngress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrIsVerify() is_verify;
    bit<9> lane_port = 0;        // set by the tables' actions, read only after a hit
    bit<8> route_to = 0;
    bit<9> transit_port = 0;

    action set_ring(bit<8> ring, bit<16> epoch, bit<24> slot_mask, bit<32> full) {
        meta.ring = ring;
        meta.epoch = epoch;
        meta.slot_mask = slot_mask;
        meta.full = full;
    }

    table spine_rings {
        key = { hdr.nr_is.ring: exact @name("tag"); }
        actions = { set_ring; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS;
    }

    action set_lane(bit<8> lane, bit<9> port) {
        meta.lane = lane;
        lane_port = port;
    }

    table spine_lanes {
        key = {
            meta.ring: exact @name("ring");
            hdr.nr_is.tor: exact @name("tor");
        }
        actions = { set_lane; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS * NR_MAX_LANES;
    }

    action set_route(bit<8> to_lane) {
        route_to = to_lane;
    }

    table spine_routes {
        key = {
            meta.ring: exact @name("ring");
            hdr.nr_carried.rank: exact @name("rank");
        }
        actions = { set_route; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_RINGS * NR_MAX_LANES;
    }

    action set_transit(bit<9> port) {
        transit_port = port;
    }

    table spine_transit {
        key = {
            hdr.ipv4.src: exact @name("src_ip");
            hdr.ipv4.dst: exact @name("dst_ip");
            hdr.bth.dqpn: exact @name("dest_qp");
        }
        actions = { set_transit; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_MAX_TRANSIT;
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

    /* One outcome of a partial, counted for its (ring, lane). */
    action lane_bump(bit<32> id) {
        spine_lane_ctr.count(((bit<32>)meta.ring * NR_MAX_LANES + (bit<32>)meta.lane) * NR_LCTRS
                             + id);
    }

    apply {
        port_rx.count((bit<32>)sm.ingress_port);
        bool message = hdr.udp.isValid() && hdr.udp.dport == IS_UDP_PORT;
        if (hdr.udp.isValid() && hdr.udp.dport == ROCE_UDP_PORT) {
            port_roce.count((bit<32>)sm.ingress_port);
        }
        bool l2_fwd = !message;

        if (message) {
            bit<2> verdict;
            is_verify.apply(hdr, meta, sm, verdict);
            bool unsupported = verdict == IS_UNSUPPORTED;    // not parsed whole
            if (verdict == IS_CORRUPT) {
                spine_is_ctr.count(NR_ISCTR_DROP_CORRUPT);
            } else if (!spine_rings.apply().hit) {
                spine_is_ctr.count(NR_ISCTR_DROP_UNKNOWN_RING);
            } else if (!spine_lanes.apply().hit) {
                spine_is_ctr.count(NR_ISCTR_DROP_UNKNOWN_TOR);
            } else if (sm.ingress_port != lane_port || hdr.nr_is.kind != IS_PARTIAL) {
                lane_bump(NR_LCTR_DROP_WRONG_PORT);
            } else if (unsupported) {
                lane_bump(NR_LCTR_DROP_MISMATCH);
            } else {
                bool routed = true;
                if (hdr.nr_carried.isValid()) {
                    if (!spine_routes.apply().hit) {
                        routed = false;            // a header with nowhere to go
                    } else if (route_to == meta.lane) {
                        routed = false;            // bound for its own ToR
                    }
                }
                if (!routed) {
                    lane_bump(NR_LCTR_DROP_MISMATCH);
                } else {
                    bit<32> ring = (bit<32>)meta.ring;
                    bit<24> k = hdr.nr_is.k[23:0];
                    bit<32> gslot = ring * NR_SLOTS + (bit<32>)(k & meta.slot_mask);
                    bit<32> base = gslot * NR_MAX_ELEMS;
                    bit<64> head;
                    slot_head.read(head, gslot);
                    bit<32> bitmap;
                    slot_bitmap.read(bitmap, gslot);
                    bit<32> me = 32w1 << meta.lane;
                    bool live = head[63:48] == meta.epoch && head[47:40] != SLOT_EMPTY;
                    bool contribute = false;
                    bit<32> keep = 32w0xFFFFFFFF;
                    bit<40> nxt;
                    bit<24> nt;
                    bool go;
                    bit<64> h;
                    if (live && head[23:0] == k) {
                        if (head[31:24] != meta.words) {
                            lane_bump(NR_LCTR_DROP_MISMATCH);
                        } else if ((bitmap & me) != 0) {
                            if (head[47:40] == SPINE_TOTALLED) {
                                NR_FOR_EACH_ELEM(NR_LOAD_ELEM)
                                meta.total = 1;
                                meta.resend = 1;
                                meta.emit_gslot = gslot;
                                sm.egress_spec = lane_port;
                                lane_bump(NR_LCTR_TOTALS_RESENT);
                            } else {
                                lane_bump(NR_LCTR_DROP_DUPLICATE);
                            }
                        } else {
                            contribute = true;
                        }
                    } else {
                        ring_next.read(nxt, ring);
                        nt = 0;
                        if (nxt[39:24] == meta.epoch) {
                            nt = nxt[23:0];
                        }
                        bit<24> ahead = k - nt;
                        if (ahead > meta.slot_mask && ahead < PSN_HALF) {
                            /* next_total may lag behind slots totalled out of order */
                            bit<24> before = nt;
                            go = true;
                            NR_SPINE_ADVANCE
                            if (nt != before) {
                                ring_next.write(ring, meta.epoch ++ nt);
                            }
                            ahead = k - nt;
                        }
                        if (ahead <= meta.slot_mask) {
                            /* in the window: whatever slot held (k - N or older) was totalled */
                            bitmap = 0;
                            keep = 0;
                            contribute = true;
                        } else if (ahead < PSN_HALF) {
                            lane_bump(NR_LCTR_DROP_OVERRUN);
                        } else {
                            lane_bump(NR_LCTR_DROP_STALE);
                        }
                    }

                    if (contribute) {
                        bit<32> acc;
                        NR_FOR_EACH_ELEM(NR_SPINE_ADD_ELEM)
                        bitmap = bitmap | me;
                        slot_bitmap.write(gslot, bitmap);
                        if (hdr.nr_carried.isValid()) {
                            /* kept for the ToR it is routed to, tagged with epoch and k */
                            bit<32> c = gslot * NR_MAX_LANES + (bit<32>)route_to;
                            spine_carried.write(c, meta.epoch ++ k ++ hdr.nr_carried.hlen[7:0]
                                                   ++ hdr.nr_carried.rank);
                            spine_rh_base.write(c, hdr.rh_base.b);
                            if (hdr.rh_e16.isValid()) {
                                spine_rh_e16.write(c, hdr.rh_e16.b);
                            }
                            if (hdr.rh_e4.isValid()) {
                                spine_rh_e4.write(c, hdr.rh_e4.b);
                            }
                        }
                        lane_bump(NR_LCTR_PARTIALS);
                        bit<8> state = SPINE_OPEN;
                        if (bitmap == meta.full) {
                            state = SPINE_TOTALLED;
                            spine_ring_ctr.count(ring * NR_SCTRS + NR_SCTR_COMPLETED);
                            meta.total = 1;
                            meta.emit_gslot = gslot;
                            sm.mcast_grp = NR_RING_GROUP_BASE + (bit<16>)meta.ring;
                        }
                        slot_head.write(gslot, meta.epoch ++ state ++ 8w0 ++ meta.words ++ k);
                        if (meta.total == 1) {
                            ring_next.read(nxt, ring);
                            nt = 0;
                            if (nxt[39:24] == meta.epoch) {
                                nt = nxt[23:0];
                            }
                            bit<24> before = nt;     // moves on over totalled slots
                            go = true;
                            NR_SPINE_ADVANCE
                            if (nt != before) {
                                ring_next.write(ring, meta.epoch ++ nt);
                            }
                        }
                    }
                }
            }
            if (meta.total == 0) {
                mark_to_drop(sm);
            }
        } else if (hdr.bth.isValid()) {
            if (spine_transit.apply().hit && transit_port != sm.ingress_port) {
                spine_is_ctr.count(NR_ISCTR_DROP_SPOOFED_TRANSIT);
                mark_to_drop(sm);
                l2_fwd = false;
            }
        }

        if (l2_fwd) {
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

#endif  /* NR_SPINE_INGRESS_P4 */
