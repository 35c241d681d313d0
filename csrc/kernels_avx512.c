/* The AVX-512 kernels (F, VL, BW, DQ, with AVX2 + FMA + F16C): the unit
 * driver (driver.inc) compiled for this target, over the sixteen-lane
 * vector vocabulary (vec_avx512.h) and its math (vec_math.h), the x86 row
 * kernels (x86_rows.h, eight lanes, as the AVX2 variant has them), and this
 * file's micro-kernels: FA_MR rows of FA_NR = 16 columns, one zmm
 * accumulator per row, the rows-as-lanes tile kernels and the few-rows
 * kernels in 16-lane registers. Each product is the AVX2 micro-kernel's sum
 * (one fused multiply-add per step of d, d ascending from 0) and each
 * exponential the AVX2 one; a tile's exponentials are summed in sixteen
 * lanes, so results agree with the AVX2 variant's to rounding (this
 * variant's own bits, the same for every thread count). Chosen at run time
 * by dispatch.c (variants.def). */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>

#define FA_TARGET                                                                          \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,prefer-vector-width=512")))
#define FA_NAME(x) x##_avx512
#define FA_VARIANT_NAME "avx512"
#define FA_MR 12 /* twelve zmm accumulators: enough independent FMAs for two ports */

#include "fa_internal.h" /* its helpers compiled for this target */
#include "microkernels.h"
#include "vec_avx512.h"
#include "vec_math.h"
#include "x86_blocks.h" /* the block formats' loads (few_scores_blocks_avx512) */

#if FA_NR != 16
#error "the AVX-512 micro-kernel holds one row of FA_NR = 16 columns in one register"
#endif

/* The micro-kernels' accumulators are named registers, one per row and
 * column block (an array of them GCC keeps in memory outside the loop over
 * d): X(r) for each of the FA_MR = 12 rows. */
#define FA_ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#if FA_MR != 12
#error "FA_ROWS12 names twelve rows"
#endif

/* (these conversions know float32, float16 and bfloat16) */
FA_DTYPES_KNOWN(fa_avx512_kernels_know_f32_f16_bf16, 3);

/* One FA_MR x 16 block of C = (A . B) scale: row r of A broadcast, one row
 * of B per step of d loaded once for all the rows; with alpha, C = C * alpha
 * + A . B (microkernels.h's gemm_block). */
static FA_ALWAYS_INLINE FA_TARGET void gemm_block_avx512(const float *a, int64_t ars,
                                                        int64_t ads, const float *b,
                                                        int64_t ldb, int64_t K, float *c,
                                                        int64_t ldc, const float *alpha,
                                                        float scale)
{
#define FA_DECL(r) __m512 acc##r = _mm512_setzero_ps();
#define FA_STEP(r) acc##r = _mm512_fmadd_ps(_mm512_set1_ps(a[(r) * ars + d * ads]), bv, acc##r);
#define FA_RESCALE(r)                                                                          \
    acc##r = _mm512_add_ps(                                                                    \
        _mm512_mul_ps(_mm512_loadu_ps(c + (r) * ldc), _mm512_set1_ps(alpha[r])), acc##r);
#define FA_SCALE(r) acc##r = _mm512_mul_ps(acc##r, sv);
#define FA_STORE(r) _mm512_storeu_ps(c + (r) * ldc, acc##r);
    int64_t d;
    FA_ROWS12(FA_DECL)
    for (d = 0; d < K; d++) {
        const __m512 bv = _mm512_loadu_ps(b + d * ldb);
        FA_ROWS12(FA_STEP)
    }
    if (alpha) { /* c * alpha + t, two roundings */
        FA_ROWS12(FA_RESCALE)
    } else if (scale != 1.0f) {
        const __m512 sv = _mm512_set1_ps(scale);
        FA_ROWS12(FA_SCALE)
    }
    FA_ROWS12(FA_STORE)
#undef FA_DECL
#undef FA_STEP
#undef FA_RESCALE
#undef FA_SCALE
#undef FA_STORE
}

/* One FA_MR x 32 block: two zmm accumulators a row (24 in all), the same sum
 * per element as gemm_block_avx512, one broadcast of A for two products. */
#define FA_HAVE_GEMM_BLOCK2 1
static FA_ALWAYS_INLINE FA_TARGET void gemm_block2_avx512(const float *a, int64_t ars,
                                                         int64_t ads, const float *b,
                                                         int64_t ldb, int64_t K, float *c,
                                                         int64_t ldc, const float *alpha,
                                                         float scale)
{
#define FA_DECL(r) __m512 acc##r = _mm512_setzero_ps(), acd##r = _mm512_setzero_ps();
#define FA_STEP(r)                                                                             \
    {                                                                                          \
        const __m512 ar = _mm512_set1_ps(a[(r) * ars + d * ads]);                                    \
        acc##r = _mm512_fmadd_ps(ar, b0, acc##r);                                              \
        acd##r = _mm512_fmadd_ps(ar, b1, acd##r);                                              \
    }
#define FA_RESCALE(r)                                                                          \
    {                                                                                          \
        const __m512 al = _mm512_set1_ps(alpha[r]);                                            \
        acc##r = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(c + (r) * ldc), al), acc##r);     \
        acd##r = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(c + (r) * ldc + 16), al), acd##r);\
    }
#define FA_SCALE(r)                                                                            \
    acc##r = _mm512_mul_ps(acc##r, sv);                                                        \
    acd##r = _mm512_mul_ps(acd##r, sv);
#define FA_STORE(r)                                                                            \
    _mm512_storeu_ps(c + (r) * ldc, acc##r);                                                   \
    _mm512_storeu_ps(c + (r) * ldc + 16, acd##r);
    int64_t d;
    FA_ROWS12(FA_DECL)
    for (d = 0; d < K; d++) {
        const __m512 b0 = _mm512_loadu_ps(b + d * ldb), b1 = _mm512_loadu_ps(b + d * ldb + 16);
        FA_ROWS12(FA_STEP)
    }
    if (alpha) { /* c * alpha + t, two roundings */
        FA_ROWS12(FA_RESCALE)
    } else if (scale != 1.0f) {
        const __m512 sv = _mm512_set1_ps(scale);
        FA_ROWS12(FA_SCALE)
    }
    FA_ROWS12(FA_STORE)
#undef FA_DECL
#undef FA_STEP
#undef FA_RESCALE
#undef FA_SCALE
#undef FA_STORE
}

/*
 * Whole key tiles of units with no float mask, soft cap or general segment
 * ids (unit_common.inc's qt_tile: a row's bounds, a shared key-padding mask and
 * ALiBi come in as -inf or the bias, lane by lane): the scores with the
 * unit's rows as the lanes. q^T in blocks of sixteen rows (row r, element d
 * at (r / 16) 16 D + 16 d + r % 16), each key's element broadcast from k's
 * row in place, so a tile needs no packed copy of k, and a row's maximum and
 * sum over the tile's keys are taken lane by lane, across registers, with no
 * reduction within a register. Each score is the micro-kernel's sum (one
 * fused multiply-add per step of d, d ascending from 0, then the scale), each
 * weight tile_exp's exponential and each row's sum tile_exp's
 * sixteen partial sums added in vf_hsum's order (vec_avx512.h): the bits of the
 * general path.
 */
#define FA_HAVE_QT_TILE 1
#define FA_QT_LANES 16
#define FA_QT_ROWS 32
typedef char fa_avx512_qt_keys[FA_BK == 64 ? 1 : -1];

/* Rows p .. p + 16 nb - 1 (nb = 1, 2 or 3 sixteen-row blocks of qt: 8, 16 or
 * 24 accumulators over eight keys) of qt_scores_body_avx512; the bits of each
 * score do not depend on nb. Returns the lanes whose new maximum is NaN or
 * +inf. */
static FA_ALWAYS_INLINE FA_TARGET __mmask16 qt_rows_avx512(
    const float *qt, int64_t p, const int nb, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int bounded, const int32_t *first,
    const int32_t *last, const int alibi, const float *slope, const float *base, int64_t nv)
{
    const __m512 sv = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY),
                 pinf = _mm512_set1_ps(INFINITY);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const float *q0 = qt + p * D, *q1 = q0 + 16 * D, *q2 = q1 + 16 * D;
    __m512 mx0 = ninf, mx1 = ninf, mx2 = ninf;
    __m512i f0 = _mm512_setzero_si512(), f1 = f0, f2 = f0, w0 = f0, w1 = f0, w2 = f0;
    __m512 sl0 = _mm512_setzero_ps(), sl1 = sl0, sl2 = sl0, bs0 = sl0, bs1 = sl0, bs2 = sl0;
    __mmask16 bad;
    int64_t g, d;
    if (alibi) {
        sl0 = _mm512_loadu_ps(slope + p);
        bs0 = _mm512_loadu_ps(base + p);
        if (nb > 1) {
            sl1 = _mm512_loadu_ps(slope + p + 16);
            bs1 = _mm512_loadu_ps(base + p + 16);
        }
        if (nb > 2) {
            sl2 = _mm512_loadu_ps(slope + p + 32);
            bs2 = _mm512_loadu_ps(base + p + 32);
        }
    }
    if (bounded) { /* key kk allowed: kk - first < last - first, unsigned */
        f0 = _mm512_loadu_si512(first + p);
        w0 = _mm512_max_epi32(_mm512_sub_epi32(_mm512_loadu_si512(last + p), f0), w0);
        if (nb > 1) {
            f1 = _mm512_loadu_si512(first + p + 16);
            w1 = _mm512_max_epi32(_mm512_sub_epi32(_mm512_loadu_si512(last + p + 16), f1), w1);
        }
        if (nb > 2) {
            f2 = _mm512_loadu_si512(first + p + 32);
            w2 = _mm512_max_epi32(_mm512_sub_epi32(_mm512_loadu_si512(last + p + 32), f2), w2);
        }
    }
    for (g = 0; g < nv; g += 8) { /* keys g .. g + 7 */
        const float *kg = k + g * rs;
#define FA_DECL(j) __m512 a##j = _mm512_setzero_ps(), b##j = a##j, c##j = a##j;
#define FA_STEP(j)                                                                             \
    {                                                                                          \
        const __m512 kv = _mm512_set1_ps(kg[(j) * rs + d]);                                    \
        a##j = _mm512_fmadd_ps(x0, kv, a##j);                                                  \
        if (nb > 1)                                                                            \
            b##j = _mm512_fmadd_ps(x1, kv, b##j);                                              \
        if (nb > 2)                                                                            \
            c##j = _mm512_fmadd_ps(x2, kv, c##j);                                              \
    }
#define FA_FIX(j, s, sl, bs, f, w)                                                                \
    {                                                                                          \
        if (alibi) { /* |base - j|: exact below 2**24 */                                       \
            const __m512 jv = _mm512_set1_ps((float)(g + (j)));                                \
            s = _mm512_sub_ps(s, _mm512_mul_ps(sl, _mm512_castsi512_ps(_mm512_and_si512(         \
                                 _mm512_castps_si512(_mm512_sub_ps(bs, jv)), absmask))));      \
        }                                                                                      \
        if (bounded) {                                                                         \
            const __m512i kk = _mm512_set1_epi32((int)g + (j));                                \
            s = _mm512_mask_mov_ps(ninf, _mm512_cmplt_epu32_mask(_mm512_sub_epi32(kk, f), w), s); \
        }                                                                                      \
    }
/* register i's scores of key j (accumulator acc): scaled, fixed, stored, into mx##i */
#define FA_OUT(j, i, acc)                                                                      \
    if (nb > (i)) {                                                                            \
        __m512 s = _mm512_mul_ps(acc, sv);                                                     \
        FA_FIX(j, s, sl##i, bs##i, f##i, w##i)                                                    \
        _mm512_storeu_ps(pt + (g + (j)) * ldp + p + 16 * (i), s);                              \
        mx##i = _mm512_max_ps(s, mx##i);                                                       \
    }
#define FA_STORE(j) { FA_OUT(j, 0, a##j) FA_OUT(j, 1, b##j) FA_OUT(j, 2, c##j) }
#define FA_KEYS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
        FA_KEYS8(FA_DECL)
        for (d = 0; d < D; d++) {
            const __m512 x0 = _mm512_loadu_ps(q0 + 16 * d);
            const __m512 x1 = nb > 1 ? _mm512_loadu_ps(q1 + 16 * d) : x0;
            const __m512 x2 = nb > 2 ? _mm512_loadu_ps(q2 + 16 * d) : x1;
            FA_KEYS8(FA_STEP)
        }
        FA_KEYS8(FA_STORE)
#undef FA_DECL
#undef FA_STEP
#undef FA_FIX
#undef FA_OUT
#undef FA_STORE
#undef FA_KEYS8
    }
    /* tile_max's `r > m ? r : m` lane by lane (a NaN m stays: rejected) */
    mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(mold + p));
    bad = _mm512_cmp_ps_mask(mx0, pinf, _CMP_NLT_UQ);
    _mm512_storeu_ps(mnew + p, mx0);
    if (nb > 1) {
        mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(mold + p + 16));
        bad |= _mm512_cmp_ps_mask(mx1, pinf, _CMP_NLT_UQ);
        _mm512_storeu_ps(mnew + p + 16, mx1);
    }
    if (nb > 2) {
        mx2 = _mm512_max_ps(mx2, _mm512_loadu_ps(mold + p + 32));
        bad |= _mm512_cmp_ps_mask(mx2, pinf, _CMP_NLT_UQ);
        _mm512_storeu_ps(mnew + p + 32, mx2);
    }
    return bad;
}

/* pt[j * ldp + r] = scale (q_r . k_j) for the tile's keys j < nv rounded up
 * to a multiple of 8 (k: row j at k + j rs; pt's columns past them are
 * left as they are) and the rows r < nrt (a multiple of 16), -inf for a key
 * outside the row's [first[r], last[r]) where bounded (first, last: int32
 * offsets within the tile); with ALiBi, minus slope[r] |base[r] - j|
 * (scale_pass's operations: the product rounded, then the difference);
 * mnew[r] = the larger of the row's largest score and mold[r]. 0 if an mnew
 * is NaN or +inf (a NaN or infinite score or running maximum: the tile is
 * then redone on the general path); NaN scores that the maximum leaves out
 * show in the sums (qt_exp). Rows go 48 at a time where the rest divides by
 * 48, else 32, and a last 16 alone (96 = 48 + 48, 64 = 32 + 32, 80 = 32 +
 * 48, 112 = 32 + 32 + 48, 16): a unit's rows rounded up to 16 rather than 32
 * leave out a pass of padding rows (L = 257 in units of 96: 80 rows for
 * the last 65 rather than 96). */
static FA_ALWAYS_INLINE FA_TARGET int qt_scores_body_avx512(
    const float *qt, int64_t nrt, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int bounded, const int32_t *first,
    const int32_t *last, const int alibi, const float *slope, const float *base, int64_t nv)
{
    __mmask16 bad = 0;
    int64_t p = 0;
    while (p < nrt) {
        const int nb = (nrt - p) % 48 == 0 ? 3 : nrt - p >= 32 ? 2 : 1;
        if (nb == 3)
            bad |= qt_rows_avx512(qt, p, 3, D, k, rs, scale, mold, pt, ldp, mnew, bounded, first,
                                  last, alibi, slope, base, nv);
        else if (nb == 2)
            bad |= qt_rows_avx512(qt, p, 2, D, k, rs, scale, mold, pt, ldp, mnew, bounded, first,
                                  last, alibi, slope, base, nv);
        else
            bad |= qt_rows_avx512(qt, p, 1, D, k, rs, scale, mold, pt, ldp, mnew, bounded, first,
                                  last, alibi, slope, base, nv);
        p += 16 * nb;
    }
    return !bad;
}

static FA_ALWAYS_INLINE FA_TARGET int qt_scores_avx512(
    const float *qt, int64_t nrt, int64_t D, const float *k, int64_t rs, float scale,
    const float *mold, float *pt, int64_t ldp, float *mnew, const int32_t *first,
    const int32_t *last, const float *slope, const float *base, int64_t nv)
{
#define FA_QT_CALL(bd, al)                                                                     \
    qt_scores_body_avx512(qt, nrt, D, k, rs, scale, mold, pt, ldp, mnew, bd, first, last, al,     \
                          slope, base, nv)
    if (slope)
        return first ? FA_QT_CALL(1, 1) : FA_QT_CALL(0, 1);
    return first ? FA_QT_CALL(1, 0) : FA_QT_CALL(0, 0);
#undef FA_QT_CALL
}

/* The weights of the keys c + 16 i below nv for sixteen rows (pt as
 * qt_scores left it, rows r .. r + 15 from p, maxima mv) in place, and their
 * sum from +0 in that order: lane c of tile_exp's register of sums. */
static FA_ALWAYS_INLINE FA_TARGET __m512 qt_part_avx512(float *p, int64_t ldp, int c, __m512 mv,
                                                        int nv)
{
    const __m512 log2e = _mm512_set1_ps(FA_LOG2E), ninf = _mm512_set1_ps(-INFINITY),
                 lo = _mm512_set1_ps(FA_EXP2_NORMAL_LO);
    const int n = c < nv ? (nv - c + 15) / 16 : 0;
    __m512 sum = _mm512_setzero_ps();
    int i;
    for (i = 0; i < n; i++) {
        float *s = p + (int64_t)(c + 16 * i) * ldp;
        const __m512 e = vf_exp2_masked(_mm512_loadu_ps(s), mv, log2e, ninf, lo);
        _mm512_storeu_ps(s, e);
        sum = _mm512_add_ps(sum, e);
    }
    return sum;
}

/* pt's scores -> exp(s - mnew) in place for the rows r < nrt and the keys
 * below nv, and each row's sum of them (float32, tile_exp's order: vf_hsum
 * of vec_avx512.h over the sixteen partial sums of keys c, c + 16, ... below
 * nv). The tile's keys from nv on (a short tile's columns past its keys)
 * are outside every row's bounds: their weights, exact zeros, are left out
 * of the sums from +0, which are then the same sums, and out of pt, where
 * P.V does not read them. 0 if a sum is NaN (a NaN score). */
static FA_ALWAYS_INLINE FA_TARGET int qt_exp_body_avx512(float *pt, int64_t ldp,
                                                         int64_t nrt, const float *mnew, float *sum,
                                                         const int nv)
{
    __mmask16 bad = 0;
    int64_t r;
    int i;
    for (r = 0; r < nrt; r += 16) {
        const __m512 mv = _mm512_loadu_ps(mnew + r);
        __m512 t6[4], t;
        for (i = 0; i < 4; i++) /* vf_hsum's first two levels, lane by lane */
            t6[i] = _mm512_add_ps(_mm512_add_ps(qt_part_avx512(pt + r, ldp, i + 12, mv, nv),
                                                qt_part_avx512(pt + r, ldp, i + 4, mv, nv)),
                                  _mm512_add_ps(qt_part_avx512(pt + r, ldp, i + 8, mv, nv),
                                                qt_part_avx512(pt + r, ldp, i, mv, nv)));
        t = _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
        bad |= _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q);
        _mm512_storeu_ps(sum + r, t);
    }
    return !bad;
}

static FA_TARGET int qt_exp_avx512(float *pt, int64_t ldp, int64_t nrt, const float *mnew,
                                   float *sum, int64_t nv)
{
    if (nv == FA_BK) /* (a whole tile: a constant count, unrolled) */
        return qt_exp_body_avx512(pt, ldp, nrt, mnew, sum, FA_BK);
    return qt_exp_body_avx512(pt, ldp, nrt, mnew, sum, (int)nv);
}

/* Sixteen half-precision elements (the bits in h) of dtype dt as float32:
 * cvt8_avx2's conversions (F16C's exact float16 one, bfloat16 by a shift
 * into the top half), sixteen lanes. */
static FA_ALWAYS_INLINE FA_TARGET __m512 cvt16_avx512(__m256i h, int dt)
{
    if (dt == FA_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Sixteen elements at p of dtype dt (a constant at each call) as float32. */
static FA_ALWAYS_INLINE FA_TARGET __m512 load16_avx512(const void *p, int dt)
{
    if (dt == FA_DTYPE_F32)
        return _mm512_loadu_ps((const float *)p);
    return cvt16_avx512(_mm256_loadu_si256((const __m256i *)p), dt);
}

/* Sixteen integers of a block (elements e .. e + 15, e 0 or 16) as signed
 * bytes: q8_0's as stored; q4_0's nibbles (low ones for e = 0) less 8. */
static FA_ALWAYS_INLINE FA_TARGET __m128i block_ints16_avx512(const unsigned char *blk,
                                                             int64_t e, int dt)
{
    if (dt == FA_DTYPE_Q8_0)
        return _mm_loadu_si128((const __m128i *)(blk + 2 + e));
    {
        __m128i x = _mm_loadu_si128((const __m128i *)(blk + 2));
        if (e >= 16)
            x = _mm_srli_epi16(x, 4);
        return _mm_sub_epi8(_mm_and_si128(x, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    }
}

/* Sixteen elements e .. e + 15 (e a multiple of 16) from `at` of dtype dt
 * (a constant at each call) as float32: load16_avx512's, or (at: a block of
 * a block format, e counted from its start) its integers times its scale,
 * the values fa_block_row gives. */
static FA_ALWAYS_INLINE FA_TARGET __m512 load16_at_avx512(const char *at, int64_t e, int dt)
{
    if (fa_dtype_block(dt) > 1) {
        const unsigned char *blk = (const unsigned char *)at + e / 32 * fa_dtype_unit(dt);
        const __m512 sc = _mm512_set1_ps(_cvtsh_ss((unsigned short)(blk[0] | (blk[1] << 8))));
        return _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(block_ints16_avx512(blk, e % 32, dt))), sc);
    }
    return load16_avx512(at + e * fa_dtype_unit(dt), dt);
}

/* The few-rows P.V (microkernels.h's few_pv; the AVX2 one's sum, one fused
 * multiply-add per key, jj ascending from 0, for each element) in 16-lane
 * registers, W of them a row: columns [c, c + 16 W) of the nr rows over the
 * keys, the value rows read in place (ld units of dtype dt apart: elements,
 * or a block format's blocks, converted by load16_at_avx512); the lines
 * `ahead` bytes past those read are fetched ahead (0: none): a block's
 * first and last byte, for each block a pass starts. */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_block_avx512(const float *p, const int nr,
                                                           const int W, const void *v,
                                                           const int dt, int64_t ld, int64_t c,
                                                           int64_t Dvp, int64_t nk,
                                                           int64_t ahead, int from, float *tile)
{
    const int64_t ub = fa_dtype_unit(dt), bk = fa_dtype_block(dt);
    /* bfloat16, 64 columns: a 32-bit lane of a 64-byte load holds two
     * elements, the even column its low half (shifted up), the odd one its
     * high half (the low bits cleared): vx[2 h] holds columns c + 32 h + 2 l,
     * vx[2 h + 1] columns c + 32 h + 2 l + 1 in lane l, put back in order at
     * the store (each column's sum is the same) */
    const int split = dt == FA_DTYPE_BF16 && W == 4;
    __m512 acc[6][4];
    int64_t jj, b;
    int r, x;
    if (from && split) { /* each sum goes on from the tile's value: columns split apart */
        const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                             28, 30);
        const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                             29, 31);
        for (r = 0; r < nr; r++)
            for (x = 0; x < 2; x++) {
                const float *t = tile + r * Dvp + c + 32 * x;
                const __m512 t0 = _mm512_loadu_ps(t), t1 = _mm512_loadu_ps(t + 16);
                acc[r][2 * x] = _mm512_permutex2var_ps(t0, ev, t1);
                acc[r][2 * x + 1] = _mm512_permutex2var_ps(t0, od, t1);
            }
    } else {
        for (r = 0; r < nr; r++)
            for (x = 0; x < W; x++)
                acc[r][x] = from ? _mm512_loadu_ps(tile + r * Dvp + c + 16 * x)
                                 : _mm512_setzero_ps();
    }
    for (jj = 0; jj < nk; jj++) {
        const char *vr = (const char *)v + (jj * ld + c / bk) * ub; /* c's unit */
        __m512 vx[4];
        if (split) {
            const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
            for (x = 0; x < 2; x++) {
                const __m512i h = _mm512_loadu_si512((const void *)(vr + 64 * x));
                vx[2 * x] = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
                vx[2 * x + 1] = _mm512_castsi512_ps(_mm512_and_si512(h, hi16));
            }
        } else {
            for (x = 0; x < W; x++)
                vx[x] = load16_at_avx512(vr, c % bk + 16 * x, dt);
        }
        if (ahead && bk > 1) {
            for (x = 0; x < W; x++)
                if ((c + 16 * x) % 32 == 0) {
                    const char *blk = vr + (c % bk + 16 * x) / 32 * ub;
                    fa_prefetch_rows(blk, ahead, ld == Dvp / bk);
                    fa_prefetch_rows(blk + ub - 1, ahead, ld == Dvp / bk);
                }
        } else if (ahead) {
            for (b = 0; b < 16 * W * ub; b += 64)
                fa_prefetch_rows(vr, ahead + b, ld == Dvp);
        }
        for (r = 0; r < nr; r++) {
            const __m512 pr = _mm512_set1_ps(p[r * FA_BK + jj]);
            for (x = 0; x < W; x++)
                acc[r][x] = _mm512_fmadd_ps(pr, vx[x], acc[r][x]);
        }
    }
    if (split) {
        const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
                                             15, 31);
        for (r = 0; r < nr; r++)
            for (x = 0; x < 2; x++) {
                float *t = tile + r * Dvp + c + 32 * x;
                _mm512_storeu_ps(t, _mm512_permutex2var_ps(acc[r][2 * x], lo, acc[r][2 * x + 1]));
                _mm512_storeu_ps(t + 16,
                                 _mm512_permutex2var_ps(acc[r][2 * x], hi, acc[r][2 * x + 1]));
            }
        return;
    }
    for (r = 0; r < nr; r++)
        for (x = 0; x < W; x++)
            _mm512_storeu_ps(tile + r * Dvp + c + 16 * x, acc[r][x]);
}

/* nr <= 6 rows: 64 columns a pass (24 accumulators at most), then 16. */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_n_avx512(const float *p, const int nr, const void *v,
                                                       const int dt, int64_t ld, int64_t Dvp,
                                                       int64_t nk, int64_t ahead, int from,
                                                       float *tile)
{
    int64_t c = 0;
    for (; c + 64 <= Dvp; c += 64)
        few_pv_block_avx512(p, nr, 4, v, dt, ld, c, Dvp, nk, ahead, from, tile);
    for (; c < Dvp; c += 16)
        few_pv_block_avx512(p, nr, 1, v, dt, ld, c, Dvp, nk, ahead, from, tile);
}

static FA_ALWAYS_INLINE FA_TARGET void few_pv_dt_avx512(const float *p, int64_t nr, const void *v,
                                                        const int dt, int64_t ld, int64_t Dvp,
                                                        int64_t nk, int64_t room, int from,
                                                        float *tile)
{
    /* the value rows of the tile that follows, where they do, are fetched ahead */
    const int64_t ahead = fa_ahead(room, ld, Dvp / fa_dtype_block(dt), fa_dtype_unit(dt));
    for (; nr > 6; nr -= 4, p += 4 * FA_BK, tile += 4 * Dvp)
        few_pv_n_avx512(p, 4, v, dt, ld, Dvp, nk, ahead, from, tile);
#define FA_CALL(n) few_pv_n_avx512(p, n, v, dt, ld, Dvp, nk, ahead, from, tile)
    FA_CONST_ROWS6(nr, FA_CALL)
#undef FA_CALL
}

/* The few-rows scores over the block formats in sixteen lanes
 * (x86_blocks.h's few_scores_blocks_avx2, whose operations on each element
 * they repeat: the same float32 values, the same products in the same
 * order, so the same bits): two eight-key halves transposed as x86_blocks.h
 * does, their elements joined sixteen keys a register. */
static FA_ALWAYS_INLINE FA_TARGET void few_scores_blocks_avx512(const float *q, const int nr,
                                                               const void *k, const int dt,
                                                               int64_t rs, int64_t D, int64_t nk,
                                                               int64_t ahead, float *s)
{
    const int64_t bb = fa_dtype_unit(dt), rsb = rs * bb;
    const int contig = rs == D / 32;
    int64_t jb, blk, e;
    int r, i, l, g;
    for (jb = 0; jb < nk; jb += 16) {
        const unsigned char *kr[16];
        __m512 acc[FA_FEW_ROWS];
        for (i = 0; i < 16; i++) /* keys past nk: any row (their scores are masked) */
            kr[i] = (const unsigned char *)k + (jb + i < nk ? jb + i : nk - 1) * rsb;
        for (r = 0; r < nr; r++)
            acc[r] = _mm512_setzero_ps();
        if (ahead && contig) { /* the sixteen rows ahead, one run: each line once */
            int64_t o;
            for (o = 0; o < 16 * rsb; o += 64)
                fa_prefetch_rows(kr[0], ahead + o, 1);
        }
        for (blk = 0; blk < D / 32; blk++) {
            const __m512 sc = _mm512_insertf32x8(_mm512_castps256_ps512(
                                                     block_scales8_avx2(kr, blk * bb)),
                                                 block_scales8_avx2(kr + 8, blk * bb), 1);
            if (ahead && !contig) /* rows apart: each block's first and last byte */
                for (i = 0; i < 16; i++) {
                    fa_prefetch_rows(kr[i], ahead + blk * bb, 0);
                    fa_prefetch_rows(kr[i], ahead + blk * bb + bb - 1, 0);
                }
            for (e = 0; e < 32; e += 8) { /* elements e .. e + 7 of the sixteen keys */
                __m128i c[2][4];
                for (g = 0; g < 2; g++) {
                    __m128i x[8], a[4], b[4];
                    for (l = 0; l < 8; l++)
                        x[l] = block_ints8_avx2(kr[8 * g + l] + blk * bb, e, dt);
                    for (l = 0; l < 4; l++)
                        a[l] = _mm_unpacklo_epi8(x[2 * l], x[2 * l + 1]);
                    b[0] = _mm_unpacklo_epi16(a[0], a[1]);
                    b[1] = _mm_unpackhi_epi16(a[0], a[1]);
                    b[2] = _mm_unpacklo_epi16(a[2], a[3]);
                    b[3] = _mm_unpackhi_epi16(a[2], a[3]);
                    c[g][0] = _mm_unpacklo_epi32(b[0], b[2]);
                    c[g][1] = _mm_unpackhi_epi32(b[0], b[2]);
                    c[g][2] = _mm_unpacklo_epi32(b[1], b[3]);
                    c[g][3] = _mm_unpackhi_epi32(b[1], b[3]);
                }
                for (i = 0; i < 8; i++) { /* element e + i: keys 0-7, then 8-15 */
                    const __m128i w = i & 1 ? _mm_unpackhi_epi64(c[0][i / 2], c[1][i / 2])
                                            : _mm_unpacklo_epi64(c[0][i / 2], c[1][i / 2]);
                    const __m512 x16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(w)),
                                                     sc);
                    for (r = 0; r < nr; r++)
                        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + blk * 32 + e + i]), x16,
                                                 acc[r]);
                }
            }
        }
        for (r = 0; r < nr; r++)
            _mm512_storeu_ps(s + r * FA_BK + jb, acc[r]);
    }
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_bdt_avx512(const float *q, int64_t nr,
                                                            const void *k, const int dt,
                                                            int64_t rs, int64_t D, int64_t nk,
                                                            int64_t room, float *s)
{
    const int64_t ahead = fa_ahead(room, rs, D / 32, fa_dtype_unit(dt));
#define FA_CALL(n) few_scores_blocks_avx512(q, n, k, dt, rs, D, nk, ahead, s)
    FA_CONST_ROWS8(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void few_pv_avx512(const float *p, int64_t nr, const void *v, int dt, int64_t ld,
                                    int64_t Dvp, int64_t nk, int64_t room, int from, float *tile)
{
    if (dt == FA_DTYPE_Q8_0)
        few_pv_dt_avx512(p, nr, v, FA_DTYPE_Q8_0, ld, Dvp, nk, room, from, tile);
    else if (dt == FA_DTYPE_Q4_0)
        few_pv_dt_avx512(p, nr, v, FA_DTYPE_Q4_0, ld, Dvp, nk, room, from, tile);
#define FA_DTYPE_CALL(t) few_pv_dt_avx512(p, nr, v, t, ld, Dvp, nk, room, from, tile)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/*
 * The few-rows scores (microkernels.h's few_scores: s[r * FA_BK + jj] = q_r . k_jj,
 * one fused multiply-add per step of d, d ascending from 0, as the
 * micro-kernel sums) sixteen keys at a time in 16-lane registers: register i
 * of a step holds keys i and i + 8 (eight elements of each, one per 256-bit
 * half), and an 8 x 8 transpose within each half (24 shuffles for 128
 * elements, against the AVX2 kernel's 24 for 64) leaves each d's sixteen
 * keys in one register, in the lane order FA_PERM16 (the same for every d,
 * so each lane sums one key's terms in order; put back in order at the
 * store). Four query rows then have four chains of sixteen keys each, twice
 * the AVX2 kernel's work per fused multiply-add. bfloat16 rows take sixteen
 * elements of each key a step: a 32-bit lane holds two of them, the even one
 * its low half shifted up, the odd one its high half with the low bits
 * cleared (both exact conversions, no shuffle); the even and odd elements
 * are transposed apart and their products taken in d order.
 */

/* Lane l of a transposed register holds key FA_PERM16[l] of the sixteen. */
static const int FA_PERM16[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

/* z[i] = (key i | key i + 8), eight elements each -> z[e] = element e of the
 * sixteen keys, in the order of FA_PERM16. */
static FA_ALWAYS_INLINE FA_TARGET void transpose_halves_avx512(__m512 z[8])
{
    const __m512 t0 = _mm512_unpacklo_ps(z[0], z[1]), t1 = _mm512_unpackhi_ps(z[0], z[1]);
    const __m512 t2 = _mm512_unpacklo_ps(z[2], z[3]), t3 = _mm512_unpackhi_ps(z[2], z[3]);
    const __m512 t4 = _mm512_unpacklo_ps(z[4], z[5]), t5 = _mm512_unpackhi_ps(z[4], z[5]);
    const __m512 t6 = _mm512_unpacklo_ps(z[6], z[7]), t7 = _mm512_unpackhi_ps(z[6], z[7]);
    const __m512 u0 = _mm512_shuffle_ps(t0, t2, 0x44), u1 = _mm512_shuffle_ps(t0, t2, 0xEE);
    const __m512 u2 = _mm512_shuffle_ps(t1, t3, 0x44), u3 = _mm512_shuffle_ps(t1, t3, 0xEE);
    const __m512 u4 = _mm512_shuffle_ps(t4, t6, 0x44), u5 = _mm512_shuffle_ps(t4, t6, 0xEE);
    const __m512 u6 = _mm512_shuffle_ps(t5, t7, 0x44), u7 = _mm512_shuffle_ps(t5, t7, 0xEE);
    /* 128-bit blocks: u0 holds element 0 of keys 0-3, element 4 of keys 0-3,
     * element 0 of keys 8-11, element 4 of keys 8-11; u4 the same of keys 4-7
     * and 12-15 */
    z[0] = _mm512_shuffle_f32x4(u0, u4, 0x88);
    z[1] = _mm512_shuffle_f32x4(u1, u5, 0x88);
    z[2] = _mm512_shuffle_f32x4(u2, u6, 0x88);
    z[3] = _mm512_shuffle_f32x4(u3, u7, 0x88);
    z[4] = _mm512_shuffle_f32x4(u0, u4, 0xDD);
    z[5] = _mm512_shuffle_f32x4(u1, u5, 0xDD);
    z[6] = _mm512_shuffle_f32x4(u2, u6, 0xDD);
    z[7] = _mm512_shuffle_f32x4(u3, u7, 0xDD);
}

/* Eight elements of key row a and eight of key row b (dtype dt) as float32:
 * (a | b), converted as cvt16_avx512 converts. */
static FA_ALWAYS_INLINE FA_TARGET __m512 load8x2_avx512(const char *a, const char *b, int dt)
{
    if (dt == FA_DTYPE_F32)
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)a)),
                                  _mm256_loadu_ps((const float *)b), 1);
    return cvt16_avx512(_mm256_inserti128_si256(
                            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                            _mm_loadu_si128((const __m128i *)b), 1),
                        dt);
}

/* pack_kt's band of sixteen keys (kernels_avx2.c's pack_kt_dt_avx2): kt[d *
 * FA_BK + jb + l] = element d of key row jb + l (rows rs elements of esz bytes
 * from base) for l < 16 and d < D rounded down to 8, eight elements of the
 * sixteen keys a step, transposed as two 8 x 8 halves of eight zmm registers
 * (24 shuffles for 128 elements; the AVX2 code's 8 x 8 transposes take 48);
 * rows `ahead` bytes on fetched ahead (0: none). Returns the elements done.
 * transpose_halves_avx512 puts its input key FA_PERM16[l] in lane l, and
 * FA_PERM16 is its own inverse: register i is loaded with keys (f, f + 4), f
 * = FA_PERM16[i] (i < 4: i; else i + 4), so that lane l holds key jb + l. */
#define FA_HAVE_KT_BAND16 1
static FA_ALWAYS_INLINE FA_TARGET int64_t kt_band16_avx512(const char *base, int dt, int64_t rs,
                                                          int64_t esz, int64_t jb, int64_t D,
                                                          int64_t ahead, float *kt)
{
    const char *ra[8], *rb[8];
    int64_t d;
    int i;
    for (i = 0; i < 8; i++) {
        ra[i] = base + (jb + FA_PERM16[i]) * rs * esz;
        rb[i] = ra[i] + 4 * rs * esz;
    }
    for (d = 0; d + 8 <= D; d += 8) {
        __m512 z[8];
        if (ahead && ((d * esz) & 63) == 0)
            for (i = 0; i < 8; i++) {
                fa_prefetch(ra[i] + d * esz, ahead);
                fa_prefetch(rb[i] + d * esz, ahead);
            }
        for (i = 0; i < 8; i++)
            z[i] = load8x2_avx512(ra[i] + d * esz, rb[i] + d * esz, dt);
        transpose_halves_avx512(z);
        for (i = 0; i < 8; i++)
            _mm512_storeu_ps(kt + (d + i) * FA_BK + jb, z[i]);
    }
    return d;
}

/* A block of `lanes` query rows d by d (unit_common.inc: pack_rows's FA_MR = 12,
 * pack_qt's FA_QT_LANES = 16): dst[d * lanes + i] = rows[i][d] for i < n
 * and d < D, 0 for n <= i < lanes, eight elements of the rows a step
 * transposed as kt_band16_avx512 transposes keys (rows from `lanes` on of
 * its sixteen are zeros, and their lanes are not stored). */
#define FA_HAVE_PACK_BLOCK 1
static FA_TARGET void pack_block_avx512(const float *const *rows, int n, int64_t D, float *dst,
                                        int lanes)
{
    const __m256 zero = _mm256_setzero_ps();
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1u);
    int64_t d;
    int i;
    for (d = 0; d + 8 <= D; d += 8) {
        __m512 z[8];
        for (i = 0; i < 8; i++) {
            const int f = FA_PERM16[i];
            z[i] = _mm512_insertf32x8(
                _mm512_castps256_ps512(f < n ? _mm256_loadu_ps(rows[f] + d) : zero),
                f + 4 < n ? _mm256_loadu_ps(rows[f + 4] + d) : zero, 1);
        }
        transpose_halves_avx512(z);
        for (i = 0; i < 8; i++)
            _mm512_mask_storeu_ps(dst + (d + i) * lanes, keep, z[i]);
    }
    for (; d < D; d++)
        for (i = 0; i < lanes; i++)
            dst[d * lanes + i] = i < n ? rows[i][d] : 0.0f;
}

/* h[i] = (row i | row i + 8), eight 16-bit elements each -> h[e] = element e
 * of rows 0-7 | element e of rows 8-15 (an 8 x 8 transpose in each 128-bit
 * half: 24 in-lane shuffles). */
static FA_ALWAYS_INLINE FA_TARGET void transpose8_epi16_avx512(__m256i h[8])
{
    const __m256i t0 = _mm256_unpacklo_epi16(h[0], h[1]), t1 = _mm256_unpackhi_epi16(h[0], h[1]);
    const __m256i t2 = _mm256_unpacklo_epi16(h[2], h[3]), t3 = _mm256_unpackhi_epi16(h[2], h[3]);
    const __m256i t4 = _mm256_unpacklo_epi16(h[4], h[5]), t5 = _mm256_unpackhi_epi16(h[4], h[5]);
    const __m256i t6 = _mm256_unpacklo_epi16(h[6], h[7]), t7 = _mm256_unpackhi_epi16(h[6], h[7]);
    const __m256i u0 = _mm256_unpacklo_epi32(t0, t2), u1 = _mm256_unpackhi_epi32(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi32(t1, t3), u3 = _mm256_unpackhi_epi32(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi32(t4, t6), u5 = _mm256_unpackhi_epi32(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi32(t5, t7), u7 = _mm256_unpackhi_epi32(t5, t7);
    h[0] = _mm256_unpacklo_epi64(u0, u4);
    h[1] = _mm256_unpackhi_epi64(u0, u4);
    h[2] = _mm256_unpacklo_epi64(u1, u5);
    h[3] = _mm256_unpackhi_epi64(u1, u5);
    h[4] = _mm256_unpacklo_epi64(u2, u6);
    h[5] = _mm256_unpackhi_epi64(u2, u6);
    h[6] = _mm256_unpacklo_epi64(u3, u7);
    h[7] = _mm256_unpackhi_epi64(u3, u7);
}

/* The same 8 x 8 transpose of 16-bit elements in each of the four 128-bit
 * lanes of eight zmm registers: h[i] = row i (four runs of eight elements)
 * -> lane l of h[e] holds element e of run l of rows 0-7. */
static FA_ALWAYS_INLINE FA_TARGET void transpose8_epi16_x4_avx512(__m512i h[8])
{
    const __m512i t0 = _mm512_unpacklo_epi16(h[0], h[1]), t1 = _mm512_unpackhi_epi16(h[0], h[1]);
    const __m512i t2 = _mm512_unpacklo_epi16(h[2], h[3]), t3 = _mm512_unpackhi_epi16(h[2], h[3]);
    const __m512i t4 = _mm512_unpacklo_epi16(h[4], h[5]), t5 = _mm512_unpackhi_epi16(h[4], h[5]);
    const __m512i t6 = _mm512_unpacklo_epi16(h[6], h[7]), t7 = _mm512_unpackhi_epi16(h[6], h[7]);
    const __m512i u0 = _mm512_unpacklo_epi32(t0, t2), u1 = _mm512_unpackhi_epi32(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi32(t1, t3), u3 = _mm512_unpackhi_epi32(t1, t3);
    const __m512i u4 = _mm512_unpacklo_epi32(t4, t6), u5 = _mm512_unpackhi_epi32(t4, t6);
    const __m512i u6 = _mm512_unpacklo_epi32(t5, t7), u7 = _mm512_unpackhi_epi32(t5, t7);
    h[0] = _mm512_unpacklo_epi64(u0, u4);
    h[1] = _mm512_unpackhi_epi64(u0, u4);
    h[2] = _mm512_unpacklo_epi64(u1, u5);
    h[3] = _mm512_unpackhi_epi64(u1, u5);
    h[4] = _mm512_unpacklo_epi64(u2, u6);
    h[5] = _mm512_unpackhi_epi64(u2, u6);
    h[6] = _mm512_unpacklo_epi64(u3, u7);
    h[7] = _mm512_unpackhi_epi64(u3, u7);
}

/* One block of sixteen keys (few_scores_n_avx512): key i's row at kr[i]
 * when kr is given (a block that runs past the tile's last key), else at kb +
 * i rse (kr NULL in the inlined copy for whole blocks: the addresses are then
 * a base and a stride in registers, where sixteen pointers would not fit
 * beside the accumulators). Scores into s[r * FA_BK + 0 .. 15]. next (bytes,
 * or 0): the sixteen rows that far past kb, contiguous like these, are
 * fetched into level 1 as these are read. */
static FA_ALWAYS_INLINE FA_TARGET void few_block_avx512(const float *q, const int nr,
                                                        const char *kb, int64_t rse,
                                                        const char *const *kr, const int dt,
                                                        int64_t D, int64_t ahead, int contig,
                                                        int64_t next, float *s)
{
#define FA_KEY(i) (kr ? kr[i] : kb + (int64_t)(i) * rse)
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    /* elements of each key a step: 32 bytes of a row */
    const int64_t step = dt == FA_DTYPE_BF16 ? 16 : 8;
    __m512 acc[FA_FEW_ROWS];
    int64_t d;
    int r, i;
    for (r = 0; r < nr; r++)
        acc[r] = _mm512_setzero_ps();
    d = 0;
    if (dt == FA_DTYPE_F16)
        for (; d + 32 <= D; d += 32) {
            /* 32 elements (64 bytes) of each key a step, no inserts: keys 0-7
             * and 8-15 transposed in each 128-bit lane (a[e], b[e]: element
             * 8 l + e of the eight keys in lane l), their lanes paired by a
             * two-source permute (low half: element e of the sixteen keys in
             * order, high half: element 8 + e; then 16 + e and 24 + e) and
             * converted sixteen at a time */
            const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
            const __m512i hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
            __m512i a[8], b[8];
            int qd;
            if (ahead && ((d * 2) & 63) == 0) {
                if (contig && !kr)
                    for (i = 0; i < 16 && d * 2 * 16 + 64 * i < 16 * rse; i++)
                        fa_prefetch_rows(kb + ahead + d * 2 * 16 + 64 * i, 0, 1);
                else
                    for (i = 0; i < 16; i++)
                        fa_prefetch_rows(FA_KEY(i), ahead + d * 2, contig);
            }
            if (next) /* 16 lines of the next block a step: all of it over the steps */
                for (i = 0; i < 16; i++)
                    fa_prefetch(kb + next + d * 2 * 16 + 64 * i, 0);
            for (i = 0; i < 8; i++) {
                a[i] = _mm512_loadu_si512((const void *)(FA_KEY(i) + d * 2));
                b[i] = _mm512_loadu_si512((const void *)(FA_KEY(i + 8) + d * 2));
            }
            transpose8_epi16_x4_avx512(a);
            transpose8_epi16_x4_avx512(b);
            for (i = 0; i < 8; i++) {
                const __m512i x = a[i];
                a[i] = _mm512_permutex2var_epi64(x, lo, b[i]);
                b[i] = _mm512_permutex2var_epi64(x, hi, b[i]);
            }
#pragma GCC unroll 4
            for (qd = 0; qd < 4; qd++)
#pragma GCC unroll 8
                for (i = 0; i < 8; i++) {
                    const __m512i x = qd < 2 ? a[i] : b[i];
                    const __m512 zi = _mm512_cvtph_ps(qd & 1 ? _mm512_extracti64x4_epi64(x, 1)
                                                             : _mm512_castsi512_si256(x));
                    for (r = 0; r < nr; r++)
                        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d + 8 * qd + i]), zi,
                                                 acc[r]);
                }
        }
    for (; d + step <= D; d += step) {
        __m512 z[8];
        if (ahead && ((d * esz) & 63) == 0) {
            if (contig && !kr) /* the block's rows are one run: fetched in line order,
                                * none past its end */
                for (i = 0; i < 16 && d * esz * 16 + 64 * i < 16 * rse; i++)
                    fa_prefetch_rows(kb + ahead + d * esz * 16 + 64 * i, 0, 1);
            else
                for (i = 0; i < 16; i++)
                    fa_prefetch_rows(FA_KEY(i), ahead + d * esz, contig);
        }
        if (next && ((d * esz) & 63) == 0)
            for (i = 0; i < 16 && d * esz * 16 + 64 * i < 16 * rse; i++)
                fa_prefetch(kb + next + d * esz * 16 + 64 * i, 0);
        if (dt == FA_DTYPE_BF16) {
            const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
            for (i = 0; i < 8; i++)
                z[i] = _mm512_castsi512_ps(_mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(FA_KEY(i) + d * 2))),
                    _mm256_loadu_si256((const __m256i *)(FA_KEY(i + 8) + d * 2)), 1));
            transpose_halves_avx512(z);
#pragma GCC unroll 8
            for (i = 0; i < 8; i++) {
                const __m512i x = _mm512_castps_si512(z[i]);
                const __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
                const __m512 od = _mm512_castsi512_ps(_mm512_and_si512(x, hi16));
                for (r = 0; r < nr; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d + 2 * i]), ev, acc[r]);
                for (r = 0; r < nr; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d + 2 * i + 1]), od,
                                             acc[r]);
            }
        } else if (dt == FA_DTYPE_F16) {
            /* h[i]: keys FA_PERM16[i] | FA_PERM16[i + 8], eight elements each;
             * transposed as 16-bit elements within each 128-bit half, h[e]
             * holds element d + e of the sixteen keys in FA_PERM16's order,
             * converted sixteen at a time */
            __m256i h[8];
            for (i = 0; i < 8; i++)
                h[i] = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(FA_KEY(i) + d * 2))),
                    _mm_loadu_si128((const __m128i *)(FA_KEY(i + 8) + d * 2)), 1);
            transpose8_epi16_avx512(h);
            for (i = 0; i < 8; i++) {
                const __m512 zi = _mm512_cvtph_ps(h[i]);
                for (r = 0; r < nr; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d + i]), zi, acc[r]);
            }
        } else {
            for (i = 0; i < 8; i++)
                z[i] = load8x2_avx512(FA_KEY(i) + d * 4, FA_KEY(i + 8) + d * 4, FA_DTYPE_F32);
            transpose_halves_avx512(z);
            for (i = 0; i < 8; i++)
                for (r = 0; r < nr; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d + i]), z[i], acc[r]);
        }
    }
    for (; d < D; d++) { /* the last D mod step elements: the keys in FA_PERM16's order */
        float c[16];
        __m512 cv;
        for (i = 0; i < 16; i++) /* (float16: the keys in order) */
            c[i] = fa_load_elem(FA_KEY(dt == FA_DTYPE_F16 ? i : FA_PERM16[i]), d, dt);
        cv = _mm512_loadu_ps(c);
        for (r = 0; r < nr; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d]), cv, acc[r]);
    }
    for (r = 0; r < nr; r++) /* (the sixteen columns lie in the row: nk <= FA_BK) */
        _mm512_storeu_ps(s + r * FA_BK, dt == FA_DTYPE_F16 ? acc[r]
                                                           : _mm512_shuffle_f32x4(acc[r], acc[r], 0xD8));
#undef FA_KEY
}

/* few_block_avx512 writes whole blocks of 16 score columns: the key runs
 * sdpa_unit hands it (FA_FEW_SUBK keys, the last run of a tile shorter) start
 * on a block and leave room for one in the row. */
typedef char fa_avx512_few_subk[(FA_FEW_SUBK % 16 == 0 && FA_BK % FA_FEW_SUBK == 0) ? 1 : -1];

static FA_ALWAYS_INLINE FA_TARGET void few_scores_n_avx512(const float *q, const int nr,
                                                           const void *k, const int dt,
                                                           int64_t rs, int64_t D, int64_t nk,
                                                           int64_t room, float *s)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt), rse = rs * esz;
    /* the rows of the tile that follows, where they do, are fetched ahead */
    const int64_t ahead = fa_ahead(room, rs, D, esz);
    const int contig = rs == D;
    int64_t jb;
    int i;
    /* Contiguous rows: besides the level-2 fetches a tile or two ahead, each
     * whole block fetches the next block's rows (in this tile, or the next
     * tile's first where room holds them) into level 1. On the Xeon of
     * docs/performance.rst, decoding 32/8 heads over 16384 keys, D = 128:
     * float16 1.045x, bfloat16 1.056x, float32 1.013x; D = 64 float16
     * 1.04x; 32/32 heads float16 1.08x. (The AVX2 kernel's blocks of eight
     * gained nothing there: float32 1.02x, bfloat16 0.97x.) */
    for (jb = 0; jb + 16 <= nk; jb += 16)
        few_block_avx512(q, nr, (const char *)k + jb * rse, rse, NULL, dt, D, ahead, contig,
                         contig && (jb + 32 <= nk || room >= 16) ? 16 * rse : 0, s + jb);
    if (jb < nk) {
        const char *kr[16];
        for (i = 0; i < 16; i++) /* keys past nk: any row (their scores are masked) */
            kr[i] = (const char *)k + (jb + i < nk ? jb + i : nk - 1) * rse;
        few_block_avx512(q, nr, NULL, rse, kr, dt, D, ahead, contig, 0, s + jb);
    }
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_dt_avx512(const float *q, int64_t nr,
                                                            const void *k, const int dt,
                                                            int64_t rs, int64_t D, int64_t nk,
                                                            int64_t room, float *s)
{
#define FA_CALL(n) few_scores_n_avx512(q, n, k, dt, rs, D, nk, room, s)
    FA_CONST_ROWS8(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void few_scores_avx512(const float *q, int64_t nr, const void *k, int dt,
                                        int64_t rs, int64_t D, int64_t nk, int64_t room,
                                        float *s)
{
    if (dt == FA_DTYPE_Q8_0)
        few_scores_bdt_avx512(q, nr, k, FA_DTYPE_Q8_0, rs, D, nk, room, s);
    else if (dt == FA_DTYPE_Q4_0)
        few_scores_bdt_avx512(q, nr, k, FA_DTYPE_Q4_0, rs, D, nk, room, s);
#define FA_DTYPE_CALL(t) few_scores_dt_avx512(q, nr, k, t, rs, D, nk, room, s)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/* few_scores and few_pv read the block formats in place
 * (few_scores_blocks_avx512; few_pv through load16_at_avx512) */
#define FA_HAVE_FEW_BLOCKS 1

#include "x86_rows.h"
#include "driver.inc"
#else
typedef int fa_no_avx512_variant; /* ISO C forbids an empty translation unit */
#endif
