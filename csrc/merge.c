/*
 * merge.c -- exact merge of attention results computed over disjoint key sets.
 *
 * Partial p holds, per row r, an output o_p[r] (Dv floats) and its
 * log-sum-exp lse_p[r]. The merged row is
 *   lse = log sum_p exp(lse_p),   o = sum_p exp(lse_p - lse) o_p,
 * evaluated as m = max_p lse_p, w_p = exp(lse_p - m), W = sum_p w_p and
 * lse = m + log W in float64, and o = sum_p c_p o_p with c_p = w_p / W rounded
 * to float32, summed in float32 as the attention kernels' accumulators are
 * (at float32 rounding; float64 sums would make the merge compute-bound). The
 * sums run in partial order p = 0, 1, ...: a row's bits depend only on its
 * inputs, never on the thread count. Non-finite rules (those of
 * finish_rows in op_sdpa.inc for one call):
 *   - a partial with lse_p = -inf is skipped: its o_p is never read;
 *   - all -inf (or P = 0): o = 0, lse = -inf;
 *   - any NaN lse_p: o NaN, lse NaN; else any +inf lse_p: o NaN, lse +inf.
 * Memory-bound: each o_p row is read once, FA_MERGE_VD columns of all the
 * partials at a time summed in registers (up to FA_MERGE_PW partials; beyond,
 * blocks of FA_MERGE_BD columns in a stack buffer, with the same bits). No
 * allocation.
 */
#include "fa_internal.h"
#include "fastattn.h"

#define FA_MERGE_BD 256 /* output columns accumulated at once */
#define FA_MERGE_VD 16  /* columns of one row summed in registers */
#define FA_MERGE_PW 64  /* partial weights kept on the stack (more are recomputed) */

static void merge_row(const float *const *outs, const float *const *lses, int64_t P, int64_t r,
                      int64_t Dv, float *o, float *lse)
{
    double m = -INFINITY, wsum = 0.0, w[FA_MERGE_PW];
    float acc[FA_MERGE_BD];
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
        const double e = x != -INFINITY ? exp((double)x - m) : 0.0;
        if (p < FA_MERGE_PW)
            w[p] = e;
        wsum += e;
    }
    lse[r] = (float)(m + log(wsum));
    if (P <= FA_MERGE_PW) { /* the partials read: pointers and weights in registers' reach */
        const float *src[FA_MERGE_PW];
        int64_t np = 0, i;
        for (p = 0; p < P; p++)
            if (lses[p][r] != -INFINITY) { /* the others are never read */
                src[np] = outs[p] + r * Dv;
                w[np++] = w[p] / wsum;
            }
        for (d = 0; d + FA_MERGE_VD <= Dv; d += FA_MERGE_VD) {
            float a[FA_MERGE_VD] = {0.0f};
            int j;
            for (i = 0; i < np; i++) {
                const float *s = src[i] + d;
                const float c = (float)w[i];
                for (j = 0; j < FA_MERGE_VD; j++) /* vectorised: FA_MERGE_VD columns at once */
                    a[j] += c * s[j];
            }
            for (j = 0; j < FA_MERGE_VD; j++)
                orow[d + j] = a[j];
        }
        for (; d < Dv; d++) {
            float a = 0.0f;
            for (i = 0; i < np; i++)
                a += (float)w[i] * src[i][d];
            orow[d] = a;
        }
        return;
    }
    /* Many partials: columns in blocks, the weights recomputed (the same values,
     * summed in the same order: the same bits as above). */
    for (d0 = 0; d0 < Dv; d0 += FA_MERGE_BD) {
        n = Dv - d0 < FA_MERGE_BD ? Dv - d0 : FA_MERGE_BD;
        for (d = 0; d < n; d++)
            acc[d] = 0.0f;
        for (p = 0; p < P; p++) {
            const float x = lses[p][r];
            const float *src;
            float c;
            if (x == -INFINITY)
                continue; /* never read */
            c = (float)(exp((double)x - m) / wsum);
            src = outs[p] + r * Dv + d0;
            for (d = 0; d < n; d++)
                acc[d] += c * src[d];
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
