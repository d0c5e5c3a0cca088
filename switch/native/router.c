/* One-armed routing around the pipeline: router.h (router.py is the executable spec). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "router.h"

#define ETH_LEN 14
#define TTL_OFF (ETH_LEN + 8)
#define CSUM_OFF (ETH_LEN + 10)
#define DST_IP_OFF (ETH_LEN + 16)

struct nrdp_router {
    pthread_mutex_t lock;
    uint8_t own_mac[6];
    struct nrdp_router_table t;
    struct nrdp_router_counters c;
};

struct nrdp_router *nrdp_router_create(const uint8_t own_mac[6])
{
    struct nrdp_router *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->lock, NULL)) {
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    memcpy(r->own_mac, own_mac, 6);
    return r;
}

void nrdp_router_destroy(struct nrdp_router *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->lock);
    free(r);
}

int nrdp_router_set(struct nrdp_router *r, const struct nrdp_router_table *t)
{
    if (t->nmacs > NRDP_ROUTER_MAX || t->nips > NRDP_ROUTER_MAX)
        return -1;
    pthread_mutex_lock(&r->lock);
    r->t = *t;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

void nrdp_router_counters(struct nrdp_router *r, struct nrdp_router_counters *out)
{
    pthread_mutex_lock(&r->lock);
    *out = r->c;
    pthread_mutex_unlock(&r->lock);
}

void nrdp_router_abi_sizes(size_t sizes[2])
{
    sizes[0] = sizeof(struct nrdp_router_table);
    sizes[1] = sizeof(struct nrdp_router_counters);
}

int nrdp_router_for_me(const struct nrdp_router *r, const uint8_t *frame, uint32_t len)
{
    return len >= 6 && memcmp(frame, r->own_mac, 6) == 0;
}

static uint32_t port_of_mac(const struct nrdp_router_table *t, const uint8_t *mac)
{
    for (uint32_t i = 0; i < t->nmacs; i++)
        if (memcmp(t->mac[i], mac, 6) == 0)
            return t->port[i];
    return 0;
}

static const uint8_t *mac_of_port(const struct nrdp_router_table *t, uint32_t port)
{
    for (uint32_t i = 0; i < t->nmacs; i++)
        if (t->port[i] == port)
            return t->mac[i];
    return NULL;
}

static const uint8_t *mac_of_ip(const struct nrdp_router_table *t, const uint8_t *ip)
{
    for (uint32_t j = 0; j < t->nips; j++)
        if (memcmp(t->ip[j], ip, 4) == 0)
            return t->ip_mac[j];
    return NULL;
}

/* RFC 791's checksum over the ihl-byte header at h, its checksum field taken as zero. */
static uint16_t ipv4_checksum(const uint8_t *h, uint32_t ihl)
{
    uint32_t sum = 0;
    for (uint32_t i = 0; i < ihl; i += 2)
        if (i != 10)
            sum += (uint32_t)h[i] << 8 | h[i + 1];
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    return (uint16_t)~sum;
}

/* router.py's _rewrite: 0 (sent on), or -1 (dropped, counted). */
static int rewrite(struct nrdp_router *r, const uint8_t *dst, uint8_t *f, uint32_t len)
{
    uint32_t ihl = len >= ETH_LEN + 20 ? (f[ETH_LEN] & 0xFu) * 4 : 0;
    if (ihl < 20 || len < ETH_LEN + ihl || f[12] != 0x08 || f[13] != 0x00 ||
        f[ETH_LEN] >> 4 != 4) {
        r->c.not_routable++;
        return -1;
    }
    if (!dst) {
        r->c.no_route++;
        return -1;
    }
    if (f[TTL_OFF] <= 1) {
        r->c.ttl_expired++;
        return -1;
    }
    memcpy(f, dst, 6);
    memcpy(f + 6, r->own_mac, 6);
    f[TTL_OFF]--;
    uint16_t csum = ipv4_checksum(f + ETH_LEN, ihl);
    f[CSUM_OFF] = (uint8_t)(csum >> 8);
    f[CSUM_OFF + 1] = (uint8_t)csum;
    r->c.routed++;
    return 0;
}

int nrdp_route(struct nrdp_router *r, struct nrdp_pipe *pipe, uint8_t *frame, uint32_t len,
               struct nrdp_out_batch *out)
{
    out->n = 0;
    pthread_mutex_lock(&r->lock);
    if (!nrdp_router_for_me(r, frame, len)) {
        r->c.not_for_router++;
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    uint32_t from = len >= 12 ? port_of_mac(&r->t, frame + 6) : 0;
    int n = nrdp_process(pipe, from, frame, len, out);
    if (n == NRDP_NOT_MINE) {                /* router.py's forward() */
        if (len < ETH_LEN + 20)
            r->c.not_routable++;
        else if (rewrite(r, mac_of_ip(&r->t, frame + DST_IP_OFF), frame, len) == 0)
            out->out[out->n++] = (struct nrdp_out){NRDP_ROUTER_PORT, len, frame};
    } else {                                 /* router.py's to_neighbour(), per output */
        uint32_t kept = 0;
        for (int i = 0; i < n; i++) {
            struct nrdp_out o = out->out[i];
            if (rewrite(r, mac_of_port(&r->t, o.port), (uint8_t *)o.data, o.len) == 0)
                out->out[kept++] = (struct nrdp_out){NRDP_ROUTER_PORT, o.len, o.data};
        }
        out->n = kept;
    }
    pthread_mutex_unlock(&r->lock);
    return (int)out->n;
}
