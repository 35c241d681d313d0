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

#define FA_EXP_DIFF fa_exp_diff

/* ------------------------------------------------------------------------- */
/* softmax, log_softmax, logsumexp of one contiguous row                     */

/* Maximum of x[0..n) ignoring NaN (-inf for n == 0); *has_nan set if any NaN. */
static FA_TARGET float FA_NAME(row_max)(const float *x, int64_t n, int *has_nan)
{
    float mx[LANES];
    int nan_seen[LANES];
    int64_t j, l;
    float m = -INFINITY;
    int any = 0;
    for (l = 0; l < LANES; l++) {
        mx[l] = -INFINITY;
        nan_seen[l] = 0;
    }
    for (j = 0; j + LANES <= n; j += LANES) {
        for (l = 0; l < LANES; l++) {
            float xv = x[j + l];
            mx[l] = xv > mx[l] ? xv : mx[l];
            nan_seen[l] |= (xv != xv);
        }
    }
    for (; j < n; j++) {
        float xv = x[j];
        m = xv > m ? xv : m;
        any |= (xv != xv);
    }
    for (l = 0; l < LANES; l++) {
        m = mx[l] > m ? mx[l] : m;
        any |= nan_seen[l];
    }
    *has_nan = any;
    return m;
}

/* y[j] = exp(x[j] - m) (y may be NULL). sum_j exp(x[j] - m) comes back in two
 * float64 parts: *top, the number of entries equal to m (each adds exactly 1),
 * and the return value, the sum of the others, so that log(sum) can be taken
 * as log1p((*top - 1) + rest) without losing a tiny rest. */
static FA_TARGET double FA_NAME(exp_store_sum)(const float *restrict x, float *restrict y,
                                               int64_t n, float m, double *top)
{
    enum { BLOCK = 16 * LANES };
    float buf[BLOCK]; /* where a block's exponentials go when y is NULL */
    double acc[LANES], cnt[LANES];
    double s = 0.0, c = 0.0;
    int64_t j0, j, l;
    for (l = 0; l < LANES; l++)
        acc[l] = cnt[l] = 0.0;
    for (j0 = 0; j0 < n; j0 += BLOCK) {
        const int64_t nb = n - j0 < BLOCK ? n - j0 : BLOCK;
        const float *xb = x + j0;
        float *e = y ? y + j0 : buf;
        /* Two simple loops, so that the compiler vectorises each: the
         * exponentials, then their sum (lane l takes the entries j = l mod
         * LANES of the row's full groups of LANES; the last n mod LANES
         * entries go to s in order). */
        for (j = 0; j < nb; j++)
            e[j] = FA_EXP_DIFF(xb[j], m);
        for (j = 0; j + LANES <= nb; j += LANES)
            for (l = 0; l < LANES; l++) {
                const int is_top = xb[j + l] == m;
                acc[l] += is_top ? 0.0 : (double)e[j + l];
                cnt[l] += is_top ? 1.0 : 0.0;
            }
        for (; j < nb; j++) {
            if (xb[j] == m)
                c += 1.0;
            else
                s += (double)e[j];
        }
    }
    for (l = 0; l < LANES; l++) {
        s += acc[l];
        c += cnt[l];
    }
    *top = c;
    return s;
}

static FA_TARGET void FA_NAME(rowwise_row)(const float *x, float *out, int64_t n, int op,
                                            const float *next)
{
    (void)next; /* the portable kernel does not prefetch */
    int has_nan;
    float m = FA_NAME(row_max)(x, n, &has_nan);
    double inv, logsum, top, rest;
    int64_t j;

    if (op == FA_OP_LOGSUMEXP) {
        if (has_nan)
            *out = NAN;
        else if (m == INFINITY || m == -INFINITY) /* +inf row, or all -inf / empty */
            *out = m;
        else {
            rest = FA_NAME(exp_store_sum)(x, NULL, n, m, &top);
            *out = (float)((double)m + log1p((top - 1.0) + rest));
        }
        return;
    }
    if (has_nan || m == INFINITY || m == -INFINITY) {
        for (j = 0; j < n; j++) /* exp(inf - inf) and exp(-inf + inf) are NaN */
            out[j] = NAN;
        return;
    }
    if (op == FA_OP_SOFTMAX) {
        rest = FA_NAME(exp_store_sum)(x, out, n, m, &top);
        inv = 1.0 / (top + rest);
        for (j = 0; j < n; j++)
            out[j] = (float)((double)out[j] * inv);
    } else {
        rest = FA_NAME(exp_store_sum)(x, NULL, n, m, &top);
        logsum = log1p((top - 1.0) + rest);
        for (j = 0; j < n; j++)
            out[j] = (float)(((double)x[j] - (double)m) - logsum);
    }
}

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
/* Rows of k and v as float32                                                */

/* dst[0..n) = src[0..n) (dtype dt) converted to float32; 1 if all are finite. */
static FA_ALWAYS_INLINE FA_TARGET int FA_NAME(load_row_dt)(const void *src, int dt, int64_t n,
                                                          float *dst, int64_t ahead)
{
    int bad = 0;
    int64_t d;
    if (ahead)
        for (d = 0; d < n * (int64_t)fa_dtype_size(dt); d += 64)
            fa_prefetch(src, ahead + d);
    for (d = 0; d < n; d++) {
        const float x = fa_load_elem(src, d, dt);
        const float z = x - x; /* 0 for finite values, NaN otherwise */
        dst[d] = x;
        bad |= (z != z);
    }
    return !bad;
}

static FA_TARGET int FA_NAME(load_row)(const void *src, int dt, int64_t n, float *dst,
                                       int64_t ahead)
{
    int ok = 0;
#define FA_DTYPE_CALL(t) ok = FA_NAME(load_row_dt)(src, t, n, dst, ahead)
    FA_DTYPE_SWITCH(dt)
#undef FA_DTYPE_CALL
    return ok;
}

/* ------------------------------------------------------------------------- */
/* Finite checks                                                             */

/* 1 if x[0..n) are all finite: x - x is +0 for finite x and NaN otherwise,
 * and a NaN stays in its lane's sum (LANES independent sums: the loop
 * vectorises without reassociating anything). ahead (bytes, or 0): the
 * lines that far past those read are fetched ahead (the next tile). */
static FA_TARGET int FA_NAME(row_finite)(const float *x, int64_t n, int64_t ahead)
{
    float acc[LANES];
    float tail = 0.0f;
    int64_t i, l;
    int bad = 0;
    if (ahead) /* (apart from the sums: a call in their loop stops its vectorisation) */
        for (i = 0; i < n; i += 16)
            fa_prefetch(x + i, ahead);
    for (l = 0; l < LANES; l++)
        acc[l] = 0.0f;
    for (i = 0; i + LANES <= n; i += LANES)
        for (l = 0; l < LANES; l++)
            acc[l] += x[i + l] - x[i + l];
    for (; i < n; i++)
        tail += x[i] - x[i];
    for (l = 0; l < LANES; l++)
        bad |= acc[l] != acc[l];
    return !bad && tail == tail;
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
