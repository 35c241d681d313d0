/*
 * attention.c -- fused scaled dot-product attention with an online softmax:
 * argument checks, work units, threads (the per-unit kernels are in
 * driver.inc, one copy per SIMD variant).
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
 * folded in chunk order: merge_chunk); a unit that holds too large a share
 * of the work for the threads (decoding: one query row per head) has each of
 * its chunks as a work item of its own, and the partials are folded
 * afterwards in the same order, with the same bits. One thread policy
 * (plan_build, plan_run) serves every operation of the op table (fa_op:
 * SDPA, packed batches of it, the weights), each a unit function and, for
 * an operation whose units may be split, a fold.
 * Working memory is O(threads x tile), plus the partials of split units
 * (capped at FA_MAX_PARTIAL bytes).
 */
#include "fa_kernels.h"
#include "fa_internal.h"

#include <float.h>
#include <stdlib.h>

#define FA_MAX_PARTIAL (32.0 * 1024 * 1024) /* bytes of partials for split units, at most */

/* A thread's working memory is one allocation, carved into buffers
 * (fa_arena, which the backward's scratch uses too). */
#define FA_SCRATCH_ALIGN 64
#ifdef FA_ASAN
#include <sanitizer/asan_interface.h>
#endif

void *fa_arena(const size_t *sizes, int n, void **const *slots)
{
    size_t offs[FA_ARENA_MAX], total = 0;
    char *base;
    void *arena;
    int i;
    if (n < 1 || n > FA_ARENA_MAX)
        return NULL;
    for (i = 0; i < n; i++) {
        offs[i] = total;
        total += (sizes[i] + 2 * FA_SCRATCH_ALIGN - 1) / FA_SCRATCH_ALIGN * FA_SCRATCH_ALIGN;
    }
    arena = malloc(total + FA_SCRATCH_ALIGN);
    if (!arena)
        return NULL;
    base = (char *)arena + (FA_SCRATCH_ALIGN - (uintptr_t)arena % FA_SCRATCH_ALIGN)
                               % FA_SCRATCH_ALIGN;
    for (i = 0; i < n; i++) {
        *slots[i] = base + offs[i];
#ifdef FA_ASAN
        /* all bits set (a NaN): what a kernel reads before it writes shows
         * (unit_common.inc's qt_tile checks its padding rows) */
        memset(base + offs[i], 0xFF, sizes[i]);
        ASAN_POISON_MEMORY_REGION(base + offs[i] + sizes[i],
                                  (i + 1 < n ? offs[i + 1] : total) - offs[i] - sizes[i]);
#endif
    }
    return arena;
}

static void scratch_free(fa_scratch *w)
{
    free(w->arena); /* (ASan's allocator takes poisoned gaps back as they are) */
    w->arena = NULL;
}

#define FA_SCRATCH_BUFFERS 22 /* the buffers of fa_scratch */

/* Scratch for units of at most bq rows (FA_BQ_IN_PLACE or FA_BQ). */
static int scratch_alloc(fa_scratch *w, int64_t D, int64_t Dv, int64_t bq)
{
    const size_t Dp = (size_t)D, Dvp = (size_t)((Dv + FA_NR - 1) / FA_NR * FA_NR), B = (size_t)bq;
    /* the buffers' sizes in bytes, in the order they are carved */
    const size_t sizes[FA_SCRATCH_BUFFERS] = {
        B * Dp * sizeof(float),                /* qpad */
        Dp * FA_BK * sizeof(float),            /* kt */
        B * FA_BK * sizeof(float),             /* sc */
        (FA_BK * Dvp + 1) * sizeof(float),     /* vpad */
        (B * Dvp + 1) * sizeof(float),         /* tile */
        (B * Dvp + 1) * sizeof(float),         /* acc */
        B * sizeof(float),                     /* m */
        B * sizeof(float),                     /* alpha */
        B * sizeof(double),                    /* l */
        B * sizeof(int64_t),                   /* lo */
        B * sizeof(int64_t),                   /* hi */
        B,                                     /* live */
        FA_MAX_MR * FA_BK * sizeof(float),     /* prow */
        (FA_BK * Dvp + 1) * sizeof(float),     /* vrow */
        B * FA_BK,                             /* allow */
        B * sizeof(float),                     /* mt */
        B * sizeof(double),                    /* lt */
        (B * Dvp + 1) * sizeof(float),         /* acct */
        B * sizeof(float),                     /* tmax */
        FA_MAX_MR * FA_NR * sizeof(float),     /* pvo */
        B * Dp * sizeof(float),                /* qt */
        FA_BK * Dp * sizeof(float),            /* kq */
    };
    void **slots[FA_SCRATCH_BUFFERS];
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
    slots[18] = (void **)&w->tmax;
    slots[19] = (void **)&w->pvo;
    slots[20] = (void **)&w->qt;
    slots[21] = (void **)&w->kq;
    w->arena = fa_arena(sizes, FA_SCRATCH_BUFFERS, slots);
    if (!w->arena)
        return FA_ERR_NOMEM;
    w->Dvp = (int64_t)Dvp;
    w->bq = bq;
    return FA_OK;
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

/* A code of dtypes.h, for rows of n elements: a block format's rows are
 * whole blocks. */
static int valid_dtype(int dt, int64_t n)
{
    return fa_dtype_unit(dt) != 0 && n % fa_dtype_block(dt) == 0;
}

/* The units (elements, or blocks) of a row of n elements of dtype dt. */
static int64_t row_units(int dt, int64_t n)
{
    return n / fa_dtype_block(dt);
}

/* No array is this many elements long: every sum of offsets and strides
 * that in_span forms from terms within it stays far inside int64. */
#define FA_REACH ((int64_t)1 << 60)

/* Adds (n - 1) st to [*lo, *hi] (nothing for n <= 1); 0 where it is beyond
 * FA_REACH. */
static int reach(int64_t *lo, int64_t *hi, int64_t n, int64_t st)
{
    if (n <= 1 || st == 0)
        return 1;
    if (st > FA_REACH / (n - 1) || st < -(FA_REACH / (n - 1)))
        return 0;
    if (st < 0)
        *lo += (n - 1) * st;
    else
        *hi += (n - 1) * st;
    return 1;
}

/* 1 if the elements off + i st1 + j st2 + [0, width) for i < n1, j < n2 all
 * lie in s (trivially when there are none). */
int fa_in_span(fa_span s, int64_t off, int64_t n1, int64_t st1, int64_t n2, int64_t st2,
                   int64_t width)
{
    int64_t lo = off, hi = off;
    if (n1 <= 0 || n2 <= 0 || width <= 0)
        return 1;
    if (off < -FA_REACH || off > FA_REACH || width > FA_REACH || !reach(&lo, &hi, n1, st1)
        || !reach(&lo, &hi, n2, st2))
        return 0;
    return lo >= s.lo && hi + width <= s.hi;
}

/* 1 if every element that batch item b touches lies in its array's span
 * (see "Bounds" in fastattn.h); weights: the output is the L x S weights,
 * and v is not read; with_lse: lse is written. */
static int item_in_bounds(const fa_attn_args *a, int64_t b, int weights, int with_lse)
{
    const int64_t L = a->L, S = a->S;
    const int64_t kw = row_units(a->k_dtype, a->D), vw = row_units(a->v_dtype, a->Dv);
    if (!fa_in_span(a->q_span, a->q_off[b], L, a->q_rs, 1, 0, a->D))
        return 0;
    if (a->o_off && !weights) {
        if (!fa_in_span(a->out_span, a->o_off[b], L, a->o_rs, 1, 0, a->Dv))
            return 0;
        if (with_lse && !fa_in_span(a->lse_span, a->lse_off[b], L, a->lse_rs, 1, 0, 1))
            return 0;
    }
    if (S == 0)
        return 1;
    if (a->block_table) {
        /* the item's entries, then its rows of every page there is */
        const int64_t bs = a->block_size, rows = S < bs ? S : bs;
        const int64_t pages = (S + bs - 1) / bs;
        if (a->bt_off[b] < 0 || a->bt_off[b] > a->bt_len - pages)
            return 0;
        if (!fa_in_span(a->k_span, a->k_off[b], rows, a->k_rs, a->num_pages, a->k_ps, kw))
            return 0;
        if (!weights && !fa_in_span(a->v_span, a->v_off[b], rows, a->v_rs, a->num_pages, a->v_ps,
                                 vw))
            return 0;
    } else {
        if (!fa_in_span(a->k_span, a->k_off[b], S, a->k_rs, 1, 0, kw))
            return 0;
        if (!weights && !fa_in_span(a->v_span, a->v_off[b], S, a->v_rs, 1, 0, vw))
            return 0;
    }
    if (a->mask_kind != FA_MASK_NONE
        && !fa_in_span(a->mask_span, a->mask_off[b], L, a->mask_sl, S, a->mask_ss, 1))
        return 0;
    if (a->seg_q && (!fa_in_span(a->seg_q_span, a->seg_q_off[b], L, a->seg_q_sl, 1, 0, 1)
                     || !fa_in_span(a->seg_k_span, a->seg_k_off[b], S, a->seg_k_ss, 1, 0, 1)))
        return 0;
    return 1;
}

/* The checks every entry point makes before any work: the arguments' domains,
 * then the bounds of every array (see "Bounds" in fastattn.h). */
int fa_check_args(const fa_attn_args *a, int nthreads, int weights, int with_lse)
{
    int64_t b, rows;
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
    if (!valid_dtype(a->k_dtype, a->D) || !valid_dtype(a->v_dtype, a->Dv))
        return FA_ERR_ARG;
    if (a->block_table && a->nbatch > 0 && a->L > 0 && a->S > 0
        && (a->block_size < FA_BK || a->block_size % FA_BK != 0 || !a->bt_off))
        return FA_ERR_ARG; /* a tile never straddles pages */
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
    if (a->nbatch == 0 || a->L == 0)
        return FA_OK;
    /* bounds: the per-item arrays, the output, then each item's elements */
    if ((a->alibi_slopes && a->slopes_len < a->nbatch) || (a->sinks && a->sinks_len < a->nbatch))
        return FA_ERR_ARG;
    if (a->nbatch > FA_REACH / a->L)
        return FA_ERR_ARG;
    rows = a->nbatch * a->L;
    if (weights ? !fa_in_span(a->out_span, 0, rows, a->S, 1, 0, a->S)
                : !a->o_off && (!fa_in_span(a->out_span, 0, rows, a->Dv, 1, 0, a->Dv)
                                || (with_lse && !fa_in_span(a->lse_span, 0, rows, 1, 1, 0, 1))))
        return FA_ERR_ARG;
    for (b = 0; b < a->nbatch; b++)
        if (!item_in_bounds(a, b, weights, with_lse))
            return FA_ERR_ARG;
    if (a->block_table && a->S > 0) { /* every page a row j < S lies in exists */
        const int64_t pages = (a->S + a->block_size - 1) / a->block_size;
        int64_t p;
        for (b = 0; b < a->nbatch; b++)
            for (p = 0; p < pages; p++) {
                const int64_t pg = a->block_table[a->bt_off[b] + p];
                if (pg < 0 || pg >= a->num_pages)
                    return FA_ERR_ARG;
            }
    }
    return FA_OK;
}

/* The geometry of the work units (see fa_unit): query tile t is rows
 * [t nq, (t + 1) nq), or with cuts [qcut[t], qcut[t + 1]) (at most nq rows);
 * a unit holds at most bq rows. */
typedef struct {
    int64_t G, kvh, nh, nhs, nq, nqt, nunits, bq;
    const int64_t *qcut;
} fa_units;

/* 1 if batch item b's k and v rows lie within those of item c (the same key
 * row holds both heads: a (B, S, H, D) cache), on the same pages. */
static int shares_rows(const fa_attn_args *a, int64_t b, int64_t c)
{
    const int64_t dk = a->k_off[b] - a->k_off[c], dv = a->v_off[b] - a->v_off[c];
    return dk > -a->k_rs && dk < a->k_rs && dv > -a->v_rs && dv < a->v_rs
           && (!a->block_table || a->bt_off[b] == a->bt_off[c]);
}

/* Decoding (a GQA group's query rows fit the few-rows kernels) from k and v
 * whose kv heads share their rows: how many consecutive groups of G items
 * (each sharing its k and v) read the same rows, if the whole batch is made
 * of such runs (at most FA_BQ_IN_PLACE rows in all); else 1. A unit of
 * those groups reads each key tile's rows for all of them, where separate
 * units would each read a fraction of every row, one row per memory page. */
static int64_t row_groups(const fa_attn_args *a, int64_t G)
{
    int64_t m = 1, b, i;
    if (a->L * G > FA_FEW_ROWS || a->Dv <= 0 || a->Dv % FA_NR != 0 || a->S <= 0
        || (a->k_rs == a->D && a->v_rs == a->Dv))
        return 1;
    while ((m + 1) * G <= a->nbatch && (m + 1) * G * a->L <= FA_BQ_IN_PLACE
           && shares_rows(a, m * G, 0))
        m++;
    if (m == 1 || a->nbatch % (m * G) != 0)
        return 1;
    for (b = 0; b < a->nbatch; b += m * G)
        for (i = 1; i < m; i++)
            if (!shares_rows(a, b + i * G, b))
                return 1;
    return m;
}

/*
 * Query tiles split where documents start (segment ids, the same for every
 * batch item, non-decreasing along L for the queries and, as seg_sorted
 * promises, for the keys): a tile of rows from two documents walks the keys
 * of both for all of its rows. Each tile [t nq, (t + 1) nq) is cut at the
 * rows where a document starts, leaving pieces of at least DOC_MIN_ROWS rows
 * (shorter documents share a piece); the tiles keep their places, so a
 * piece's rows meet the key tiles as before. A row's arithmetic does not
 * depend on the rows that share its unit: the bits are the same. Fills
 * cut[0..nqt] and returns nqt, or 0 where the tiles stay as they are (cut:
 * room for L + 1).
 */
#define DOC_MIN_ROWS 16
/* The room doc_tiles may fill for a: L + 1, or 0 where it never cuts. */
static int64_t doc_tiles_room(const fa_attn_args *a)
{
    return a->seg_q && a->seg_sorted && a->L > 0 ? a->L + 1 : 0;
}

static int64_t doc_tiles(const fa_attn_args *a, int64_t nq, int64_t *cut)
{
    const int64_t *ids;
    const int64_t sl = a->seg_q_sl;
    int64_t b, i, s, t = 0;
    if (!a->seg_q || !a->seg_sorted || sl == 0 || a->nbatch <= 0 || a->L <= nq)
        return 0;
    for (b = 1; b < a->nbatch; b++)
        if (a->seg_q_off[b] != a->seg_q_off[0])
            return 0;
    ids = a->seg_q + a->seg_q_off[0];
    for (i = 1; i < a->L; i++)
        if (ids[i * sl] < ids[(i - 1) * sl])
            return 0;
    cut[0] = 0;
    for (s = 0; s < a->L; s += nq) {
        const int64_t e = s + nq < a->L ? s + nq : a->L;
        for (i = s + DOC_MIN_ROWS; i <= e - DOC_MIN_ROWS; i++)
            if (ids[i * sl] != ids[(i - 1) * sl] && i - cut[t] >= DOC_MIN_ROWS)
                cut[++t] = i; /* a document starts at row i */
        cut[++t] = e;
    }
    return t;
}

/* 1 if units of FA_BQ rather than FA_BQ_IN_PLACE rows pay where the values
 * are read in place: every row sees every key (no is_causal, no window), one
 * kv head's k and v rows (S (D + Dv) elements) take more than half of a
 * core's level-2 cache, so that each unit reads them again from the level
 * below, and FA_BQ rows still leave 8 units a thread. A unit reads k and v
 * once for its rows, so twice the rows halve that traffic (on the 2-core
 * Intel Xeon of docs/performance.rst, L = S = 4096, D = 128, 8 heads: 1.047x;
 * L = S = 2048: 1.028x; causal calls gained nothing, short ones lost up to
 * 1.5 %). The unit's size does not change any row's arithmetic. */
static int wide_units(const fa_attn_args *a, int64_t G, int threads)
{
    const int64_t kv_bytes = a->S * (row_units(a->k_dtype, a->D) * fa_dtype_unit(a->k_dtype)
                                     + row_units(a->v_dtype, a->Dv) * fa_dtype_unit(a->v_dtype));
    const int64_t nq = FA_BQ / (G < FA_BQ ? G : FA_BQ);
    if (a->is_causal || a->win_left >= 0 || a->win_right >= 0 || a->S <= 0)
        return 0;
    if ((a->nbatch / G) * ((a->L + nq - 1) / nq) < 8 * (int64_t)threads)
        return 0;
    return kv_bytes > fa_l2_cache_bytes() / 2;
}

/* The units of a: groups of G items (several kv heads' groups, rows: see
 * row_groups) cut into slices of nh heads and tiles of nq query rows (a
 * unit holds at most bq rows: FA_BQ where its value tiles are copied, see
 * fa_v_in_place). threads: the threads to feed, to let a unit hold several
 * kv heads (the SDPA kernel: as many as leave at least two work items,
 * units times key chunks, a thread), or 0 for one kv head a unit (the
 * weights). cut: room for doc_tiles (doc_tiles_room(a)), or NULL. */
static fa_units unit_geometry(const fa_attn_args *a, int threads, int64_t *cut)
{
    fa_units g;
    g.G = a->nbatch > 0 ? kv_group(a) : 1;
    g.kvh = g.G;
    if (threads > 0 && a->nbatch > 0 && a->L > 0) {
        const int64_t chunks = (a->S + FA_CK - 1) / FA_CK;
        int64_t m = row_groups(a, g.G), m2;
        while (m > 1 && threads > 1 && a->nbatch / (g.G * m) * chunks < 2 * (int64_t)threads) {
            for (m2 = m - 1; m % m2 != 0; m2--) /* the next divisor of m down */
                ;
            m = m2;
        }
        g.G *= m;
    }
    g.bq = threads > 0 && a->L * g.G > FA_FEW_ROWS && a->Dv > 0
                   && (!fa_v_in_place(a->v_dtype, a->v_rs, a->Dv) || wide_units(a, g.G, threads))
               ? FA_BQ : FA_BQ_IN_PLACE;       /* (not decoding, nor the weights) */
    g.nh = g.G < g.bq ? g.G : g.bq;            /* heads per unit */
    g.nhs = (g.G + g.nh - 1) / g.nh;           /* head slices per group */
    g.nq = g.bq / g.nh;                        /* query rows per head */
    g.nq = a->L < g.nq ? (a->L > 0 ? a->L : 1) : g.nq;
    g.nqt = (a->L + g.nq - 1) / g.nq;          /* query tiles */
    g.qcut = NULL;
    if (cut) {
        const int64_t nqt = doc_tiles(a, g.nq, cut);
        if (nqt > 0) {
            g.nqt = nqt;
            g.qcut = cut;
        }
    }
    g.nunits = a->L > 0 ? (a->nbatch / g.G) * g.nhs * g.nqt : 0;
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
    u.kvh = g->kvh < g->G ? g->kvh : u.nh; /* (a unit of several kv heads holds them all) */
    if (g->qcut) {
        u.i0 = g->qcut[qt];
        u.nq = g->qcut[qt + 1] - u.i0;
    } else {
        u.i0 = qt * g->nq;
        u.nq = a->L - u.i0 < g->nq ? a->L - u.i0 : g->nq;
    }
    u.chunk = chunk;
    return u;
}

/* The keys [*lo, *hi) that some row of unit u may see (causal and window
 * bounds; a superset of the rows' own bounds). */
static void unit_keys(const fa_attn_args *a, const fa_unit *u, int64_t *lo, int64_t *hi)
{
    const int64_t p_first = u->i0 + a->S - a->L, p_last = p_first + u->nq - 1;
    int64_t l = 0, h = a->S;
    if (a->is_causal && p_last + 1 < h)
        h = p_last + 1;
    if (a->win_right >= 0 && p_last + a->win_right + 1 < h)
        h = p_last + a->win_right + 1;
    if (a->win_left >= 0 && p_first - a->win_left > l)
        l = p_first - a->win_left;
    *lo = l;
    *hi = h > l ? h : l;
}

/*
 * The end of a float key-padding mask's span [l, h) of item b (a mask row
 * shared by the queries) without its trailing keys whose weights are exact
 * zeros in every row of unit u that may see them: h, or c where the keys [c,
 * h) all carry values so far below the row's largest, mk, that no score can
 * bring them within reach of the row's maximum (Hugging Face's padding,
 * finfo(float32).min where a key is padded, and 0 elsewhere). Such a key's
 * weight exp(s + M - m) is 0 in float32, its product with a finite value is
 * a zero, and sums from +0 that leave out trailing zero terms are the same
 * sums: the bits of the whole range. What that takes, checked here:
 * - every row that sees a key of [c, h) also sees the key of mk (jk < c):
 *   each row's keys start at l (no window's left side, no segment ids);
 *   only the keys of [c, h) that some row of the unit may see (causal and
 *   window bounds: unit_keys; a split unit's chunk: its keys) are looked
 *   at, and none where no row does; units of fewer than 16 rows an item
 *   (decoding) keep the keys, whose reading would cost what computing them
 *   does;
 * - a bound on every score |s| that those keys and jk can have
 *   (scale D max|q| max|k| over the unit's rows of item b and those keys,
 *   doubled for the rounding and the kernels' move to base 2; a soft cap's
 *   twice c), with the unscaled product D max|q| max|k| also finite in
 *   float32 (scale 0 times an overflowed product is NaN), and finite q
 *   rows, key rows and value rows (a NaN or an infinity there reaches the
 *   result through a zero weight, 0 x inf);
 * - the tail's largest value mt, with the bound on both sides (ALiBi's bias
 *   in it: at most slope (L + S) apart between any two keys of a row) and
 *   float32's rounding of s + M, more than 1024 below mk.
 * A row whose keys are all at finfo.min keeps them (they weigh equally).
 */
int64_t fa_zero_tail(const fa_attn_args *a, const fa_unit *u, int64_t b, int64_t l, int64_t h,
                     fa_max_abs_fn max_abs)
{
    const float *mrow = a->float_mask + a->mask_off[b];
    const int64_t ms = a->mask_ss, D = a->D;
    float mk = -INFINITY, mt = -INFINITY;
    float qmax = 0.0f, kmax = 0.0f;
    double dot, bound;
    int64_t i, j, jk = l, c, s0, e, lo_u, hi_u;
    if (a->win_left >= 0 || a->seg_q || h <= l || u->nq < 16)
        return h;
    for (j = l; j < h; j++) {
        const float x = mrow[j * ms];
        if (x != x)
            return h;
        if (x > mk) {
            mk = x;
            jk = j;
        }
    }
    if (!(mk > -INFINITY && mk < INFINITY))
        return h;
    for (c = h; c > l && mrow[(c - 1) * ms] < mk - 1024.0f; c--)
        mt = mrow[(c - 1) * ms] > mt ? mrow[(c - 1) * ms] : mt;
    unit_keys(a, u, &lo_u, &hi_u);
    if (u->chunk >= 0) { /* (a unit split over threads: this chunk's keys) */
        lo_u = u->chunk * FA_CK > lo_u ? u->chunk * FA_CK : lo_u;
        hi_u = (u->chunk + 1) * FA_CK < hi_u ? (u->chunk + 1) * FA_CK : hi_u;
    }
    s0 = c > lo_u ? c : lo_u;
    e = hi_u < h ? hi_u : h; /* the tail's keys [s0, e) that the unit may see */
    if (s0 >= e)
        return h;
    for (i = u->i0; i < u->i0 + u->nq; i++) { /* the unit's rows of item b */
        const float x = max_abs(a->q + a->q_off[b] + i * a->q_rs, FA_DTYPE_F32, D);
        qmax = x > qmax ? x : qmax;
    }
    for (j = s0 - 1; j < e; j++) { /* (j = s0 - 1: the key of mk first) */
        const float x = max_abs(fa_kv_tile(a, b, 0, j == s0 - 1 ? jk : j), a->k_dtype, D);
        kmax = x > kmax ? x : kmax;
        if (j >= s0 && a->Dv > 0
            && max_abs(fa_kv_tile(a, b, 1, j), a->v_dtype, a->Dv) == INFINITY)
            return h;
    }
    dot = 2.0 * (double)D * (double)qmax * (double)kmax;
    /* (q . k may overflow before it is scaled: inf x 0; a row that is not
     * finite makes dot inf or NaN) */
    if (!(dot < (double)FLT_MAX))
        return h;
    bound = fabs((double)a->scale) * dot;
    if (a->softcap > 0.0f && bound > 2.0 * (double)a->softcap)
        bound = 2.0 * (double)a->softcap;
    if (a->alibi_slopes) /* its bias, -slope |p - j|, lies in [-slope (L + S), 0] */
        bound += fabs((double)a->alibi_slopes[b])
                 * ((double)a->L + (double)a->S + fabs((double)a->alibi_shift));
    if (!((double)mt + fabs((double)mt) * 0x1p-20 + 2.0 * bound + 1024.0
          < (double)mk - fabs((double)mk) * 0x1p-20))
        return h;
    return c;
}

/*
 * The thread policy, one for every operation: the work of one or more
 * problems (an SDPA or weights call; the sequences of a packed batch), each
 * a fa_attn_args with its own units, goes into one list of work items that
 * the threads take in order (dynamically). An item is a unit, or, for a unit
 * that holds too large a share of the work for the threads to end together
 * (decoding: one query row per head), one key chunk of a run of such units
 * of the same problem, each into its own partial; the partials are folded
 * in chunk order afterwards, with the bits of the whole unit.
 *
 * Order: the problems by their cost, the biggest first (stable); within a
 * problem, its units in unit_at order (the units of one head slice
 * together, the last query tiles first), which is the order of a separate
 * call on that problem; split units' chunks chunk by chunk across the units
 * of a run, so that one thread reads the rows of several heads at the same
 * keys (in a (B, S, H, D) layout they share memory pages).
 */
typedef struct {
    const fa_attn_args *a;
    fa_units g;
    double cost;   /* the sum of its units' costs */
    int64_t index; /* its place in the caller's list (ties in the order) */
    unsigned char *vflag; /* its value tiles' record (fa_scratch's vflag), or NULL */
    int64_t vflag_nt;     /* key tiles per batch item in it */
} fa_problem;

/* Units [n, n_end) of problem p: unit n whole (chunk < 0, n_end = n + 1), or
 * key chunk `chunk` of each, into partial slots slot + (n' - n) span +
 * (chunk - c_lo), span = c_hi - c_lo (nrmax rows each). */
typedef struct {
    int64_t p, n, n_end, chunk, c_lo, c_hi, slot;
} fa_item;

typedef struct {
    const fa_problem *pr;
    int64_t nprob;
    int64_t *qcuts; /* the problems' document tiles (fa_units' qcut), one allocation */
    fa_item *items; /* nitems work items, then nfold fold items (split runs) */
    int64_t nitems, nfold;
    int64_t nrmax, Dvp; /* partials: rows per slot (the largest unit), floats per row */
    int64_t bq;         /* the scratch's rows: the largest of the problems' bq */
    float *pm, *pacc;
    double *pl;
    unsigned char *vflags; /* the problems' value-tile records, one allocation */
} fa_plan;

/* Rows of unit u times the keys they may see: its cost. */
static double unit_cost(const fa_attn_args *a, const fa_unit *u)
{
    int64_t lo, hi;
    unit_keys(a, u, &lo, &hi);
    return (double)(u->nh * u->nq) * (double)(hi - lo) + 1.0;
}

/* 1 if unit u (of cost c, out of `total`) is to be split into its key
 * chunks: it holds more than 1/(4 nt_max) of the work (nt_max threads at
 * most), or it has few rows (decoding) and the rows of k or v lie apart (a
 * (B, S, H, D) layout: a run of such units then reads, chunk by chunk, the
 * rows of several heads that share memory pages, where the hardware
 * prefetchers would fetch the neighbouring heads' rows for nothing). */
static int split_unit(const fa_attn_args *a, const fa_unit *u, double c, double total,
                      int nt_max)
{
    if (nt_max >= 2 && c * 4.0 * (double)nt_max > total)
        return 1;
    return u->kvh * u->nq <= FA_FEW_ROWS && (a->k_rs != a->D || (a->Dv > 0 && a->v_rs != a->Dv));
}

static int problem_cmp(const void *x, const void *y)
{
    const fa_problem *p = (const fa_problem *)x, *q = (const fa_problem *)y;
    if (p->cost != q->cost)
        return p->cost > q->cost ? -1 : 1;
    return p->index < q->index ? -1 : (p->index > q->index ? 1 : 0);
}

static void plan_free(fa_plan *pl)
{
    free((void *)pl->pr);
    free(pl->items);
    free(pl->pm);
    free(pl->pl);
    free(pl->pacc);
    free(pl->vflags);
    free(pl->qcuts);
}


/* The key tiles per batch item of a's value-tile record (fa_scratch's
 * vflag), or 0 where it has none: it pays where values are read in place
 * (fa_v_in_place; only v_tile's in-place reads consult it) by more than one
 * unit (each unit then checks a tile the first unit has checked). */
static int64_t vflag_tiles(const fa_attn_args *a, const fa_units *g)
{
    if (a->Dv <= 0 || !fa_v_in_place(a->v_dtype, a->v_rs, a->Dv) || a->S <= 0
        || g->nunits <= a->nbatch / g->G)
        return 0;
    return (a->S + FA_BK - 1) / FA_BK;
}

/* The plan for problems a[0..nprob) (each checked by check_args); split: 0
 * for whole units only (weights). *nt: the threads to use. */
static int plan_build(const fa_attn_args *a, int64_t nprob, int split, int nthreads,
                      fa_plan *pl, int *nt)
{
    fa_problem *pr;
    double work = 0.0, reads = 0.0, total = 0.0, budget = FA_MAX_PARTIAL;
    int64_t p, n, m, nunits = 0, nitems = 0, nfold = 0, nslots = 0, cap;
    int nt_max;
    memset(pl, 0, sizeof *pl);
    pl->Dvp = nprob > 0 ? (a[0].Dv + FA_NR - 1) / FA_NR * FA_NR : 0;
    if ((uint64_t)nprob > SIZE_MAX / sizeof(fa_problem))
        return FA_ERR_NOMEM;
    pr = (fa_problem *)malloc((size_t)nprob * sizeof *pr + 1);
    if (!pr)
        return FA_ERR_NOMEM;
    pl->pr = pr;
    { /* the document tiles of the problems with sorted segment ids */
        size_t ncut = 0;
        for (p = 0; p < nprob; p++)
            ncut += (size_t)doc_tiles_room(&a[p]);
        if (ncut > 0 && !(pl->qcuts = (int64_t *)malloc(ncut * sizeof(int64_t))))
            return FA_ERR_NOMEM;
        for (ncut = 0, p = 0; p < nprob; p++) {
            pr[p].g = unit_geometry(&a[p], split ? nthreads : 0,
                                    doc_tiles_room(&a[p]) > 0 ? pl->qcuts + ncut : NULL);
            ncut += (size_t)doc_tiles_room(&a[p]);
        }
    }
    for (p = 0; p < nprob; p++) {
        const fa_attn_args *q = &a[p];
        pr[p].a = q;
        pr[p].index = p;
        pr[p].cost = 0.0;
        pr[p].vflag = NULL;
        pr[p].vflag_nt = 0;
        for (n = 0; n < pr[p].g.nunits; n++) {
            const fa_unit u = unit_at(q, &pr[p].g, n, -1);
            int64_t lo, hi;
            pr[p].cost += unit_cost(q, &u);
            unit_keys(q, &u, &lo, &hi);
            reads += (double)((u.nh + u.kvh - 1) / u.kvh) * (double)(hi - lo)
                     * (double)(q->D + q->Dv); /* (its kv heads: at least one) */
        }
        nunits += pr[p].g.nunits;
        total += pr[p].cost;
        if (pr[p].g.nunits > 0)
            work += (double)q->nbatch * (double)q->L * (double)(q->S > 0 ? q->S : 1)
                    * (double)(q->D + q->Dv);
        if (pr[p].g.nh * pr[p].g.nq > pl->nrmax)
            pl->nrmax = pr[p].g.nh * pr[p].g.nq;
        if (pr[p].g.bq > pl->bq)
            pl->bq = pr[p].g.bq;
    }
    qsort(pr, (size_t)nprob, sizeof *pr, problem_cmp);
    pl->nprob = nprob;
    work += FA_KEY_READ_WORK * reads;
    *nt = fa_threads_for(nthreads, work, nunits);
    /* the threads there would be if the units were cut small enough */
    nt_max = fa_threads_for(nthreads, work, INT64_MAX / 2);
    /* a unit is split when it holds more than 1/(4 nt_max) of the work (and
     * its keys span more than one chunk), while the partials fit the budget */
    cap = 0;
    if (split && pl->nrmax > 0) {
        const double per = (double)pl->nrmax * ((double)pl->Dvp * 4.0 + 12.0);
        cap = budget / per < (double)nunits * 1024.0 ? (int64_t)(budget / per)
                                                      : nunits * (int64_t)1024;
    }
    /* count: pass 0 sizes the lists, pass 1 fills them */
    for (m = 0; m < 2; m++) {
        int64_t ni = 0, nf = 0, slots = 0;
        for (p = 0; p < nprob; p++) {
            const fa_attn_args *q = pr[p].a;
            const fa_units *g = &pr[p].g;
            for (n = 0; n < g->nunits;) {
                const fa_unit u = unit_at(q, g, n, -1);
                const double c = unit_cost(q, &u);
                int64_t lo, hi, c_lo, c_hi, n_end, run, c2;
                unit_keys(q, &u, &lo, &hi);
                c_lo = lo / FA_CK;
                c_hi = (hi + FA_CK - 1) / FA_CK;
                if (c_hi - c_lo < 2 || !split_unit(q, &u, c, total, nt_max)
                    || slots + (c_hi - c_lo) > cap) {
                    if (m) {
                        fa_item *it = &pl->items[ni];
                        it->p = p;
                        it->n = n;
                        it->n_end = n + 1;
                        it->chunk = -1;
                        it->c_lo = it->c_hi = it->slot = 0;
                    }
                    ni++;
                    n++;
                    continue;
                }
                /* a run: the following units of this problem with the same
                 * key chunks, split alike */
                for (n_end = n + 1; n_end < g->nunits; n_end++) {
                    const fa_unit v = unit_at(q, g, n_end, -1);
                    int64_t lo2, hi2;
                    unit_keys(q, &v, &lo2, &hi2);
                    if (lo2 / FA_CK != c_lo || (hi2 + FA_CK - 1) / FA_CK != c_hi
                        || !split_unit(q, &v, unit_cost(q, &v), total, nt_max)
                        || slots + (n_end - n + 1) * (c_hi - c_lo) > cap)
                        break;
                }
                run = n_end - n;
                /* runs of at most 8 units: enough items for the threads */
                if (run > 8)
                    n_end = n + (run = 8);
                for (c2 = c_lo; c2 < c_hi; c2++) {
                    if (m) {
                        fa_item *it = &pl->items[ni];
                        it->p = p;
                        it->n = n;
                        it->n_end = n_end;
                        it->chunk = c2;
                        it->c_lo = c_lo;
                        it->c_hi = c_hi;
                        it->slot = slots;
                    }
                    ni++;
                }
                if (m) {
                    fa_item *f = &pl->items[pl->nitems + nf];
                    f->p = p;
                    f->n = n;
                    f->n_end = n_end;
                    f->chunk = -1;
                    f->c_lo = c_lo;
                    f->c_hi = c_hi;
                    f->slot = slots;
                }
                nf++;
                slots += run * (c_hi - c_lo);
                n = n_end;
            }
        }
        if (!m) {
            nitems = ni;
            nfold = nf;
            nslots = slots;
            pl->items = (fa_item *)malloc((size_t)(nitems + nfold) * sizeof(fa_item) + 1);
            if (!pl->items)
                return FA_ERR_NOMEM;
            pl->nitems = nitems;
            pl->nfold = nfold;
        }
    }
    if (nslots > 0) {
        const size_t rows = (size_t)(nslots * pl->nrmax);
        pl->pm = (float *)malloc(rows * sizeof(float));
        pl->pl = (double *)malloc(rows * sizeof(double));
        pl->pacc = (float *)malloc(rows * (size_t)pl->Dvp * sizeof(float) + sizeof(float));
        if (!pl->pm || !pl->pl || !pl->pacc)
            return FA_ERR_NOMEM;
    }
    { /* the value-tile records */
        size_t nflags = 0;
        for (p = 0; p < nprob; p++) {
            /* (records of at most 16 MiB in all: a tile of 64 keys a byte) */
            const uint64_t nt_p = (uint64_t)vflag_tiles(pr[p].a, &pr[p].g);
            pr[p].vflag_nt = nt_p * (uint64_t)pr[p].a->nbatch <= ((uint64_t)1 << 24) - nflags
                                 ? (int64_t)nt_p : 0;
            nflags += (size_t)(pr[p].vflag_nt * pr[p].a->nbatch);
        }
        if (nflags > 0) {
            pl->vflags = (unsigned char *)calloc(nflags, 1);
            if (!pl->vflags)
                return FA_ERR_NOMEM;
        }
        for (nflags = 0, p = 0; p < nprob; p++) {
            pr[p].vflag = pr[p].vflag_nt > 0 ? pl->vflags + nflags : NULL;
            nflags += (size_t)(pr[p].vflag_nt * pr[p].a->nbatch);
        }
    }
    if (nfold > 0) /* split units: threads for the chunks */
        *nt = fa_threads_for(nthreads, work, nitems);
    return FA_OK;
}

/* The outputs of a call: SDPA's out and lse, or the weights. */
typedef struct {
    float *out, *lse, *weights;
} fa_outputs;

/*
 * An operation over work units, one row of the op table: its unit (the
 * variant's driver, driver.inc, through the kernel table) and, where its
 * units may be split into key chunks (splits = 1), its fold, which combines a
 * split unit's partials (nchunks of them, in chunk order) into the outputs.
 * The thread policy (plan_build, plan_run) is the same for every operation.
 */
typedef struct {
    const char *name;
    int splits;
    void (*unit)(const fa_kernel_table *k, const fa_attn_args *a, const fa_unit *u,
                 const fa_outputs *o, fa_scratch *w, const fa_partial *part);
    void (*fold)(const fa_kernel_table *k, const fa_attn_args *a, const fa_unit *u,
                 const fa_plan *pl, int64_t slot, int64_t nchunks, const fa_outputs *o,
                 fa_scratch *w);
} fa_op;

static void sdpa_unit(const fa_kernel_table *k, const fa_attn_args *a, const fa_unit *u,
                      const fa_outputs *o, fa_scratch *w, const fa_partial *part)
{
    k->sdpa_unit(a, u, o->out, o->lse, w, part);
}

/* The partials of a split unit folded into the row totals (mt, lt, acct)
 * in chunk order, then its output rows and lse written from them. */
static void sdpa_fold(const fa_kernel_table *k, const fa_attn_args *a, const fa_unit *u,
                      const fa_plan *pl, int64_t slot, int64_t nchunks, const fa_outputs *o,
                      fa_scratch *w)
{
    const int64_t nr = u->nh * u->nq, nrmax = pl->nrmax, Dvp = pl->Dvp;
    int64_t r, c;
    for (r = 0; r < nr; r++) {
        w->mt[r] = -INFINITY;
        w->lt[r] = 0.0;
    }
    for (c = 0; c < nchunks; c++)
        k->merge_chunk(nr, Dvp, pl->pm + (slot + c) * nrmax, pl->pl + (slot + c) * nrmax,
                       pl->pacc + (slot + c) * nrmax * Dvp, w->mt, w->lt, w->acct);
    k->finish_rows(a, u, Dvp, w->mt, w->lt, w->acct, o->out, o->lse);
}

static void weights_unit(const fa_kernel_table *k, const fa_attn_args *a, const fa_unit *u,
                         const fa_outputs *o, fa_scratch *w, const fa_partial *part)
{
    (void)part; /* (never split) */
    k->weights_unit(a, u, o->weights, w);
}

static const fa_op fa_op_sdpa = {"sdpa", 1, sdpa_unit, sdpa_fold};
static const fa_op fa_op_weights = {"weights", 0, weights_unit, NULL};

/* Runs operation op over the plan's items, nt threads. */
static int plan_run(const fa_plan *pl, const fa_op *op, const fa_outputs *o, int nt)
{
    const fa_kernel_table *kern = fa_active_kernels();
    const int64_t nrmax = pl->nrmax, Dvp = pl->Dvp;
    const double start = nt > 1 ? fa_now() : 0.0;
    double last = start; /* when the last thread arrived (the thread policy's record) */
    int status = FA_OK;
    if (pl->nitems == 0)
        return FA_OK;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
    {
        fa_scratch w;
        int64_t t, n;
        int ok;
        if (nt > 1) {
            const double now = fa_now();
#ifdef _OPENMP
#pragma omp critical(fastattn_arrival)
#endif
            if (now > last)
                last = now;
        }
        ok = scratch_alloc(&w, pl->pr[0].a->D, pl->pr[0].a->Dv, pl->bq) == FA_OK;
        if (!ok) {
#ifdef _OPENMP
#pragma omp critical(fastattn_status)
#endif
            status = FA_ERR_NOMEM;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (t = 0; t < pl->nitems; t++) {
            const fa_item *it = &pl->items[t];
            const fa_problem *p = &pl->pr[it->p];
            if (!ok)
                continue;
            w.vflag = p->vflag;
            w.vflag_nt = p->vflag_nt;
            for (n = it->n; n < it->n_end; n++) {
                const fa_unit u = unit_at(p->a, &p->g, n, it->chunk);
                if (it->chunk >= 0) {
                    const int64_t s = it->slot + (n - it->n) * (it->c_hi - it->c_lo)
                                      + (it->chunk - it->c_lo);
                    fa_partial part;
                    part.m = pl->pm + s * nrmax;
                    part.l = pl->pl + s * nrmax;
                    part.acc = pl->pacc + s * nrmax * Dvp;
                    op->unit(kern, p->a, &u, o, &w, &part);
                } else {
                    op->unit(kern, p->a, &u, o, &w, NULL);
                }
            }
        }
        if (pl->nfold > 0) { /* each split unit: its partials folded in chunk order */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (t = 0; t < pl->nfold; t++) {
                const fa_item *f = &pl->items[pl->nitems + t];
                const fa_problem *p = &pl->pr[f->p];
                if (!ok || status != FA_OK)
                    continue; /* (a thread without memory left partials unwritten) */
                for (n = f->n; n < f->n_end; n++) {
                    const fa_unit u = unit_at(p->a, &p->g, n, -1);
                    op->fold(kern, p->a, &u, pl, f->slot + (n - f->n) * (f->c_hi - f->c_lo),
                             f->c_hi - f->c_lo, o, &w);
                }
            }
        }
        if (ok)
            scratch_free(&w);
    }
    if (nt > 1)
        fa_note_wait(start, last - start, nt);
    return status;
}

/* Plans and runs operation op over problems a[0..nprob). */
static int run_problems(const fa_attn_args *a, int64_t nprob, const fa_op *op, float *out,
                        float *lse, float *weights, int nthreads)
{
    fa_plan pl;
    fa_outputs o;
    int nt = 1;
    int status = plan_build(a, nprob, op->splits, nthreads, &pl, &nt);
    o.out = out;
    o.lse = lse;
    o.weights = weights;
    if (status == FA_OK)
        status = plan_run(&pl, op, &o, nt);
    plan_free(&pl);
    return status;
}

int fa_sdpa_f32(const fa_attn_args *a, float *out, float *lse, int nthreads)
{
    int status = fa_check_args(a, nthreads, 0, lse != NULL);
    if (status != FA_OK)
        return status;
    if (!out && a->nbatch > 0 && a->L > 0 && a->Dv > 0)
        return FA_ERR_ARG;
    if (a->Dv == 0 && !lse)
        return FA_OK; /* nothing to write */
    return run_problems(a, 1, &fa_op_sdpa, out, lse, NULL, nthreads);
}

int fa_attention_weights_f32(const fa_attn_args *a, float *weights, int nthreads)
{
    fa_attn_args w;
    int status;
    if (!a)
        return FA_ERR_ARG;
    /* The weights read no values: v may be NULL (then v_off too, and Dv 0).
     * The kernels then see k's description in v's place, never read. */
    w = *a;
    if (!w.v && !w.v_off) {
        if (w.Dv != 0)
            return FA_ERR_ARG;
        w.v = w.k;
        w.v_off = w.k_off;
        w.v_rs = w.k_rs;
        w.v_ps = w.k_ps;
        w.v_dtype = w.k_dtype;
    }
    status = fa_check_args(&w, nthreads, 1, 0);
    if (status != FA_OK)
        return status;
    if (w.S == 0)
        return FA_OK;
    if (!weights && w.nbatch > 0 && w.L > 0)
        return FA_ERR_ARG;
    return run_problems(&w, 1, &fa_op_weights, NULL, NULL, weights, nthreads);
}

int fa_check_cu_seqlens(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                        const int64_t *cu_k)
{
    int64_t s;
    if (!a || nseq < 0 || !cu_q || !cu_k || a->nbatch < 0)
        return FA_ERR_ARG;
    if (a->mask_kind != FA_MASK_NONE || a->seg_q || a->block_table || cu_q[0] != 0
        || cu_k[0] != 0)
        return FA_ERR_ARG;
    for (s = 0; s < nseq; s++)
        if (cu_q[s + 1] < cu_q[s] || cu_k[s + 1] < cu_k[s])
            return FA_ERR_ARG;
    if (nseq > 0 && a->nbatch > 0 && cu_q[nseq] > 0
        && (!a->o_off || !a->lse_off
            || (uint64_t)nseq > (uint64_t)(SIZE_MAX / sizeof(fa_attn_args)) / (uint64_t)a->nbatch))
        return FA_ERR_ARG;
    return FA_OK;
}

void fa_varlen_sequence(const fa_attn_args *a, const int64_t *cu_q, const int64_t *cu_k,
                        int64_t s, fa_attn_args *q)
{
    const int64_t at = s * a->nbatch; /* the first of its (row, head) items */
    *q = *a;
    q->L = cu_q[s + 1] - cu_q[s];
    q->S = cu_k[s + 1] - cu_k[s];
    q->q_off = a->q_off + at;
    q->k_off = a->k_off + at;
    q->v_off = a->v_off + at;
    q->o_off = a->o_off + at;
    q->lse_off = a->lse_off + at;
    q->alibi_slopes = a->alibi_slopes ? a->alibi_slopes + at : NULL;
    q->slopes_len = a->alibi_slopes ? a->slopes_len - at : 0;
    q->sinks = a->sinks ? a->sinks + at : NULL;
    q->sinks_len = a->sinks ? a->sinks_len - at : 0;
}

int fa_varlen_f32(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                  const int64_t *cu_k, float *out, float *lse, int nthreads)
{
    fa_attn_args *sa = NULL;
    int64_t s;
    int status = fa_check_cu_seqlens(a, nseq, cu_q, cu_k);
    if (status != FA_OK || nthreads < 1)
        return FA_ERR_ARG;
    if (nseq == 0 || a->nbatch == 0 || cu_q[nseq] == 0)
        return FA_OK;
    if (a->Dv > 0 && !out)
        return FA_ERR_ARG;
    sa = (fa_attn_args *)malloc((size_t)nseq * sizeof *sa);
    if (!sa)
        return FA_ERR_NOMEM;
    for (s = 0; s < nseq && status == FA_OK; s++) { /* sequence s alone, as fa_sdpa_f32 sees it */
        fa_varlen_sequence(a, cu_q, cu_k, s, &sa[s]);
        status = fa_check_args(&sa[s], nthreads, 0, lse != NULL);
    }
    if (status == FA_OK)
        status = run_problems(sa, nseq, &fa_op_sdpa, out, lse, NULL, nthreads);
    free(sa);
    return status;
}
