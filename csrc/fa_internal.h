/*
 * fa_internal.h -- helpers shared by the kernels (not part of the C contract).
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef INFINITY
#define INFINITY (1.0f / 0.0f)
#endif

/*
 * exp(t) rounded once to float32, for a float64 argument t.
 *
 * Range reduction t = n ln2 + r with |r| <= ln2/2 in float64 (n by the
 * 1.5 * 2**52 rounding trick, so no float->int conversion is needed), a degree-8
 * Taylor polynomial for exp(r) (truncation error < 2.2e-10 relative), and the
 * factor 2**n built directly in the exponent bits of a double. Every step is
 * float64, so the only error that matters is the final rounding to float32:
 * the result is within 0.51 ulp of exp(t), subnormal results included.
 * t = -inf gives exactly 0, t = +inf gives +inf, NaN gives NaN.
 * Branch-free so the compiler can vectorise loops that call it.
 */
static inline float fa_exp_d(double t)
{
    const double shift = 6755399441055744.0; /* 1.5 * 2**52 */
    const double log2e = 1.4426950408889634074;
    const double ln2 = 0.69314718055994530942;
    int not_nan = (t == t);
    double tc = not_nan ? t : 0.0;
    double y, n, r, p, scale;
    uint64_t bits;
    tc = tc < -160.0 ? -160.0 : tc; /* exp(-160) rounds to 0 in float32 */
    tc = tc > 100.0 ? 100.0 : tc;   /* exp(100) rounds to +inf in float32 */
    y = tc * log2e + shift;         /* round(tc / ln2) sits in the low bits of y */
    n = y - shift;
    r = tc - n * ln2;
    p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120
        + r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320))))))));
    memcpy(&bits, &y, sizeof bits);
    bits = (bits + 1023u) << 52; /* the exponent field of 2**n, n in [-231, 145] */
    memcpy(&scale, &bits, sizeof scale);
    return not_nan ? (float)(p * scale) : (float)t;
}

/* exp(x - m), the difference taken exactly in float64. */
static inline float fa_exp_diff(float x, float m)
{
    return fa_exp_d((double)x - (double)m);
}

/* NaN-propagating maximum: max(a, b), or NaN if either is NaN. */
static inline float fa_max_nan(float a, float b)
{
    if (a != a || b != b)
        return a + b;
    return a > b ? a : b;
}

/* Threads actually used for `work` units (e.g. multiply-adds), given a cap. */
static inline int fa_threads_for(int nthreads, double work, int64_t nitems)
{
    const double min_work_per_thread = 131072.0;
    int nt = nthreads < 1 ? 1 : nthreads;
    if (work < 2.0 * min_work_per_thread)
        return 1;
    if ((double)nt > work / min_work_per_thread)
        nt = (int)(work / min_work_per_thread);
    if ((int64_t)nt > nitems)
        nt = (int)nitems;
    return nt < 1 ? 1 : nt;
}

#endif /* FA_INTERNAL_H */
