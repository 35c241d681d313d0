/*
 * portable_rows.h -- row kernels in portable C99, written for the compiler to
 * vectorise at the build's baseline (fixed-size blocks, LANES independent
 * sums, no calls in inner loops): softmax / log_softmax / logsumexp of a row
 * with fa_exp_diff's exponential (FA_EXP_DIFF), a row of k or v converted to
 * float32 with its finite check, and the finite check of a float32 row.
 * The generic variant's, and those of a variant that brings no row kernels
 * of its own (kernels_neon.c): the same source and flags, so the same bits.
 *
 * The including kernel file defines FA_TARGET and FA_NAME and includes
 * microkernels.h (LANES) first.
 */
#ifndef FA_PORTABLE_ROWS_H
#define FA_PORTABLE_ROWS_H

#include "fa_internal.h"

#include <math.h>

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

#endif /* FA_PORTABLE_ROWS_H */
