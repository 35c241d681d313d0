/*
 * The portable kernels: C99 for the build's baseline instruction set, written
 * for the compiler to vectorise (fixed-size blocks, LANES independent sums,
 * no calls in inner loops); the micro-kernels of microkernels.h, then the
 * unit driver (driver.inc).
 */
#define FA_NAME(x) x##_generic
#define FA_VARIANT_NAME "generic"
#define FA_MR 4

#include "fa_internal.h"
#include "microkernels.h"
#include "portable_rows.h" /* rowwise_row, load_row, row_finite */

/* ------------------------------------------------------------------------- */
/* 2**x of an array                                                          */

static FA_TARGET void FA_NAME(exp2_array)(const float *x, float *y, int64_t n)
{
    int64_t j;
    for (j = 0; j < n; j++)
        y[j] = fa_exp2f(x[j]);
}

/* ------------------------------------------------------------------------- */
/* The micro-kernel                                                          */

/* One MR x NR block: t = sum over d < K of A(r, d) * b[d * ldb + col], A(r, d)
 * = a[r * ars + d * ads] (row-major rows: ars = lda, ads = 1; a block packed
 * d by d: ars = 1, ads = MR), a row at a time (NR accumulators fit the
 * baseline's vector registers); then c = t * scale (one rounding more, none
 * when scale is 1), or with alpha (one factor per row) c = c * alpha[r] + t
 * (two roundings: the online softmax's rescale-and-add, see sdpa_unit). The
 * micro-kernels are inlined where they are called, so that constant strides
 * become address offsets. */
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(gemm_block)(const float *a, int64_t ars,
                                                          int64_t ads, const float *b,
                                                          int64_t ldb, int64_t K, float *c,
                                                          int64_t ldc, const float *alpha,
                                                          float scale)
{
    int64_t d;
    int r, col;
    for (r = 0; r < MR; r++) {
        float acc[NR];
        for (col = 0; col < NR; col++)
            acc[col] = 0.0f;
        for (d = 0; d < K; d++) {
            const float ar = a[r * ars + d * ads];
            const float *brow = b + d * ldb;
            for (col = 0; col < NR; col++)
                acc[col] += ar * brow[col];
        }
        if (alpha)
            for (col = 0; col < NR; col++)
                c[r * ldc + col] = c[r * ldc + col] * alpha[r] + acc[col];
        else
            for (col = 0; col < NR; col++)
                c[r * ldc + col] = acc[col] * scale;
    }
}

/* ------------------------------------------------------------------------- */
/* A key tile, transposed                                                    */

/* kt[d * BK + jj] = k row jj, element d (k: key row j0, rows rs elements of
 * dtype dt apart), converted to float32, for jj < nk; zero for nk <= jj < nk
 * rounded up to NR (tile_scores reads no column after those). */
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(pack_kt_dt)(const void *k, int dt, int64_t rs,
                                                          int64_t D, int64_t nk, float *kt)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    int64_t jj, d;
    for (jj = 0; jj < nk; jj++) {
        const void *krow = (const char *)k + jj * rs * esz;
        for (d = 0; d < D; d++)
            kt[d * BK + jj] = fa_load_elem(krow, d, dt);
    }
    for (d = 0; d < D; d++)
        for (jj = nk; jj < (nk + NR - 1) / NR * NR; jj++)
            kt[d * BK + jj] = 0.0f;
}

static FA_TARGET void FA_NAME(pack_kt)(const void *k, int dt, int64_t rs, int64_t D, int64_t nk,
                                       int64_t room, float *kt)
{
    (void)room; /* (no fetches ahead here) */
#define FA_DTYPE_CALL(t) FA_NAME(pack_kt_dt)(k, t, rs, D, nk, kt)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

/* ------------------------------------------------------------------------- */
/* The tile softmax step                                                     */

/* NaN-propagating max of s[0..nc) and m. nc: the tile's keys rounded up to
 * a multiple of 16 (FA_TILE_COLS); the scores after it are -inf and take no
 * part (skipping them changes no sum: they would add exact zeros). */
static FA_TARGET float FA_NAME(tile_max)(const float *s, int64_t nc, float m)
{
    float mx = -INFINITY;
    int nan = (m != m);
    int64_t jj;
    for (jj = 0; jj < nc; jj++) {
        mx = s[jj] > mx ? s[jj] : mx;
        nan |= (s[jj] != s[jj]);
    }
    if (nan)
        return NAN;
    return mx > m ? mx : m;
}

/* p = exp(s - m) = 2**((s - m) log2 e) in place (0 where s = -inf) for
 * s[0..nc); returns sum p in a fixed order. (A variant may take a shorter
 * exponential of the same bits for a register of arguments whose results are
 * all normal; this one has one exponential.) */
static FA_TARGET double FA_NAME(tile_exp)(float *s, int64_t nc, float m)
{
    float part[LANES];
    double sum = 0.0;
    int64_t jj, l;
    for (l = 0; l < LANES; l++)
        part[l] = 0.0f;
    for (jj = 0; jj < nc; jj += LANES)
        for (l = 0; l < LANES; l++) {
            const float x = s[jj + l];
            const float p = x == -INFINITY ? 0.0f : fa_exp2f((x - m) * FA_LOG2E);
            s[jj + l] = p;
            part[l] += p;
        }
    for (l = 0; l < LANES; l++)
        sum += (double)part[l];
    return sum;
}

/* ------------------------------------------------------------------------- */
/* The few-rows kernels                                                      */

/*
 * The few-rows kernels: the products of the micro-kernel (gemm_block) for
 * nr <= FA_FEW_ROWS query rows, k and v read in place. Each element is the
 * micro-kernel's sum term by term, `acc += a * b` from 0 in the same order (d
 * ascending for a score, keys ascending for P.V), so a row gets the same bits
 * on either path. room: the key rows after the tile that may be fetched
 * ahead (fa_kv_room; these portable loops fetch none).
 *
 * s[r * BK + jj] = q_r . k_jj for jj < nk: the rows r < nr of q (stride D)
 * against the key rows from k on (rs elements of dtype dt apart, converted as
 * pack_kt does); the scores of the keys from nk on are left to mask_row.
 */
static FA_TARGET void FA_NAME(few_scores)(const float *q, int64_t nr, const void *k, int dt,
                                          int64_t rs, int64_t D, int64_t nk, int64_t room,
                                          float *s)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    int64_t r, jj, d;
    (void)room;
    for (r = 0; r < nr; r++) {
        const float *qr = q + r * D;
        jj = 0;
        if (dt == FA_DTYPE_F32)
            for (; jj + 4 <= nk; jj += 4) { /* four keys at once: four chains */
                const float *k0 = (const float *)k + jj * rs, *k1 = k0 + rs, *k2 = k1 + rs,
                            *k3 = k2 + rs;
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
                for (d = 0; d < D; d++) {
                    const float qd = qr[d];
                    a0 += qd * k0[d];
                    a1 += qd * k1[d];
                    a2 += qd * k2[d];
                    a3 += qd * k3[d];
                }
                s[r * BK + jj] = a0;
                s[r * BK + jj + 1] = a1;
                s[r * BK + jj + 2] = a2;
                s[r * BK + jj + 3] = a3;
            }
        for (; jj < nk; jj++) {
            const char *kj = (const char *)k + jj * rs * esz;
            float acc = 0.0f;
            if (dt == FA_DTYPE_F32) {
                const float *kf = (const float *)kj;
                for (d = 0; d < D; d++)
                    acc += qr[d] * kf[d];
            } else {
                for (d = 0; d < D; d++)
                    acc += qr[d] * fa_load_elem(kj, d, dt);
            }
            s[r * BK + jj] = acc;
        }
    }
}

/* tile[r * Dvp + c] = sum over jj < nk of p[r * BK + jj] v[jj * ld + c]: the
 * value rows read in place (ld elements of dtype dt apart, Dvp of them a row,
 * converted as load_row does). from: each sum goes on from tile's value (a
 * tile taken a run of keys at a time: the terms added in the same order as
 * one call over all of its keys); 0: from +0. */
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(few_pv_dt)(const float *p, int64_t nr,
                                                         const void *v, int dt, int64_t ld,
                                                         int64_t Dvp, int64_t nk, int from,
                                                         float *tile)
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    int64_t r, jj, c;
    for (r = 0; r < nr; r++) {
        float *t = tile + r * Dvp;
        for (c = 0; !from && c < Dvp; c++)
            t[c] = 0.0f;
        for (jj = 0; jj < nk; jj++) {
            const float pj = p[r * BK + jj];
            const void *vr = (const char *)v + jj * ld * esz;
            for (c = 0; c < Dvp; c++)
                t[c] += pj * fa_load_elem(vr, c, dt);
        }
    }
}

static FA_TARGET void FA_NAME(few_pv)(const float *p, int64_t nr, const void *v, int dt,
                                      int64_t ld, int64_t Dvp, int64_t nk, int64_t room,
                                      int from, float *tile)
{
    (void)room;
#define FA_DTYPE_CALL(t) FA_NAME(few_pv_dt)(p, nr, v, t, ld, Dvp, nk, from, tile)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
}

#include "driver.inc"
