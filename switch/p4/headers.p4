/* Headers and metadata of the NetReduce v1model program.
 *
 * RoCEv2 over IPv4 as rxe sends it (shared/ROCE.md):
 *   Ethernet | IPv4 (IHL 5) | UDP (dport 4791) | BTH | [RETH][ImmDt] or [AETH] | payload | ICRC
 * An RC RDMA WRITE's payload is parsed as up to NR_MAX_ELEMS little-endian int32 words
 * (payload.p4 byte-reverses them around the sums).
 */
#ifndef NR_HEADERS_P4
#define NR_HEADERS_P4

#include "limits.p4"

/* Both roles of the two-tier fabric (spine.p4, tor.p4) speak the inter-switch messages. */
#if defined(NR_ROLE_SPINE) || defined(NR_ROLE_TOR)
#define NR_INTERSWITCH
#endif

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IPPROTO_UDP    = 17;
const bit<16> ROCE_UDP_PORT  = 4791;
const bit<16> IS_UDP_PORT    = 4792;   // inter-switch messages (switch/dataplane/interswitch.py)

const bit<16> IPV4_LEN  = 20;
const bit<16> UDP_LEN   = 8;
const bit<16> BTH_LEN   = 12;
const bit<16> RETH_LEN  = 16;
const bit<16> IMMDT_LEN = 4;
const bit<16> ICRC_LEN  = 4;

/* RC opcodes (IBTA Vol. 1 Table 38): the RDMA WRITEs the switch aggregates, and ACK. */
const bit<8> OP_WRITE_FIRST     = 0x06;
const bit<8> OP_WRITE_MIDDLE    = 0x07;
const bit<8> OP_WRITE_LAST      = 0x08;
const bit<8> OP_WRITE_LAST_IMM  = 0x09;
const bit<8> OP_WRITE_ONLY      = 0x0a;
const bit<8> OP_WRITE_ONLY_IMM  = 0x0b;
const bit<8> OP_ACKNOWLEDGE     = 0x11;

/* Payload bytes the parser accepts: a multiple of 4, at most NR_MAX_PL_BYTES. Because
 * NR_MAX_PL_BYTES is a power of two, "< NR_MAX_PL_BYTES and a multiple of 4" is
 * "value & PL_SHORT_MASK == 0". */
const bit<16> MAX_PL_BYTES  = NR_MAX_PL_BYTES;
const bit<16> PL_SHORT_MASK = ~(MAX_PL_BYTES - 1) | 3;

/* Slot states (slot_head[47:40]); a slot whose epoch is not its ring's is empty. */
const bit<8> SLOT_EMPTY   = 0;
const bit<8> SLOT_OPEN    = 1;   // collecting contributions
const bit<8> SLOT_EMITTED = 2;   // its result went out; retransmissions are served from it
#ifdef NR_ROLE_TOR
const bit<8> SLOT_READY   = 3;   // ToR: the spine's total is in the sums, not emitted yet
#endif
const bit<24> PSN_HALF    = 24w0x800000;  // serial arithmetic: a distance below this is "ahead"

/* Ingress dispatch (meta.mode). */
const bit<2> MODE_L2       = 0;  // forward by destination MAC
const bit<2> MODE_RING     = 1;  // a packet of a registered connection
const bit<2> MODE_CONTINUE = 2;  // a recirculated continuation: emit the ring's next slot
const bit<2> MODE_DROP     = 3;  // a registered connection's response from another port than its responder's

header ethernet_t {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  tos;
    bit<16> total_len;
    bit<16> id;
    bit<3>  flags;
    bit<13> frag;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> csum;
    bit<32> src;
    bit<32> dst;
}

header udp_t {
    bit<16> sport;
    bit<16> dport;
    bit<16> len;
    bit<16> csum;
}

/* Base Transport Header. `fb` is byte 4 (FECN, BECN, 6 reserved bits): the ICRC counts
 * it as all ones. */
header bth_t {
    bit<8>  opcode;
    bit<1>  se;
    bit<1>  mig;
    bit<2>  pad;
    bit<4>  tver;
    bit<16> pkey;
    bit<8>  fb;
    bit<24> dqpn;
    bit<1>  ackreq;
    bit<7>  resv7;
    bit<24> psn;
}

header reth_t {
    bit<64> va;
    bit<32> rkey;
    bit<32> dma_len;
}

header immdt_t {
    bit<32> imm;
}

header aeth_t {
    bit<8>  syndrome;
    bit<24> msn;
}

header word_t {
    bit<32> v;
}

header icrc_t {
    bit<32> v;   // the CRC-32 byte-reversed: it is stored little-endian on the wire
}

#ifdef NR_INTERSWITCH
/* The inter-switch message (switch/dataplane/interswitch.py), fabric roles only:
 *   nr_is | length/4 payload words (hdr.pl) | [nr_carried | RoCE header] | CRC32 (hdr.icrc)
 * A carried RoCE header (hlen bytes: Ethernet up to the payload of a WRITE) is opaque to the
 * spine (a ToR reads a total's, to rebuild an entering connection's results); it is parsed
 * as fixed chunks by hlen: 54 = base, 58 = base | ext4 (ImmDt),
 * 70 = base | ext16 (RETH), 74 = base | ext16 | ext4. */
const bit<8> IS_VERSION = 1;
const bit<8> IS_PARTIAL = 1;
const bit<8> IS_TOTAL   = 2;
const bit<16> IS_HEADER_LEN  = 16;
const bit<16> IS_CARRIED_LEN = 4;
const bit<2> IS_OK          = 0;   // NrIsVerify's verdicts (iscrc.p4)
const bit<2> IS_CORRUPT     = 1;
const bit<2> IS_UNSUPPORTED = 2;

header nr_is_t {
    bit<8>  version;
    bit<8>  kind;
    bit<8>  tor;
    bit<8>  carried;
    bit<32> ring;
    bit<32> k;
    bit<16> length;
    bit<16> reserved;
}

header nr_carried_t {
    bit<16> rank;
    bit<16> hlen;
}

header nr_rh_base_t { bit<432> b; }     // Ethernet | IPv4 | UDP | BTH: 54 bytes
header nr_rh_e16_t  { bit<128> b; }     // RETH
header nr_rh_e4_t   { bit<32> b; }      // ImmDt
#endif

struct headers_t {
    ethernet_t          eth;
    ipv4_t              ipv4;
    udp_t               udp;
    bth_t               bth;
    reth_t              reth;
    immdt_t             immdt;
    aeth_t              aeth;
#ifdef NR_INTERSWITCH
    nr_is_t             nr_is;
#endif
    word_t[NR_MAX_ELEMS] pl;
#ifdef NR_INTERSWITCH
    nr_carried_t        nr_carried;
    nr_rh_base_t        rh_base;
    nr_rh_e16_t         rh_e16;
    nr_rh_e4_t          rh_e4;
#endif
    icrc_t              icrc;         // the ICRC, or the CRC32 of an inter-switch message
}

struct meta_t {
    /* parser */
    bit<16> pl_bytes;      // UDP length - UDP - BTH - extension headers - ICRC (pad included)
    bit<8>  words;         // payload words parsed into hdr.pl
    bit<8>  words_left;    // parser loop counter
    bit<1>  len_ok;        // pad 0 and pl_bytes a multiple of 4, <= MAX_PL_BYTES
    /* ingress dispatch, connection (conn_table) and ring (ring_table) */
    bit<2>  mode;
    @field_list(NR_FL_CONTINUE)
    bit<8>  ring;          // ring index
    bit<8>  rank;
    bit<24> psn0;
    bit<9>  in_port;       // the requester's port
    bit<9>  out_port;      // the responder's port
    bit<32> conn;          // ring * NR_MAX_RANKS + rank
    bit<16> epoch;         // the ring's registration epoch: older slot state counts as empty
    bit<24> slot_mask;     // N - 1
    bit<32> full;          // bitmap with one bit per rank of the ring
    /* aggregation */
    bit<1>  fresh;         // the packet (re)opened its slot: its payload starts the sums
    bit<1>  served;        // a retransmission answered from an emitted slot (unicast)
    /* emission, read by egress */
    bit<1>  emit;          // this packet carries slot emit_gslot's result to the ring's group
    bit<1>  cont;          // the slot after it is complete too: recirculate a continuation
    bit<24> emit_k;        // relative PSN of the emitted slot
    bit<32> emit_gslot;
    bit<8>  emit_opcode;
    bit<8>  emit_words;
    bit<16> replica;       // egress: the rank whose result this replica becomes
    /* L2 and egress fix-ups */
    bit<1>  flood;
    bit<1>  fix_icrc;
    bit<1>  fix_ipv4;
#ifdef NR_INTERSWITCH
    bit<1>  is_parsed;     // the message was parsed to its CRC32 (0: too long, > 1 carried, ...)
    bit<8>  is_carried;    // its carried headers (the parser's copy of hdr.nr_is.carried)
#endif
#ifdef NR_ROLE_SPINE
    /* spine (spine_ingress.p4, spine_egress.p4) */
    bit<8>  lane;          // the sending ToR's lane; egress: the lane a resent total goes to
    bit<1>  total;         // this packet carries slot emit_gslot's total (multicast or resend)
    bit<1>  resend;        // ... to meta.lane only (a repeated partial of a totalled slot)
#endif
#ifdef NR_ROLE_TOR
    /* ToR (tor_ingress.p4, tor_egress.p4): the parser's, then ring_table's set_ring */
    bit<1>  is_msg;        // an inter-switch message: its payload words end in its carried part
    bit<24> w2;            // 2W: rule 7 empties the slots up to k - 2W
    bit<8>  tor_id;
    bit<9>  uplink;
    bit<32> tag;           // the ring's inter-switch tag (interswitch.ring_tag)
    bit<48> me_mac;
    bit<32> me_ip;
    bit<48> spine_mac;
    bit<32> spine_ip;
    bit<1>  has_leave;     // a local requester whose responder is in another rack ...
    bit<8>  leave_lane;    // ... its lane (bitmap bit) and rank: its header rides up
    bit<16> leave_rank;
    bit<1>  has_enter;     // a remote requester whose responder is here ...
    bit<8>  enter_lane;    // ... its lane (contrib_* and replica_table index) and rank
    bit<16> enter_rank;
    /* what the ring's multicast group carries (egress keeps the replicas asked for) */
    bit<1>  mcast;
    bit<1>  part_a;        // the partial of next_emit, again
    bit<24> part_a_k;
    bit<1>  part_b;        // the partial of the packet's k (its completion, or again)
    bit<24> part_b_k;
    bit<1>  fwd;           // transit: the packet itself to the entering connection's responder
#endif
}

#endif  /* NR_HEADERS_P4 */
