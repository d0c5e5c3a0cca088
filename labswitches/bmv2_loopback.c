/* LD_PRELOAD'ed into simple_switch_grpc by labswitches/bmv2_lab.py (Bmv2Switch): its Thrift
 * server (the runtime CLI's: every table and register of the switch, other tenants' R_Keys
 * among them) takes no bind address and listens on every address of the switch's namespace. Here
 * a bind() to an IPv4 or IPv6 wildcard address becomes one to loopback: 127.0.0.1, or for
 * an IPv6 socket ::ffff:127.0.0.1 (IPv4 127.0.0.1 only; ::1 when the socket is IPv6-only).
 * Any other bind (P4Runtime's 127.0.0.1, the ports' AF_PACKET, nanomsg's AF_UNIX) is
 * untouched. Bmv2Switch then checks in /proc/net/tcp* that nothing listens elsewhere.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) {
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
        if (!real_bind) {
            errno = ENOSYS;
            return -1;
        }
    }
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
            static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                     0, 0, 0xff, 0xff, 127, 0, 0, 1};
            memcpy(&in6.sin6_addr, mapped, sizeof mapped);
            if (real_bind(fd, (const struct sockaddr *)&in6, sizeof in6) == 0)
                return 0;
            in6.sin6_addr = in6addr_loopback;
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
