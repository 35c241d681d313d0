/* The AVX2 + FMA kernels: kernels.inc compiled for that target by attribute
 * (so the rest of the build stays baseline), with an intrinsics micro-kernel;
 * chosen at run time by dispatch.c. */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>
#include <math.h>

#define FA_TARGET __attribute__((target("avx2,fma")))
#define FA_NAME(x) x##_avx2
#define FA_VARIANT_NAME "avx2"
#define FA_MR 6

/* One 6 x 16 block of C = A . B in twelve ymm accumulators, one fused
 * multiply-add per element and step of d, d ascending. */
#define FA_HAVE_GEMM_BLOCK 1
static FA_TARGET void gemm_block_avx2(const float *a, int64_t lda, const float *b,
                                      int64_t ldb, int64_t K, float *c, int64_t ldc)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    int64_t d;
    for (d = 0; d < K; d++) {
        const __m256 b0 = _mm256_loadu_ps(b + d * ldb);
        const __m256 b1 = _mm256_loadu_ps(b + d * ldb + 8);
        __m256 ar;
        ar = _mm256_broadcast_ss(a + d);
        c00 = _mm256_fmadd_ps(ar, b0, c00);
        c01 = _mm256_fmadd_ps(ar, b1, c01);
        ar = _mm256_broadcast_ss(a + lda + d);
        c10 = _mm256_fmadd_ps(ar, b0, c10);
        c11 = _mm256_fmadd_ps(ar, b1, c11);
        ar = _mm256_broadcast_ss(a + 2 * lda + d);
        c20 = _mm256_fmadd_ps(ar, b0, c20);
        c21 = _mm256_fmadd_ps(ar, b1, c21);
        ar = _mm256_broadcast_ss(a + 3 * lda + d);
        c30 = _mm256_fmadd_ps(ar, b0, c30);
        c31 = _mm256_fmadd_ps(ar, b1, c31);
        ar = _mm256_broadcast_ss(a + 4 * lda + d);
        c40 = _mm256_fmadd_ps(ar, b0, c40);
        c41 = _mm256_fmadd_ps(ar, b1, c41);
        ar = _mm256_broadcast_ss(a + 5 * lda + d);
        c50 = _mm256_fmadd_ps(ar, b0, c50);
        c51 = _mm256_fmadd_ps(ar, b1, c51);
    }
    _mm256_storeu_ps(c, c00);
    _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + ldc, c10);
    _mm256_storeu_ps(c + ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20);
    _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30);
    _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40);
    _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50);
    _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

/* 2**x, eight lanes: fa_exp2f's algorithm with fused multiply-adds. */
static inline FA_TARGET __m256 exp2_avx2(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(128.0f)),
                              _mm256_set1_ps(-151.0f));
    __m256 y = _mm256_add_ps(xc, shift);
    __m256 f = _mm256_sub_ps(xc, _mm256_sub_ps(y, shift));
    __m256 p = _mm256_set1_ps(1.52527338040598e-05f);
    __m256i n, n1, n2;
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.000154035303933816f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00133335581464284f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00961812910762848f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.0555041086648216f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.240226506959101f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.693147180559945f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    n = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000));
    n1 = _mm256_srai_epi32(n, 1);
    n2 = _mm256_sub_epi32(n, n1);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    return _mm256_blendv_ps(p, x, nan);
}

/* Sum of the eight lanes, in a fixed order. */
static inline FA_TARGET float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The tile softmax step, eight lanes at a time (see the portable versions). */
#define FA_HAVE_TILE_SOFTMAX 1
static FA_TARGET float tile_max_avx2(const float *s, float m)
{
    __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    __m128 h;
    float r;
    int jj;
    for (jj = 0; jj < FA_BK; jj += 8) {
        const __m256 x = _mm256_loadu_ps(s + jj);
        mx = _mm256_max_ps(mx, x); /* a NaN x leaves mx; caught by `nan` */
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan) || m != m)
        return NAN;
    h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    r = _mm_cvtss_f32(h);
    return r > m ? r : m;
}

static FA_TARGET double tile_exp_avx2(float *s, float m)
{
    const __m256 mv = _mm256_set1_ps(m);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 sum = _mm256_setzero_ps();
    int jj;
    for (jj = 0; jj < FA_BK; jj += 8) {
        const __m256 x = _mm256_loadu_ps(s + jj);
        __m256 p = exp2_avx2(_mm256_sub_ps(x, mv));
        p = _mm256_andnot_ps(_mm256_cmp_ps(x, ninf, _CMP_EQ_OQ), p); /* -inf: exactly 0 */
        _mm256_storeu_ps(s + jj, p);
        sum = _mm256_add_ps(sum, p);
    }
    return (double)hsum_avx2(sum);
}

/* kt[d * FA_BK + jj] = k[j0 + jj, d] (zero for jj >= nk): the key tile
 * transposed in 8 x 8 blocks of registers. */
#define FA_HAVE_PACK_KT 1
static FA_TARGET void pack_kt_avx2(const float *k, int64_t D, int64_t j0, int64_t nk, float *kt)
{
    int64_t jb, d, jj;
    for (jb = 0; jb < FA_BK; jb += 8) {
        if (jb + 8 <= nk) {
            const float *src = k + (j0 + jb) * D;
            for (d = 0; d + 8 <= D; d += 8) {
                __m256 r0 = _mm256_loadu_ps(src + d), r1 = _mm256_loadu_ps(src + D + d);
                __m256 r2 = _mm256_loadu_ps(src + 2 * D + d), r3 = _mm256_loadu_ps(src + 3 * D + d);
                __m256 r4 = _mm256_loadu_ps(src + 4 * D + d), r5 = _mm256_loadu_ps(src + 5 * D + d);
                __m256 r6 = _mm256_loadu_ps(src + 6 * D + d), r7 = _mm256_loadu_ps(src + 7 * D + d);
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
                __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
                __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
                __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float *dst = kt + d * FA_BK + jb;
                _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(dst + FA_BK, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(dst + 2 * FA_BK, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(dst + 3 * FA_BK, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(dst + 4 * FA_BK, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(dst + 5 * FA_BK, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(dst + 6 * FA_BK, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(dst + 7 * FA_BK, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
            for (; d < D; d++)
                for (jj = 0; jj < 8; jj++)
                    kt[d * FA_BK + jb + jj] = src[jj * D + d];
        } else {
            for (jj = jb; jj < jb + 8; jj++)
                for (d = 0; d < D; d++)
                    kt[d * FA_BK + jj] = jj < nk ? k[(j0 + jj) * D + d] : 0.0f;
        }
    }
}

/* Lanes [0, n) of eight (n < 8), as a mask for maskload / maskstore. */
static inline FA_TARGET __m256i tail_mask_avx2(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/*
 * exp(x - m) in float32 for a finite row maximum m >= x, eight lanes.
 * The difference is split exactly into s + err (Knuth's TwoSum), reduced as
 * s = n ln2 + r (Cody-Waite, ln2 in two parts), exp(r + err) by its degree-7
 * Taylor polynomial with fused multiply-adds, and 2**n applied as two exact
 * power-of-two factors (subnormal results rounded once): within 2 ulp of
 * exp(x - m) taken exactly (the tests hold it to that). x = -inf gives 0.
 */
static inline FA_TARGET __m256 exp_diff_avx2(__m256 x, __m256 m)
{
    const __m256 nm = _mm256_xor_ps(m, _mm256_set1_ps(-0.0f));
    const __m256 s = _mm256_add_ps(x, nm);
    const __m256 bb = _mm256_sub_ps(s, x);
    const __m256 err = _mm256_add_ps(_mm256_sub_ps(x, _mm256_sub_ps(s, bb)),
                                     _mm256_sub_ps(nm, bb));
    const __m256 underflow = _mm256_cmp_ps(s, _mm256_set1_ps(-104.0f), _CMP_LT_OQ);
    const __m256 sc = _mm256_max_ps(s, _mm256_set1_ps(-104.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(sc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), sc);
    __m256 p;
    __m256i ni, n1, n2;
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    r = _mm256_add_ps(r, _mm256_andnot_ps(underflow, err));
    { /* the Taylor polynomial by Estrin's scheme: a short dependency chain */
        const __m256 r2 = _mm256_mul_ps(r, r);
        const __m256 r4 = _mm256_mul_ps(r2, r2);
        const __m256 a01 = _mm256_add_ps(_mm256_set1_ps(1.0f), r);
        const __m256 a23 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 6), _mm256_set1_ps(0.5f));
        const __m256 a45 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 120), _mm256_set1_ps(1.0f / 24));
        const __m256 a67 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 5040), _mm256_set1_ps(1.0f / 720));
        p = _mm256_fmadd_ps(r4, _mm256_fmadd_ps(r2, a67, a45), _mm256_fmadd_ps(r2, a23, a01));
    }
    ni = _mm256_cvtps_epi32(n);
    n1 = _mm256_srai_epi32(ni, 1);
    n2 = _mm256_sub_epi32(ni, n1);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    return _mm256_andnot_ps(underflow, p);
}

/* exp(x - m) of one float through the eight-lane code, so that every path of
 * this variant computes the same values. */
static inline FA_TARGET float exp_diff_one_avx2(float x, float m)
{
    return _mm_cvtss_f32(_mm256_castps256_ps128(exp_diff_avx2(_mm256_set1_ps(x),
                                                              _mm256_set1_ps(m))));
}
#define FA_EXP_DIFF exp_diff_one_avx2

/* Adds the eight floats of v to the four-double accumulators lo and hi. */
static inline FA_TARGET void add_pd_avx2(__m256 v, __m256d *lo, __m256d *hi)
{
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

static inline FA_TARGET double hsum_pd_avx2(__m256d lo, __m256d hi)
{
    __m256d s = _mm256_add_pd(lo, hi);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* Stores eight floats; non-temporally (bypassing the caches) when asked and
 * the address allows it, for outputs too large to stay in cache. */
static inline FA_TARGET void store_avx2(float *p, __m256 v, int stream)
{
    if (stream && ((uintptr_t)p & 31) == 0)
        _mm256_stream_ps(p, v);
    else
        _mm256_storeu_ps(p, v);
}

/* softmax / log_softmax / logsumexp of one row (the rules of rowwise.c):
 * a max pass, a fused exp-store-sum pass (float64 sum), then the scale pass. */
#define FA_HAVE_ROWWISE 1
static FA_TARGET void rowwise_row_avx2(const float *x, float *out, int64_t n, int op,
                                       float *scratch, int stream)
{
    float *buf = scratch ? scratch : out; /* where softmax keeps exp(x - m) */
    __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps(), mv;
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    __m256i ntop = _mm256_setzero_si256();
    const int64_t nb = n / 8 * 8;
    const __m256i tail = tail_mask_avx2(n - nb);
    __m128 h;
    float m;
    double sum, top, logsum;
    int64_t j;
    for (j = 0; j < nb; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        mx = _mm256_max_ps(mx, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (nb < n) {
        const __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + nb, tail),
                                          _mm256_castsi256_ps(tail));
        mx = _mm256_max_ps(mx, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
    if (_mm256_movemask_ps(nan)) {
        m = NAN;
    }
    if (op == FA_OP_LOGSUMEXP && (m != m || m == INFINITY || m == -INFINITY)) {
        *out = m; /* NaN, +inf, or all -inf / empty */
        return;
    }
    if (m != m || m == INFINITY || m == -INFINITY) {
        for (j = 0; j < n; j++) /* exp(inf - inf) and exp(-inf + inf) are NaN */
            out[j] = NAN;
        return;
    }
    /* exp(x - m), stored for softmax; the sum in two float64 parts as in the
     * portable kernel: the count of entries equal to m (each adds exactly 1)
     * and the sum of the others, so log(sum) = log1p((top - 1) + rest). */
    mv = _mm256_set1_ps(m);
    for (j = 0; j < nb; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const __m256 e = exp_diff_avx2(v, mv);
        const __m256 is_top = _mm256_cmp_ps(v, mv, _CMP_EQ_OQ);
        if (op == FA_OP_SOFTMAX)
            _mm256_storeu_ps(buf + j, e);
        add_pd_avx2(_mm256_andnot_ps(is_top, e), &lo, &hi);
        ntop = _mm256_sub_epi32(ntop, _mm256_castps_si256(is_top));
    }
    if (nb < n) {
        const __m256 in = _mm256_castsi256_ps(tail);
        const __m256 v = _mm256_maskload_ps(x + nb, tail);
        const __m256 e = _mm256_and_ps(exp_diff_avx2(v, mv), in);
        const __m256 is_top = _mm256_and_ps(_mm256_cmp_ps(v, mv, _CMP_EQ_OQ), in);
        if (op == FA_OP_SOFTMAX)
            _mm256_maskstore_ps(buf + nb, tail, e);
        add_pd_avx2(_mm256_andnot_ps(is_top, e), &lo, &hi);
        ntop = _mm256_sub_epi32(ntop, _mm256_castps_si256(is_top));
    }
    {
        int32_t counts[8];
        int l;
        _mm256_storeu_si256((__m256i *)counts, ntop);
        top = 0.0;
        for (l = 0; l < 8; l++)
            top += (double)counts[l];
    }
    sum = hsum_pd_avx2(lo, hi);
    logsum = log1p((top - 1.0) + sum);
    if (op == FA_OP_LOGSUMEXP) {
        *out = (float)((double)m + logsum);
    } else if (op == FA_OP_SOFTMAX) {
        const __m256d inv = _mm256_set1_pd(1.0 / (top + sum));
        for (j = 0; j < nb; j += 8) {
            const __m256 e = _mm256_loadu_ps(buf + j);
            const __m128 a = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)), inv));
            const __m128 b = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)), inv));
            store_avx2(out + j, _mm256_set_m128(b, a), stream);
        }
        for (; j < n; j++)
            out[j] = (float)((double)buf[j] * _mm256_cvtsd_f64(inv));
    } else {
        const __m256d md = _mm256_set1_pd((double)m), ls = _mm256_set1_pd(logsum);
        for (j = 0; j < nb; j += 8) { /* (x - m) - log(sum): x - m is exact in float64 */
            const __m256 v = _mm256_loadu_ps(x + j);
            const __m256d a = _mm256_sub_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), md), ls);
            const __m256d b = _mm256_sub_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), md), ls);
            store_avx2(out + j, _mm256_set_m128(_mm256_cvtpd_ps(b), _mm256_cvtpd_ps(a)), stream);
        }
        for (; j < n; j++)
            out[j] = (float)(((double)x[j] - (double)m) - logsum);
    }
    if (stream)
        _mm_sfence(); /* order the non-temporal stores before the caller's next ones */
}

#include "kernels.inc"
#else
typedef int fa_no_avx2_variant; /* ISO C forbids an empty translation unit */
#endif
