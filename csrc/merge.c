/*
 * merge.c -- exact merge of attention results computed over disjoint key sets.
 *
 * Partial p holds, per row r, an output o_p[r] (Dv floats) and its
 * log-sum-exp lse_p[r]. The merged row is
 *   lse = log sum_p exp(lse_p),   o = sum_p exp(lse_p - lse) o_p,
 * evaluated as m = max_p lse_p, w_p = exp(lse_p - m), W = sum_p w_p (float64),
 * lse = m + log W, o = sum_p (w_p / W) o_p, the sums taken in partial order
 * p = 0, 1, ... in float64: a row's bits depend only on its inputs, never on
 * the thread count. Non-finite rules (those of fa_finish_rows for one call):
 *   - a partial with lse_p = -inf is skipped: its o_p is never read;
 *   - all -inf (or P = 0): o = 0, lse = -inf;
 *   - any NaN lse_p: o NaN, lse NaN; else any +inf lse_p: o NaN, lse +inf.
 * Memory-bound: each o_p row is read once, in blocks of FA_MERGE_BD columns
 * held in float64 on the stack (no allocation).
 */
#include "fa_internal.h"
#include "fastattn.h"

#define FA_MERGE_BD 256 /* output columns accumulated at once */

static void merge_row(const float *const *outs, const float *const *lses, int64_t P, int64_t r,
                      int64_t Dv, float *o, float *lse)
{
    double m = -INFINITY, wsum = 0.0, acc[FA_MERGE_BD];
    int has_nan = 0, has_inf = 0;
    int64_t p, d0, d, n;
    float *orow = o + r * Dv;
    for (p = 0; p < P; p++) {
        const float x = lses[p][r];
        if (x != x)
            has_nan = 1;
        else if (x == INFINITY)
            has_inf = 1;
        else if ((double)x > m)
            m = (double)x;
    }
    if (has_nan || has_inf) {
        for (d = 0; d < Dv; d++)
            orow[d] = NAN;
        lse[r] = has_nan ? NAN : INFINITY;
        return;
    }
    if (m == -INFINITY) { /* no partial has a key for this row */
        for (d = 0; d < Dv; d++)
            orow[d] = 0.0f;
        lse[r] = -INFINITY;
        return;
    }
    for (p = 0; p < P; p++) {
        const float x = lses[p][r];
        if (x != -INFINITY)
            wsum += exp((double)x - m);
    }
    lse[r] = (float)(m + log(wsum));
    for (d0 = 0; d0 < Dv; d0 += FA_MERGE_BD) {
        n = Dv - d0 < FA_MERGE_BD ? Dv - d0 : FA_MERGE_BD;
        for (d = 0; d < n; d++)
            acc[d] = 0.0;
        for (p = 0; p < P; p++) {
            const float x = lses[p][r];
            const float *src;
            double c;
            if (x == -INFINITY)
                continue; /* never read */
            c = exp((double)x - m) / wsum;
            src = outs[p] + r * Dv + d0;
            for (d = 0; d < n; d++)
                acc[d] += c * (double)src[d];
        }
        for (d = 0; d < n; d++)
            orow[d0 + d] = (float)acc[d];
    }
}

int fa_merge_f32(const float *const *outs, const float *const *lses, int64_t P, int64_t nrows,
                 int64_t Dv, float *o, float *lse, int nthreads)
{
    int64_t r, p;
    int nt;
    if (P < 0 || nrows < 0 || Dv < 0 || nthreads < 1)
        return FA_ERR_ARG;
    if (nrows == 0)
        return FA_OK;
    if (!lse || (Dv > 0 && !o) || (P > 0 && (!outs || !lses)))
        return FA_ERR_ARG;
    for (p = 0; p < P; p++)
        if (!lses[p] || (Dv > 0 && !outs[p]))
            return FA_ERR_ARG;
    nt = fa_threads_for(nthreads, (double)(P > 0 ? P : 1) * (double)nrows * (double)(Dv + 4),
                        nrows);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (r = 0; r < nrows; r++)
        merge_row(outs, lses, P, r, Dv, o, lse);
    return FA_OK;
}
