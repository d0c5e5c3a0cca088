/* Measuring aids for benchmarks/bench_native.py, in the same library as the workers:
 * the compute-only bound (process() over frames in memory, no I/O) and one core's
 * memcpy bandwidth. Under callgrind (--instr-atstart=no) only the loop of nrio_compute
 * is instrumented: its instruction count per frame is repeatable whatever the machine.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <string.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "nrio.h"
#ifdef NRIO_PIPELINE_STUB
#include "pipeline_stub.h"
#else
#include "pipeline.h"
#endif

static uint64_t thread_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* process() over n frames of blob (each handled once, in place, as a receive leaves it);
 * the thread's CPU ns, or -1. */
int64_t nrio_compute(void *pipe, uint8_t *blob, const uint64_t *offset,
                     const uint32_t *len, const uint32_t *port, uint32_t n, uint64_t *outputs)
{
    static struct nrdp_out_batch out;
    uint64_t outs = 0, t0 = thread_ns();
    CALLGRIND_START_INSTRUMENTATION;
    for (uint32_t i = 0; i < n; i++) {
        int k = nrdp_process(pipe, port[i], blob + offset[i], len[i], &out);
        outs += k > 0 ? (uint64_t)k : 0;
    }
    CALLGRIND_STOP_INSTRUMENTATION;
    uint64_t t1 = thread_ns();
    *outputs = outs;
    return (int64_t)(t1 - t0);
}

double nrio_memcpy_gbps(size_t bytes, uint32_t reps)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    uint64_t best = UINT64_MAX;
    for (uint32_t r = 0; r < reps; r++) {
        uint64_t t0 = thread_ns();
        memcpy(r & 1 ? a : b, r & 1 ? b : a, bytes);
        uint64_t dt = thread_ns() - t0;
        best = dt < best ? dt : best;
    }
    volatile uint8_t sink = a[bytes / 2] ^ b[bytes / 3];
    (void)sink;
    free(a);
    free(b);
    return (double)bytes / (double)best;
}

/* Sends n frames of blob, frame i on socket fds[port[i]], in sendmmsg(2) batches of up to
 * `batch` per socket, pausing pause_us after every `batch` frames: a driver fast enough
 * that the receiving side's NAPI works in batches, as under load. Frames sent, or -1. */
int64_t nrio_send_burst(const int *fds, const uint8_t *blob, const uint64_t *offset,
                        const uint32_t *len, const uint32_t *port, uint32_t n, uint32_t batch,
                        uint32_t pause_us)
{
    enum { MAXP = 64, MAXB = 64 };
    static struct mmsghdr msg[MAXP][MAXB];
    static struct iovec iov[MAXP][MAXB];
    uint32_t fill[MAXP] = {0};
    int64_t sent = 0;
    if (batch == 0 || batch > MAXB)
        return -1;
    for (uint32_t i = 0; i <= n; i++) {
        uint32_t p = i < n ? port[i] : 0;
        if (p >= MAXP)
            return -1;
        for (uint32_t q = 0; q < MAXP; q++) {
            if (!fill[q] || (i < n && fill[q] < batch))
                continue;
            int r = sendmmsg(fds[q], msg[q], fill[q], 0);
            sent += r > 0 ? r : 0;
            fill[q] = 0;
            if (pause_us)
                usleep(pause_us);
        }
        if (i == n)
            break;
        iov[p][fill[p]] = (struct iovec){(void *)(blob + offset[i]), len[i]};
        msg[p][fill[p]].msg_hdr = (struct msghdr){.msg_iov = &iov[p][fill[p]], .msg_iovlen = 1};
        fill[p]++;
    }
    return sent;
}
