/*
 * attention.c -- fused scaled dot-product attention with an online softmax:
 * argument checks, work units, threads (the per-unit kernels are in
 * kernels.inc, one copy per SIMD variant).
 *
 * Work is split into units of at most FA_BQ query rows that share their k and
 * v (one head's query tile, or the query heads of one GQA/MQA group), handed
 * out to OpenMP threads dynamically. A unit walks the key tiles
 * [t FA_BK, (t+1) FA_BK) that its rows may see (causal and window bounds skip
 * the rest), keeping per row a running max m, a running sum l and an
 * accumulator acc (online softmax, Milakov & Gimelshein 2018; FlashAttention,
 * Dao et al. 2022):
 *   m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  alpha = exp(m - m'),
 *   l' = alpha l + sum_j p_j,  acc' = alpha acc + sum_j p_j v_j,
 * and finally o = acc / l, lse = m + log(l). Working memory is O(threads x tile).
 */
#include "fa_kernels.h"
#include "fa_internal.h"

#include <stdlib.h>

static void scratch_free(fa_scratch *w)
{
    free(w->qpad);
    free(w->kt);
    free(w->sc);
    free(w->vpad);
    free(w->tile);
    free(w->acc);
    free(w->m);
    free(w->alpha);
    free(w->l);
    free(w->lo);
    free(w->hi);
    free(w->live);
    free(w->prow);
    free(w->vrow);
    free(w->allow);
}

static int scratch_alloc(fa_scratch *w, int64_t D, int64_t Dv)
{
    size_t Dp = (size_t)D, Dvp = (size_t)((Dv + FA_NR - 1) / FA_NR * FA_NR);
    memset(w, 0, sizeof *w);
    if ((uint64_t)D > ((uint64_t)1 << 40) / FA_BQ || (uint64_t)Dv > ((uint64_t)1 << 40) / FA_BQ)
        return FA_ERR_NOMEM;
    w->Dvp = (int64_t)Dvp;
    w->qpad = (float *)malloc(FA_BQ * Dp * sizeof(float));
    w->kt = (float *)malloc(Dp * FA_BK * sizeof(float));
    w->sc = (float *)malloc(FA_BQ * FA_BK * sizeof(float));
    w->vpad = (float *)malloc((FA_BK * Dvp + 1) * sizeof(float));
    w->tile = (float *)malloc((FA_BQ * Dvp + 1) * sizeof(float));
    w->acc = (float *)malloc((FA_BQ * Dvp + 1) * sizeof(float));
    w->m = (float *)malloc(FA_BQ * sizeof(float));
    w->alpha = (float *)malloc(FA_BQ * sizeof(float));
    w->l = (double *)malloc(FA_BQ * sizeof(double));
    w->lo = (int64_t *)malloc(FA_BQ * sizeof(int64_t));
    w->hi = (int64_t *)malloc(FA_BQ * sizeof(int64_t));
    w->live = (unsigned char *)malloc(FA_BQ);
    w->prow = (float *)malloc(FA_MAX_MR * FA_BK * sizeof(float));
    w->vrow = (float *)malloc((FA_BK * Dvp + 1) * sizeof(float));
    w->allow = (unsigned char *)malloc(FA_BQ * FA_BK);
    if (!w->qpad || !w->kt || !w->sc || !w->vpad || !w->tile || !w->acc || !w->m
        || !w->alpha || !w->l || !w->lo || !w->hi || !w->live || !w->prow || !w->vrow
        || !w->allow) {
        scratch_free(w);
        return FA_ERR_NOMEM;
    }
    return FA_OK;
}

/* The number of consecutive batch items that share k and v (GQA groups, MQA
 * broadcast), if the whole batch is made of such groups; else 1. */
static int64_t kv_group(const fa_attn_args *a)
{
    int64_t g = 1, b;
    while (g < a->nbatch && a->k_off[g] == a->k_off[0] && a->v_off[g] == a->v_off[0])
        g++;
    if (a->nbatch % g != 0)
        return 1;
    for (b = 0; b < a->nbatch; b++)
        if (a->k_off[b] != a->k_off[b - b % g] || a->v_off[b] != a->v_off[b - b % g])
            return 1;
    return g;
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

/* Runs the SDPA (weights == NULL) or weights kernel over every work unit. */
static int run_units(const fa_attn_args *a, float *out, float *lse, float *weights,
                     int nthreads)
{
    const fa_kernel_table *kern = fa_active_kernels();
    const int64_t G = a->nbatch > 0 ? kv_group(a) : 1;
    const int64_t nh = G < FA_BQ ? G : FA_BQ;            /* heads per unit */
    const int64_t nhs = (G + nh - 1) / nh;               /* head slices per group */
    const int64_t nq0 = FA_BQ / nh;                      /* query rows per head */
    const int64_t nq = a->L < nq0 ? (a->L > 0 ? a->L : 1) : nq0;
    const int64_t nqt = (a->L + nq - 1) / nq;            /* query tiles */
    const int64_t nunits = (a->nbatch / G) * nhs * nqt;
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
        fa_scratch w;
        int64_t n;
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
        for (n = 0; n < nunits; n++) {
            const int64_t qt = n % nqt, hs = (n / nqt) % nhs, g = n / (nqt * nhs);
            fa_unit u;
            u.b0 = g * G + hs * nh;
            u.nh = G - hs * nh < nh ? G - hs * nh : nh;
            u.i0 = qt * nq;
            u.nq = a->L - u.i0 < nq ? a->L - u.i0 : nq;
            if (!ok)
                continue;
            if (weights)
                kern->weights_unit(a, &u, weights, &w);
            else
                kern->sdpa_unit(a, &u, out, lse, &w);
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
