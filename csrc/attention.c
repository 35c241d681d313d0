/*
 * attention.c -- fused scaled dot-product attention with an online softmax.
 *
 * Work is split into (batch item, tile of BQ query rows) units handed out to
 * OpenMP threads. A unit walks the key tiles [t*BK, (t+1)*BK) that its rows may
 * see (causal and window bounds skip the rest), keeping per row a running max
 * m, a running sum l and an accumulator acc (FlashAttention, Dao et al. 2022;
 * online softmax, Milakov & Gimelshein 2018):
 *   m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  alpha = exp(m - m'),
 *   l' = alpha l + sum_j p_j,  acc' = alpha acc + sum_j p_j v_j,
 * and finally o = acc / l, lse = m + log(l). Working memory is O(threads x tile).
 *
 * Determinism: key tiles are fixed multiples of BK from key 0, every row's
 * arithmetic is done row by row in a fixed order, and a tile in which a row has
 * no allowed key leaves that row's state bit-for-bit unchanged, so a row's
 * result depends neither on the thread count nor on the other rows in its unit.
 */
#include "fastattn.h"
#include "fa_internal.h"

#include <stdlib.h>

#define BQ 32 /* query rows per work unit */
#define BK 64 /* keys per tile */

/* Allowed key range [*lo, *hi) of query row i from is_causal and the window. */
static void row_bounds(const fa_attn_args *a, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t p = i + a->S - a->L;
    int64_t l = 0, h = a->S;
    if (a->is_causal && p + 1 < h)
        h = p + 1;
    if (a->win_right >= 0 && p + a->win_right + 1 < h)
        h = p + a->win_right + 1;
    if (a->win_left >= 0 && p - a->win_left > l)
        l = p - a->win_left;
    if (h < l)
        h = l;
    *lo = l;
    *hi = h;
}

/* kt[d * BK + jj] = k[j0 + jj, d] for jj < nk, zero for nk <= jj < BK. */
static void pack_kt(const float *k, int64_t D, int64_t j0, int64_t nk, float *kt)
{
    int64_t jj, d;
    for (jj = 0; jj < nk; jj++) {
        const float *krow = k + (j0 + jj) * D;
        for (d = 0; d < D; d++)
            kt[d * BK + jj] = krow[d];
    }
    for (jj = nk; jj < BK; jj++)
        for (d = 0; d < D; d++)
            kt[d * BK + jj] = 0.0f;
}

/*
 * Scores of query row i (of batch item b) against key tile [j0, j0 + nk):
 * s[jj] = scale * (q_i . k_j) (+ float mask), or -inf where key j is not allowed
 * (outside [lo, hi), bool mask false, float mask -inf) and for jj >= nk.
 */
static void score_row(const fa_attn_args *a, int64_t b, int64_t i, const float *qrow,
                      const float *kt, int64_t j0, int64_t nk, int64_t lo, int64_t hi,
                      float *s)
{
    const int64_t D = a->D;
    float dot[BK];
    int64_t jj, d;
    for (jj = 0; jj < BK; jj++)
        dot[jj] = 0.0f;
    for (d = 0; d < D; d++) {
        const float qd = qrow[d];
        const float *ktd = kt + d * BK;
        for (jj = 0; jj < BK; jj++)
            dot[jj] += qd * ktd[jj];
    }
    for (jj = 0; jj < BK; jj++) {
        int64_t j = j0 + jj;
        int ok = jj < nk && j >= lo && j < hi;
        s[jj] = ok ? a->scale * dot[jj] : -INFINITY;
    }
    if (a->mask_kind == FA_MASK_BOOL) {
        const uint8_t *mrow = a->bool_mask + a->mask_off[b] + i * a->mask_sl;
        for (jj = 0; jj < nk; jj++)
            if (!mrow[(j0 + jj) * a->mask_ss])
                s[jj] = -INFINITY;
    } else if (a->mask_kind == FA_MASK_FLOAT) {
        const float *mrow = a->float_mask + a->mask_off[b] + i * a->mask_sl;
        for (jj = 0; jj < nk; jj++) {
            float mv = mrow[(j0 + jj) * a->mask_ss];
            if (s[jj] != -INFINITY || mv == -INFINITY)
                s[jj] = mv == -INFINITY ? -INFINITY : s[jj] + mv;
        }
    }
}

/* Per-thread scratch. */
typedef struct {
    float *kt;   /* D x BK packed keys */
    float *acc;  /* BQ x Dv accumulators */
    float *tacc; /* Dv: one row's contribution of the current tile */
    float *m;    /* BQ running maxima */
    double *l;   /* BQ running sums */
} scratch;

static void scratch_free(scratch *w)
{
    free(w->kt);
    free(w->acc);
    free(w->tacc);
    free(w->m);
    free(w->l);
}

static int scratch_alloc(scratch *w, int64_t D, int64_t Dv)
{
    memset(w, 0, sizeof *w);
    w->kt = (float *)malloc((size_t)(D * BK) * sizeof(float));
    w->acc = (float *)malloc((size_t)(BQ * Dv + 1) * sizeof(float));
    w->tacc = (float *)malloc((size_t)(Dv + 1) * sizeof(float));
    w->m = (float *)malloc(BQ * sizeof(float));
    w->l = (double *)malloc(BQ * sizeof(double));
    if (!w->kt || !w->acc || !w->tacc || !w->m || !w->l) {
        scratch_free(w);
        return FA_ERR_NOMEM;
    }
    return FA_OK;
}

/* One work unit of SDPA: rows [i0, i1) of batch item b. */
static void sdpa_unit(const fa_attn_args *a, int64_t b, int64_t i0, int64_t i1,
                      float *out, float *lse, scratch *w)
{
    const int64_t D = a->D, Dv = a->Dv;
    const float *q = a->q + a->q_off[b];
    const float *k = a->k + a->k_off[b];
    const float *v = a->v + a->v_off[b];
    int64_t lo_first, hi_first, lo_last, hi_last, t, i, jj, d;
    float s[BK], p[BK];

    for (i = 0; i < i1 - i0; i++) {
        w->m[i] = -INFINITY;
        w->l[i] = 0.0;
        for (d = 0; d < Dv; d++)
            w->acc[i * Dv + d] = 0.0f;
    }
    row_bounds(a, i0, &lo_first, &hi_first);
    row_bounds(a, i1 - 1, &lo_last, &hi_last);
    /* Bounds grow with i, so the unit needs keys [lo_first, hi_last). */
    for (t = lo_first / BK; t * BK < hi_last; t++) {
        const int64_t j0 = t * BK;
        const int64_t nk = a->S - j0 < BK ? a->S - j0 : BK;
        pack_kt(k, D, j0, nk, w->kt);
        for (i = i0; i < i1; i++) {
            int64_t lo, hi;
            float *acc = w->acc + (i - i0) * Dv;
            float m_old = w->m[i - i0], m_new, alpha;
            double tsum = 0.0;
            row_bounds(a, i, &lo, &hi);
            if (hi <= j0 || lo >= j0 + nk)
                continue; /* no allowed key of this row in this tile */
            score_row(a, b, i, q + i * D, w->kt, j0, nk, lo, hi, s);
            m_new = m_old;
            for (jj = 0; jj < nk; jj++)
                m_new = fa_max_nan(m_new, s[jj]);
            if (m_new == -INFINITY)
                continue; /* every score -inf: nothing contributes */
            for (jj = 0; jj < BK; jj++)
                p[jj] = s[jj] == -INFINITY ? 0.0f : fa_exp_diff(s[jj], m_new);
            for (jj = 0; jj < nk; jj++)
                tsum += (double)p[jj];
            for (d = 0; d < Dv; d++)
                w->tacc[d] = 0.0f;
            for (jj = 0; jj < nk; jj++) {
                const float pj = p[jj];
                const float *vrow = v + (j0 + jj) * Dv;
                if (s[jj] == -INFINITY)
                    continue; /* masked keys: their v rows are never read */
                for (d = 0; d < Dv; d++)
                    w->tacc[d] += pj * vrow[d];
            }
            if (m_new != m_old) { /* also true when m_new is NaN */
                alpha = fa_exp_diff(m_old, m_new);
                for (d = 0; d < Dv; d++)
                    acc[d] = acc[d] * alpha + w->tacc[d];
                w->l[i - i0] = w->l[i - i0] * (double)alpha + tsum;
                w->m[i - i0] = m_new;
            } else {
                for (d = 0; d < Dv; d++)
                    acc[d] += w->tacc[d];
                w->l[i - i0] += tsum;
            }
        }
    }
    for (i = i0; i < i1; i++) {
        const float m = w->m[i - i0];
        const double l = w->l[i - i0];
        const float *acc = w->acc + (i - i0) * Dv;
        float *o = Dv > 0 ? out + (b * a->L + i) * Dv : NULL;
        float lse_i;
        if (m != m || m == INFINITY) { /* NaN among the allowed scores, or +inf */
            for (d = 0; d < Dv; d++)
                o[d] = NAN;
            lse_i = m;
        } else if (m == -INFINITY) { /* no allowed key, or all scores -inf */
            for (d = 0; d < Dv; d++)
                o[d] = 0.0f;
            lse_i = -INFINITY;
        } else {
            const double inv = 1.0 / l;
            for (d = 0; d < Dv; d++)
                o[d] = (float)((double)acc[d] * inv);
            lse_i = (float)((double)m + log(l));
        }
        if (lse)
            lse[b * a->L + i] = lse_i;
    }
}

/* Softmax weights of rows [i0, i1) of batch item b, written to weights. */
static void weights_unit(const fa_attn_args *a, int64_t b, int64_t i0, int64_t i1,
                         float *weights, scratch *w)
{
    const int64_t D = a->D, S = a->S;
    const float *q = a->q + a->q_off[b];
    const float *k = a->k + a->k_off[b];
    int64_t t, i, j, jj;
    float s[BK];
    for (t = 0; t * BK < S; t++) {
        const int64_t j0 = t * BK;
        const int64_t nk = S - j0 < BK ? S - j0 : BK;
        pack_kt(k, D, j0, nk, w->kt);
        for (i = i0; i < i1; i++) {
            int64_t lo, hi;
            float *row = weights + (b * a->L + i) * S;
            row_bounds(a, i, &lo, &hi);
            score_row(a, b, i, q + i * D, w->kt, j0, nk, lo, hi, s);
            for (jj = 0; jj < nk; jj++)
                row[j0 + jj] = s[jj];
        }
    }
    for (i = i0; i < i1; i++) {
        float *row = weights + (b * a->L + i) * S;
        float m = -INFINITY;
        double sum = 0.0, inv;
        for (j = 0; j < S; j++)
            m = fa_max_nan(m, row[j]);
        if (m != m || m == INFINITY || m == -INFINITY) {
            const float fillv = m == -INFINITY ? 0.0f : NAN;
            for (j = 0; j < S; j++)
                row[j] = fillv;
            continue;
        }
        for (j = 0; j < S; j++) {
            row[j] = row[j] == -INFINITY ? 0.0f : fa_exp_diff(row[j], m);
            sum += (double)row[j];
        }
        inv = 1.0 / sum;
        for (j = 0; j < S; j++)
            row[j] = (float)((double)row[j] * inv);
    }
}

static int check_args(const fa_attn_args *a, int nthreads)
{
    if (!a || nthreads < 1)
        return FA_ERR_ARG;
    if (a->nbatch < 0 || a->L < 0 || a->S < 0 || a->D < 1 || a->Dv < 0)
        return FA_ERR_ARG;
    if (a->nbatch > 0 && a->L > 0) {
        if (!a->q_off || !a->k_off || !a->v_off || !a->q)
            return FA_ERR_ARG;
        if (a->S > 0 && (!a->k || (a->Dv > 0 && !a->v)))
            return FA_ERR_ARG;
    }
    if (a->mask_kind != FA_MASK_NONE && a->mask_kind != FA_MASK_BOOL
        && a->mask_kind != FA_MASK_FLOAT)
        return FA_ERR_ARG;
    if (a->mask_kind != FA_MASK_NONE && a->nbatch > 0 && a->L > 0 && a->S > 0) {
        if (!a->mask_off)
            return FA_ERR_ARG;
        if (a->mask_kind == FA_MASK_BOOL ? !a->bool_mask : !a->float_mask)
            return FA_ERR_ARG;
    }
    return FA_OK;
}

/* Runs sdpa_unit (lse/out) or weights_unit (weights) over every work unit. */
static int run_units(const fa_attn_args *a, float *out, float *lse, float *weights,
                     int nthreads)
{
    const int64_t nqt = (a->L + BQ - 1) / BQ;
    const int64_t nunits = a->nbatch * nqt;
    double work = (double)a->nbatch * (double)a->L * (double)(a->S > 0 ? a->S : 1)
                  * (double)(a->D + a->Dv);
    int status = FA_OK;
    int nt;
    if (nunits == 0)
        return FA_OK;
    nt = fa_threads_for(nthreads, work, nunits);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        scratch w;
        int64_t u;
        int ok = scratch_alloc(&w, a->D, a->Dv) == FA_OK;
        if (!ok) {
#ifdef _OPENMP
#pragma omp critical(fastattn_status)
#endif
            status = FA_ERR_NOMEM;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (u = 0; u < nunits; u++) {
            const int64_t b = u / nqt;
            const int64_t i0 = (u % nqt) * BQ;
            const int64_t i1 = i0 + BQ < a->L ? i0 + BQ : a->L;
            if (!ok)
                continue;
            if (weights)
                weights_unit(a, b, i0, i1, weights, &w);
            else
                sdpa_unit(a, b, i0, i1, out, lse, &w);
        }
        if (ok)
            scratch_free(&w);
    }
    return status;
}

int fa_sdpa_f32(const fa_attn_args *a, float *out, float *lse, int nthreads)
{
    int status = check_args(a, nthreads);
    if (status != FA_OK)
        return status;
    if (!out && a->nbatch > 0 && a->L > 0 && a->Dv > 0)
        return FA_ERR_ARG;
    return run_units(a, out, lse, NULL, nthreads);
}

int fa_attention_weights_f32(const fa_attn_args *a, float *weights, int nthreads)
{
    int status = check_args(a, nthreads);
    if (status != FA_OK)
        return status;
    if (a->S == 0)
        return FA_OK;
    if (!weights && a->nbatch > 0 && a->L > 0)
        return FA_ERR_ARG;
    return run_units(a, NULL, NULL, weights, nthreads);
}
