/* The host's per-byte passes of a switch call, each one pass over the data (issue 41 item 5):
 * the int32 min/max, the float32 per-block min/max, quantize (float32 -> int32 wire words;
 * also fused with the min/max, ahead of the scales' agreement) and dequantize (int32 sums
 * -> float32). netreduce/hostpass.py calls them through ctypes.
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

/* RANGE_LANES independent minima and maxima (four AVX2 registers each), folded at the
 * end: the loads overlap instead of waiting on one register's min (~1.25x the one-lane loop
 * in cache and from memory) */
#define RANGE_LANES 32

CLONES void nr_range_i32(const int32_t *x, size_t n, int32_t *lo, int32_t *hi)
{
    int32_t ls[RANGE_LANES], hs[RANGE_LANES];
    for (int k = 0; k < RANGE_LANES; k++) {
        ls[k] = INT32_MAX;
        hs[k] = INT32_MIN;
    }
    size_t i = 0;
    for (; i + RANGE_LANES <= n; i += RANGE_LANES)
        for (int k = 0; k < RANGE_LANES; k++) {
            ls[k] = x[i + k] < ls[k] ? x[i + k] : ls[k];
            hs[k] = x[i + k] > hs[k] ? x[i + k] : hs[k];
        }
    int32_t l = INT32_MAX, h = INT32_MIN;
    for (int k = 0; k < RANGE_LANES; k++) {
        l = ls[k] < l ? ls[k] : l;
        h = hs[k] > h ? hs[k] : h;
    }
    for (; i < n; i++) {
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

/* *lo, *hi of x[start, end), NaN if it holds a NaN (as numpy's minimum/maximum propagate
 * it); returns whether it does */
static int span_range(const float *x, size_t start, size_t end, float *lo, float *hi)
{
    float l = INFINITY, h = -INFINITY;
    int nan = 0;
    for (size_t i = range_lanes(x, start, end, &l, &h, &nan); i < end; i++) {
        float v = x[i];
        l = v < l ? v : l;
        h = v > h ? v : h;
        nan |= v != v;
    }
    *lo = nan ? NAN : l;
    *hi = nan ? NAN : h;
    return nan;
}

/* Per block of `block` elements (the last may be shorter): lo[b], hi[b] (`span_range`). */
void nr_block_ranges_f32(const float *x, size_t n, size_t block, float *lo, float *hi)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block)
        span_range(x, start, start + block < n ? start + block : n, &lo[b], &hi[b]);
}

/* wire[i] = rint(x[i] * 2^e) for i in [start, end): the one quantizing loop. Where 2^e
 * is a normal float32 the product is formed in float32, eight lanes at a time: exact as
 * in double (a power of two; |x * 2^e| < 2^31 never overflows, and a product below
 * 2^-126 rounds to 0 either way), rounded by the current (nearest-even) mode. */
static inline void quantize_span(const float *x, size_t start, size_t end, int32_t e,
                                 int32_t *wire)
{
    if (e >= -126 && e <= 127) {
        float scale = ldexpf(1.0f, e);
        for (size_t i = start; i < end; i++)
            wire[i] = __builtin_irintf(x[i] * scale);
        return;
    }
    double scale = ldexp(1.0, e);
    for (size_t i = start; i < end; i++) {
        double v = (double)x[i] * scale;
        wire[i] = (int32_t)((v + RINT_MAGIC) - RINT_MAGIC);
    }
}

/* wire[i] = rint(x[i] * 2^exps[i / block]); every |x * 2^e| < 2^31 (the caller's scales) */
CLONES void nr_quantize_f32(const float *x, size_t n, size_t block, const int32_t *exps,
                            int32_t *wire)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        quantize_span(x, start, end, exps[b], wire);
    }
}

/* nr_quantize_f32 for the blocks b where exps[b] != ahead[b] only (the others hold the
 * words of nr_block_ranges_quantize_f32 already) */
CLONES void nr_requantize_f32(const float *x, size_t n, size_t block, const int32_t *exps,
                              const int32_t *ahead, int32_t *wire)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        if (exps[b] != ahead[b])
            quantize_span(x, start, end, exps[b], wire);
    }
}

/* One memory pass for nr_block_ranges_f32 and a quantize ahead of the scales' agreement:
 * per block, its lo[b] and hi[b] (as nr_block_ranges_f32), then from the cache the block
 * quantized with this rank's own exponent e = base - F, F = floor(log2 max(-lo, hi))
 * clamped to [-128, 127] (-128 for 0: netreduce.algorithms.switch.log2_floors), written
 * to exps[b]; a block holding NaN or infinity is not quantized and gets exps[b] =
 * INT32_MIN (its call cannot travel quantized). */
CLONES void nr_block_ranges_quantize_f32(const float *x, size_t n, size_t block, int32_t base,
                                         float *lo, float *hi, int32_t *exps, int32_t *wire)
{
    for (size_t b = 0, start = 0; start < n; b++, start += block) {
        size_t end = start + block < n ? start + block : n;
        int nan = span_range(x, start, end, &lo[b], &hi[b]);
        float l = lo[b], h = hi[b];
        if (nan || isinf(l) || isinf(h)) {
            exps[b] = INT32_MIN;
            continue;
        }
        float m = -l > h ? -l : h;
        int32_t floor = -128;
        if (m > 0) {
            int e;
            frexpf(m, &e);
            floor = e - 1 < -128 ? -128 : (e - 1 > 127 ? 127 : e - 1);
        }
        exps[b] = base - floor;
        quantize_span(x, start, end, exps[b], wire);
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
        if (divisor == 1 && exps[b] >= -97 && exps[b] <= 126) {
            /* float32: s rounded once, then scaled exactly (|s| < 2^31: no overflow for
             * e >= -97, no subnormal for e <= 126), the same bits as in double */
            float fscale = ldexpf(1.0f, -exps[b]);
            for (size_t i = start; i < end; i++)
                dst[i] = (float)s[i] * fscale;
        } else if (divisor == 1) {
            for (size_t i = start; i < end; i++)
                dst[i] = (float)((double)s[i] * scale);
        } else {
            for (size_t i = start; i < end; i++)
                dst[i] = (float)((double)s[i] * scale / d);
        }
    }
}
