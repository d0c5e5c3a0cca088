/* The host's per-byte passes of a switch call, each one pass over the data (issue 41 item 5):
 * the int32 min/max, the float32 per-block min/max, quantize (float32 -> int32 wire words)
 * and dequantize (int32 sums -> float32). netreduce/hostpass.py calls them through ctypes.
 *
 * Invariant: every function gives bit for bit what the numpy passes of
 * netreduce/algorithms/switch.py give (tests/test_hostpass.py): quantize forms x * 2^e in
 * double (exact: a float32 times a power of two within double's range) and rounds it to
 * the nearest integer, ties to even, as numpy's float32 ldexp then rint do (float32's
 * product is exact too, or below 2^-126 in magnitude, where both round to 0); dequantize
 * forms s * 2^-e in double (exact), divides by the divisor in double and rounds once to
 * float32, as numpy does. No allocation, no state: safe from any thread. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* x + 1.5 * 2^52 - 1.5 * 2^52: x rounded to an integer, ties to even (|x| < 2^51) */
#define RINT_MAGIC 6755399441055744.0

CLONES void nr_range_i32(const int32_t *x, size_t n, int32_t *lo, int32_t *hi)
{
    int32_t l = INT32_MAX, h = INT32_MIN;
    for (size_t i = 0; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    *lo = l;
    *hi = h;
}

/* min/max of x[i..end) into *l, *h (v < l ? v : l: a NaN never enters), and whether a
 * NaN was seen: with SSE, four lanes at a time (minps/maxps are exactly that select; gcc
 * does not vectorize a float min reduction by itself). */
static size_t range_lanes(const float *x, size_t i, size_t end, float *l, float *h, int *nan)
{
#ifdef __SSE2__
    __m128 lo4 = _mm_set1_ps(*l), hi4 = _mm_set1_ps(*h), un4 = _mm_setzero_ps();
    for (; i + 4 <= end; i += 4) {
        __m128 v = _mm_loadu_ps(x + i);
        lo4 = _mm_min_ps(v, lo4);
        hi4 = _mm_max_ps(v, hi4);
        un4 = _mm_or_ps(un4, _mm_cmpunord_ps(v, v));
    }
    float lanes[4], highs[4];
    _mm_storeu_ps(lanes, lo4);
    _mm_storeu_ps(highs, hi4);
    for (int j = 0; j < 4; j++) {
        *l = lanes[j] < *l ? lanes[j] : *l;
        *h = highs[j] > *h ? highs[j] : *h;
    }
    *nan |= _mm_movemask_ps(un4) != 0;
#endif
    return i;
}

/* Per block of `block` elements (the last may be shorter): lo[b], hi[b], NaN if the block
 * holds a NaN (as numpy's minimum/maximum propagate it). */
void nr_block_ranges_f32(const float *x, size_t n, size_t block, float *lo, float *hi)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        float l = INFINITY, h = -INFINITY;
        int nan = 0;
        for (size_t i = range_lanes(x, start, end, &l, &h, &nan); i < end; i++) {
            float v = x[i];
            l = v < l ? v : l;
            h = v > h ? v : h;
            nan |= v != v;
        }
        lo[b] = nan ? NAN : l;
        hi[b] = nan ? NAN : h;
    }
}

/* wire[i] = rint(x[i] * 2^exps[i / block]); every |x * 2^e| < 2^31 (the caller's scales) */
CLONES void nr_quantize_f32(const float *x, size_t n, size_t block, const int32_t *exps,
                            int32_t *wire)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        double scale = ldexp(1.0, exps[b]);
        for (size_t i = start; i < end; i++) {
            double v = (double)x[i] * scale;
            wire[i] = (int32_t)((v + RINT_MAGIC) - RINT_MAGIC);
        }
    }
}

/* dst[i] = (float)(s[i] * 2^-exps[i / block] / divisor), the division in double */
CLONES void nr_dequantize_f32(const int32_t *s, size_t n, size_t block, const int32_t *exps,
                              int32_t divisor, float *dst)
{
    double d = (double)divisor;
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        double scale = ldexp(1.0, -exps[b]);
        if (divisor == 1) {
            for (size_t i = start; i < end; i++)
                dst[i] = (float)((double)s[i] * scale);
        } else {
            for (size_t i = start; i < end; i++)
                dst[i] = (float)((double)s[i] * scale / d);
        }
    }
}
