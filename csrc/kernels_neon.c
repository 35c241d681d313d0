/* The AArch64 Advanced SIMD (NEON) kernels: the unit driver (driver.inc)
 * over the four-lane vector vocabulary (vec_neon.h) and its math
 * (vec_math.h: the tile softmax and 2**x), the portable row kernels
 * (portable_rows.h), and this file's micro-kernels: a 6 x 16 gemm block, the
 * key tile packed by 4 x 4 register transposes, and the few-rows kernels.
 * NEON is in every AArch64 CPU: no target attribute, no run-time test
 * (variants.def). Its geometry is explained in docs/dev/architecture.rst. */
#include "fa_kernels.h"

#if defined(FA_HAVE_ARM64_VARIANTS)
#include <arm_neon.h>
#include <math.h>

#define FA_NAME(x) x##_neon
#define FA_VARIANT_NAME "neon"
/* 6 rows x 16 columns: 24 accumulators of the 32 vector registers, four for
 * a row of B and one for the broadcast element of A; six broadcast loads and
 * four loads of B feed 24 multiply-adds a step of d, so the FMA pipes (two
 * to four of 128 bits on current cores) bound it, not the loads. */
#define FA_MR 6
typedef char fa_neon_six_rows[FA_MR == 6 ? 1 : -1]; /* (gemm_block's packed loads) */

#include "fa_internal.h"
#include "microkernels.h"
#include "vec_neon.h"
#include "vec_math.h"     /* tile_max, tile_exp, exp2_array */
#include "portable_rows.h" /* rowwise_row, load_row, row_finite, FA_EXP_DIFF */

/* (the conversions below know float32, float16 and bfloat16) */
FA_DTYPES_KNOWN(fa_neon_knows_f32_f16_bf16, 3);

/* Four elements at p of dtype dt (a constant at each call) as float32:
 * float16 by fcvtl (exact), bfloat16 by a shift into the top half. */
static FA_ALWAYS_INLINE float32x4_t load4_neon(const void *p, int dt)
{
    if (dt == FA_DTYPE_F32)
        return vld1q_f32((const float *)p);
    if (dt == FA_DTYPE_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p), 16));
}

/* The 4 x 4 block of elements off .. off + 3 (bytes off from each row
 * row[l], dtype dt), converted and transposed: on return c[i] holds element i
 * of the four rows (lane l from row l). */
static FA_ALWAYS_INLINE void load_transpose4_neon(const char *const row[4], int64_t off, int dt,
                                                  float32x4_t c[4])
{
    const float32x4_t r0 = load4_neon(row[0] + off, dt), r1 = load4_neon(row[1] + off, dt);
    const float32x4_t r2 = load4_neon(row[2] + off, dt), r3 = load4_neon(row[3] + off, dt);
    const float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1);
    const float32x4_t t2 = vtrn1q_f32(r2, r3), t3 = vtrn2q_f32(r2, r3);
#define FA_F64(x) vreinterpretq_f64_f32(x)
    c[0] = vreinterpretq_f32_f64(vtrn1q_f64(FA_F64(t0), FA_F64(t2)));
    c[1] = vreinterpretq_f32_f64(vtrn1q_f64(FA_F64(t1), FA_F64(t3)));
    c[2] = vreinterpretq_f32_f64(vtrn2q_f64(FA_F64(t0), FA_F64(t2)));
    c[3] = vreinterpretq_f32_f64(vtrn2q_f64(FA_F64(t1), FA_F64(t3)));
#undef FA_F64
}

/* One 6 x 16 block of C = (A . B) scale in 24 accumulators, one fused
 * multiply-add per element and step of d, d ascending; with alpha, C = C *
 * alpha + A . B (microkernels.h's gemm_block). Where A is packed d by d (ars
 * = 1: a step's six elements side by side; the score and most P.V calls) they
 * are two loads, used by lane (fmla by element: the broadcast's value) so that
 * the block keeps 24 + 4 + 2 registers; gcc, given six broadcasts, keeps six
 * scalars live and spills two accumulators. Row-major A broadcasts. */
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(gemm_block)(const float *a, int64_t ars,
                                                          int64_t ads, const float *b,
                                                          int64_t ldb, int64_t K, float *c,
                                                          int64_t ldc, const float *alpha,
                                                          float scale)
{
    float32x4_t acc[FA_MR][4];
    int64_t d;
    int r, j;
    for (r = 0; r < FA_MR; r++)
        for (j = 0; j < 4; j++)
            acc[r][j] = vdupq_n_f32(0.0f);
    if (ars == 1) {
        for (d = 0; d < K; d++) {
            const float *bd = b + d * ldb, *ad = a + d * ads;
            const float32x4_t b0 = vld1q_f32(bd), b1 = vld1q_f32(bd + 4);
            const float32x4_t b2 = vld1q_f32(bd + 8), b3 = vld1q_f32(bd + 12);
            const float32x4_t a0 = vld1q_f32(ad);
            const float32x2_t a4 = vld1_f32(ad + 4);
#define FA_ROW(r, x, fma, lane)                                                                \
    acc[r][0] = fma(acc[r][0], b0, x, lane);                                                   \
    acc[r][1] = fma(acc[r][1], b1, x, lane);                                                   \
    acc[r][2] = fma(acc[r][2], b2, x, lane);                                                   \
    acc[r][3] = fma(acc[r][3], b3, x, lane);
            FA_ROW(0, a0, vfmaq_laneq_f32, 0)
            FA_ROW(1, a0, vfmaq_laneq_f32, 1)
            FA_ROW(2, a0, vfmaq_laneq_f32, 2)
            FA_ROW(3, a0, vfmaq_laneq_f32, 3)
            FA_ROW(4, a4, vfmaq_lane_f32, 0)
            FA_ROW(5, a4, vfmaq_lane_f32, 1)
#undef FA_ROW
        }
    } else {
        for (d = 0; d < K; d++) {
            const float *bd = b + d * ldb;
            const float32x4_t b0 = vld1q_f32(bd), b1 = vld1q_f32(bd + 4);
            const float32x4_t b2 = vld1q_f32(bd + 8), b3 = vld1q_f32(bd + 12);
            for (r = 0; r < FA_MR; r++) {
                const float32x4_t ar = vld1q_dup_f32(a + r * ars + d * ads);
                acc[r][0] = vfmaq_f32(acc[r][0], ar, b0);
                acc[r][1] = vfmaq_f32(acc[r][1], ar, b1);
                acc[r][2] = vfmaq_f32(acc[r][2], ar, b2);
                acc[r][3] = vfmaq_f32(acc[r][3], ar, b3);
            }
        }
    }
    for (r = 0; r < FA_MR; r++) {
        float *cr = c + r * ldc;
        for (j = 0; j < 4; j++) {
            float32x4_t t = acc[r][j];
            if (alpha) /* c * alpha + t, two roundings */
                t = vaddq_f32(vmulq_f32(vld1q_f32(cr + 4 * j), vdupq_n_f32(alpha[r])), t);
            else if (scale != 1.0f)
                t = vmulq_f32(t, vdupq_n_f32(scale));
            vst1q_f32(cr + 4 * j, t);
        }
    }
}

/* kt[d * FA_BK + jj] = k row jj, element d (rows rs elements of dtype dt
 * apart), converted to float32, zero for nk <= jj < nk rounded up to FA_NR:
 * the key tile transposed in 4 x 4 blocks of registers. The next tile's rows,
 * where they follow and lie far apart (a (T, H, D) layout), are fetched
 * ahead. */
static FA_ALWAYS_INLINE void pack_kt_dt_neon(const void *k, const int dt, int64_t rs, int64_t D,
                                             int64_t nk, int64_t room, float *kt)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const char *base = (const char *)k;
    const int64_t ncol = (nk + FA_NR - 1) / FA_NR * FA_NR;
    const int64_t ahead = fa_ahead_tiles(room, rs != D, rs, esz);
    int64_t jb, d, jj;
    int i;
    for (jb = 0; jb < ncol; jb += 4) {
        if (jb + 4 <= nk) {
            const char *rows[4];
            for (i = 0; i < 4; i++)
                rows[i] = base + (jb + i) * rs * esz;
            for (d = 0; d + 4 <= D; d += 4) {
                float32x4_t c[4];
                if (ahead && ((d * esz) & 63) == 0)
                    for (i = 0; i < 4; i++)
                        fa_prefetch(rows[i] + d * esz, ahead);
                load_transpose4_neon(rows, d * esz, dt, c);
                for (i = 0; i < 4; i++)
                    vst1q_f32(kt + (d + i) * FA_BK + jb, c[i]);
            }
            for (; d < D; d++)
                for (i = 0; i < 4; i++)
                    kt[d * FA_BK + jb + i] = fa_load_elem(rows[i], d, dt);
        } else {
            for (jj = jb; jj < jb + 4; jj++)
                for (d = 0; d < D; d++)
                    kt[d * FA_BK + jj] = jj < nk ? fa_load_elem(base + jj * rs * esz, d, dt)
                                                 : 0.0f;
        }
    }
}

static FA_TARGET void FA_NAME(pack_kt)(const void *k, int dt, int64_t rs, int64_t D, int64_t nk,
                                       int64_t room, float *kt)
{
#define FA_DTYPE_CALL(t) pack_kt_dt_neon(k, t, rs, D, nk, room, kt)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/*
 * The few-rows kernels (microkernels.h): the products of gemm_block_neon for
 * nr <= FA_FEW_ROWS query rows, k and v read in place. Scores: eight keys at
 * a time (two registers of four, rows rs elements of dtype dt apart,
 * converted as pack_kt does), transposed in registers four elements of d at
 * a time, then one fused multiply-add per key and step of d, d ascending
 * from 0, each by q's element d taken from a register of four (fmla by lane:
 * the same value as a broadcast). nr and dt are constants in each inlined
 * copy, so the accumulators (2 nr) live in registers.
 */
static FA_ALWAYS_INLINE void few_scores_n_neon(const float *q, const int nr, const void *k,
                                               const int dt, int64_t rs, int64_t D, int64_t nk,
                                               int64_t ahead, float *s)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const int contig = rs == D;
    int64_t jb, d;
    int r, i;
    for (jb = 0; jb < nk; jb += 8) {
        const char *kr[8];
        float32x4_t acc0[FA_FEW_ROWS], acc1[FA_FEW_ROWS];
        for (i = 0; i < 8; i++) /* keys past nk: any row (their scores are masked) */
            kr[i] = (const char *)k + (jb + i < nk ? jb + i : nk - 1) * rs * esz;
        for (r = 0; r < nr; r++)
            acc0[r] = acc1[r] = vdupq_n_f32(0.0f);
        for (d = 0; d + 4 <= D; d += 4) {
            float32x4_t c[4];
            if (ahead && ((d * esz) & 63) == 0)
                for (i = 0; i < 8; i++)
                    fa_prefetch_rows(kr[i], ahead + d * esz, contig);
            /* (each group's four registers used before the next is loaded:
             * 2 nr accumulators + 4 + the loads fit 32 registers at nr = 8) */
            load_transpose4_neon(kr, d * esz, dt, c);
            for (r = 0; r < nr; r++) {
                const float32x4_t qv = vld1q_f32(q + r * D + d);
                acc0[r] = vfmaq_laneq_f32(acc0[r], c[0], qv, 0);
                acc0[r] = vfmaq_laneq_f32(acc0[r], c[1], qv, 1);
                acc0[r] = vfmaq_laneq_f32(acc0[r], c[2], qv, 2);
                acc0[r] = vfmaq_laneq_f32(acc0[r], c[3], qv, 3);
            }
            load_transpose4_neon(kr + 4, d * esz, dt, c);
            for (r = 0; r < nr; r++) {
                const float32x4_t qv = vld1q_f32(q + r * D + d);
                acc1[r] = vfmaq_laneq_f32(acc1[r], c[0], qv, 0);
                acc1[r] = vfmaq_laneq_f32(acc1[r], c[1], qv, 1);
                acc1[r] = vfmaq_laneq_f32(acc1[r], c[2], qv, 2);
                acc1[r] = vfmaq_laneq_f32(acc1[r], c[3], qv, 3);
            }
        }
        for (; d < D; d++) {
            float e[8];
            float32x4_t x0, x1;
            for (i = 0; i < 8; i++)
                e[i] = fa_load_elem(kr[i], d, dt);
            x0 = vld1q_f32(e);
            x1 = vld1q_f32(e + 4);
            for (r = 0; r < nr; r++) {
                const float32x4_t qd = vld1q_dup_f32(q + r * D + d);
                acc0[r] = vfmaq_f32(acc0[r], qd, x0);
                acc1[r] = vfmaq_f32(acc1[r], qd, x1);
            }
        }
        for (r = 0; r < nr; r++) {
            vst1q_f32(s + r * FA_BK + jb, acc0[r]);
            vst1q_f32(s + r * FA_BK + jb + 4, acc1[r]);
        }
    }
}

static FA_ALWAYS_INLINE void few_scores_dt_neon(const float *q, int64_t nr, const void *k,
                                                const int dt, int64_t rs, int64_t D, int64_t nk,
                                                int64_t room, float *s)
{
    /* the rows of the tile that follows, where they do, are fetched ahead */
    const int64_t ahead = fa_ahead(room, rs, D, (int64_t)fa_dtype_size(dt));
#define FA_CALL(n) few_scores_n_neon(q, n, k, dt, rs, D, nk, ahead, s)
    FA_CONST_ROWS8(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void FA_NAME(few_scores)(const float *q, int64_t nr, const void *k, int dt,
                                          int64_t rs, int64_t D, int64_t nk, int64_t room,
                                          float *s)
{
#define FA_DTYPE_CALL(t) few_scores_dt_neon(q, nr, k, t, rs, D, nk, room, s)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/* tile[r * Dvp + c] = sum over jj < nk of p[r * FA_BK + jj] v[jj * ld + c] for
 * the nr rows, the value rows read in place (ld elements of dtype dt apart,
 * Dvp of them a row): gemm_block_neon's sum, one fused multiply-add per key,
 * jj ascending from 0 (from: going on from the tile's value, as
 * microkernels.h's few_pv), 16 columns (four registers) at a time. nr and dt
 * are constants in each inlined copy. The value rows of the tile that
 * follows, where they do (ahead: fa_ahead's distance), are fetched ahead. */
static FA_ALWAYS_INLINE void few_pv_n_neon(const float *p, const int nr, const void *v,
                                           const int dt, int64_t ld, int64_t Dvp, int64_t nk,
                                           int64_t ahead, int from, float *tile)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    const int contig = ld == Dvp;
    int64_t c, jj;
    int r, j;
    for (c = 0; c < Dvp; c += 16) {
        float32x4_t acc[6][4];
        const int fetch = ahead && ((c * esz) & 63) == 0;
        for (r = 0; r < nr; r++)
            for (j = 0; j < 4; j++)
                acc[r][j] = from ? vld1q_f32(tile + r * Dvp + c + 4 * j) : vdupq_n_f32(0.0f);
        for (jj = 0; jj < nk; jj++) {
            const char *vr = (const char *)v + (jj * ld + c) * esz;
            float32x4_t x[4];
            for (j = 0; j < 4; j++)
                x[j] = load4_neon(vr + 4 * j * esz, dt);
            if (fetch)
                fa_prefetch_rows(vr, ahead, contig);
            for (r = 0; r < nr; r++) {
                const float32x4_t pr = vld1q_dup_f32(p + r * FA_BK + jj);
                for (j = 0; j < 4; j++)
                    acc[r][j] = vfmaq_f32(acc[r][j], pr, x[j]);
            }
        }
        for (r = 0; r < nr; r++)
            for (j = 0; j < 4; j++)
                vst1q_f32(tile + r * Dvp + c + 4 * j, acc[r][j]);
    }
}

static FA_ALWAYS_INLINE void few_pv_dt_neon(const float *p, int64_t nr, const void *v,
                                            const int dt, int64_t ld, int64_t Dvp, int64_t nk,
                                            int64_t room, int from, float *tile)
{
    const int64_t ahead = fa_ahead(room, ld, Dvp, (int64_t)fa_dtype_size(dt));
    for (; nr > 6; nr -= 4, p += 4 * FA_BK, tile += 4 * Dvp) /* 24 accumulators at most */
        few_pv_n_neon(p, 4, v, dt, ld, Dvp, nk, ahead, from, tile);
#define FA_CALL(n) few_pv_n_neon(p, n, v, dt, ld, Dvp, nk, ahead, from, tile)
    FA_CONST_ROWS6(nr, FA_CALL)
#undef FA_CALL
}

static FA_TARGET void FA_NAME(few_pv)(const float *p, int64_t nr, const void *v, int dt,
                                      int64_t ld, int64_t Dvp, int64_t nk, int64_t room,
                                      int from, float *tile)
{
#define FA_DTYPE_CALL(t) few_pv_dt_neon(p, nr, v, t, ld, Dvp, nk, room, from, tile)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

#include "driver.inc"
#else
typedef int fa_no_neon_variant; /* ISO C forbids an empty translation unit */
#endif
