/* The AVX2 + FMA (+ F16C) kernels: kernels.inc compiled for that target by attribute
 * (so the rest of the build stays baseline), with an intrinsics micro-kernel;
 * chosen at run time by dispatch.c. */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>
#include <math.h>

#ifndef FA_VARIANT_NAME /* kernels_avx512.c includes this file with its own target and names */
#define FA_TARGET __attribute__((target("avx2,fma,f16c")))
#define FA_NAME(x) x##_avx2
#define FA_VARIANT_NAME "avx2"
#define FA_MR 6
#endif

#include "fa_internal.h" /* its helpers compiled for this target */

#ifndef FA_HAVE_GEMM_BLOCK /* (a variant that includes this file may bring its own) */
/* One 6 x 16 block of C = (A . B) scale in twelve ymm accumulators, one fused
 * multiply-add per element and step of d, d ascending; with alpha, C = C *
 * alpha + A . B (kernels.inc's gemm_block). */
#define FA_HAVE_GEMM_BLOCK 1
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(gemm_block)(const float *a, int64_t ars,
                                                          int64_t ads, const float *b,
                                                          int64_t ldb, int64_t K, float *c,
                                                          int64_t ldc, const float *alpha,
                                                          float scale)
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
        ar = _mm256_broadcast_ss(a + d * ads);
        c00 = _mm256_fmadd_ps(ar, b0, c00);
        c01 = _mm256_fmadd_ps(ar, b1, c01);
        ar = _mm256_broadcast_ss(a + ars + d * ads);
        c10 = _mm256_fmadd_ps(ar, b0, c10);
        c11 = _mm256_fmadd_ps(ar, b1, c11);
        ar = _mm256_broadcast_ss(a + 2 * ars + d * ads);
        c20 = _mm256_fmadd_ps(ar, b0, c20);
        c21 = _mm256_fmadd_ps(ar, b1, c21);
        ar = _mm256_broadcast_ss(a + 3 * ars + d * ads);
        c30 = _mm256_fmadd_ps(ar, b0, c30);
        c31 = _mm256_fmadd_ps(ar, b1, c31);
        ar = _mm256_broadcast_ss(a + 4 * ars + d * ads);
        c40 = _mm256_fmadd_ps(ar, b0, c40);
        c41 = _mm256_fmadd_ps(ar, b1, c41);
        ar = _mm256_broadcast_ss(a + 5 * ars + d * ads);
        c50 = _mm256_fmadd_ps(ar, b0, c50);
        c51 = _mm256_fmadd_ps(ar, b1, c51);
    }
    if (alpha) { /* c * alpha + t, two roundings */
#define FA_ACC(row, col, t)                                                                    \
    t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(c + (row) * ldc + (col)),                 \
                                    _mm256_set1_ps(alpha[row])),                              \
                      t)
        FA_ACC(0, 0, c00); FA_ACC(0, 8, c01); FA_ACC(1, 0, c10); FA_ACC(1, 8, c11);
        FA_ACC(2, 0, c20); FA_ACC(2, 8, c21); FA_ACC(3, 0, c30); FA_ACC(3, 8, c31);
        FA_ACC(4, 0, c40); FA_ACC(4, 8, c41); FA_ACC(5, 0, c50); FA_ACC(5, 8, c51);
#undef FA_ACC
    } else if (scale != 1.0f) {
        const __m256 sv = _mm256_set1_ps(scale);
        c00 = _mm256_mul_ps(c00, sv); c01 = _mm256_mul_ps(c01, sv);
        c10 = _mm256_mul_ps(c10, sv); c11 = _mm256_mul_ps(c11, sv);
        c20 = _mm256_mul_ps(c20, sv); c21 = _mm256_mul_ps(c21, sv);
        c30 = _mm256_mul_ps(c30, sv); c31 = _mm256_mul_ps(c31, sv);
        c40 = _mm256_mul_ps(c40, sv); c41 = _mm256_mul_ps(c41, sv);
        c50 = _mm256_mul_ps(c50, sv); c51 = _mm256_mul_ps(c51, sv);
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
#endif

/* 2**f for |f| <= 1/2 (a little beyond is fine): fa_exp2f's polynomial with
 * fused multiply-adds. */
static inline FA_TARGET __m256 exp2_poly_avx2(__m256 f)
{
    __m256 p = _mm256_set1_ps(1.52527338040598e-05f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.000154035303933816f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00133335581464284f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00961812910762848f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.0555041086648216f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.240226506959101f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.693147180559945f));
    return _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
}

/* 2**x, eight lanes: fa_exp2f's algorithm (2**n applied as two exact
 * power-of-two factors, so that a subnormal result is rounded once). */
static inline FA_TARGET __m256 exp2_avx2(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(128.0f)),
                              _mm256_set1_ps(-151.0f));
    __m256 y = _mm256_add_ps(xc, shift);
    __m256 p = exp2_poly_avx2(_mm256_sub_ps(xc, _mm256_sub_ps(y, shift)));
    __m256i n, n1, n2;
    n = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000));
    n1 = _mm256_srai_epi32(n, 1);
    n2 = _mm256_sub_epi32(n, n1);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    return _mm256_blendv_ps(p, x, nan);
}

/* 2**x for -124 <= x <= 0, where the result is a normal float: 2**n is added
 * to the exponent field (y's low bits hold n, so y << 23 is n << 23). Bit for
 * bit the value exp2_avx2 gives. */
static inline FA_TARGET __m256 exp2_normal_avx2(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256 y = _mm256_add_ps(x, shift);
    const __m256 p = exp2_poly_avx2(_mm256_sub_ps(x, _mm256_sub_ps(y, shift)));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p),
                                                _mm256_slli_epi32(_mm256_castps_si256(y), 23)));
}

/* 2**x for x <= 0 (-inf and NaN included), bit for bit exp2_avx2's value,
 * without its multiplications into the subnormal range (which the CPU
 * finishes in microcode: ~7.7 ns a value against 0.45). A lane whose result
 * p 2**n is normal takes exp2_normal_avx2's exponent addition; below that,
 * the result is p's 24-bit significand M shifted right by sh = -126 - n - e
 * (p = M 2**(e - 23), e in {-1, 0}) with round-half-to-even, which is the
 * bit pattern of p 2**n rounded once (a shifted-out result of 2**23 is the
 * least normal float, its bits those of the integer). */
static inline FA_TARGET __m256 exp2_nonpos_avx2(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(-151.0f)); /* (x <= 0) */
    const __m256 y = _mm256_add_ps(xc, shift);
    const __m256 p = exp2_poly_avx2(_mm256_sub_ps(xc, _mm256_sub_ps(y, shift)));
    const __m256i pb = _mm256_castps_si256(p);
    const __m256i n = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000));
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(pb, 23), _mm256_set1_epi32(127));
    const __m256i sh = _mm256_sub_epi32(_mm256_set1_epi32(-126),
                                        _mm256_add_epi32(n, e)); /* > 0: subnormal */
    const __m256i m = _mm256_or_si256(_mm256_and_si256(pb, _mm256_set1_epi32(0x7FFFFF)),
                                      _mm256_set1_epi32(0x800000));
    const __m256i half = _mm256_sllv_epi32(one, _mm256_sub_epi32(sh, one));
    const __m256i odd = _mm256_and_si256(_mm256_srlv_epi32(m, sh), one);
    const __m256i sub = _mm256_srlv_epi32(
        _mm256_add_epi32(m, _mm256_add_epi32(_mm256_sub_epi32(half, one), odd)), sh);
    const __m256i nrm = _mm256_add_epi32(pb, _mm256_slli_epi32(n, 23));
    const __m256 r = _mm256_castsi256_ps(
        _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(sh, _mm256_setzero_si256())));
    return _mm256_blendv_ps(r, x, nan);
}

/* Sum of the eight lanes, in a fixed order. */
static inline FA_TARGET float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Largest and smallest of the eight lanes (callers check for NaN apart). */
static inline FA_TARGET float hmax_avx2(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

static inline FA_TARGET float hmin_avx2(__m256 v)
{
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}

/* 2**x is a normal float for x >= EXP2_NORMAL_LO (and x <= 0): exp2_normal_avx2 serves. */
#define EXP2_NORMAL_LO -124.0f

/* exp(x - m) = 2**((x - m) log2 e) of eight scores x (mv = m, a row's maximum),
 * a score of -inf (a masked key, the padding of a short tile) exactly 0: lanes
 * whose argument is at least EXP2_NORMAL_LO (a normal result; not NaN) take
 * exp2_normal_avx2, others exp2_nonpos_avx2. Where every argument is (the
 * common case) no lane is -inf and the mask is not formed: the same bits. */
static FA_ALWAYS_INLINE FA_TARGET __m256 exp2_masked_avx2(__m256 x, __m256 mv, __m256 log2e,
                                                          __m256 ninf, __m256 lo)
{
    const __m256 y = _mm256_mul_ps(_mm256_sub_ps(x, mv), log2e);
    const __m256 big = _mm256_cmp_ps(y, lo, _CMP_GE_OQ);
    __m256 masked;
    if (_mm256_movemask_ps(big) == 0xFF)
        return exp2_normal_avx2(y);
    masked = _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ);
    return _mm256_andnot_ps(masked, _mm256_movemask_ps(_mm256_or_ps(masked, big)) == 0xFF
                                        ? exp2_normal_avx2(y)
                                        : exp2_nonpos_avx2(y)); /* -inf: exactly 0 */
}

#ifndef FA_HAVE_TILE_SOFTMAX /* (a variant that includes this file may bring its own) */
#define FA_HAVE_TILE_SOFTMAX 1
/* The tile softmax step, eight lanes at a time (see the portable versions). */
static FA_TARGET float FA_NAME(tile_max)(const float *s, int64_t nc, float m)
{
    __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    float r;
    int jj;
    for (jj = 0; jj < nc; jj += 8) {
        const __m256 x = _mm256_loadu_ps(s + jj);
        mx = _mm256_max_ps(mx, x); /* a NaN x leaves mx; caught by `nan` */
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan) || m != m)
        return NAN;
    r = hmax_avx2(mx);
    return r > m ? r : m;
}

/* A row of scores s[0..nc) (natural units) -> exp(s - m) = 2**((s - m) log2 e),
 * and their sum. Eight lanes whose arguments are -inf (masked keys, the
 * padding of a short tile) or at least EXP2_NORMAL_LO (a normal result; not
 * NaN) take exp2_normal_avx2, the -inf lanes set to exactly 0 as the general
 * path sets them: the same bits, fewer instructions; other lanes
 * exp2_nonpos_avx2. */
static FA_TARGET double FA_NAME(tile_exp)(float *s, int64_t nc, float m)
{
    const __m256 mv = _mm256_set1_ps(m), log2e = _mm256_set1_ps(FA_LOG2E);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), lo = _mm256_set1_ps(EXP2_NORMAL_LO);
    __m256 sum = _mm256_setzero_ps();
    int jj;
    for (jj = 0; jj < nc; jj += 8) {
        const __m256 p = exp2_masked_avx2(_mm256_loadu_ps(s + jj), mv, log2e, ninf, lo);
        _mm256_storeu_ps(s + jj, p);
        sum = _mm256_add_ps(sum, p);
    }
    return (double)hsum_avx2(sum);
}
#endif

#ifndef FA_HAVE_QT_TILE /* (a variant that includes this file may bring its own) */
/*
 * Whole tiles with the unit's rows as the lanes (kernels.inc's qt_tile):
 * q^T in blocks of eight rows, each key's element broadcast from k's row in
 * place, maxima and sums lane by lane across registers. Each score is
 * gemm_block's sum (d ascending from 0, one fused multiply-add a step, then
 * the scale), each weight tile_exp's exponential, each row's sum tile_exp's
 * eight partial sums added in hsum_avx2's order: the general path's bits.
 */
#define FA_HAVE_QT_TILE 1
#define FA_QT_LANES 8
#define FA_QT_ROWS 16
typedef char FA_NAME(qt_keys)[FA_BK == 64 ? 1 : -1];

/* qt_scores_avx512's contract, with passes of sixteen rows (two registers)
 * over four keys at a time. */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(qt_scores_body)(
    const float *qt, int64_t nrt, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int bounded, const int32_t *first,
    const int32_t *last, const int alibi, const float *slope, const float *base, int64_t nc)
{
    const __m256 sv = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY),
                 pinf = _mm256_set1_ps(INFINITY), absmask = _mm256_castsi256_ps(
                                                      _mm256_set1_epi32(0x7FFFFFFF));
    __m256 bad = _mm256_setzero_ps();
    int64_t p, g, d;
    for (p = 0; p < nrt; p += 16) { /* rows p .. p + 15: two blocks of eight */
        const float *q0 = qt + p * D, *q1 = q0 + 8 * D;
        __m256 mx0 = ninf, mx1 = ninf;
        __m256i f0 = _mm256_setzero_si256(), f1 = f0, l0 = f0, l1 = f0;
        __m256 sl0 = _mm256_setzero_ps(), sl1 = sl0, bs0 = sl0, bs1 = sl0;
        if (alibi) {
            sl0 = _mm256_loadu_ps(slope + p);
            sl1 = _mm256_loadu_ps(slope + p + 8);
            bs0 = _mm256_loadu_ps(base + p);
            bs1 = _mm256_loadu_ps(base + p + 8);
        }
        if (bounded) {
            f0 = _mm256_loadu_si256((const __m256i *)(first + p));
            f1 = _mm256_loadu_si256((const __m256i *)(first + p + 8));
            l0 = _mm256_loadu_si256((const __m256i *)(last + p));
            l1 = _mm256_loadu_si256((const __m256i *)(last + p + 8));
        }
        for (g = 0; g < nc; g += 4) { /* keys g .. g + 3 */
            const float *kg = k + g * rs;
#define FA_DECL(j) __m256 a##j = _mm256_setzero_ps(), b##j = _mm256_setzero_ps();
#define FA_STEP(j)                                                                             \
    {                                                                                          \
        const __m256 kv = _mm256_broadcast_ss(kg + (j) * rs + d);                              \
        a##j = _mm256_fmadd_ps(x0, kv, a##j);                                                  \
        b##j = _mm256_fmadd_ps(x1, kv, b##j);                                                  \
    }
#define FA_ALLOW(s, f, l) /* first <= kk < last: kept, else -inf */                            \
    s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(_mm256_andnot_si256(                     \
                                      _mm256_cmpgt_epi32(f, kk), _mm256_cmpgt_epi32(l, kk))));
#define FA_STORE(j)                                                                            \
    {                                                                                          \
        __m256 s0 = _mm256_mul_ps(a##j, sv), s1 = _mm256_mul_ps(b##j, sv);                     \
        if (alibi) { /* |base - j|: exact below 2**24 */                                       \
            const __m256 jv = _mm256_set1_ps((float)(g + (j)));                                \
            s0 = _mm256_sub_ps(s0, _mm256_mul_ps(sl0, _mm256_and_ps(_mm256_sub_ps(bs0, jv), absmask))); \
            s1 = _mm256_sub_ps(s1, _mm256_mul_ps(sl1, _mm256_and_ps(_mm256_sub_ps(bs1, jv), absmask))); \
        }                                                                                      \
        if (bounded) {                                                                         \
            const __m256i kk = _mm256_set1_epi32((int)g + (j));                                \
            FA_ALLOW(s0, f0, l0)                                                               \
            FA_ALLOW(s1, f1, l1)                                                               \
        }                                                                                      \
        _mm256_storeu_ps(pt + (g + (j)) * ldp + p, s0);                                        \
        _mm256_storeu_ps(pt + (g + (j)) * ldp + p + 8, s1);                                    \
        mx0 = _mm256_max_ps(s0, mx0);                                                          \
        mx1 = _mm256_max_ps(s1, mx1);                                                          \
    }
#define FA_KEYS4(X) X(0) X(1) X(2) X(3)
            FA_KEYS4(FA_DECL)
            for (d = 0; d < D; d++) {
                const __m256 x0 = _mm256_loadu_ps(q0 + 8 * d), x1 = _mm256_loadu_ps(q1 + 8 * d);
                FA_KEYS4(FA_STEP)
            }
            FA_KEYS4(FA_STORE)
#undef FA_DECL
#undef FA_STEP
#undef FA_ALLOW
#undef FA_STORE
#undef FA_KEYS4
        }
        /* tile_max's `r > m ? r : m` lane by lane (a NaN m stays: rejected) */
        mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(mold + p));
        mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(mold + p + 8));
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(mx0, pinf, _CMP_NLT_UQ),
                                             _mm256_cmp_ps(mx1, pinf, _CMP_NLT_UQ)));
        _mm256_storeu_ps(mnew + p, mx0);
        _mm256_storeu_ps(mnew + p + 8, mx1);
    }
    return !_mm256_movemask_ps(bad);
}

/* (inlined into qt_tile: called there as a function, the AVX2 build's
 * whole call of 512 rows, D = 64, ran 2 % slower on the Xeon of
 * docs/performance.rst) */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(qt_scores)(
    const float *qt, int64_t nrt, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int32_t *first,
    const int32_t *last, const float *slope, const float *base, int64_t nc)
{
#define FA_QT_CALL(bd, al)                                                                     \
    FA_NAME(qt_scores_body)(qt, nrt, D, k, rs, scale, mold, pt, ldp, mnew, bd, first, last, al, \
                            slope, base, nc)
    if (slope)
        return first ? FA_QT_CALL(1, 1) : FA_QT_CALL(0, 1);
    return first ? FA_QT_CALL(1, 0) : FA_QT_CALL(0, 0);
#undef FA_QT_CALL
}

/* The weights of keys c + 8 i (i = 0 .. n - 1) for eight rows (from p, maxima
 * mv) in place, and their sum from +0 in that order: lane c of tile_exp's
 * register of sums. */
static FA_ALWAYS_INLINE FA_TARGET __m256 FA_NAME(qt_part)(float *p, int64_t ldp, int c, __m256 mv,
                                                          int n)
{
    const __m256 log2e = _mm256_set1_ps(FA_LOG2E), ninf = _mm256_set1_ps(-INFINITY),
                 lo = _mm256_set1_ps(EXP2_NORMAL_LO);
    __m256 sum = _mm256_setzero_ps();
    int i;
    for (i = 0; i < n; i++) {
        float *s = p + (int64_t)(c + 8 * i) * ldp;
        const __m256 e = exp2_masked_avx2(_mm256_loadu_ps(s), mv, log2e, ninf, lo);
        _mm256_storeu_ps(s, e);
        sum = _mm256_add_ps(sum, e);
    }
    return sum;
}

/* qt_exp_avx512's contract, eight rows a register: each row's sum hsum_avx2's
 * order over the partial sums of keys c, c + 8, ... below nc. */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(qt_exp_body)(float *pt, int64_t ldp,
                                                           int64_t nrt, const float *mnew,
                                                           float *sum, const int n)
{
    __m256 bad = _mm256_setzero_ps();
    int64_t r;
    for (r = 0; r < nrt; r += 8) {
        const __m256 mv = _mm256_loadu_ps(mnew + r);
        float *p = pt + r;
        const __m256 t0 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 0, mv, n),
                                        FA_NAME(qt_part)(p, ldp, 4, mv, n));
        const __m256 t2 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 2, mv, n),
                                        FA_NAME(qt_part)(p, ldp, 6, mv, n));
        const __m256 t1 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 1, mv, n),
                                        FA_NAME(qt_part)(p, ldp, 5, mv, n));
        const __m256 t3 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 3, mv, n),
                                        FA_NAME(qt_part)(p, ldp, 7, mv, n));
        const __m256 t = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(t, t, _CMP_UNORD_Q));
        _mm256_storeu_ps(sum + r, t);
    }
    return !_mm256_movemask_ps(bad);
}

static FA_TARGET int FA_NAME(qt_exp)(float *pt, int64_t ldp, int64_t nrt, const float *mnew,
                                     float *sum, int64_t nc)
{
    if (nc == FA_BK) /* (a whole tile: a constant count, unrolled) */
        return FA_NAME(qt_exp_body)(pt, ldp, nrt, mnew, sum, FA_BK / 8);
    return FA_NAME(qt_exp_body)(pt, ldp, nrt, mnew, sum, (int)(nc / 8));
}
#endif

/* Eight half-precision elements (the bits in h) of dtype dt as float32:
 * F16C's exact float16 conversion, bfloat16 by a shift into the top half. */
static FA_ALWAYS_INLINE FA_TARGET __m256 cvt8_avx2(__m128i h, int dt)
{
    if (dt == FA_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Eight elements at p of dtype dt (a constant at each call) as float32. */
static FA_ALWAYS_INLINE FA_TARGET __m256 load8_avx2(const void *p, int dt)
{
    if (dt == FA_DTYPE_F32)
        return _mm256_loadu_ps((const float *)p);
    return cvt8_avx2(_mm_loadu_si128((const __m128i *)p), dt);
}

/* Four 16-bit elements of dtype dt from each of x and y (the low 64 bits of
 * each, or with hi the high ones) as eight float32, x's in lanes 0-3. */
static FA_ALWAYS_INLINE FA_TARGET __m256 join8_avx2(__m128i x, __m128i y, const int hi, int dt)
{
    if (dt == FA_DTYPE_BF16) { /* the bits into the top half of each lane, 128 bits at a time */
        const __m128i z = _mm_setzero_si128();
        const __m128i lo4 = hi ? _mm_unpackhi_epi16(z, x) : _mm_unpacklo_epi16(z, x);
        const __m128i hi4 = hi ? _mm_unpackhi_epi16(z, y) : _mm_unpacklo_epi16(z, y);
        return _mm256_castsi256_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(lo4), hi4, 1));
    }
    return cvt8_avx2(hi ? _mm_unpackhi_epi64(x, y) : _mm_unpacklo_epi64(x, y), dt);
}

/* The 8 x 8 block of elements off .. off + 7 (bytes off from each row row[l],
 * dtype dt) transposed and converted: on return r[i] holds element i of every
 * row (lane l from row l). float32: each register is loaded as two halves
 * (rows l and l + 4), so the transposition takes in-lane shuffles only, no
 * cross-lane permutes (several micro-ops on CPUs with 128-bit vector units).
 * 16-bit elements: transposed as stored, 128 bits a register, then converted
 * eight at a time (half the conversions and loads of two 4-element halves). */
static FA_ALWAYS_INLINE FA_TARGET void load_transpose8_avx2(const char *row[8], int64_t off,
                                                            int dt, __m256 r[8])
{
    int h, l;
    if (dt != FA_DTYPE_F32) { /* 16-bit elements: transposed as stored, then converted */
        __m128i x[8], a[8], b[8];
        for (l = 0; l < 8; l++)
            x[l] = _mm_loadu_si128((const __m128i *)(row[l] + off));
        for (l = 0; l < 4; l++) { /* pairs of keys: elements 0-3 and 4-7 */
            a[l] = _mm_unpacklo_epi16(x[2 * l], x[2 * l + 1]);
            a[l + 4] = _mm_unpackhi_epi16(x[2 * l], x[2 * l + 1]);
        }
        for (h = 0; h < 2; h++) /* quads of keys 4h .. 4h + 3: elements 0-1, 2-3, 4-5, 6-7 */
            for (l = 0; l < 2; l++) {
                b[4 * h + 2 * l] = _mm_unpacklo_epi32(a[2 * h + 4 * l], a[2 * h + 4 * l + 1]);
                b[4 * h + 2 * l + 1] = _mm_unpackhi_epi32(a[2 * h + 4 * l], a[2 * h + 4 * l + 1]);
            }
        for (l = 0; l < 4; l++) { /* all eight keys: elements 2l and 2l + 1 */
            r[2 * l] = join8_avx2(b[l], b[l + 4], 0, dt);
            r[2 * l + 1] = join8_avx2(b[l], b[l + 4], 1, dt);
        }
        return;
    }
    for (h = 0; h < 2; h++) { /* elements off + 4h .. off + 4h + 3 */
        __m256 x[4];
        for (l = 0; l < 4; l++)
            x[l] = _mm256_insertf128_ps(
                _mm256_castps128_ps256(_mm_loadu_ps((const float *)(row[l] + off) + 4 * h)),
                _mm_loadu_ps((const float *)(row[l + 4] + off) + 4 * h), 1);
        {
            const __m256 t0 = _mm256_unpacklo_ps(x[0], x[1]), t1 = _mm256_unpackhi_ps(x[0], x[1]);
            const __m256 t2 = _mm256_unpacklo_ps(x[2], x[3]), t3 = _mm256_unpackhi_ps(x[2], x[3]);
            r[4 * h] = _mm256_shuffle_ps(t0, t2, 0x44);
            r[4 * h + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
            r[4 * h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
            r[4 * h + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
        }
    }
}

/* kt[d * FA_BK + jj] = k row jj, element d (k: key row j0, rows rs elements of
 * dtype dt apart), converted to float32, zero for nk <= jj < nk rounded up to
 * FA_NR (the micro-kernel's columns; tile_scores reads no column after those):
 * the key tile transposed in 8 x 8 blocks of registers. */
static FA_ALWAYS_INLINE FA_TARGET void pack_kt_dt_avx2(const void *k, int dt, int64_t rs,
                                                       int64_t D, int64_t nk, int64_t room,
                                                       float *kt)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const char *base = (const char *)k;
    int64_t jb, d, jj;
    int i;
#define FA_ROW(r) (base + ((jb + (r)) * rs + d) * esz)
    const int64_t ncol = (nk + FA_NR - 1) / FA_NR * FA_NR;
    /* the next tile's rows, where they follow (room: fa_kv_room), are fetched
     * ahead when they lie far apart, e.g. a (T, H, D) layout (the hardware
     * prefetchers do not stream those) */
    const int64_t ahead = fa_ahead_tiles(room, rs != D, rs, esz);
    int64_t d0 = 0; /* elements of the keys from jb on done by a band of sixteen */
    for (jb = 0; jb < ncol; jb += 8) {
        if (jb + 8 <= nk) {
            const char *rows[8];
#ifdef FA_HAVE_KT_BAND16 /* (a variant that includes this file may bring it) */
            if ((jb & 15) == 0)
                d0 = jb + 16 <= nk ? kt_band16_avx512(base, dt, rs, esz, jb, D, ahead, kt) : 0;
#endif
            for (i = 0; i < 8; i++)
                rows[i] = base + (jb + i) * rs * esz;
            for (d = d0; d + 8 <= D; d += 8) {
                __m256 r[8];
                if (ahead && ((d * esz) & 63) == 0)
                    for (i = 0; i < 8; i++)
                        fa_prefetch(FA_ROW(i), ahead);
                load_transpose8_avx2(rows, d * esz, dt, r);
                for (i = 0; i < 8; i++)
                    _mm256_storeu_ps(kt + (d + i) * FA_BK + jb, r[i]);
            }
            for (; d < D; d++)
                for (jj = 0; jj < 8; jj++)
                    kt[d * FA_BK + jb + jj] = fa_load_elem(base + (jb + jj) * rs * esz, d, dt);
        } else {
            for (jj = jb; jj < jb + 8; jj++)
                for (d = 0; d < D; d++)
                    kt[d * FA_BK + jj] = jj < nk ? fa_load_elem(base + jj * rs * esz, d, dt)
                                                 : 0.0f;
        }
    }
#undef FA_ROW
}

#define FA_HAVE_PACK_KT 1
static FA_TARGET void FA_NAME(pack_kt)(const void *k, int dt, int64_t rs, int64_t D, int64_t nk,
                                   int64_t room, float *kt)
{
    if (dt == FA_DTYPE_F16)
        pack_kt_dt_avx2(k, FA_DTYPE_F16, rs, D, nk, room, kt);
    else if (dt == FA_DTYPE_BF16)
        pack_kt_dt_avx2(k, FA_DTYPE_BF16, rs, D, nk, room, kt);
    else
        pack_kt_dt_avx2(k, FA_DTYPE_F32, rs, D, nk, room, kt);
}

/* dst[0..n) = src[0..n) (dtype dt) converted to float32; 1 if all are
 * finite. Half-precision elements sixteen at a time, non-finite ones told by
 * their exponent bits (all ones); float32 eight at a time (x - x is NaN). */
static FA_ALWAYS_INLINE FA_TARGET int load_row_dt_avx2(const void *src, int dt, int64_t n,
                                                       float *dst, int64_t ahead)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    __m256 bad = _mm256_setzero_ps();
    __m256i badh = _mm256_setzero_si256();
    int badt = 0;
    int64_t d = 0;
    if (dt != FA_DTYPE_F32) {
        const __m256i expo = _mm256_set1_epi16(dt == FA_DTYPE_F16 ? 0x7C00 : 0x7F80);
        for (; d + 16 <= n; d += 16) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + d));
            if (ahead && (d & 31) == 0)
                fa_prefetch((const uint16_t *)src + d, ahead); /* 32 elements: one line */
            badh = _mm256_or_si256(badh, _mm256_cmpeq_epi16(_mm256_and_si256(h, expo), expo));
            _mm256_storeu_ps(dst + d, cvt8_avx2(_mm256_castsi256_si128(h), dt));
            _mm256_storeu_ps(dst + d + 8, cvt8_avx2(_mm256_extracti128_si256(h, 1), dt));
        }
    }
    for (; d + 8 <= n; d += 8) {
        const __m256 x = load8_avx2((const char *)src + d * esz, dt);
        if (ahead && ((d * esz) & 63) == 0)
            fa_prefetch((const char *)src + d * esz, ahead);
        _mm256_storeu_ps(dst + d, x);
        bad = _mm256_or_ps(bad, _mm256_sub_ps(x, x)); /* NaN lanes for inf and NaN */
    }
    for (; d < n; d++) {
        const float x = fa_load_elem(src, d, dt), z = x - x;
        dst[d] = x;
        badt |= (z != z);
    }
    return !badt && !_mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q))
           && _mm256_testz_si256(badh, badh);
}

/* 1 if x[0..n) are all finite (x - x is +0 for finite x, NaN otherwise; the
 * OR of such bits is NaN if any is); the lines `ahead` bytes past those read
 * are fetched ahead (0: none). */
#define FA_HAVE_ROW_FINITE 1
static FA_TARGET int FA_NAME(row_finite)(const float *x, int64_t n, int64_t ahead)
{
    __m256 bad = _mm256_setzero_ps();
    int64_t i = 0;
    int badt = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        if (ahead)
            fa_prefetch(x + i, ahead); /* 16 floats: one line */
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_sub_ps(a, a), _mm256_sub_ps(b, b)));
    }
    for (; i < n; i++) {
        const float z = x[i] - x[i];
        badt |= (z != z);
    }
    return !badt && !_mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q));
}

#define FA_HAVE_LOAD_ROW 1
static FA_TARGET int FA_NAME(load_row)(const void *src, int dt, int64_t n, float *dst,
                                   int64_t ahead)
{
    if (dt == FA_DTYPE_F16)
        return load_row_dt_avx2(src, FA_DTYPE_F16, n, dst, ahead);
    if (dt == FA_DTYPE_BF16)
        return load_row_dt_avx2(src, FA_DTYPE_BF16, n, dst, ahead);
    return load_row_dt_avx2(src, FA_DTYPE_F32, n, dst, ahead);
}

#ifndef FA_HAVE_FEW_SCORES /* (a variant that includes this file may bring its own) */
/*
 * The few-rows kernels (see kernels.inc): the products of gemm_block_avx2 for
 * nr <= FA_FEW_ROWS query rows, k and v read in place. Scores: eight keys at
 * a time (rows rs elements of dtype dt apart, converted as pack_kt does),
 * transposed in registers (load_transpose8_avx2), one fused multiply-add per key
 * and step of d, d ascending from 0, as the micro-kernel does. nr and dt are
 * constants in each inlined copy, so the accumulators live in registers.
 */
static FA_ALWAYS_INLINE FA_TARGET void few_scores_n_avx2(const float *q, const int nr,
                                                         const void *k, const int dt, int64_t rs,
                                                         int64_t D, int64_t nk, int64_t ahead,
                                                         float *s)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const int contig = rs == D;
    int64_t jb, d;
    int r, i;
    for (jb = 0; jb < nk; jb += 8) {
        const char *kr[8];
        __m256 acc[FA_FEW_ROWS];
        for (i = 0; i < 8; i++) /* keys past nk: any row (their scores are masked) */
            kr[i] = (const char *)k + (jb + i < nk ? jb + i : nk - 1) * rs * esz;
        for (r = 0; r < nr; r++)
            acc[r] = _mm256_setzero_ps();
        for (d = 0; d + 8 <= D; d += 8) {
            __m256 c[8];
            if (ahead && ((d * esz) & 63) == 0)
                for (i = 0; i < 8; i++)
                    fa_prefetch_rows(kr[i], ahead + d * esz, contig);
            load_transpose8_avx2(kr, d * esz, dt, c);
            for (i = 0; i < 8; i++)
                for (r = 0; r < nr; r++)
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + r * D + d + i), c[i], acc[r]);
        }
        for (; d < D; d++) {
            const __m256 c = _mm256_setr_ps(
                fa_load_elem(kr[0], d, dt), fa_load_elem(kr[1], d, dt), fa_load_elem(kr[2], d, dt),
                fa_load_elem(kr[3], d, dt), fa_load_elem(kr[4], d, dt), fa_load_elem(kr[5], d, dt),
                fa_load_elem(kr[6], d, dt), fa_load_elem(kr[7], d, dt));
            for (r = 0; r < nr; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + r * D + d), c, acc[r]);
        }
        for (r = 0; r < nr; r++)
            _mm256_storeu_ps(s + r * FA_BK + jb, acc[r]);
    }
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_dt_avx2(const float *q, int64_t nr,
                                                          const void *k, const int dt, int64_t rs,
                                                          int64_t D, int64_t nk, int64_t room,
                                                          float *s)
{
    /* the rows of the tile that follows, where they do, are fetched ahead */
    const int64_t ahead = fa_ahead(room, rs, D, (int64_t)fa_dtype_size(dt));
#define FA_CALL(n) few_scores_n_avx2(q, n, k, dt, rs, D, nk, ahead, s)
    FA_CONST_ROWS8(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void FA_NAME(few_scores)(const float *q, int64_t nr, const void *k, int dt,
                                      int64_t rs, int64_t D, int64_t nk, int64_t room, float *s)
{
    if (dt == FA_DTYPE_F16)
        few_scores_dt_avx2(q, nr, k, FA_DTYPE_F16, rs, D, nk, room, s);
    else if (dt == FA_DTYPE_BF16)
        few_scores_dt_avx2(q, nr, k, FA_DTYPE_BF16, rs, D, nk, room, s);
    else
        few_scores_dt_avx2(q, nr, k, FA_DTYPE_F32, rs, D, nk, room, s);
}
#endif
#define FA_HAVE_FEW_KERNELS 1

#ifndef FA_HAVE_FEW_PV /* (a variant that includes this file may bring its own) */
/* tile[r * Dvp + c] = sum over jj < nk of p[r * FA_BK + jj] v[jj * ld + c] for
 * the nr rows, the value rows read in place (ld elements of dtype dt apart,
 * Dvp of them a row, converted by load8_avx2): gemm_block_avx2's sum, one
 * fused multiply-add per key, jj ascending from 0 (from: going on from the
 * tile's value, as kernels.inc's few_pv), 16 columns at a time. nr
 * and dt are constants in each inlined copy. The value rows of the tile that
 * follows, where they do (ahead: fa_ahead's distance), are fetched ahead, a
 * line at a time as these are read. */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_n_avx2(const float *p, const int nr, const void *v,
                                                     const int dt, int64_t ld, int64_t Dvp,
                                                     int64_t nk, int64_t ahead, int from,
                                                     float *tile)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const int contig = ld == Dvp;
    int64_t c, jj;
    int r;
    for (c = 0; c < Dvp; c += 16) {
        __m256 a0[FA_FEW_ROWS], a1[FA_FEW_ROWS];
        const int fetch = ahead && ((c * esz) & 63) == 0;
        for (r = 0; r < nr; r++) {
            a0[r] = from ? _mm256_loadu_ps(tile + r * Dvp + c) : _mm256_setzero_ps();
            a1[r] = from ? _mm256_loadu_ps(tile + r * Dvp + c + 8) : _mm256_setzero_ps();
        }
        for (jj = 0; jj < nk; jj++) {
            const char *vr = (const char *)v + (jj * ld + c) * esz;
            const __m256 v0 = load8_avx2(vr, dt), v1 = load8_avx2(vr + 8 * esz, dt);
            if (fetch)
                fa_prefetch_rows(vr, ahead, contig);
            for (r = 0; r < nr; r++) {
                const __m256 pr = _mm256_broadcast_ss(p + r * FA_BK + jj);
                a0[r] = _mm256_fmadd_ps(pr, v0, a0[r]);
                a1[r] = _mm256_fmadd_ps(pr, v1, a1[r]);
            }
        }
        for (r = 0; r < nr; r++) {
            _mm256_storeu_ps(tile + r * Dvp + c, a0[r]);
            _mm256_storeu_ps(tile + r * Dvp + c + 8, a1[r]);
        }
    }
}

static FA_ALWAYS_INLINE FA_TARGET void few_pv_dt_avx2(const float *p, int64_t nr, const void *v,
                                                      const int dt, int64_t ld, int64_t Dvp,
                                                      int64_t nk, int64_t room, int from,
                                                      float *tile)
{
    const int64_t ahead = fa_ahead(room, ld, Dvp, (int64_t)fa_dtype_size(dt));
    for (; nr > 6; nr -= 4, p += 4 * FA_BK, tile += 4 * Dvp) /* twelve accumulators at most */
        few_pv_n_avx2(p, 4, v, dt, ld, Dvp, nk, ahead, from, tile);
#define FA_CALL(n) few_pv_n_avx2(p, n, v, dt, ld, Dvp, nk, ahead, from, tile)
    FA_CONST_ROWS6(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void FA_NAME(few_pv)(const float *p, int64_t nr, const void *v, int dt,
                                      int64_t ld, int64_t Dvp, int64_t nk, int64_t room,
                                      int from, float *tile)
{
    if (dt == FA_DTYPE_F16)
        few_pv_dt_avx2(p, nr, v, FA_DTYPE_F16, ld, Dvp, nk, room, from, tile);
    else if (dt == FA_DTYPE_BF16)
        few_pv_dt_avx2(p, nr, v, FA_DTYPE_BF16, ld, Dvp, nk, room, from, tile);
    else
        few_pv_dt_avx2(p, nr, v, FA_DTYPE_F32, ld, Dvp, nk, room, from, tile);
}
#endif

/* Lanes [0, n) of eight (n < 8), as a mask for maskload / maskstore. */
static inline FA_TARGET __m256i tail_mask_avx2(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 2**x of an array, eight at a time, as the attention kernel takes it:
 * exp2_normal_avx2 where all eight lie in [-124, 0], else exp2_avx2 (so the
 * tests reach both). */
#define FA_HAVE_EXP2_ARRAY 1
static FA_TARGET void FA_NAME(exp2_array)(const float *x, float *y, int64_t n)
{
    int64_t j;
    for (j = 0; j < n; j += 8) {
        const __m256i in = n - j >= 8 ? _mm256_set1_epi32(-1) : tail_mask_avx2(n - j);
        const __m256 v = _mm256_maskload_ps(x + j, in); /* lanes past n: 0 */
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(EXP2_NORMAL_LO), _CMP_GE_OQ),
                                        _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LE_OQ));
        const int nonpos = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(),
                                                            _CMP_NLE_UQ)) == 0;
        _mm256_maskstore_ps(y + j, in, _mm256_movemask_ps(ok) == 0xFF ? exp2_normal_avx2(v)
                                       : nonpos ? exp2_nonpos_avx2(v) : exp2_avx2(v));
    }
}

/*
 * exp(x - m) in float32 for a finite row maximum m >= x, eight lanes, as
 * p * 2**n (n in the low bits of *y_out). The difference is split exactly into
 * s + err (Knuth's TwoSum), reduced as s = n ln2 + r (Cody-Waite, ln2 in two
 * parts), and exp(r + err) taken by a degree-6 polynomial with the least
 * relative error on |r| <= ln2 / 2 (2e-8; tools/fit_exp_poly.py computes its
 * coefficients), by Horner's rule with fused multiply-adds. `full` (a
 * constant at each call) handles every x <= m: differences below -104 give
 * p = 0 (x = -inf included). Without it the caller guarantees x - m >= -86,
 * so that p * 2**n is a normal float.
 */
static inline FA_TARGET __m256 exp_diff_poly_avx2(__m256 x, __m256 nm, int full, __m256 *y_out)
{
    const __m256 s = _mm256_add_ps(x, nm);
    const __m256 bb = _mm256_sub_ps(s, x);
    __m256 err = _mm256_add_ps(_mm256_sub_ps(x, _mm256_sub_ps(s, bb)), _mm256_sub_ps(nm, bb));
    __m256 sc = s, under = _mm256_setzero_ps(), y, n, r, p;
    if (full) {
        under = _mm256_cmp_ps(s, _mm256_set1_ps(-104.0f), _CMP_LT_OQ); /* exp(-104) rounds to 0 */
        sc = _mm256_max_ps(s, _mm256_set1_ps(-104.0f));
        err = _mm256_andnot_ps(under, err);
    }
    /* n = round(sc / ln2), held in y's low bits (y = n + 1.5 * 2**23) */
    y = _mm256_fmadd_ps(sc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(12582912.0f));
    n = _mm256_sub_ps(y, _mm256_set1_ps(12582912.0f));
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), sc); /* exact: ln2's first 9 bits */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r); /* the rest of ln2 */
    r = _mm256_add_ps(r, err);
    p = _mm256_fmadd_ps(_mm256_set1_ps(0.0013842703774571419f), r,
                        _mm256_set1_ps(0.008374971337616444f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.041668057441711426f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.1666642129421234f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.4999999403953552f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    *y_out = y;
    return full ? _mm256_andnot_ps(under, p) : p;
}

/*
 * exp(x - m), eight lanes, for any x <= m (nm = -m): 2**n applied as two
 * exact power-of-two factors, so that a subnormal result is rounded once.
 * Within 2 ulp of exp(x - m) taken exactly (the tests hold it to that).
 */
static inline FA_TARGET __m256 exp_diff_avx2(__m256 x, __m256 nm)
{
    const __m256i bias = _mm256_set1_epi32(127);
    __m256i ni, n1, n2;
    __m256 y;
    __m256 p = exp_diff_poly_avx2(x, nm, 1, &y);
    ni = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000));
    n1 = _mm256_srai_epi32(ni, 1);
    n2 = _mm256_sub_epi32(ni, n1);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
}

/*
 * The same for x - m >= -86, where every result is a normal float: 2**n is
 * added to p's exponent field (y's low bits hold n, so y << 23 is n << 23).
 * Bit for bit the value exp_diff_avx2 gives.
 */
static inline FA_TARGET __m256 exp_diff_normal_avx2(__m256 x, __m256 nm)
{
    __m256 y;
    const __m256 p = exp_diff_poly_avx2(x, nm, 0, &y);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p),
                                                _mm256_slli_epi32(_mm256_castps_si256(y), 23)));
}

/* exp(x - m) of one float through the eight-lane code, so that every path of
 * this variant computes the same values. */
static inline FA_TARGET float exp_diff_one_avx2(float x, float m)
{
    return _mm_cvtss_f32(_mm256_castps256_ps128(exp_diff_avx2(_mm256_set1_ps(x),
                                                              _mm256_set1_ps(-m))));
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

/*
 * The exponential pass of a row: e = exp(x - m) (stored to buf for softmax)
 * and their sum in two float64 parts, *top = the count of entries equal to m
 * (each adds exactly 1) and the sum of the others, so that log(sum) =
 * log1p((top - 1) + rest) stays accurate near 0. softmax needs only the
 * total, so it counts nothing apart (*top = 0). Pairs of vectors are added in
 * float32 (one rounding, <= 2**-24 relative) before the float64 sum, in an
 * order fixed by n alone. `normal` (a constant at each call): every
 * x - m >= -86, so exp_diff_normal_avx2 serves.
 */
static inline FA_TARGET void exp_pass_avx2(const float *x, float *buf, int64_t n, float m,
                                           int op, int normal, const float *next,
                                           double *top, double *rest)
{
    const __m256 mv = _mm256_set1_ps(m), nm = _mm256_set1_ps(-m);
    const int count_top = op != FA_OP_SOFTMAX;
    const int64_t nb = n / 8 * 8;
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    __m256i ntop = _mm256_setzero_si256();
    int64_t j = 0;
#define FA_EXP8(v) (normal ? exp_diff_normal_avx2((v), nm) : exp_diff_avx2((v), nm))
    for (; j + 16 <= nb; j += 16) {
        const __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
        __m256 e0 = FA_EXP8(v0), e1 = FA_EXP8(v1);
        _mm_prefetch((const char *)(next + j), _MM_HINT_T0); /* one line of the next row */
        if (op == FA_OP_SOFTMAX) {
            _mm256_storeu_ps(buf + j, e0);
            _mm256_storeu_ps(buf + j + 8, e1);
        }
        if (count_top) {
            const __m256 t0 = _mm256_cmp_ps(v0, mv, _CMP_EQ_OQ), t1 = _mm256_cmp_ps(v1, mv, _CMP_EQ_OQ);
            e0 = _mm256_andnot_ps(t0, e0);
            e1 = _mm256_andnot_ps(t1, e1);
            ntop = _mm256_sub_epi32(ntop, _mm256_castps_si256(t0));
            ntop = _mm256_sub_epi32(ntop, _mm256_castps_si256(t1));
        }
        add_pd_avx2(_mm256_add_ps(e0, e1), &lo, &hi);
    }
    if (j < n) { /* the last 1 to 15 entries: one or two vectors, the last masked */
        const __m256i full = _mm256_set1_epi32(-1), tail = tail_mask_avx2(n - nb);
        for (; j < n; j += 8) {
            const __m256i in = j < nb ? full : tail;
            const __m256 inf = _mm256_castsi256_ps(in);
            const __m256 v = _mm256_maskload_ps(x + j, in);
            __m256 e = _mm256_and_ps(FA_EXP8(v), inf);
            if (op == FA_OP_SOFTMAX)
                _mm256_maskstore_ps(buf + j, in, e);
            if (count_top) {
                const __m256 t = _mm256_and_ps(_mm256_cmp_ps(v, mv, _CMP_EQ_OQ), inf);
                e = _mm256_andnot_ps(t, e);
                ntop = _mm256_sub_epi32(ntop, _mm256_castps_si256(t));
            }
            add_pd_avx2(e, &lo, &hi);
        }
    }
#undef FA_EXP8
    {
        int32_t counts[8];
        int l;
        _mm256_storeu_si256((__m256i *)counts, ntop);
        *top = 0.0;
        for (l = 0; l < 8; l++)
            *top += (double)counts[l];
    }
    *rest = hsum_pd_avx2(lo, hi);
}

/* Eight results of the last pass: softmax's v / sum for v = exp(x - m), as
 * v * (ih + il) with 1 / sum split into two floats (within half an ulp, plus
 * ~2**-48, of the exact quotient), or log_softmax's (x - m) - log(sum) for
 * v = x (x - m is exact in float64). */
static inline FA_TARGET __m256 finish8_avx2(__m256 v, int op, __m256 ih, __m256 il, __m256d md,
                                            __m256d ls)
{
    __m256d a, b;
    if (op == FA_OP_SOFTMAX)
        return _mm256_fmadd_ps(v, ih, _mm256_mul_ps(v, il));
    a = _mm256_sub_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), md), ls);
    b = _mm256_sub_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), md), ls);
    return _mm256_set_m128(_mm256_cvtpd_ps(b), _mm256_cvtpd_ps(a));
}

/* The last pass over a row, src -> out (src == out for softmax); the last 0
 * to 7 lanes masked. */
static inline FA_TARGET void finish_row_avx2(const float *src, float *out, int64_t n, int op,
                                             float ih, float il, float m, double logsum)
{
    const __m256 ihv = _mm256_set1_ps(ih), ilv = _mm256_set1_ps(il);
    const __m256d md = _mm256_set1_pd((double)m), ls = _mm256_set1_pd(logsum);
    int64_t j;
    for (j = 0; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, finish8_avx2(_mm256_loadu_ps(src + j), op, ihv, ilv, md, ls));
    if (j < n) {
        const __m256i in = tail_mask_avx2(n - j);
        _mm256_maskstore_ps(out + j, in,
                            finish8_avx2(_mm256_maskload_ps(src + j, in), op, ihv, ilv, md, ls));
    }
}

/* softmax / log_softmax / logsumexp of one row (the rules of rowwise.c):
 * a max pass (which also finds the minimum), the exponential pass, then the
 * scale pass. */
#define FA_HAVE_ROWWISE 1
static FA_TARGET void FA_NAME(rowwise_row)(const float *x, float *out, int64_t n, int op,
                                       const float *next)
{
    __m256 mx = _mm256_set1_ps(-INFINITY), mn = _mm256_set1_ps(INFINITY);
    __m256 nan = _mm256_setzero_ps();
    const int64_t nb = n / 8 * 8;
    const __m256i tail = tail_mask_avx2(n - nb);
    float m, lowest;
    double top, rest;
    int64_t j;
    for (j = 0; j < nb; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        mx = _mm256_max_ps(mx, v);
        mn = _mm256_min_ps(mn, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (nb < n) {
        const __m256 in = _mm256_castsi256_ps(tail);
        const __m256 v = _mm256_maskload_ps(x + nb, tail);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, in));
        mn = _mm256_min_ps(mn, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), v, in));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    m = hmax_avx2(mx);
    lowest = hmin_avx2(mn);
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
    if ((double)lowest - (double)m >= -86.0) /* no result below FLT_MIN, no -inf */
        exp_pass_avx2(x, out, n, m, op, 1, next ? next : x, &top, &rest);
    else
        exp_pass_avx2(x, out, n, m, op, 0, next ? next : x, &top, &rest);
    if (op == FA_OP_LOGSUMEXP) {
        *out = (float)((double)m + log1p((top - 1.0) + rest));
    } else if (op == FA_OP_SOFTMAX) {
        const double inv = 1.0 / (top + rest);
        finish_row_avx2(out, out, n, op, (float)inv, (float)(inv - (double)(float)inv), 0.0f, 0.0);
    } else {
        finish_row_avx2(x, out, n, op, 0.0f, 0.0f, m, log1p((top - 1.0) + rest));
    }
}

#include "kernels.inc"
#else
typedef int fa_no_avx2_variant; /* ISO C forbids an empty translation unit */
#endif
