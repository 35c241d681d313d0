/*
 * rowwise.c -- numerically stable softmax, log_softmax and logsumexp over rows.
 *
 * Per row x of length n, with m = max(x):
 *   softmax = exp(x - m) / sum, log_softmax = (x - m) - log(sum),
 *   logsumexp = m + log(sum), sum = sum_j exp(x_j - m).
 * Non-finite rules follow IEEE arithmetic on that formula (as SciPy does):
 * a NaN anywhere makes the row NaN; a +inf makes softmax/log_softmax NaN and
 * logsumexp +inf; an all -inf row gives NaN / NaN / -inf.
 * The sum is accumulated in float64 over a fixed number of lanes, so a row's
 * result never depends on the thread count.
 */
#include "fastattn.h"
#include "fa_internal.h"

#include <stdlib.h>

#define LANES 16

/* Maximum of x[0..n) ignoring NaN (-inf for n == 0); *has_nan set if any NaN. */
static float row_max(const float *x, int64_t n, int *has_nan)
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

/* y[j] = exp(x[j] - m) (y may be NULL); returns sum_j exp(x[j] - m) in float64. */
static double exp_store_sum(const float *x, float *y, int64_t n, float m)
{
    double acc[LANES];
    double s = 0.0;
    int64_t j, l;
    for (l = 0; l < LANES; l++)
        acc[l] = 0.0;
    for (j = 0; j + LANES <= n; j += LANES) {
        for (l = 0; l < LANES; l++) {
            float e = fa_exp_diff(x[j + l], m);
            if (y)
                y[j + l] = e;
            acc[l] += (double)e;
        }
    }
    for (; j < n; j++) {
        float e = fa_exp_diff(x[j], m);
        if (y)
            y[j] = e;
        s += (double)e;
    }
    for (l = 0; l < LANES; l++)
        s += acc[l];
    return s;
}

static void fill(float *y, int64_t n, float value)
{
    int64_t j;
    for (j = 0; j < n; j++)
        y[j] = value;
}

static void one_row(const float *x, float *out, int64_t n, int op)
{
    int has_nan;
    float m = row_max(x, n, &has_nan);
    double sum, inv, logsum;
    int64_t j;

    if (op == FA_OP_LOGSUMEXP) {
        if (has_nan)
            *out = NAN;
        else if (m == INFINITY || m == -INFINITY) /* +inf row, or all -inf / empty */
            *out = m;
        else
            *out = (float)((double)m + log(exp_store_sum(x, NULL, n, m)));
        return;
    }
    if (has_nan || m == INFINITY || m == -INFINITY) {
        fill(out, n, NAN); /* exp(inf - inf) and exp(-inf + inf) are NaN */
        return;
    }
    if (op == FA_OP_SOFTMAX) {
        sum = exp_store_sum(x, out, n, m);
        inv = 1.0 / sum;
        for (j = 0; j < n; j++)
            out[j] = (float)((double)out[j] * inv);
    } else {
        logsum = log(exp_store_sum(x, NULL, n, m));
        for (j = 0; j < n; j++)
            out[j] = (float)(((double)x[j] - (double)m) - logsum);
    }
}

int fa_rowwise_f32(const float *x, float *out, int64_t nrows, int64_t n, int op,
                   int nthreads)
{
    int64_t r;
    int nt;
    if (nrows < 0 || n < 0 || nthreads < 1)
        return FA_ERR_ARG;
    if (op != FA_OP_SOFTMAX && op != FA_OP_LOG_SOFTMAX && op != FA_OP_LOGSUMEXP)
        return FA_ERR_ARG;
    if (nrows == 0)
        return FA_OK;
    if (!x && n > 0)
        return FA_ERR_ARG;
    if (!out && (n > 0 || op == FA_OP_LOGSUMEXP))
        return FA_ERR_ARG;
    nt = fa_threads_for(nthreads, 8.0 * (double)nrows * (double)(n > 0 ? n : 1), nrows);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (r = 0; r < nrows; r++) {
        float *o = op == FA_OP_LOGSUMEXP ? out + r : out + r * n;
        one_row(x + r * n, o, n, op);
    }
    return FA_OK;
}

int fa_exp_f32(const float *x, float *y, int64_t n)
{
    int64_t j;
    if (n < 0 || (n > 0 && (!x || !y)))
        return FA_ERR_ARG;
    for (j = 0; j < n; j++)
        y[j] = fa_exp_d((double)x[j]);
    return FA_OK;
}
