/* RoCEv2 over IPv4 for the native pipeline: the one place C knows header layouts.
 *
 * The same frame layout as switch/dataplane/packets.py (the executable spec):
 * Ethernet II (14) | IPv4 (20, IHL 5) | UDP (8, dport 4791) | BTH (12) | [RETH 16][ImmDt 4]
 * | payload | pad | ICRC (4, zlib CRC-32 stored little-endian). Every read is bounds-checked
 * against the frame length the caller gives; nothing here allocates or copies a payload.
 */
#ifndef NRDP_PACKET_H
#define NRDP_PACKET_H

#include <stdint.h>

#define NRDP_PSN_MASK 0xFFFFFFu
#define NRDP_PSN_HALF (1u << 23)

enum {
    NRDP_ETH_LEN = 14,
    NRDP_IP_OFF = 14,
    NRDP_UDP_OFF = 34,
    NRDP_BTH_OFF = 42,
    NRDP_EXT_OFF = 54,                 /* first byte after the BTH */
    NRDP_PSN_OFF = 51,
    NRDP_UDP_CSUM_OFF = 40,
    NRDP_ICRC_LEN = 4,
    NRDP_MIN_FRAME = 58,               /* EXT_OFF + ICRC: the shortest RoCEv2 frame */
    NRDP_UDP_OVERHEAD = 24,            /* UDP + BTH + ICRC */
    NRDP_MAX_EXT = 20,                 /* RETH + ImmDt */
    NRDP_MAX_HDR = NRDP_EXT_OFF + NRDP_MAX_EXT,
};

enum nrdp_opcode {
    NRDP_WRITE_FIRST = 0x06,
    NRDP_WRITE_MIDDLE = 0x07,
    NRDP_WRITE_LAST = 0x08,
    NRDP_WRITE_LAST_IMM = 0x09,
    NRDP_WRITE_ONLY = 0x0A,
    NRDP_WRITE_ONLY_IMM = 0x0B,
};

/* The connection key ⟨SrcIP, DstIP, DestQP⟩: addresses as one big-endian u64. */
struct nrdp_key {
    uint64_t addrs;
    uint32_t dqp;
};

/* What the pipeline reads of a candidate frame (packets.parse's tuple). */
struct nrdp_fields {
    struct nrdp_key key;
    uint32_t udp_len, opcode, pad, psn, frag;
};

/* 1 and `f` filled when the frame is IPv4 (IHL 5) / UDP 4791 and at least MIN_FRAME long,
 * else 0. Lengths and checksums are not checked here. */
int nrdp_parse(const uint8_t *frame, uint32_t len, struct nrdp_fields *f);

/* Extension-header bytes after the BTH of a WRITE opcode (RETH, ImmDt). */
uint32_t nrdp_ext_len(uint32_t opcode);
int nrdp_is_write(uint32_t opcode);
int nrdp_is_only_write(uint32_t opcode);
int nrdp_is_message_start(uint32_t opcode);

/* Is the IPv4 header checksum right (frame holds at least UDP_OFF bytes)? */
int nrdp_ipv4_ok(const uint8_t *frame);
int nrdp_is_fragment(uint32_t frag);

/* The zlib CRC-32 `crc` continued over buf[0:len) (ISA-L's crc32_gzip_refl). */
uint32_t nrdp_crc32(uint32_t crc, const uint8_t *buf, uint64_t len);

/* The ICRC state over frame[IP_OFF:end) (end >= EXT_OFF, frame holds `end` bytes): the
 * 8 bytes before IPv4 and the variant fields (TOS, TTL, IPv4 checksum, UDP checksum, BTH
 * byte 4) count as ones. Its value once `end` reaches the ICRC is the wire ICRC. */
uint32_t nrdp_icrc(const uint8_t *frame, uint32_t end);

/* CRC-32 concatenation: nrdp_crc32(a, B, n) == nrdp_crc32_shift(a, xn) ^ nrdp_crc32(0, B, n)
 * with xn = nrdp_crc32_xpow(n) (x^(8n) mod the CRC-32 polynomial; the CRC is affine in its
 * state). One CRC pass over a payload thus serves every header it is sent under. */
uint32_t nrdp_crc32_xpow(uint64_t n);
uint32_t nrdp_crc32_shift(uint32_t crc, uint32_t xn);

static inline uint32_t nrdp_get_be(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static inline void nrdp_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t nrdp_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
