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
 * and finally o = acc / l, lse = m + log(l). Keys are reduced in chunks of
 * FA_CK from key 0 (the online softmax within a chunk, then the chunks' results
 * folded in chunk order: fa_merge_chunk); when there are too few units to
 * occupy the threads (decoding: one query row per head), each chunk of a
 * unit is a work item of its own, and the partials are folded afterwards in
 * the same order, with the same bits. Working memory is O(threads x tile),
 * plus the partials of split units (capped at FA_MAX_PARTIAL bytes).
 */
#include "fa_kernels.h"
#include "fa_internal.h"

#include <stdlib.h>

#define FA_MAX_PARTIAL (32.0 * 1024 * 1024) /* bytes of partials for split units, at most */

/* A thread's working memory is one allocation, carved into the buffers of
 * fa_scratch, each FA_SCRATCH_ALIGN-aligned and followed by a gap of that
 * size; under AddressSanitizer the gaps are poisoned, so an overrun of any
 * one buffer is still reported. */
#define FA_SCRATCH_ALIGN 64
#if defined(__SANITIZE_ADDRESS__)
#define FA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_ASAN 1
#endif
#endif
#ifdef FA_ASAN
#include <sanitizer/asan_interface.h>
#endif

static void scratch_free(fa_scratch *w)
{
    free(w->arena); /* (ASan's allocator takes poisoned gaps back as they are) */
    w->arena = NULL;
}

static int scratch_alloc(fa_scratch *w, int64_t D, int64_t Dv)
{
    const size_t Dp = (size_t)D, Dvp = (size_t)((Dv + FA_NR - 1) / FA_NR * FA_NR);
    /* the buffers' sizes in bytes, in the order they are carved */
    const size_t sizes[18] = {
        FA_BQ * Dp * sizeof(float),            /* qpad */
        Dp * FA_BK * sizeof(float),            /* kt */
        FA_BQ * FA_BK * sizeof(float),         /* sc */
        (FA_BK * Dvp + 1) * sizeof(float),     /* vpad */
        (FA_BQ * Dvp + 1) * sizeof(float),     /* tile */
        (FA_BQ * Dvp + 1) * sizeof(float),     /* acc */
        FA_BQ * sizeof(float),                 /* m */
        FA_BQ * sizeof(float),                 /* alpha */
        FA_BQ * sizeof(double),                /* l */
        FA_BQ * sizeof(int64_t),               /* lo */
        FA_BQ * sizeof(int64_t),               /* hi */
        FA_BQ,                                 /* live */
        FA_MAX_MR * FA_BK * sizeof(float),     /* prow */
        (FA_BK * Dvp + 1) * sizeof(float),     /* vrow */
        FA_BQ * FA_BK,                         /* allow */
        FA_BQ * sizeof(float),                 /* mt */
        FA_BQ * sizeof(double),                /* lt */
        (FA_BQ * Dvp + 1) * sizeof(float),     /* acct */
    };
    void **slots[18];
    size_t offs[18], total = 0;
    char *base;
    int i;
    memset(w, 0, sizeof *w);
    if ((uint64_t)D > ((uint64_t)1 << 40) / FA_BQ || (uint64_t)Dv > ((uint64_t)1 << 40) / FA_BQ)
        return FA_ERR_NOMEM;
    slots[0] = (void **)&w->qpad;
    slots[1] = (void **)&w->kt;
    slots[2] = (void **)&w->sc;
    slots[3] = (void **)&w->vpad;
    slots[4] = (void **)&w->tile;
    slots[5] = (void **)&w->acc;
    slots[6] = (void **)&w->m;
    slots[7] = (void **)&w->alpha;
    slots[8] = (void **)&w->l;
    slots[9] = (void **)&w->lo;
    slots[10] = (void **)&w->hi;
    slots[11] = (void **)&w->live;
    slots[12] = (void **)&w->prow;
    slots[13] = (void **)&w->vrow;
    slots[14] = (void **)&w->allow;
    slots[15] = (void **)&w->mt;
    slots[16] = (void **)&w->lt;
    slots[17] = (void **)&w->acct;
    for (i = 0; i < 18; i++) {
        offs[i] = total;
        total += (sizes[i] + 2 * FA_SCRATCH_ALIGN - 1) / FA_SCRATCH_ALIGN * FA_SCRATCH_ALIGN;
    }
    w->arena = malloc(total + FA_SCRATCH_ALIGN);
    if (!w->arena)
        return FA_ERR_NOMEM;
    base = (char *)w->arena + (FA_SCRATCH_ALIGN - (uintptr_t)w->arena % FA_SCRATCH_ALIGN)
                                  % FA_SCRATCH_ALIGN;
    for (i = 0; i < 18; i++) {
        *slots[i] = base + offs[i];
#ifdef FA_ASAN
        ASAN_POISON_MEMORY_REGION(base + offs[i] + sizes[i],
                                  (i + 1 < 18 ? offs[i + 1] : total) - offs[i] - sizes[i]);
#endif
    }
    w->Dvp = (int64_t)Dvp;
    return FA_OK;
}

void fa_merge_chunk(int64_t nr, int64_t Dvp, const float *m, const double *l, const float *acc,
                    float *M, double *L, float *A)
{
    int64_t r, d;
    for (r = 0; r < nr; r++) {
        const float mc = m[r], mo = M[r];
        const float *src = acc + r * Dvp;
        float *dst = A + r * Dvp;
        float mn, f, g;
        if (mc == -INFINITY)
            continue; /* no key of this row in the chunk, or all scores -inf */
        if (mo == -INFINITY) { /* the first chunk with keys: taken as it is */
            M[r] = mc;
            L[r] = l[r];
            for (d = 0; d < Dvp; d++)
                dst[d] = src[d];
            continue;
        }
        mn = (mo != mo || mc != mc) ? NAN : (mc > mo ? mc : mo); /* NaN-propagating max */
        f = fa_exp2f((mo - mn) * FA_LOG2E);
        g = fa_exp2f((mc - mn) * FA_LOG2E);
        L[r] = L[r] * (double)f + l[r] * (double)g;
        for (d = 0; d < Dvp; d++)
            dst[d] = dst[d] * f + src[d] * g;
        M[r] = mn;
    }
}

void fa_finish_rows(const fa_attn_args *a, const fa_unit *u, int64_t Dvp, const float *M,
                    const double *L, const float *A, float *out, float *lse)
{
    const int64_t Dv = a->Dv, nr = u->nh * u->nq;
    int64_t r, d;
    for (r = 0; r < nr; r++) {
        const int64_t b = u->b0 + r / u->nq, i = u->i0 + r % u->nq;
        const int64_t row = a->o_off ? a->lse_off[b] + i * a->lse_rs : b * a->L + i;
        const float m = M[r];
        const float sink = a->sinks ? a->sinks[b] : -INFINITY; /* -inf: no sink */
        const float *acc = A + r * Dvp;
        float *o = Dv == 0 ? NULL : out + (a->o_off ? a->o_off[b] + i * a->o_rs : row * Dv);
        float lse_r;
        if (m != m || m == INFINITY || sink != sink) {
            /* NaN among the allowed scores or a NaN sink, or an allowed +inf */
            for (d = 0; d < Dv; d++)
                o[d] = NAN;
            lse_r = sink != sink ? sink : m;
        } else if (m == -INFINITY || sink == INFINITY) {
            /* no allowed key (or all scores -inf): the sink alone, lse = sink
             * (-inf without one); a +inf sink takes all the weight */
            for (d = 0; d < Dv; d++)
                o[d] = 0.0f;
            lse_r = m == -INFINITY ? sink : INFINITY;
        } else if (sink == -INFINITY) {
            const double inv = 1.0 / L[r];
            for (d = 0; d < Dv; d++)
                o[d] = (float)((double)acc[d] * inv);
            lse_r = lse ? (float)((double)m + log(L[r])) : 0.0f; /* the log only if asked */
        } else {
            /* the sink's exp(sink) joins the sum: both shifted by the larger */
            const double mm = sink > m ? (double)sink : (double)m;
            const double f = exp((double)m - mm);
            const double den = L[r] * f + exp((double)sink - mm);
            const double scale = f / den;
            for (d = 0; d < Dv; d++)
                o[d] = (float)((double)acc[d] * scale);
            lse_r = (float)(mm + log(den));
        }
        if (lse)
            lse[row] = lse_r;
    }
}

/* 1 if batch items b and c read the same k and v (and pages). */
static int same_kv(const fa_attn_args *a, int64_t b, int64_t c)
{
    return a->k_off[b] == a->k_off[c] && a->v_off[b] == a->v_off[c]
           && (!a->block_table || a->bt_off[b] == a->bt_off[c]);
}

/* The number of consecutive batch items that share k and v (GQA groups, MQA
 * broadcast), if the whole batch is made of such groups; else 1. */
static int64_t kv_group(const fa_attn_args *a)
{
    int64_t g = 1, b;
    while (g < a->nbatch && same_kv(a, g, 0))
        g++;
    if (a->nbatch % g != 0)
        return 1;
    for (b = 0; b < a->nbatch; b++)
        if (!same_kv(a, b, b - b % g))
            return 1;
    return g;
}

static int valid_dtype(int dt)
{
    return dt == FA_DTYPE_F32 || dt == FA_DTYPE_F16 || dt == FA_DTYPE_BF16;
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
    if (!valid_dtype(a->k_dtype) || !valid_dtype(a->v_dtype))
        return FA_ERR_ARG;
    if (a->block_table && a->nbatch > 0 && a->L > 0 && a->S > 0) {
        /* every page a row j < S lies in exists; a tile never straddles pages */
        const int64_t pages = (a->S + a->block_size - 1) / (a->block_size > 0 ? a->block_size : 1);
        int64_t b, p;
        if (a->block_size < FA_BK || a->block_size % FA_BK != 0 || !a->bt_off)
            return FA_ERR_ARG;
        for (b = 0; b < a->nbatch; b++)
            for (p = 0; p < pages; p++) {
                const int32_t pg = a->block_table[a->bt_off[b] + p];
                if (pg < 0 || pg >= a->num_pages)
                    return FA_ERR_ARG;
            }
    }
    if (a->mask_kind != FA_MASK_NONE && a->mask_kind != FA_MASK_BOOL
        && a->mask_kind != FA_MASK_FLOAT)
        return FA_ERR_ARG;
    if (!(a->softcap >= 0.0f && a->softcap <= 3.40282347e38f)) /* 0: off; NaN fails */
        return FA_ERR_ARG;
    if (a->o_off && !a->lse_off)
        return FA_ERR_ARG;
    if (a->seg_q && a->nbatch > 0 && a->L > 0 && a->S > 0
        && (!a->seg_k || !a->seg_q_off || !a->seg_k_off))
        return FA_ERR_ARG;
    if (a->mask_kind != FA_MASK_NONE && a->nbatch > 0 && a->L > 0 && a->S > 0) {
        if (!a->mask_off)
            return FA_ERR_ARG;
        if (a->mask_kind == FA_MASK_BOOL ? !a->bool_mask : !a->float_mask)
            return FA_ERR_ARG;
    }
    return FA_OK;
}

/* The geometry of the work units (see fa_unit). */
typedef struct {
    int64_t G, nh, nhs, nq, nqt, nunits;
} fa_units;

/* The units of a: groups of G items that share k and v, cut into slices of
 * nh heads and tiles of nq query rows (a unit holds at most FA_BQ rows). */
static fa_units unit_geometry(const fa_attn_args *a)
{
    fa_units g;
    g.G = a->nbatch > 0 ? kv_group(a) : 1;
    g.nh = g.G < FA_BQ ? g.G : FA_BQ;          /* heads per unit */
    g.nhs = (g.G + g.nh - 1) / g.nh;           /* head slices per group */
    g.nq = FA_BQ / g.nh;                       /* query rows per head */
    g.nq = a->L < g.nq ? (a->L > 0 ? a->L : 1) : g.nq;
    g.nqt = (a->L + g.nq - 1) / g.nq;          /* query tiles */
    g.nunits = (a->nbatch / g.G) * g.nhs * g.nqt;
    return g;
}

/* Unit n, the last query tiles first: under is_causal they see the most keys,
 * and handing the biggest units out first evens out the threads' ends. */
static fa_unit unit_at(const fa_attn_args *a, const fa_units *g, int64_t n, int64_t chunk)
{
    const int64_t qt = g->nqt - 1 - n % g->nqt, hs = (n / g->nqt) % g->nhs;
    const int64_t grp = n / (g->nqt * g->nhs);
    fa_unit u;
    u.b0 = grp * g->G + hs * g->nh;
    u.nh = g->G - hs * g->nh < g->nh ? g->G - hs * g->nh : g->nh;
    u.i0 = qt * g->nq;
    u.nq = a->L - u.i0 < g->nq ? a->L - u.i0 : g->nq;
    u.chunk = chunk;
    return u;
}

/* Runs the SDPA (weights == NULL) or weights kernel over every work unit. */
static int run_units(const fa_attn_args *a, float *out, float *lse, float *weights,
                     int nthreads)
{
    const fa_kernel_table *kern = fa_active_kernels();
    const int64_t nchunks = a->S > FA_CK ? (a->S + FA_CK - 1) / FA_CK : 1;
    double work = (double)a->nbatch * (double)a->L * (double)(a->S > 0 ? a->S : 1)
                  * (double)(a->D + a->Dv);
    const fa_units g = unit_geometry(a);
    int64_t nrmax = g.nh * g.nq, Dvp = (a->Dv + FA_NR - 1) / FA_NR * FA_NR, nitems;
    float *pm = NULL, *pacc = NULL;
    double *pl = NULL;
    int status = FA_OK, split = 0;
    int nt;
    if (g.nunits == 0)
        return FA_OK;
    nt = fa_threads_for(nthreads, work, g.nunits);
    if (!weights && nchunks > 1) { /* too few units for the threads: split them by chunk */
        const int nt_split = fa_threads_for(nthreads, work, g.nunits * nchunks);
        const double items = (double)g.nunits * (double)nchunks;
        if (nt_split > nt && g.nunits < 4 * (int64_t)nt_split
            && items * (double)nrmax * ((double)Dvp * 4.0 + 12.0) <= FA_MAX_PARTIAL) {
            const size_t rows = (size_t)(g.nunits * nchunks * nrmax);
            pm = (float *)malloc(rows * sizeof(float));
            pl = (double *)malloc(rows * sizeof(double));
            pacc = (float *)malloc(rows * (size_t)Dvp * sizeof(float) + sizeof(float));
            split = pm && pl && pacc; /* else: whole units (the same bits) */
            if (split)
                nt = nt_split;
        }
    }
    nitems = split ? g.nunits * nchunks : g.nunits;
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        fa_scratch w;
        int64_t n, c, r;
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
        for (n = 0; n < nitems; n++) {
            const fa_unit u = unit_at(a, &g, split ? n / nchunks : n, split ? n % nchunks : -1);
            if (!ok)
                continue;
            if (weights) {
                kern->weights_unit(a, &u, weights, &w);
            } else if (split) {
                fa_partial p;
                p.m = pm + n * nrmax;
                p.l = pl + n * nrmax;
                p.acc = pacc + n * nrmax * Dvp;
                kern->sdpa_unit(a, &u, out, lse, &w, &p);
            } else {
                kern->sdpa_unit(a, &u, out, lse, &w, NULL);
            }
        }
        if (split) { /* fold each unit's partials in chunk order */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (n = 0; n < g.nunits; n++) {
                const fa_unit u = unit_at(a, &g, n, -1);
                const int64_t nr = u.nh * u.nq;
                if (!ok || status != FA_OK)
                    continue; /* (a thread without memory left partials unwritten) */
                for (r = 0; r < nr; r++) {
                    w.mt[r] = -INFINITY;
                    w.lt[r] = 0.0;
                }
                for (c = 0; c < nchunks; c++) {
                    const int64_t item = n * nchunks + c;
                    fa_merge_chunk(nr, Dvp, pm + item * nrmax, pl + item * nrmax,
                                   pacc + item * nrmax * Dvp, w.mt, w.lt, w.acct);
                }
                fa_finish_rows(a, &u, Dvp, w.mt, w.lt, w.acct, out, lse);
            }
        }
        if (ok)
            scratch_free(&w);
    }
    free(pm);
    free(pl);
    free(pacc);
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

/* One work unit of a packed batch: unit n of sequence seq, and its cost. */
typedef struct {
    int64_t seq, n;
    double cost;
} fa_varlen_item;

/* Bigger first; ties in (sequence, unit) order, so the list is fixed. */
static int varlen_item_cmp(const void *x, const void *y)
{
    const fa_varlen_item *p = (const fa_varlen_item *)x, *q = (const fa_varlen_item *)y;
    if (p->cost != q->cost)
        return p->cost > q->cost ? -1 : 1;
    if (p->seq != q->seq)
        return p->seq < q->seq ? -1 : 1;
    return p->n < q->n ? -1 : (p->n > q->n ? 1 : 0);
}

/* The keys a unit's rows may see at most (causal and window bounds), times its
 * rows: the order in which units are handed out. */
static double unit_cost(const fa_attn_args *a, const fa_unit *u)
{
    const int64_t p_first = u->i0 + a->S - a->L, p_last = p_first + u->nq - 1;
    int64_t lo = 0, hi = a->S;
    if (a->is_causal && p_last + 1 < hi)
        hi = p_last + 1;
    if (a->win_right >= 0 && p_last + a->win_right + 1 < hi)
        hi = p_last + a->win_right + 1;
    if (a->win_left >= 0 && p_first - a->win_left > lo)
        lo = p_first - a->win_left;
    return (double)(u->nh * u->nq) * (double)(hi > lo ? hi - lo : 0) + 1.0;
}

int fa_varlen_f32(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                  const int64_t *cu_k, float *out, float *lse, int nthreads)
{
    const fa_kernel_table *kern = fa_active_kernels();
    const int64_t H = a ? a->nbatch : 0;
    fa_attn_args *sa = NULL;
    fa_varlen_item *items = NULL;
    int64_t s, n, nitems = 0;
    double work = 0.0;
    int status = FA_OK, nt;
    if (!a || nseq < 0 || !cu_q || !cu_k || nthreads < 1 || H < 0)
        return FA_ERR_ARG;
    if (a->mask_kind != FA_MASK_NONE || a->seg_q || a->block_table || cu_q[0] != 0
        || cu_k[0] != 0)
        return FA_ERR_ARG;
    for (s = 0; s < nseq; s++)
        if (cu_q[s + 1] < cu_q[s] || cu_k[s + 1] < cu_k[s])
            return FA_ERR_ARG;
    if (nseq == 0 || H == 0 || cu_q[nseq] == 0)
        return FA_OK;
    if (!a->o_off || !a->lse_off || (a->Dv > 0 && !out)
        || (uint64_t)nseq > (uint64_t)(SIZE_MAX / sizeof(fa_attn_args)) / (uint64_t)H)
        return FA_ERR_ARG;
    sa = (fa_attn_args *)malloc((size_t)nseq * sizeof *sa);
    if (!sa)
        return FA_ERR_NOMEM;
    for (s = 0; s < nseq && status == FA_OK; s++) { /* sequence s alone, as fa_sdpa_f32 sees it */
        fa_attn_args *q = &sa[s];
        const int64_t at = s * H;
        *q = *a;
        q->L = cu_q[s + 1] - cu_q[s];
        q->S = cu_k[s + 1] - cu_k[s];
        q->q_off = a->q_off + at;
        q->k_off = a->k_off + at;
        q->v_off = a->v_off + at;
        q->o_off = a->o_off + at;
        q->lse_off = a->lse_off + at;
        q->alibi_slopes = a->alibi_slopes ? a->alibi_slopes + at : NULL;
        q->sinks = a->sinks ? a->sinks + at : NULL;
        status = check_args(q, nthreads);
        if (q->L > 0) {
            nitems += unit_geometry(q).nunits;
            work += (double)H * (double)q->L * (double)(q->S > 0 ? q->S : 1)
                    * (double)(q->D + q->Dv);
        }
    }
    if (status == FA_OK) {
        items = (fa_varlen_item *)malloc((size_t)nitems * sizeof *items + 1);
        status = items ? FA_OK : FA_ERR_NOMEM;
    }
    if (status != FA_OK) {
        free(sa);
        return status;
    }
    nitems = 0;
    for (s = 0; s < nseq; s++) {
        const fa_units g = unit_geometry(&sa[s]);
        if (sa[s].L == 0)
            continue;
        for (n = 0; n < g.nunits; n++) {
            const fa_unit u = unit_at(&sa[s], &g, n, -1);
            items[nitems].seq = s;
            items[nitems].n = n;
            items[nitems].cost = unit_cost(&sa[s], &u);
            nitems++;
        }
    }
    qsort(items, (size_t)nitems, sizeof *items, varlen_item_cmp);
    nt = fa_threads_for(nthreads, work, nitems);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        fa_scratch w;
        int64_t t;
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
        for (t = 0; t < nitems; t++) {
            const fa_attn_args *q = &sa[items[t].seq];
            const fa_units g = unit_geometry(q);
            const fa_unit u = unit_at(q, &g, items[t].n, -1);
            if (ok)
                kern->sdpa_unit(q, &u, out, lse, &w, NULL);
        }
        if (ok)
            scratch_free(&w);
    }
    free(items);
    free(sa);
    return status;
}
