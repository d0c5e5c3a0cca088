/* RoCEv2 parsing, IPv4 checks and the ICRC (see packet.h). */
#include "packet.h"

#include <isa-l/crc.h>
#include <string.h>

int nrdp_parse(const uint8_t *frame, uint32_t len, struct nrdp_fields *f)
{
    if (len < NRDP_MIN_FRAME)
        return 0;
    if (nrdp_get_be(frame + 12, 2) != 0x0800 || frame[14] != 0x45 || frame[23] != 17
        || nrdp_get_be(frame + 36, 2) != 4791)
        return 0;
    f->key.addrs = (uint64_t)nrdp_get_be(frame + 26, 4) << 32 | nrdp_get_be(frame + 30, 4);
    f->key.dqp = nrdp_get_be(frame + 47, 3);
    f->udp_len = nrdp_get_be(frame + 38, 2);
    f->opcode = frame[42];
    f->pad = frame[43] >> 4 & 3;
    f->psn = nrdp_get_be(frame + 51, 3);
    f->frag = nrdp_get_be(frame + 20, 2);
    return 1;
}

uint32_t nrdp_ext_len(uint32_t opcode)
{
    switch (opcode) {
    case NRDP_WRITE_FIRST:
    case NRDP_WRITE_ONLY:
        return 16;
    case NRDP_WRITE_LAST_IMM:
        return 4;
    case NRDP_WRITE_ONLY_IMM:
        return 20;
    default:
        return 0;
    }
}

int nrdp_is_write(uint32_t opcode)
{
    return opcode >= NRDP_WRITE_FIRST && opcode <= NRDP_WRITE_ONLY_IMM;
}

int nrdp_is_only_write(uint32_t opcode)
{
    return opcode == NRDP_WRITE_ONLY || opcode == NRDP_WRITE_ONLY_IMM;
}

int nrdp_is_message_start(uint32_t opcode)
{
    return opcode == NRDP_WRITE_FIRST || nrdp_is_only_write(opcode);
}

int nrdp_ipv4_ok(const uint8_t *frame)
{
    uint32_t sum = 0;
    for (int i = NRDP_IP_OFF; i < NRDP_UDP_OFF; i += 2)
        sum += nrdp_get_be(frame + i, 2);
    return sum % 0xFFFF == 0;
}

int nrdp_is_fragment(uint32_t frag)
{
    return (frag & 0x3FFF) != 0;       /* MF or a fragment offset */
}

uint32_t nrdp_crc32(uint32_t crc, const uint8_t *buf, uint64_t len)
{
    return crc32_gzip_refl(crc, buf, len);
}

/* a * b mod P in the reflected representation (bit 31 is x^0), P = 0xEDB88320. */
static uint32_t crc_mul(uint32_t a, uint32_t b)
{
    uint32_t prod = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            prod ^= b;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return prod;
}

uint32_t nrdp_crc32_xpow(uint64_t n)
{
    uint32_t r = 1u << 31, p = 1u << 23;          /* x^0, x^8 */
    for (; n; n >>= 1, p = crc_mul(p, p))
        if (n & 1)
            r = crc_mul(r, p);
    return r;
}

uint32_t nrdp_crc32_shift(uint32_t crc, uint32_t xn)
{
    return crc_mul(crc, xn);
}

uint32_t nrdp_icrc(const uint8_t *frame, uint32_t end)
{
    uint8_t masked[NRDP_EXT_OFF - NRDP_IP_OFF + 8];
    memset(masked, 0xFF, 8);
    memcpy(masked + 8, frame + NRDP_IP_OFF, NRDP_EXT_OFF - NRDP_IP_OFF);
    static const uint8_t ones[] = {NRDP_IP_OFF + 1, NRDP_IP_OFF + 8, NRDP_IP_OFF + 10,
                                   NRDP_IP_OFF + 11, NRDP_UDP_OFF + 6, NRDP_UDP_OFF + 7,
                                   NRDP_BTH_OFF + 4};
    for (unsigned i = 0; i < sizeof ones; i++)
        masked[ones[i] - NRDP_IP_OFF + 8] = 0xFF;
    uint32_t crc = nrdp_crc32(0, masked, sizeof masked);
    return end > NRDP_EXT_OFF ? nrdp_crc32(crc, frame + NRDP_EXT_OFF, end - NRDP_EXT_OFF) : crc;
}
