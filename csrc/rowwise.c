/*
 * rowwise.c -- numerically stable softmax, log_softmax and logsumexp over rows.
 *
 * Per row x of length n, with m = max(x):
 *   softmax = exp(x - m) / sum, log_softmax = (x - m) - log(sum),
 *   logsumexp = m + log(sum), sum = sum_j exp(x_j - m).
 * Non-finite rules follow IEEE arithmetic on that formula (as SciPy does):
 * a NaN anywhere makes the row NaN; a +inf makes softmax/log_softmax NaN and
 * logsumexp +inf; an all -inf row gives NaN / NaN / -inf.
 * The row kernels (kernels_generic.c, x86_rows.h) accumulate the sum in float64
 * over a fixed number of lanes, in an order fixed by the row length, so a
 * row's result never depends on the thread count.
 */
#include "fa_kernels.h"
#include "fa_internal.h"

int fa_rowwise_f32(const float *x, float *out, int64_t nrows, int64_t n, int op,
                   int nthreads)
{
    const fa_kernel_table *kern = fa_active_kernels();
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
    /* Rows in contiguous blocks per thread, so that the row a thread reads next
     * is the next one in memory (prefetched while the current one computes).
     * Plain stores: non-temporal ones measured slower on the reference machine. */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (r = 0; r < nrows; r++) {
        float *o = op == FA_OP_LOGSUMEXP ? out + r : out + r * n;
        kern->rowwise_row(x + r * n, o, n, op, r + 1 < nrows ? x + (r + 1) * n : NULL);
    }
    return FA_OK;
}

int fa_exp_diff_f32(const float *x, float m, float *y, int64_t n)
{
    if (n < 0 || (n > 0 && (!x || !y)) || !(m > -INFINITY && m < INFINITY))
        return FA_ERR_ARG;
    if (n > 0)
        fa_active_kernels()->exp_diff_array(x, m, y, n);
    return FA_OK;
}
