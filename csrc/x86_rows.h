/*
 * x86_rows.h -- the AVX2 kernels that both x86 variants compile (kernels_avx2.c
 * and kernels_avx512.c, each for its own target): k's and v's rows converted
 * and packed eight elements at a time, the finite-value checks, and the
 * row-wise softmax family with its exponential exp(x - m). They work in eight
 * lanes in both variants, so that each row-wise result has the same bits on
 * both (its sum is taken in an order fixed by eight-lane registers).
 *
 * The including file defines FA_TARGET and FA_NAME, includes fa_internal.h,
 * and may define FA_HAVE_KT_BAND16 (pack_kt's sixteen-key bands) first.
 */
#ifndef FA_X86_ROWS_H
#define FA_X86_ROWS_H

#include "fa_internal.h"
#include "x86_lanes8.h"

#include <immintrin.h>
#include <math.h>

/* (these conversions know float32, float16 and bfloat16) */
FA_DTYPES_KNOWN(fa_x86_rows_know_f32_f16_bf16, 3);

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
#ifdef FA_HAVE_KT_BAND16 /* (the AVX-512 variant brings it) */
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

static FA_TARGET void FA_NAME(pack_kt)(const void *k, int dt, int64_t rs, int64_t D, int64_t nk,
                                   int64_t room, float *kt)
{
#define FA_DTYPE_CALL(t) pack_kt_dt_avx2(k, t, rs, D, nk, room, kt)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
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

static FA_TARGET int FA_NAME(load_row)(const void *src, int dt, int64_t n, float *dst,
                                   int64_t ahead)
{
    int ok = 0;
#define FA_DTYPE_CALL(t) ok = load_row_dt_avx2(src, t, n, dst, ahead)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
    return ok;
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

#endif /* FA_X86_ROWS_H */
