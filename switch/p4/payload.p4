/* The payload words, one macro application per element (P4 has no loops in controls).
 *
 * NR_FOR_EACH_ELEM(M) expands to M(0) M(1) ... M(NR_MAX_ELEMS - 1);
 * tests/test_p4_program.py checks that it lists exactly 0 .. NR_MAX_ELEMS - 1.
 */
#ifndef NR_PAYLOAD_P4
#define NR_PAYLOAD_P4

#define NR_FOR_EACH_ELEM(M) \
    M(0)  M(1)  M(2)  M(3)  M(4)  M(5)  M(6)  M(7)  \
    M(8)  M(9)  M(10) M(11) M(12) M(13) M(14) M(15) \
    M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) \
    M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31) \
    M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
    M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47) \
    M(48) M(49) M(50) M(51) M(52) M(53) M(54) M(55) \
    M(56) M(57) M(58) M(59) M(60) M(61) M(62) M(63)

/* Payload words travel little-endian (the hosts' own int32, copied without a byte swap);
 * a P4 bit<32> field reads them big-endian, so each word is byte-reversed on its way into
 * a sum and on its way back out. The sums are kept as numbers. */
#define NR_BSWAP32(x) ((x)[7:0] ++ (x)[15:8] ++ (x)[23:16] ++ (x)[31:24])

/* The per-element statements below have no condition: p4c gathers the 64 of a
 * NR_FOR_EACH_ELEM into one action, where a condition per element made BMv2 walk 64
 * conditionals and 64 one-action tables per packet (switch/p4/README.md, "Cost per
 * packet"). They touch all NR_MAX_ELEMS elements whatever the packet's length: a word
 * beyond it (an invalid hdr.pl[i]) adds whatever that header holds to a sum element no
 * result of the slot ever reads (every packet of a slot has the slot's length; a fresh
 * slot restarts all its elements), and is loaded into a header the deparser skips. */

/* Add word i of the packet to the slot's sum (base = gslot * NR_MAX_ELEMS); `keep` is 0
 * when the packet (re)opens its slot (its words start the sums), else all ones. Needs
 * `bit<32> acc`, `bit<32> base` and `bit<32> keep` in scope. */
#define NR_ADD_ELEM(i)                                                  \
    slot_sum.read(acc, base + i);                                       \
    slot_sum.write(base + i, (acc & keep) + NR_BSWAP32(hdr.pl[i].v));

/* Load the slot's sum i into word i of the packet (a served retransmission, an emission:
 * NrEmit sets which words are valid first, pl_valid.p4). */
#define NR_LOAD_ELEM(i)                                                 \
    slot_sum.read(hdr.pl[i].v, base + i);                               \
    hdr.pl[i].v = NR_BSWAP32(hdr.pl[i].v);

#endif  /* NR_PAYLOAD_P4 */
