/* The AVX-512 kernels (F, VL, BW, DQ, with AVX2 + FMA + F16C): the AVX2 variant's
 * code (kernels_avx2.c, compiled again for this target: its reductions,
 * packing and few-rows kernels; the compiler's own loops 16 lanes wide) with
 * a micro-kernel of 16-lane registers, FA_MR rows of FA_NR = 16 columns, one
 * zmm accumulator per row, and the tile softmax in 16-lane registers. Each
 * product is the AVX2 micro-kernel's sum (one fused multiply-add per step of
 * d, d ascending from 0) and each exponential the AVX2 one; a tile's
 * exponentials are summed in sixteen lanes, so results agree with the AVX2
 * variant's to rounding (this variant's own bits, the same for every thread
 * count). Chosen at run time by dispatch.c. */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>

#define FA_TARGET                                                                          \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,prefer-vector-width=512")))
#define FA_NAME(x) x##_avx512
#define FA_VARIANT_NAME "avx512"
#define FA_MR 12 /* twelve zmm accumulators: enough independent FMAs for two ports */

#include "fa_internal.h" /* its helpers compiled for this target */

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

/* One FA_MR x 16 block of C = (A . B) scale: row r of A broadcast, one row
 * of B per step of d loaded once for all the rows; with alpha, C = C * alpha
 * + A . B (kernels.inc's gemm_block). */
#define FA_HAVE_GEMM_BLOCK 1
static FA_TARGET void gemm_block_avx512(const float *a, int64_t lda, const float *b,
                                        int64_t ldb, int64_t K, float *c, int64_t ldc,
                                        const float *alpha, float scale)
{
#define FA_DECL(r) __m512 acc##r = _mm512_setzero_ps();
#define FA_STEP(r) acc##r = _mm512_fmadd_ps(_mm512_set1_ps(a[(r) * lda + d]), bv, acc##r);
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
static FA_TARGET void gemm_block2_avx512(const float *a, int64_t lda, const float *b,
                                         int64_t ldb, int64_t K, float *c, int64_t ldc,
                                         const float *alpha, float scale)
{
#define FA_DECL(r) __m512 acc##r = _mm512_setzero_ps(), acd##r = _mm512_setzero_ps();
#define FA_STEP(r)                                                                             \
    {                                                                                          \
        const __m512 ar = _mm512_set1_ps(a[(r) * lda + d]);                                    \
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

/* 2**f for |f| <= 1/2: exp2_poly_avx2's polynomial, sixteen lanes. */
static inline FA_TARGET __m512 exp2_poly_avx512(__m512 f)
{
    __m512 p = _mm512_set1_ps(1.52527338040598e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.000154035303933816f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00133335581464284f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00961812910762848f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0555041086648216f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240226506959101f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693147180559945f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
}

/* 2**x, sixteen lanes: exp2_avx2's algorithm lane for lane (the same bits). */
static inline FA_TARGET __m512 exp2_avx512(__m512 x)
{
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    const __m512i bias = _mm512_set1_epi32(127);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(128.0f)),
                                    _mm512_set1_ps(-151.0f));
    const __m512 y = _mm512_add_ps(xc, shift);
    __m512 p = exp2_poly_avx512(_mm512_sub_ps(xc, _mm512_sub_ps(y, shift)));
    const __m512i n = _mm512_sub_epi32(_mm512_castps_si512(y), _mm512_set1_epi32(0x4B400000));
    const __m512i n1 = _mm512_srai_epi32(n, 1), n2 = _mm512_sub_epi32(n, n1);
    p = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23)));
    p = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23)));
    return _mm512_mask_mov_ps(p, nan, x);
}

/* 2**x for -124 <= x <= 0 (a normal result): exp2_normal_avx2 lane for lane. */
static inline FA_TARGET __m512 exp2_normal_avx512(__m512 x)
{
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    const __m512 y = _mm512_add_ps(x, shift);
    const __m512 p = exp2_poly_avx512(_mm512_sub_ps(x, _mm512_sub_ps(y, shift)));
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p),
                                                _mm512_slli_epi32(_mm512_castps_si512(y), 23)));
}

/* The tile softmax step (see the portable versions in kernels.inc), sixteen
 * lanes at a time: the same exponentials element for element as the AVX2
 * variant's, summed in sixteen lanes (a fixed order of this variant's own). */
#define FA_HAVE_TILE_SOFTMAX 1
typedef char fa_avx512_tile_is_whole_registers[FA_BK % 16 == 0 ? 1 : -1];

static FA_TARGET float tile_max_avx512(const float *s, int64_t nc, float m, float *least)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx = ninf, mn = _mm512_set1_ps(INFINITY);
    __mmask16 nan = 0;
    float r;
    int jj;
    for (jj = 0; jj < nc; jj += 16) {
        const __m512 x = _mm512_loadu_ps(s + jj);
        mx = _mm512_max_ps(mx, x); /* a NaN x: caught by `nan` */
        mn = _mm512_mask_min_ps(mn, _mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_UQ), mn, x);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    *least = _mm512_reduce_min_ps(mn);
    if (nan || m != m)
        return NAN;
    r = _mm512_reduce_max_ps(mx);
    return r > m ? r : m;
}

/* s[0..nc) -> exp(s - m) in place (exactly 0 for -inf) and their sum (the
 * sixteen lanes' sums added). normal: every score above -inf lies within 85
 * of m, so exp2_normal_avx512 serves (a constant at each call: two loops). */
static FA_ALWAYS_INLINE FA_TARGET __m512 tile_exp_pass_avx512(float *s, int64_t nc, float m,
                                                              int normal)
{
    const __m512 mv = _mm512_set1_ps(m), log2e = _mm512_set1_ps(FA_LOG2E);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 sum = _mm512_setzero_ps();
    int64_t jj;
    for (jj = 0; jj < nc; jj += 16) {
        const __m512 x = _mm512_loadu_ps(s + jj);
        const __m512 y = _mm512_mul_ps(_mm512_sub_ps(x, mv), log2e);
        const __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_UQ),
                                             normal ? exp2_normal_avx512(y) : exp2_avx512(y));
        _mm512_storeu_ps(s + jj, p);
        sum = _mm512_add_ps(sum, p);
    }
    return sum;
}

static FA_TARGET double tile_exp_avx512(float *s, int64_t nc, float m, int normal)
{
    if (normal)
        return (double)_mm512_reduce_add_ps(tile_exp_pass_avx512(s, nc, m, 1));
    return (double)_mm512_reduce_add_ps(tile_exp_pass_avx512(s, nc, m, 0));
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

/* The few-rows P.V (kernels.inc's few_pv; the AVX2 one's sum, one fused
 * multiply-add per key, jj ascending from 0, for each element) in 16-lane
 * registers, W of them a row: columns [c, c + 16 W) of the nr rows over the
 * keys, the value rows read in place (ld elements of dtype dt apart); the
 * lines `ahead` bytes past those read are fetched ahead (0: none). */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_block_avx512(const float *p, const int nr,
                                                           const int W, const void *v,
                                                           const int dt, int64_t ld, int64_t c,
                                                           int64_t Dvp, int64_t nk,
                                                           int64_t ahead, float *tile)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    __m512 acc[6][4];
    int64_t jj, b;
    int r, x;
    for (r = 0; r < nr; r++)
        for (x = 0; x < W; x++)
            acc[r][x] = _mm512_setzero_ps();
    for (jj = 0; jj < nk; jj++) {
        const char *vr = (const char *)v + (jj * ld + c) * esz;
        __m512 vx[4];
        for (x = 0; x < W; x++)
            vx[x] = load16_avx512(vr + 16 * x * esz, dt);
        if (ahead)
            for (b = 0; b < 16 * W * esz; b += 64)
                fa_prefetch(vr, ahead + b);
        for (r = 0; r < nr; r++) {
            const __m512 pr = _mm512_set1_ps(p[r * FA_BK + jj]);
            for (x = 0; x < W; x++)
                acc[r][x] = _mm512_fmadd_ps(pr, vx[x], acc[r][x]);
        }
    }
    for (r = 0; r < nr; r++)
        for (x = 0; x < W; x++)
            _mm512_storeu_ps(tile + r * Dvp + c + 16 * x, acc[r][x]);
}

/* nr <= 6 rows: 64 columns a pass (24 accumulators at most), then 16. */
static FA_ALWAYS_INLINE FA_TARGET void few_pv_n_avx512(const float *p, const int nr, const void *v,
                                                       const int dt, int64_t ld, int64_t Dvp,
                                                       int64_t nk, int64_t ahead, float *tile)
{
    int64_t c = 0;
    for (; c + 64 <= Dvp; c += 64)
        few_pv_block_avx512(p, nr, 4, v, dt, ld, c, Dvp, nk, ahead, tile);
    for (; c < Dvp; c += 16)
        few_pv_block_avx512(p, nr, 1, v, dt, ld, c, Dvp, nk, ahead, tile);
}

static FA_ALWAYS_INLINE FA_TARGET void few_pv_dt_avx512(const float *p, int64_t nr, const void *v,
                                                        const int dt, int64_t ld, int64_t Dvp,
                                                        int64_t nk, float *tile)
{
    /* a full tile: the value rows of the tile that follows are fetched ahead */
    const int64_t ahead = nk == FA_BK ? FA_BK * ld * (int64_t)fa_dtype_size(dt) : 0;
    for (; nr > 6; nr -= 4, p += 4 * FA_BK, tile += 4 * Dvp)
        few_pv_n_avx512(p, 4, v, dt, ld, Dvp, nk, ahead, tile);
    switch (nr) {
    case 1: few_pv_n_avx512(p, 1, v, dt, ld, Dvp, nk, ahead, tile); break;
    case 2: few_pv_n_avx512(p, 2, v, dt, ld, Dvp, nk, ahead, tile); break;
    case 3: few_pv_n_avx512(p, 3, v, dt, ld, Dvp, nk, ahead, tile); break;
    case 4: few_pv_n_avx512(p, 4, v, dt, ld, Dvp, nk, ahead, tile); break;
    case 5: few_pv_n_avx512(p, 5, v, dt, ld, Dvp, nk, ahead, tile); break;
    default: few_pv_n_avx512(p, 6, v, dt, ld, Dvp, nk, ahead, tile); break;
    }
}

#define FA_HAVE_FEW_PV 1
static FA_TARGET void few_pv_avx512(const float *p, int64_t nr, const void *v, int dt, int64_t ld,
                                    int64_t Dvp, int64_t nk, float *tile)
{
    if (dt == FA_DTYPE_F16)
        few_pv_dt_avx512(p, nr, v, FA_DTYPE_F16, ld, Dvp, nk, tile);
    else if (dt == FA_DTYPE_BF16)
        few_pv_dt_avx512(p, nr, v, FA_DTYPE_BF16, ld, Dvp, nk, tile);
    else
        few_pv_dt_avx512(p, nr, v, FA_DTYPE_F32, ld, Dvp, nk, tile);
}

#include "kernels_avx2.c"
#else
typedef int fa_no_avx512_variant; /* ISO C forbids an empty translation unit */
#endif
