/*
 * backward.c -- the gradients of attention: checks, Delta, and the two passes
 * of units (op_backward.inc) on the threads.
 *
 *   1. Delta_i = rowsum(dout_i o out_i) of every row (float64 sums, in order),
 *      and with sinks each batch item's dsinks, one item per thread at a time;
 *   2. the key-major units: dk and dv of each (kv item, key tile);
 *   3. the query-major units: dq of each (batch item, block of FA_BWD_BQ rows).
 *
 * Each unit writes its own rows of the gradients and sums in a fixed order,
 * so the threads change no bit. Working memory: Delta (one float a row) and
 * a scratch per thread whose size does not depend on L or S.
 */
#include "fa_internal.h"
#include "fa_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FA_BWD_BUFFERS 15
/* The most bytes of dq a thread holds for a unit of a whole kv item. */
#define FA_BWD_HEAD_BYTES ((int64_t)64 << 20)

static int bwd_scratch_alloc(fa_bwd_scratch *w, int64_t D, int64_t Dv)
{
    const size_t Dp = (size_t)((D + FA_NR - 1) / FA_NR * FA_NR);
    const size_t Dvp = (size_t)((Dv + FA_NR - 1) / FA_NR * FA_NR);
    const size_t BQ = FA_BWD_BQ, BK = FA_BK, LDP = FA_BK + FA_MAX_MR;
    const size_t rows = LDP > BQ ? LDP : BQ, cols = Dp > Dvp ? Dp : Dvp;
    const size_t sizes[FA_BWD_BUFFERS] = {
        BQ * Dp * sizeof(float),         /* qt */
        BQ * Dvp * sizeof(float),        /* dot */
        Dp * BK * sizeof(float),         /* kt */
        Dvp * BK * sizeof(float),        /* vt */
        BK * Dp * sizeof(float),         /* krow */
        BQ * LDP * sizeof(float),        /* p */
        BQ * LDP * sizeof(float),        /* ds */
        BQ * BK * sizeof(float),         /* raw */
        rows * cols * sizeof(float),     /* acc */
        rows * cols * sizeof(float),     /* acc2 */
        (LDP + BQ) * sizeof(float),      /* ones */
        3 * BQ * sizeof(float),          /* rshift, rinv, rdelta */
        2 * BQ * sizeof(int64_t),        /* lo, hi */
        BQ,                              /* live */
        BQ,                              /* bad */
    };
    void **slots[FA_BWD_BUFFERS];
    size_t i;
    memset(w, 0, sizeof *w);
    if ((uint64_t)D > ((uint64_t)1 << 32) || (uint64_t)Dv > ((uint64_t)1 << 32))
        return FA_ERR_NOMEM;
    slots[0] = (void **)&w->qt;
    slots[1] = (void **)&w->dot;
    slots[2] = (void **)&w->kt;
    slots[3] = (void **)&w->vt;
    slots[4] = (void **)&w->krow;
    slots[5] = (void **)&w->p;
    slots[6] = (void **)&w->ds;
    slots[7] = (void **)&w->raw;
    slots[8] = (void **)&w->acc;
    slots[9] = (void **)&w->acc2;
    slots[10] = (void **)&w->ones;
    slots[11] = (void **)&w->rshift;
    slots[12] = (void **)&w->lo;
    slots[13] = (void **)&w->live;
    slots[14] = (void **)&w->bad;
    w->arena = fa_arena(sizes, FA_BWD_BUFFERS, slots);
    if (!w->arena)
        return FA_ERR_NOMEM;
    w->rinv = w->rshift + BQ;
    w->rdelta = w->rshift + 2 * BQ;
    w->hi = w->lo + BQ;
    for (i = 0; i < LDP + BQ; i++)
        w->ones[i] = 1.0f;
    w->Dp = (int64_t)Dp;
    w->Dvp = (int64_t)Dvp;
    return FA_OK;
}

/* Row i of batch item b of the output layout, and of lse (fa_attn_args). */
static int64_t orow(const fa_attn_args *a, int64_t b, int64_t i)
{
    return a->o_off ? a->o_off[b] + i * a->o_rs : (b * a->L + i) * a->Dv;
}

static int64_t lrow(const fa_attn_args *a, int64_t b, int64_t i)
{
    return a->lse_off ? a->lse_off[b] + i * a->lse_rs : b * a->L + i;
}

/* The backward's own arrays: the group, and the bounds of dout, out (at the
 * output layout, which check_args checked against out_span), lse, dq, dk,
 * dv and dsinks. */
static int bwd_check(const fa_attn_args *a, const fa_bwd_args *g)
{
    int64_t b, c, nkv;
    if (!g || g->group < 1 || a->nbatch % g->group != 0)
        return FA_ERR_ARG;
    if (a->block_table)
        return FA_ERR_ARG; /* (paged k and v: not differentiated) */
    if (fa_dtype_block(a->k_dtype) != 1 || fa_dtype_block(a->v_dtype) != 1)
        return FA_ERR_ARG; /* (quantized k and v: not differentiated) */
    if (a->nbatch == 0 || a->L == 0)
        return FA_OK;
    if (!g->dout || !g->out || !g->lse || !g->dq || !g->dq_off)
        return FA_ERR_ARG;
    if (g->out_span.lo != g->dout_span.lo || g->out_span.hi != g->dout_span.hi)
        return FA_ERR_ARG; /* out has dout's layout */
    if (a->sinks && (!g->dsinks || g->dsinks_len < a->nbatch))
        return FA_ERR_ARG;
    for (b = 0; b < a->nbatch; b++) {
        if (!fa_in_span(g->dq_span, g->dq_off[b], a->L, g->dq_rs, 1, 0, a->D))
            return FA_ERR_ARG;
        if (a->S > 0 && (a->k_off[b] != a->k_off[b - b % g->group]
                         || a->v_off[b] != a->v_off[b - b % g->group]))
            return FA_ERR_ARG; /* a kv item's batch items read the same rows */
    }
    nkv = a->nbatch / g->group;
    if (a->S > 0) {
        if (!g->dk || !g->dk_off || (a->Dv > 0 && (!g->dv || !g->dv_off)))
            return FA_ERR_ARG;
        for (c = 0; c < nkv; c++)
            if (!fa_in_span(g->dk_span, g->dk_off[c], a->S, g->dk_rs, 1, 0, a->D)
                || (a->Dv > 0
                    && !fa_in_span(g->dv_span, g->dv_off[c], a->S, g->dv_rs, 1, 0, a->Dv)))
                return FA_ERR_ARG;
    }
    return FA_OK;
}

/* Item b's rows: Delta, shift = lse (NaN for +inf) and inv = 1, the rows
 * of large |lse| recomputed (bwd_row_stats), then its dsink = -sum_i
 * exp(sink - lse_i) Delta_i, with exp(sink - shift_i) inv_i for
 * exp(sink - lse_i). */
static void bwd_rows(const fa_kernel_table *kern, const fa_attn_args *a, const fa_bwd_args *g,
                     int64_t b, const fa_bwd_rows *r, fa_bwd_scratch *w)
{
    double dsink = 0.0;
    int64_t i, c, t;
    for (i = 0; i < a->L; i++) {
        const float *dy = g->dout + orow(a, b, i), *y = g->out + orow(a, b, i);
        const int64_t at = b * a->L + i;
        double s = 0.0;
        for (c = 0; c < a->Dv; c++)
            s += (double)dy[c] * (double)y[c];
        r->delta[at] = (float)s;
        /* lse +inf: an allowed score of +inf, whose row the forward's
         * softmax makes NaN; shift NaN gives every allowed key of the row
         * the weight NaN (and the keys not allowed 0, as exp(-inf - shift)
         * is 0 whatever the shift) */
        r->shift[at] = g->lse[lrow(a, b, i)] == INFINITY ? NAN : g->lse[lrow(a, b, i)];
        r->inv[at] = 1.0f;
    }
    for (t = 0; t < (a->L + FA_BWD_BQ - 1) / FA_BWD_BQ; t++)
        kern->bwd_row_stats(a, g, r, b, t, w);
    if (!a->sinks)
        return;
    for (i = 0; i < a->L; i++) {
        const int64_t at = b * a->L + i;
        if (r->shift[at] != -INFINITY) /* (-inf: no key and a sink of -inf: nothing) */
            dsink -= exp((double)a->sinks[b] - (double)r->shift[at]) * (double)r->inv[at]
                     * (double)r->delta[at];
    }
    g->dsinks[b] = (float)dsink;
}

/* Problem p's rows in the call's row data (3 floats a row). */
static fa_bwd_rows rows_of(float *data, const int64_t *start, int64_t nprob, int64_t p)
{
    const int64_t total = start[nprob];
    fa_bwd_rows r;
    r.delta = data + start[p];
    r.shift = data + total + start[p];
    r.inv = data + 2 * total + start[p];
    return r;
}

/* The passes over the problems a[0..nprob) (gradients g[p] of each). */
static int bwd_run(const fa_attn_args *a, const fa_bwd_args *g, int64_t nprob, int nthreads)
{
    const fa_kernel_table *kern = fa_active_kernels();
    int64_t p, rows = 0, nkv_units = 0, nq_units = 0, items = 0, D = 0, Dv = 0;
    int64_t *start; /* per problem: its first row of delta, first kv unit, first q unit */
    float *data; /* the rows' Delta, shift and inv */
    double work = 0.0;
    int status = FA_OK, nt, fused;
    size_t dq_bytes;
    for (p = 0; p < nprob; p++) {
        const int64_t L = a[p].L, S = a[p].S, nb = a[p].nbatch;
        if (nb == 0 || L == 0)
            continue;
        rows += nb * L;
        items += nb;
        nkv_units += S > 0 ? nb / g[p].group * ((S + FA_BK - 1) / FA_BK) : 0;
        nq_units += nb * ((L + FA_BWD_BQ - 1) / FA_BWD_BQ);
        work += (double)nb * (double)L * (double)S * (double)(a[p].D + a[p].Dv);
        D = a[p].D > D ? a[p].D : D;
        Dv = a[p].Dv > Dv ? a[p].Dv : Dv;
    }
    if (items == 0)
        return FA_OK;
    start = (int64_t *)malloc((size_t)(3 * (nprob + 1)) * sizeof(int64_t));
    data = (float *)malloc((size_t)(3 * rows) * sizeof(float));
    if (!start || !data) {
        free(start);
        free(data);
        return FA_ERR_NOMEM;
    }
    start[0] = start[nprob + 1] = start[2 * (nprob + 1)] = 0;
    for (p = 0; p < nprob; p++) {
        const int64_t L = a[p].L, S = a[p].S, nb = (a[p].L == 0) ? 0 : a[p].nbatch;
        start[p + 1] = start[p] + nb * L;
        start[nprob + 1 + p + 1] = start[nprob + 1 + p]
                                   + (S > 0 ? nb / g[p].group * ((S + FA_BK - 1) / FA_BK) : 0);
        start[2 * (nprob + 1) + p + 1] = start[2 * (nprob + 1) + p]
                                         + nb * ((L + FA_BWD_BQ - 1) / FA_BWD_BQ);
    }
    nt = fa_threads_for(nthreads, work, nkv_units > nq_units ? nkv_units : nq_units);
    /* One unit a kv item (bwd_head_unit: five products a pair instead of
     * seven) where the kv items keep every thread busy but for at most a
     * quarter of the last round, and their dq fits FA_BWD_HEAD_BYTES: the
     * same bits either way. */
    {
        int64_t heads = 0, most = 0;
        for (p = 0; p < nprob; p++)
            if (a[p].L > 0) {
                const int64_t nkv = a[p].nbatch / g[p].group;
                const int64_t lp = (a[p].L + FA_BWD_BQ - 1) / FA_BWD_BQ * FA_BWD_BQ;
                const int64_t bytes = g[p].group * lp * ((a[p].D + FA_NR - 1) / FA_NR * FA_NR) * 4;
                heads += nkv;
                most = bytes > most ? bytes : most;
            }
        fused = heads > 0 && most <= FA_BWD_HEAD_BYTES
                && 4 * ((heads + nt - 1) / nt * nt - heads) <= heads;
        dq_bytes = (size_t)most;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        fa_bwd_scratch w;
        int64_t u, q;
        float *dq = fused ? (float *)malloc(dq_bytes) : NULL;
        const int ok = bwd_scratch_alloc(&w, D, Dv) == FA_OK && (!fused || dq);
        if (!ok) {
#ifdef _OPENMP
#pragma omp critical(fastattn_bwd_status)
#endif
            status = FA_ERR_NOMEM;
        }
        /* 1. Delta (and dsinks), an item at a time */
        for (q = 0; q < nprob; q++) {
            int64_t b;
            if (a[q].L == 0)
                continue;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (b = 0; b < a[q].nbatch; b++)
                if (ok) {
                    const fa_bwd_rows r = rows_of(data, start, nprob, q);
                    bwd_rows(kern, &a[q], &g[q], b, &r, &w);
                }
        }
        /* 2. every gradient of a kv item at once; or dk and dv, key-major,
         * then 3. dq, query-major (each pass after the last: the for loops
         * end with a barrier) */
        if (fused) {
            for (q = 0; q < nprob; q++) {
                int64_t c;
                if (a[q].L == 0)
                    continue;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
                for (c = 0; c < a[q].nbatch / g[q].group; c++)
                    if (ok && status == FA_OK) {
                        const fa_bwd_rows r = rows_of(data, start, nprob, q);
                        kern->bwd_head_unit(&a[q], &g[q], &r, c, &w, dq);
                    }
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (u = 0; u < (fused ? 0 : nkv_units); u++) {
            int64_t pp = 0, n, tiles;
            if (!ok || status != FA_OK)
                continue;
            while (start[nprob + 1 + pp + 1] <= u)
                pp++;
            n = u - start[nprob + 1 + pp];
            tiles = (a[pp].S + FA_BK - 1) / FA_BK;
            {
                const fa_bwd_rows r = rows_of(data, start, nprob, pp);
                kern->bwd_kv_unit(&a[pp], &g[pp], &r, n / tiles, n % tiles, &w);
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (u = 0; u < (fused ? 0 : nq_units); u++) {
            int64_t pp = 0, n, blocks;
            if (!ok || status != FA_OK)
                continue;
            while (start[2 * (nprob + 1) + pp + 1] <= u)
                pp++;
            n = u - start[2 * (nprob + 1) + pp];
            blocks = (a[pp].L + FA_BWD_BQ - 1) / FA_BWD_BQ;
            {
                const fa_bwd_rows r = rows_of(data, start, nprob, pp);
                kern->bwd_q_unit(&a[pp], &g[pp], &r, n / blocks, n % blocks, &w);
            }
        }
        free(w.arena);
        free(dq);
    }
    free(start);
    free(data);
    return status;
}

/* The forward's checks (with dout's span as the output's), then the
 * backward's own. */
static int bwd_check_all(const fa_attn_args *a, const fa_bwd_args *g, int nthreads)
{
    fa_attn_args c;
    int status;
    if (!a || !g)
        return FA_ERR_ARG;
    c = *a;
    c.out_span = g->dout_span;
    c.lse_span = g->lse_span;
    status = fa_check_args(&c, nthreads, 0, 1);
    if (status == FA_OK)
        status = bwd_check(a, g);
    if (status == FA_OK && a->nbatch > 0 && a->L > 0 && a->Dv > 0 && (!g->dout || !g->out))
        status = FA_ERR_ARG;
    return status;
}

int fa_attention_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int nthreads)
{
    int status = bwd_check_all(a, g, nthreads);
    if (status != FA_OK)
        return status;
    if (a->nbatch == 0 || a->L == 0)
        return FA_OK;
    return bwd_run(a, g, 1, nthreads);
}

int fa_varlen_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int64_t nseq,
                           const int64_t *cu_q, const int64_t *cu_k, int nthreads)
{
    fa_attn_args *sa = NULL;
    fa_bwd_args *sg = NULL;
    int64_t s;
    int status = fa_check_cu_seqlens(a, nseq, cu_q, cu_k);
    if (status != FA_OK || !g || nthreads < 1 || g->group < 1 || a->nbatch % g->group != 0)
        return FA_ERR_ARG;
    if (nseq == 0 || a->nbatch == 0 || cu_q[nseq] == 0)
        return FA_OK;
    sa = (fa_attn_args *)malloc((size_t)nseq * sizeof *sa);
    sg = (fa_bwd_args *)malloc((size_t)nseq * sizeof *sg);
    if (!sa || !sg) {
        free(sa);
        free(sg);
        return FA_ERR_NOMEM;
    }
    for (s = 0; s < nseq && status == FA_OK; s++) { /* sequence s alone */
        const int64_t at = s * a->nbatch, kat = s * (a->nbatch / g->group);
        fa_bwd_args *h = &sg[s];
        fa_varlen_sequence(a, cu_q, cu_k, s, &sa[s]);
        *h = *g;
        h->dq_off = g->dq_off + at;
        h->dk_off = g->dk_off ? g->dk_off + kat : NULL;
        h->dv_off = g->dv_off ? g->dv_off + kat : NULL;
        h->dsinks = g->dsinks ? g->dsinks + at : NULL;
        h->dsinks_len = g->dsinks ? g->dsinks_len - at : 0;
        status = bwd_check_all(&sa[s], h, nthreads);
    }
    if (status == FA_OK)
        status = bwd_run(sa, sg, nseq, nthreads);
    free(sa);
    free(sg);
    return status;
}
