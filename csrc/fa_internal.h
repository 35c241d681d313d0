/*
 * fa_internal.h -- helpers shared by the kernels (not part of the C contract).
 *
 * A file that compiles a SIMD variant defines FA_TARGET (a target attribute)
 * before including this header, so that these helpers are compiled for, and
 * inlined into, that variant's functions.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef FA_TARGET
#define FA_TARGET
#endif

#ifndef INFINITY
#define INFINITY (1.0f / 0.0f)
#endif
#ifndef NAN
#define NAN (0.0f / 0.0f)
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
static inline FA_TARGET float fa_exp_d(double t)
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
static inline FA_TARGET float fa_exp_diff(float x, float m)
{
    return fa_exp_d((double)x - (double)m);
}

/*
 * 2**x in float32 arithmetic, for the attention kernels' scores (which carry
 * log2(e) in their scale, so exp(s) = 2**(s log2 e)).
 *
 * x = n + f with n = round(x), |f| <= 1/2 (exact); 2**f = exp(f ln2) by its
 * degree-7 Taylor polynomial (truncation < 5e-9 relative); 2**n applied as two
 * exact power-of-two factors so that subnormal results are rounded once.
 * Within 2 ulp of 2**x (the tests hold it to that); -inf gives exactly 0,
 * +inf gives +inf, NaN gives NaN. Branch-free, float32 only: it vectorises
 * 8 or 16 wide.
 */
static inline FA_TARGET float fa_exp2f(float x)
{
    const float shift = 12582912.0f; /* 1.5 * 2**23 */
    const float c1 = 0.693147180559945f, c2 = 0.240226506959101f,
                c3 = 0.0555041086648216f, c4 = 0.00961812910762848f,
                c5 = 0.00133335581464284f, c6 = 0.000154035303933816f,
                c7 = 1.52527338040598e-05f;
    int not_nan = (x == x);
    float xc = not_nan ? x : 0.0f;
    float y, n, f, p, s1, s2;
    int32_t ni, n1, n2, b1, b2;
    xc = xc < -151.0f ? -151.0f : xc; /* 2**-151 rounds to 0 */
    xc = xc > 128.0f ? 128.0f : xc;   /* 2**128 rounds to +inf */
    y = xc + shift;
    n = y - shift;
    f = xc - n;
    p = 1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
    memcpy(&ni, &y, sizeof ni);
    ni -= 0x4B400000; /* the integer n, from the low bits of y */
    n1 = ni / 2;
    n2 = ni - n1;
    b1 = (n1 + 127) << 23;
    b2 = (n2 + 127) << 23;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return not_nan ? (p * s1) * s2 : x;
}

/* Threads actually used for `work` units (e.g. multiply-adds), given a cap. */
static inline int fa_threads_for(int nthreads, double work, int64_t nitems)
{
    const double min_work_per_thread = 1048576.0; /* ~50 us: below it a thread costs more than it gives */
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
