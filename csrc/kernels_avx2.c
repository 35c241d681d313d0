/* The AVX2 + FMA (+ F16C) kernels: the unit driver (driver.inc) compiled for
 * that target by attribute (so the rest of the build stays baseline), over
 * the eight-lane vector vocabulary (vec_avx2.h) and its math (vec_math.h),
 * the x86 row kernels (x86_rows.h), and this file's micro-kernels: a 6 x 16
 * gemm block, the rows-as-lanes tile kernels and the few-rows kernels.
 * Chosen at run time by dispatch.c (variants.def). */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>
#include <math.h>

#define FA_TARGET __attribute__((target("avx2,fma,f16c")))
#define FA_NAME(x) x##_avx2
#define FA_VARIANT_NAME "avx2"
#define FA_MR 6

#include "fa_internal.h" /* its helpers compiled for this target */
#include "microkernels.h"
#include "vec_avx2.h"
#include "vec_math.h"
#include "x86_rows.h"
#include "x86_blocks.h"

/* One 6 x 16 block of C = (A . B) scale in twelve ymm accumulators, one fused
 * multiply-add per element and step of d, d ascending; with alpha, C = C *
 * alpha + A . B (microkernels.h's gemm_block). */
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

/*
 * Whole tiles with the unit's rows as the lanes (unit_common.inc's qt_tile):
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

/* qt_scores_avx512's contract (rows r < nrt, a multiple of 8), with passes
 * of sixteen rows (two registers) over four keys at a time; a last eight
 * rows alone keep the first register's results (the second repeats it: the
 * work of a padding block). */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(qt_scores_body)(
    const float *qt, int64_t nrt, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int bounded, const int32_t *first,
    const int32_t *last, const int alibi, const float *slope, const float *base, int64_t nv)
{
    const __m256 sv = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY),
                 pinf = _mm256_set1_ps(INFINITY), absmask = _mm256_castsi256_ps(
                                                      _mm256_set1_epi32(0x7FFFFFFF));
    __m256 bad = _mm256_setzero_ps();
    int64_t p, g, d;
    for (p = 0; p < nrt; p += 16) { /* rows p .. p + 15: two blocks of eight */
        const int two = nrt - p >= 16;
        const float *q0 = qt + p * D, *q1 = two ? q0 + 8 * D : q0;
        __m256 mx0 = ninf, mx1 = ninf;
        __m256i f0 = _mm256_setzero_si256(), f1 = f0, l0 = f0, l1 = f0;
        __m256 sl0 = _mm256_setzero_ps(), sl1 = sl0, bs0 = sl0, bs1 = sl0;
        if (alibi) {
            sl0 = _mm256_loadu_ps(slope + p);
            sl1 = two ? _mm256_loadu_ps(slope + p + 8) : sl0;
            bs0 = _mm256_loadu_ps(base + p);
            bs1 = two ? _mm256_loadu_ps(base + p + 8) : bs0;
        }
        if (bounded) {
            f0 = _mm256_loadu_si256((const __m256i *)(first + p));
            f1 = two ? _mm256_loadu_si256((const __m256i *)(first + p + 8)) : f0;
            l0 = _mm256_loadu_si256((const __m256i *)(last + p));
            l1 = two ? _mm256_loadu_si256((const __m256i *)(last + p + 8)) : l0;
        }
        for (g = 0; g < nv; g += 4) { /* keys g .. g + 3 */
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
        if (two)                                                                               \
            _mm256_storeu_ps(pt + (g + (j)) * ldp + p + 8, s1);                                \
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
        mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(mold + (two ? p + 8 : p)));
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(mx0, pinf, _CMP_NLT_UQ),
                                             _mm256_cmp_ps(mx1, pinf, _CMP_NLT_UQ)));
        _mm256_storeu_ps(mnew + p, mx0);
        if (two)
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
    const int32_t *last, const float *slope, const float *base, int64_t nv)
{
#define FA_QT_CALL(bd, al)                                                                     \
    FA_NAME(qt_scores_body)(qt, nrt, D, k, rs, scale, mold, pt, ldp, mnew, bd, first, last, al, \
                            slope, base, nv)
    if (slope)
        return first ? FA_QT_CALL(1, 1) : FA_QT_CALL(0, 1);
    return first ? FA_QT_CALL(1, 0) : FA_QT_CALL(0, 0);
#undef FA_QT_CALL
}

/* The weights of the keys c + 8 i below nv for eight rows (from p, maxima
 * mv) in place, and their sum from +0 in that order: lane c of tile_exp's
 * register of sums. */
static FA_ALWAYS_INLINE FA_TARGET __m256 FA_NAME(qt_part)(float *p, int64_t ldp, int c, __m256 mv,
                                                          int nv)
{
    const int n = c < nv ? (nv - c + 7) / 8 : 0;
    const __m256 log2e = _mm256_set1_ps(FA_LOG2E), ninf = _mm256_set1_ps(-INFINITY),
                 lo = _mm256_set1_ps(FA_EXP2_NORMAL_LO);
    __m256 sum = _mm256_setzero_ps();
    int i;
    for (i = 0; i < n; i++) {
        float *s = p + (int64_t)(c + 8 * i) * ldp;
        const __m256 e = vf_exp2_masked(_mm256_loadu_ps(s), mv, log2e, ninf, lo);
        _mm256_storeu_ps(s, e);
        sum = _mm256_add_ps(sum, e);
    }
    return sum;
}

/* qt_exp_avx512's contract, eight rows a register: each row's sum hsum_avx2's
 * order over the partial sums of keys c, c + 8, ... below nv. */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(qt_exp_body)(float *pt, int64_t ldp,
                                                           int64_t nrt, const float *mnew,
                                                           float *sum, const int nv)
{
    __m256 bad = _mm256_setzero_ps();
    int64_t r;
    for (r = 0; r < nrt; r += 8) {
        const __m256 mv = _mm256_loadu_ps(mnew + r);
        float *p = pt + r;
        const __m256 t0 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 0, mv, nv),
                                        FA_NAME(qt_part)(p, ldp, 4, mv, nv));
        const __m256 t2 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 2, mv, nv),
                                        FA_NAME(qt_part)(p, ldp, 6, mv, nv));
        const __m256 t1 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 1, mv, nv),
                                        FA_NAME(qt_part)(p, ldp, 5, mv, nv));
        const __m256 t3 = _mm256_add_ps(FA_NAME(qt_part)(p, ldp, 3, mv, nv),
                                        FA_NAME(qt_part)(p, ldp, 7, mv, nv));
        const __m256 t = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(t, t, _CMP_UNORD_Q));
        _mm256_storeu_ps(sum + r, t);
    }
    return !_mm256_movemask_ps(bad);
}

static FA_TARGET int FA_NAME(qt_exp)(float *pt, int64_t ldp, int64_t nrt, const float *mnew,
                                     float *sum, int64_t nv)
{
    if (nv == FA_BK) /* (a whole tile: a constant count, unrolled) */
        return FA_NAME(qt_exp_body)(pt, ldp, nrt, mnew, sum, FA_BK);
    return FA_NAME(qt_exp_body)(pt, ldp, nrt, mnew, sum, (int)nv);
}

/*
 * The few-rows kernels (microkernels.h): the products of gemm_block_avx2 for
 * nr <= FA_FEW_ROWS query rows, k and v read in place. Scores: eight keys at
 * a time (rows rs elements of dtype dt apart, converted as pack_kt does),
 * transposed in registers (load_transpose8_avx2), one fused multiply-add per key
 * and step of d, d ascending from 0, as the micro-kernel does. nr and dt are
 * constants in each inlined copy, so the accumulators live in registers.
 */
static FA_ALWAYS_INLINE FA_TARGET void few_scores_tail_avx2(const float *q, const int nr,
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

/* The float32 scores of nb whole blocks of eight keys (nb 8 rows of Dc
 * elements each from kb, one after another: a contiguous k, Dc a constant,
 * so that every row's address is kb plus a constant) through d together: the
 * operations on each key are few_scores_tail_avx2's, and each block's chain
 * of Dc multiply-adds is independent of the others' (with one row, a single
 * chain of 4-cycle multiply-adds a block held the whole kernel). */
static FA_ALWAYS_INLINE FA_TARGET void few_scores_f32c_avx2(const float *q, const int nr,
                                                            const int nb, const float *kb,
                                                            const int64_t Dc, int64_t ahead,
                                                            float *s)
{
    __m256 acc[4][FA_FEW_ROWS];
    int64_t d;
    int r, i, b, h, l;
    for (b = 0; b < nb; b++)
        for (r = 0; r < nr; r++)
            acc[b][r] = _mm256_setzero_ps();
    for (d = 0; d < Dc; d += 8) {
        if (ahead && (d & 15) == 0)
            for (i = 0; i < 8 * nb; i++)
                fa_prefetch_rows(kb + i * Dc, ahead + d * (int64_t)sizeof(float), 1);
        for (h = 0; h < 8; h += 4) /* elements d + h .. d + h + 3 of each block */
            for (b = 0; b < nb; b++) {
                const float *kr = kb + (8 * b) * Dc + d + h;
                __m256 x[4], t0, t1, t2, t3, c[4];
                for (l = 0; l < 4; l++) /* (two loads and a blend: no shuffle) */
                    x[l] = _mm256_blend_ps(_mm256_broadcast_ps((const __m128 *)(kr + l * Dc)),
                                           _mm256_broadcast_ps((const __m128 *)(kr + (l + 4) * Dc)),
                                           0xF0);
                t0 = _mm256_unpacklo_ps(x[0], x[1]);
                t1 = _mm256_unpackhi_ps(x[0], x[1]);
                t2 = _mm256_unpacklo_ps(x[2], x[3]);
                t3 = _mm256_unpackhi_ps(x[2], x[3]);
                c[0] = _mm256_shuffle_ps(t0, t2, 0x44);
                c[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
                c[2] = _mm256_shuffle_ps(t1, t3, 0x44);
                c[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
                for (i = 0; i < 4; i++)
                    for (r = 0; r < nr; r++)
                        acc[b][r] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + r * Dc + d + h + i),
                                                    c[i], acc[b][r]);
            }
    }
    for (b = 0; b < nb; b++)
        for (r = 0; r < nr; r++)
            _mm256_storeu_ps(s + r * FA_BK + 8 * b, acc[b][r]);
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_n_avx2(const float *q, const int nr,
                                                         const void *k, const int dt, int64_t rs,
                                                         int64_t D, int64_t nk, int64_t ahead,
                                                         float *s)
{
    int64_t jb = 0;
    /* contiguous float32 rows of the common head sizes: blocks interleaved
     * for four chains at least */
    const int nb = nr <= 3 ? 2 : 1;
    if (dt == FA_DTYPE_F32 && rs == D && nb > 1 && (D == 64 || D == 128)) {
        for (; jb + 8 * nb <= nk; jb += 8 * nb)
            if (D == 64)
                few_scores_f32c_avx2(q, nr, nb, (const float *)k + jb * D, 64, ahead, s + jb);
            else
                few_scores_f32c_avx2(q, nr, nb, (const float *)k + jb * D, 128, ahead, s + jb);
    }
    if (jb < nk)
        few_scores_tail_avx2(q, nr, (const char *)k + jb * rs * (int64_t)fa_dtype_size(dt), dt,
                             rs, D, nk - jb, ahead, s + jb);
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
    if (dt == FA_DTYPE_Q8_0)
        few_scores_bdt_avx2(q, nr, k, FA_DTYPE_Q8_0, rs, D, nk, room, s);
    else if (dt == FA_DTYPE_Q4_0)
        few_scores_bdt_avx2(q, nr, k, FA_DTYPE_Q4_0, rs, D, nk, room, s);
#define FA_DTYPE_CALL(t) few_scores_dt_avx2(q, nr, k, t, rs, D, nk, room, s)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/* Eight elements e .. e + 7 (e a multiple of 8) from `at` of dtype dt (a
 * constant at each call) as float32: load8_avx2's, or (at: a block of a
 * block format, e counted from its start) block8_at_avx2's. */
static FA_ALWAYS_INLINE FA_TARGET __m256 load8_at_avx2(const char *at, int64_t e, int dt)
{
    if (fa_dtype_block(dt) > 1)
        return block8_at_avx2((const unsigned char *)at, e, dt);
    return load8_avx2(at + e * fa_dtype_unit(dt), dt);
}

/* Fetches ahead (fa_prefetch_rows) what a pass reads from element e of
 * `at` (as load8_at_avx2) where e is column col of its row and col starts a
 * line of elements, or a block (its first and last byte, which may lie in
 * two lines). */
static FA_ALWAYS_INLINE FA_TARGET void prefetch_at_avx2(const char *at, int64_t e, int64_t col,
                                                        int dt, int64_t ahead, int contig)
{
    const int64_t ub = fa_dtype_unit(dt);
    if (fa_dtype_block(dt) > 1) {
        if (col % 32 == 0) {
            fa_prefetch_rows(at + e / 32 * ub, ahead, contig);
            fa_prefetch_rows(at + e / 32 * ub + ub - 1, ahead, contig);
        }
    } else if ((col * ub & 63) == 0) {
        fa_prefetch_rows(at + e * ub, ahead, contig);
    }
}

/* tile[r * Dvp + c] = sum over jj < nk of p[r * FA_BK + jj] v[jj * ld + c] for
 * the nr rows, the value rows read in place (ld units of dtype dt apart --
 * elements, or a block format's blocks --, Dvp elements a row, converted by
 * load8_at_avx2): gemm_block_avx2's sum, one
 * fused multiply-add per key, jj ascending from 0 (from: going on from the
 * tile's value, as microkernels.h's few_pv). Each accumulator is one chain
 * of nk dependent multiply-adds, so a pass takes nv registers (8 nv columns)
 * of each row, enough chains for the multiply-add pipes with few rows (one
 * row, 16 columns a pass: 2 chains, half the rate of 8); the same operations
 * on each element whatever nv. nr, nv and dt are constants in each inlined
 * copy. The value rows of the tile that follows, where they do (ahead:
 * fa_ahead's distance), are fetched ahead, a line at a time as these are
 * read (prefetch_at_avx2: of a block, its first and last byte). */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_cols_avx2(const float *p, const int nr, const int nv,
                                                        const void *v, const int dt, int64_t ld,
                                                        int64_t Dvp, int64_t c, int64_t nk,
                                                        int64_t ahead, int from, float *tile)
{
    const int64_t ub = fa_dtype_unit(dt), bk = fa_dtype_block(dt);
    const int contig = ld == Dvp / bk;
    __m256 acc[FA_FEW_ROWS * 8];
    int64_t jj;
    int r, i;
    for (r = 0; r < nr; r++)
        for (i = 0; i < nv; i++)
            acc[r * nv + i] = from ? _mm256_loadu_ps(tile + r * Dvp + c + 8 * i)
                                   : _mm256_setzero_ps();
    for (jj = 0; jj < nk; jj++) {
        const char *vr = (const char *)v + (jj * ld + c / bk) * ub; /* c's unit */
        __m256 pr[FA_FEW_ROWS];
        if (ahead) /* (a line holds two registers' elements at most; a block may start at any) */
            for (i = 0; i < nv; i += bk > 1 ? 1 : 2)
                prefetch_at_avx2(vr, c % bk + 8 * i, c + 8 * i, dt, ahead, contig);
        for (r = 0; r < nr; r++)
            pr[r] = _mm256_broadcast_ss(p + r * FA_BK + jj);
        for (i = 0; i < nv; i++) { /* (one value register live at a time) */
            const __m256 x = load8_at_avx2(vr, c % bk + 8 * i, dt);
            for (r = 0; r < nr; r++)
                acc[r * nv + i] = _mm256_fmadd_ps(pr[r], x, acc[r * nv + i]);
        }
    }
    for (r = 0; r < nr; r++)
        for (i = 0; i < nv; i++)
            _mm256_storeu_ps(tile + r * Dvp + c + 8 * i, acc[r * nv + i]);
}

static FA_ALWAYS_INLINE FA_TARGET void few_pv_n_avx2(const float *p, const int nr, const void *v,
                                                     const int dt, int64_t ld, int64_t Dvp,
                                                     int64_t nk, int64_t ahead, int from,
                                                     float *tile)
{
    /* registers a row in a pass: one row, 8 chains (64 columns); more rows,
     * 2 a row (more were no faster at 2 or 3 rows; Dvp is a multiple of 16) */
    const int nv = nr == 1 ? 8 : 2;
    int64_t c = 0;
    for (; c + 8 * nv <= Dvp; c += 8 * nv)
        few_pv_cols_avx2(p, nr, nv, v, dt, ld, Dvp, c, nk, ahead, from, tile);
    for (; c < Dvp; c += 16)
        few_pv_cols_avx2(p, nr, 2, v, dt, ld, Dvp, c, nk, ahead, from, tile);
}

static FA_ALWAYS_INLINE FA_TARGET void few_pv_dt_avx2(const float *p, int64_t nr, const void *v,
                                                      const int dt, int64_t ld, int64_t Dvp,
                                                      int64_t nk, int64_t room, int from,
                                                      float *tile)
{
    const int64_t ahead = fa_ahead(room, ld, Dvp / fa_dtype_block(dt), fa_dtype_unit(dt));
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
    if (dt == FA_DTYPE_Q8_0)
        few_pv_dt_avx2(p, nr, v, FA_DTYPE_Q8_0, ld, Dvp, nk, room, from, tile);
    else if (dt == FA_DTYPE_Q4_0)
        few_pv_dt_avx2(p, nr, v, FA_DTYPE_Q4_0, ld, Dvp, nk, room, from, tile);
#define FA_DTYPE_CALL(t) few_pv_dt_avx2(p, nr, v, t, ld, Dvp, nk, room, from, tile)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/* few_scores and few_pv read the block formats in place (x86_blocks.h) */
#define FA_HAVE_FEW_BLOCKS 1

#include "driver.inc"
#else
typedef int fa_no_avx2_variant; /* ISO C forbids an empty translation unit */
#endif
