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

/* Add word i of the packet to the slot's sum (base = gslot * NR_MAX_ELEMS); a fresh slot
 * starts from the packet's word. Needs `bit<32> acc` and `bit<32> base` in scope. */
#define NR_ADD_ELEM(i)                                      \
    if (hdr.pl[i].isValid()) {                              \
        slot_sum.read(acc, base + i);                       \
        if (meta.fresh == 1) { acc = 0; }                   \
        slot_sum.write(base + i, acc + NR_BSWAP32(hdr.pl[i].v)); \
    }

/* Replace word i of the packet by the slot's sum (a served retransmission). */
#define NR_LOAD_ELEM(i)                                     \
    if (hdr.pl[i].isValid()) {                              \
        slot_sum.read(hdr.pl[i].v, base + i);               \
        hdr.pl[i].v = NR_BSWAP32(hdr.pl[i].v);              \
    }

/* Make the packet's payload the emitted slot's sums: meta.emit_words words. */
#define NR_EMIT_ELEM(i)                                     \
    if (meta.emit_words > i) {                              \
        hdr.pl[i].setValid();                               \
        slot_sum.read(hdr.pl[i].v, base + i);               \
        hdr.pl[i].v = NR_BSWAP32(hdr.pl[i].v);              \
    } else {                                                \
        hdr.pl[i].setInvalid();                             \
    }

#endif  /* NR_PAYLOAD_P4 */
