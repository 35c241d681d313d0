/*
 * fa_kernels.h -- the per-SIMD-variant kernels and their run-time selection.
 *
 * Each variant of variants.def is one kernel file, csrc/kernels_<name>.c:
 * its micro-kernels (microkernels.h) and the unit driver (driver.inc)
 * compiled over them into a table of function pointers; dispatch.c picks one
 * table at import from the CPU's features (or FASTATTN_SIMD), and
 * rowwise.c and attention.c's op table call through it.
 */
#ifndef FA_KERNELS_H
#define FA_KERNELS_H

#include "fastattn.h"

#include <stdint.h>

/* x86-64 builds with gcc or clang also compile an AVX2+FMA variant (target
 * attributes); other compilers and architectures get the portable one. Not
 * clang-cl (clang with _MSC_VER): its immintrin.h leaves out the AVX types
 * unless the whole file is built with -mavx, and it does not link the
 * compiler-rt that __builtin_cpu_supports needs. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER) \
    && (defined(__x86_64__) || defined(__i386__))
#define FA_HAVE_X86_VARIANTS 1
#endif
/* aarch64 builds with gcc or clang (Linux, macOS) also compile the NEON
 * variant: Advanced SIMD is part of every AArch64 CPU, so it needs no target
 * attribute and no run-time test. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER) && defined(__aarch64__) \
    && defined(__ARM_NEON)
#define FA_HAVE_ARM64_VARIANTS 1
#endif

/* Query rows per attention work unit (multiples of every MR and of the
 * rows-as-lanes kernels' FA_QT_ROWS): FA_BQ_IN_PLACE where a unit reads its
 * value tiles in place, FA_BQ (the most, the scratch's rows) where it copies
 * each of them (fa_v_in_place in fa_internal.h) or where full rows read k
 * and v that overflow half of the level-2 cache (attention.c's wide_units
 * and unit_geometry). */
#define FA_BQ 192
#define FA_BQ_IN_PLACE 96
#define FA_BK FA_KEY_TILE /* keys per tile (fastattn.h: pages hold whole tiles) */
#define FA_NR 16 /* columns of a micro-kernel block: Dv is padded to it */
/* Keys per chunk (a multiple of FA_BK). A row's keys are reduced chunk by
 * chunk from key 0: an online softmax within a chunk, then the chunk's
 * (max, sum, accumulator) folded into the row's totals in chunk order. The
 * order depends on S alone, so a unit's chunks may run on different threads
 * (few query rows: decoding) with the same bits as one thread running them. */
#define FA_CK 1024
#define FA_MAX_MR 12 /* rows of a micro-kernel block, at most (each variant checks its FA_MR) */
/* A work unit of at most this many query rows (decoding: one row per head, or
 * the heads of one GQA group) takes the few-rows kernels: the same products,
 * read from k's and v's rows in place instead of packed tiles of FA_MR-row
 * blocks. */
#define FA_FEW_ROWS 8
/* Keys a step of a few-rows unit of several kv heads over interleaved rows
 * (op_sdpa.inc's sdpa_unit): a multiple of the AVX-512 score kernel's block
 * of 16 keys, which writes 16 columns, that divides FA_BK. */
#define FA_FEW_SUBK 16

/* Rows of one attention work unit: heads b0 .. b0+nh-1, query rows i0 ..
 * i0+nq-1 of each; row r is (b0 + r / nq, i0 + r % nq). Each run of kvh
 * heads from b0 on shares its k and v (kvh = nh, or, in decoding from a cache
 * whose kv heads share their rows, a (B, S, H, D) layout, the GQA group of
 * each of several kv heads: the unit then reads each key tile's rows for all
 * of its kv heads at once, in memory order). */
typedef struct {
    int64_t b0, nh, i0, nq;
    int64_t kvh;   /* heads per k and v (divides nh) */
    int64_t chunk; /* split work: the one key chunk to compute, into a partial */
} fa_unit;

/* One key chunk's result for the rows of a unit, when a unit's chunks are
 * split over threads: running max (natural units), sum, and Dvp accumulators per row. */
typedef struct {
    float *m;
    double *l;
    float *acc;
} fa_partial;

/* Per-thread working memory of the attention kernels (sizes in attention.c's scratch_alloc). */
typedef struct {
    int64_t Dvp;      /* Dv rounded up to FA_NR */
    int64_t bq;       /* the most rows of a unit (FA_BQ_IN_PLACE or FA_BQ), the
                       * rows of the buffers below; qt_tile's P^T in sc has its key
                       * rows bq floats apart */
    float *qpad;      /* bq x D       the unit's query rows, zero rows to a multiple of MR
                       * (row by row, or in MR-row blocks d by d: pack_rows) */
    float *kt;        /* D x FA_BK    the key tile, transposed, zero padded (qt_tile: a
                       * short tile's key rows as they are, zero rows after) */
    float *kq;        /* FA_BK x D    key rows of a block format, converted (unit_common.inc's
                       * kv_rows) */
    float *qt;        /* bq x D       the unit's query rows in blocks of FA_QT_LANES rows,
                       * d by d (a variant's rows-as-lanes kernels: qt_tile) */
    float *sc;        /* bq x FA_BK scores, then probabilities */
    float *vpad;      /* FA_BK x Dvp  the value tile, zero padded */
    float *tile;      /* bq x Dvp     one tile's P.V */
    float *acc;       /* bq x Dvp     running accumulators */
    float *m;         /* bq running maxima of the scores */
    float *alpha;     /* bq rescale factors of the current tile */
    float *tmax;      /* bq the rows' maxima with the current tile */
    double *l;        /* bq running sums */
    int64_t *lo, *hi; /* bq allowed key ranges */
    unsigned char *live; /* bq: row has an allowed key in the current tile */
    float *prow;      /* FA_MAX_MR x FA_BK one row's probabilities, zero padded */
    float *vrow;      /* FA_BK x Dvp  the value tile as one row weighs it */
    float *pvo;       /* FA_MAX_MR x FA_NR one micro-kernel block of that row's products */
    unsigned char *allow; /* bq x FA_BK: key allowed (score > -inf), kept for
                           * tiles whose value rows are not all finite */
    float *mt;        /* bq       the rows' totals over the chunks done: max, */
    double *lt;       /* bq       sum */
    float *acct;      /* bq x Dvp and accumulators */
    void *arena;      /* the one allocation that holds all of the above */
    /* Shared by the threads, set per work item (not part of the arena): the
     * call's record of which float32 value tiles are finite, vflag[b vflag_nt
     * + t] for batch item b, key tile t: 0 not yet known, 1 finite, 2 not (or
     * NULL: each unit checks its tiles). */
    unsigned char *vflag;
    int64_t vflag_nt;
} fa_scratch;

/* Rows of a query block of the backward's units (a multiple of every MR). */
#define FA_BWD_BQ 96
/* A row whose forward lse is this large in magnitude has its softmax's
 * normalizer recomputed (bwd_row_stats): exp(s - lse) from a float32 lse
 * has a relative error of |lse| 2**-24 (1.5e-5 at 256), and a row of
 * float32-min padding keeps nothing of log(S) in its lse at all. */
#define FA_BWD_LSE_EXACT 256.0f

/* The backward's rows (one block per problem, each nbatch x L floats): Delta
 * = rowsum(dout o out), then each row's P = exp(s - shift) inv: shift = lse
 * and inv = 1, or, for the rows of FA_BWD_LSE_EXACT, the row's maximum score
 * and the inverse of its sum of exp(s - max) (sinks included). */
typedef struct {
    float *delta, *shift, *inv;
} fa_bwd_rows;

/* Per-thread working memory of the backward's units (sizes in backward.c's
 * bwd_scratch_alloc). Dp, Dvp: D and Dv rounded up to FA_NR; ldp: the row
 * length of the tiles of scores (FA_BK rounded up to the variant's MR). */
typedef struct {
    int64_t Dp, Dvp;
    float *qt;        /* FA_BWD_BQ x Dp   a block's query rows, zero padded */
    float *dot;       /* FA_BWD_BQ x Dvp  their rows of dout, zero padded */
    float *kt;        /* D x FA_BK        the key tile, transposed (pack_kt) */
    float *vt;        /* Dv x FA_BK       the value tile, transposed */
    float *krow;      /* FA_BK x Dp       the key tile's rows, zero padded (dq's products) */
    float *p;         /* FA_BWD_BQ x ldp  scores, then weights P */
    float *ds;        /* FA_BWD_BQ x ldp  dout . v, then dS */
    float *raw;       /* FA_BWD_BQ x FA_BK  scale (q . k), for the soft cap's derivative */
    float *acc;       /* max(FA_BK + FA_MAX_MR, FA_BWD_BQ) x max(Dp, Dvp): dq; or dk ... */
    float *acc2;      /* ... and dv */
    float *ones;      /* FA_BK + FA_MAX_MR + FA_BWD_BQ ones: the products' alpha (C += A.B) */
    float *rshift, *rinv, *rdelta; /* FA_BWD_BQ: the block's rows' P = exp(s - shift) inv
                                    * (shift lse, inv 1, or fa_bwd_rows's), and Delta */
    int64_t *lo, *hi; /* FA_BWD_BQ allowed key ranges */
    unsigned char *live; /* FA_BWD_BQ: the row takes part in the current pair */
    unsigned char *bad;  /* FA_BWD_BQ: a row with an allowed key whose q or dout is not
                          * finite (its products are added apart: op_backward.inc) */
    int64_t nbad;
    void *arena;
} fa_bwd_scratch;

typedef struct {
    const char *name;
    /* One row of softmax (exp(x - m) stored in `out`, then scaled in place),
     * log_softmax or logsumexp (one float). next: the n floats this thread
     * reads next (or NULL), which a variant may prefetch while it computes. */
    void (*rowwise_row)(const float *x, float *out, int64_t n, int op, const float *next);
    /* part NULL: every chunk of the unit, output and lse written; else only
     * chunk u->chunk, its partial written to part. */
    void (*sdpa_unit)(const fa_attn_args *a, const fa_unit *u, float *out, float *lse,
                      fa_scratch *w, const fa_partial *part);
    void (*weights_unit)(const fa_attn_args *a, const fa_unit *u, float *weights,
                         fa_scratch *w);
    void (*exp_diff_array)(const float *x, float m, float *y, int64_t n);
    void (*exp2_array)(const float *x, float *y, int64_t n);
    void (*tanh_array)(const float *x, float *y, int64_t n);
    /* A chunk's partial (m, l, acc) of nr rows folded into the totals (M, L,
     * A); the rows' output and lse written from the totals (sdpa_unit's own
     * last steps, for the units split over threads). */
    void (*merge_chunk)(int64_t nr, int64_t Dvp, const float *m, const double *l,
                        const float *acc, float *M, double *L, float *A);
    void (*finish_rows)(const fa_attn_args *a, const fa_unit *u, int64_t Dvp, const float *M,
                        const double *L, const float *A, float *out, float *lse);
    /* The backward's units (op_backward.inc), over the rows' data r
     * (fa_bwd_rows): the shift and inv of the rows of query block t of
     * item b whose |lse| >= FA_BWD_LSE_EXACT; dk and dv of key tile t of
     * kv item c; dq of query block t (FA_BWD_BQ rows) of batch item b. */
    void (*bwd_row_stats)(const fa_attn_args *a, const fa_bwd_args *g, const fa_bwd_rows *r,
                          int64_t b, int64_t t, fa_bwd_scratch *w);
    void (*bwd_kv_unit)(const fa_attn_args *a, const fa_bwd_args *g, const fa_bwd_rows *r,
                        int64_t c, int64_t t, fa_bwd_scratch *w);
    void (*bwd_q_unit)(const fa_attn_args *a, const fa_bwd_args *g, const fa_bwd_rows *r,
                       int64_t b, int64_t t, fa_bwd_scratch *w);
    /* Both at once for every key tile of kv item c (five products a pair
     * instead of seven, the same bits): dq, the sums of its batch items'
     * rows, group x (L rounded up to FA_BWD_BQ) x Dp floats. */
    void (*bwd_head_unit)(const fa_attn_args *a, const fa_bwd_args *g, const fa_bwd_rows *r,
                          int64_t c, fa_bwd_scratch *w, float *dq);
} fa_kernel_table;

/* The largest magnitude among n elements of dtype dt, +inf if one is not
 * finite (each variant's, unit_common.inc). */
typedef float (*fa_max_abs_fn)(const void *p, int dt, int64_t n);

/* The end of item b's float key-padding span [l, h) for unit u without its
 * trailing keys of exact zero weight (attention.c; shared by the variants'
 * unit_bounds, which pass their max_abs). */
int64_t fa_zero_tail(const fa_attn_args *a, const fa_unit *u, int64_t b, int64_t l, int64_t h,
                     fa_max_abs_fn max_abs);

/* Each variant's table, fa_kernels_<name> (variants.def; declared for
 * every line, defined by the kernel files of the variants a build has). */
#define FA_VARIANT(name, arch, runs_here) extern const fa_kernel_table fa_kernels_##name;
#include "variants.def"
#undef FA_VARIANT

/* The table in use (selected on first use if fa_select_simd was not called). */
const fa_kernel_table *fa_active_kernels(void);

#endif /* FA_KERNELS_H */
