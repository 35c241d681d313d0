/*
 * fastattn.h -- the C contract of fastattn's kernels (the one header Cython sees).
 *
 * Every kernel works on float32 buffers (attention's k and v may also be float16
 * or bfloat16) described by int64 sizes and element offsets/strides, returns an int status (FA_OK or a negative FA_ERR_*),
 * never prints, aborts or touches Python, and frees everything it allocates.
 */
#ifndef FASTATTN_H
#define FASTATTN_H

#include "dtypes.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define FA_OK 0
#define FA_ERR_ARG (-1)      /* an argument is out of its domain */
#define FA_ERR_NOMEM (-2)    /* an allocation failed */
#define FA_ERR_INTERNAL (-3) /* a broken invariant: a bug */

/* Row-wise reductions of fa_rowwise_f32. */
#define FA_OP_SOFTMAX 0
#define FA_OP_LOG_SOFTMAX 1
#define FA_OP_LOGSUMEXP 2

/* Mask kinds of fa_attn_args. */
#define FA_MASK_NONE 0
#define FA_MASK_BOOL 1  /* uint8 0/1, 1 = may attend */
#define FA_MASK_FLOAT 2 /* float32 added to the scores; -inf masks */

/*
 * op over each of the nrows contiguous rows of length n of x.
 * softmax / log_softmax: out has nrows * n elements; logsumexp: nrows elements.
 * nthreads >= 1 is an upper bound; small problems run on one thread.
 */
int fa_rowwise_f32(const float *x, float *out, int64_t nrows, int64_t n, int op,
                   int nthreads);

/* Element types of k and v (fa_attn_args.k_dtype, v_dtype), the rows of
 * dtypes.h: FA_DTYPE_F32 (float32), FA_DTYPE_F16 (IEEE 754 binary16, as
 * uint16 bits), FA_DTYPE_BF16 (bfloat16, as uint16 bits). Half-precision
 * elements are converted exactly to float32 where the kernels read them. */
enum {
#define FA_DTYPE_CODE(NAME, code, name, bytes, block, at) FA_DTYPE_##NAME = code,
    FA_DTYPES(FA_DTYPE_CODE)
#undef FA_DTYPE_CODE
};

/* Row i of that table (0 <= i < fa_dtype_count()): its code, NumPy name,
 * bytes a block and elements a block. */
int fa_dtype_count(void);
void fa_dtype_row(int i, int *code, const char **name, int *bytes, int *block);

/* Keys of the kernels' tile: a paged cache's block_size is a multiple of it. */
#define FA_KEY_TILE 64

/* The elements [lo, hi) of an array that a call may touch, counted (in its
 * elements) from the element its offsets count from: negative strides reach
 * below it, so lo may be negative. An empty array is {0, 0}. */
typedef struct {
    int64_t lo, hi;
} fa_span;

/*
 * Scaled dot-product attention over nbatch independent (L, S) problems.
 *
 * Offsets and strides count elements (of float32 for q, of k_dtype / v_dtype
 * for k / v) and may be negative or zero; only the feature axis must be
 * contiguous. Batch item b reads query row i at q + q_off[b] + i * q_rs (D
 * floats), key row j at k + k_off[b] + j * k_rs (D elements) and value row j at
 * v + v_off[b] + j * v_rs (Dv elements), and mask element (i, j) at
 * mask_off[b] + i * mask_sl + j * mask_ss (strides may be 0: broadcast masks
 * are read in place).
 *
 * Paged k and v (block_table != NULL; FlashAttention's block_table): key and
 * value row j of batch item b lie in page pg = block_table[bt_off[b] + j /
 * block_size], at k + pg * k_ps + k_off[b] + (j % block_size) * k_rs (v
 * likewise with v_ps, v_off, v_rs). block_size must be a positive multiple of
 * FA_KEY_TILE (a page holds whole key tiles); every entry used (j < S) must
 * lie in [0, num_pages).
 *
 * Query row i sits at key position p = i + S - L (bottom-right alignment).
 * Scores, in natural units and this order: s = scale (q . k); with softcap > 0,
 * s = softcap tanh(s / softcap); with alibi_slopes, s -= alibi_slopes[b]
 * |p + alibi_shift - j| (alibi_shift: 0, or the offset of a block of a longer
 * sequence, whose positions are not those of its own alignment); plus the
 * float mask. Key j is allowed iff the bool mask is true,
 * !is_causal || j <= p, win_left < 0 || j >= p - win_left,
 * win_right < 0 || j <= p + win_right, and (with segment ids)
 * seg_q[seg_q_off[b] + i seg_q_sl] == seg_k[seg_k_off[b] + j seg_k_ss].
 * seg_sorted = 1 promises that every batch item's key ids are non-decreasing
 * along S: each row's allowed keys are then one range, found by bisection, and
 * the tiles outside it are skipped. With sinks, row i of item b has one more
 * key, of score sinks[b] and value 0, in its softmax and lse.
 *
 * Bounds: the *_span fields give the extent of each array (and bt_len,
 * slopes_len, sinks_len the entries of the 1-d ones). Before any work every
 * element the call will touch -- from every batch item's offsets, strides,
 * lengths, page numbers and (packed batches) sequence offsets -- is checked
 * to lie inside them; a violation is FA_ERR_ARG, never an access.
 */
typedef struct {
    int64_t nbatch, L, S, D, Dv;
    const float *q;
    const void *k;
    const void *v;
    int k_dtype, v_dtype;      /* FA_DTYPE_*; k and v may differ */
    const int64_t *q_off;
    const int64_t *k_off;
    const int64_t *v_off;
    int64_t q_rs, k_rs, v_rs;  /* row strides along L (q) and S (k, v) */
    const int64_t *block_table; /* NULL: k and v are not paged */
    const int64_t *bt_off;     /* per batch item: the start of its row of block_table */
    int64_t block_size, num_pages;
    int64_t k_ps, v_ps;        /* page strides */
    int mask_kind;
    const uint8_t *bool_mask;  /* FA_MASK_BOOL */
    const float *float_mask;   /* FA_MASK_FLOAT */
    const int64_t *mask_off;   /* per batch item; NULL when mask_kind is NONE */
    int64_t mask_sl, mask_ss;  /* element strides along L and S */
    int is_causal;
    int64_t win_left, win_right; /* < 0: unbounded */
    float scale;
    float softcap;               /* 0: off; else finite > 0 */
    const float *alibi_slopes;   /* nbatch slopes, or NULL */
    int64_t alibi_shift;         /* added to p in ALiBi's |p - j| (0: none) */
    const float *sinks;          /* nbatch sink logits, or NULL */
    const int64_t *seg_q;        /* segment ids, or NULL (then seg_k is unused) */
    const int64_t *seg_k;
    const int64_t *seg_q_off;    /* per batch item */
    const int64_t *seg_k_off;
    int64_t seg_q_sl, seg_k_ss;  /* element strides along L and S (0: broadcast) */
    int seg_sorted;
    /* Where the output goes (SDPA and varlen): NULL o_off puts row i of item b
     * at out + (b L + i) Dv and its lse at lse[b L + i]; else at out +
     * o_off[b] + i o_rs and lse[lse_off[b] + i lse_rs]. */
    const int64_t *o_off;
    const int64_t *lse_off;
    int64_t o_rs, lse_rs;
    /* Extents of the arrays (see "Bounds" above). out_span is that of the
     * output (the weights for fa_attention_weights_f32), lse_span that of lse. */
    fa_span q_span, k_span, v_span, mask_span, seg_q_span, seg_k_span, out_span, lse_span;
    int64_t bt_len, slopes_len, sinks_len;
} fa_attn_args;

/* out: nbatch * L * Dv floats (row-major); lse: nbatch * L floats or NULL. */
int fa_sdpa_f32(const fa_attn_args *a, float *out, float *lse, int nthreads);

/*
 * Packed variable-length batches: nseq sequences of a->nbatch heads each.
 * Sequence s has L_s = cu_q[s + 1] - cu_q[s] query rows and S_s = cu_k[s + 1]
 * - cu_k[s] keys (cu_q, cu_k: nseq + 1 non-decreasing entries from 0); its
 * head h is batch item s * nbatch + h of every per-item array (q_off, k_off,
 * v_off, o_off, lse_off, alibi_slopes, sinks: nseq * nbatch entries), and it
 * is computed exactly as fa_sdpa_f32 on that sequence alone (a->L and a->S
 * are ignored). The work units of all sequences run in one parallel region
 * under the thread policy of fa_sdpa_f32 (the biggest sequences first; a unit
 * that holds a large share of the work split into its key chunks). No mask,
 * segment ids or paging; o_off is required.
 */
int fa_varlen_f32(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                  const int64_t *cu_k, float *out, float *lse, int nthreads);

/* weights: nbatch * L * S floats, the softmax weights of the same computation.
 * The weights read no values: a->v and a->v_off may be NULL (a->Dv 0). */
int fa_attention_weights_f32(const fa_attn_args *a, float *weights, int nthreads);

/*
 * The gradients of fa_sdpa_f32 (FlashAttention-2's backward: P recomputed
 * tile by tile from lse, Delta = rowsum(dO o O)) for a loss L(O) whose
 * gradient dout = dL/dO is given: a describes the forward call exactly as it
 * was made (every option means what it means there; no paged k and v),
 * with its output layout (o_off / o_rs, or contiguous rows) locating the rows
 * of both dout and out, and lse_off / lse_rs those of lse. Batch items b
 * and c share a kv item when b / group == c / group: their k and v rows must
 * be the same (k_off, v_off equal), and its gradients sum theirs.
 *
 *   dv_j = sum_i P_ij dout_i          dS_ij = P_ij (dout_i . v_j - Delta_i)
 *   dq_i = scale sum_j dS'_ij k_j     dk_j  = scale sum_i dS'_ij q_i
 *   dsinks_b = -sum_i exp(sinks_b - lse_i) Delta_i
 *
 * over the pairs (i, j) of nonzero weight P_ij = exp(s_ij - lse_i) (masked
 * keys and rows of lse -inf contribute nothing; such a row's dq is 0), dS'
 * = dS (1 - tanh^2(scale q.k / softcap)) with a soft cap, else dS.
 * Deterministic: dk and dv are computed by units that own a block of keys of
 * one kv item, dq by units that own a block of query rows, each summing in
 * a fixed order, so every bit is independent of the thread count.
 */
typedef struct {
    int64_t group;        /* batch items per kv item (>= 1, divides nbatch) */
    const float *dout;    /* rows of Dv floats, at the output layout of the fa_attn_args */
    const float *out;     /* the forward's output, the same layout */
    const float *lse;     /* the forward's lse, at its lse layout */
    float *dq;            /* row i of item b at dq_off[b] + i dq_rs: D floats */
    float *dk, *dv;       /* row j of kv item c at dk_off[c] + j dk_rs (D floats), v: Dv */
    float *dsinks;        /* nbatch floats, with sinks (else unused) */
    const int64_t *dq_off, *dk_off, *dv_off;
    int64_t dq_rs, dk_rs, dv_rs;
    fa_span dout_span, out_span, lse_span, dq_span, dk_span, dv_span;
    int64_t dsinks_len;
} fa_bwd_args;

int fa_attention_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int nthreads);

/* The same over nseq packed sequences (see fa_varlen_f32): sequence s's
 * head h is batch item s nbatch + h of every per-item array, dk_off and
 * dv_off with nseq nbatch / group entries. */
int fa_varlen_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int64_t nseq,
                           const int64_t *cu_q, const int64_t *cu_k, int nthreads);

/*
 * Merge of P partial attention results over disjoint key sets: partial p is
 * outs[p] (nrows x Dv, row-major) with its log-sum-exps lses[p] (nrows). Writes
 * o (nrows x Dv) and lse (nrows): lse = log sum_p exp(lse_p),
 * o = sum_p exp(lse_p - lse) o_p, folded in partial order. A partial whose
 * lse_p is -inf is never read; all -inf gives o = 0, lse = -inf; a NaN lse_p
 * gives a NaN row (lse NaN), else a +inf one gives o NaN, lse +inf.
 */
int fa_merge_f32(const float *const *outs, const float *const *lses, int64_t P, int64_t nrows,
                 int64_t Dv, float *o, float *lse, int nthreads);

/* The exponentials of the selected SIMD variant, exposed for the accuracy
 * tests: y[i] = exp(x[i] - m) as the softmax family computes it (m finite,
 * x[i] <= m), and y[i] = 2**x[i] as the attention kernels compute it. */
int fa_exp_diff_f32(const float *x, float m, float *y, int64_t n);
int fa_exp2_f32(const float *x, float *y, int64_t n);
/* y[i] = tanh(x[i]) as the attention kernels soft-cap scores (selected variant). */
int fa_tanh_f32(const float *x, float *y, int64_t n);

/* SIMD variant: NULL/"auto" picks the best this CPU runs; "generic", "avx2".
 * FA_ERR_ARG for an unknown name or one this CPU or build cannot run. */
int fa_select_simd(const char *name);
/* Comma-separated variants this CPU and build can run, e.g. "generic,avx2". */
const char *fa_simd_available(void);

/* The float32 FMA peak in GFLOP/s of `nthreads` threads running `iters`
 * steps of 12 independent FMA chains `lanes` wide (8: AVX2 + FMA, 16:
 * AVX-512F); -1 where this CPU or build has no such instructions. A yardstick
 * for the benchmarks, not a kernel. */
double fa_fma_peak_gflops(int lanes, int nthreads, long iters);

/* The thread policy (its rule: fa_internal.h): the threads a call of `work`
 * units and `nitems` work items gets now under the cap `nthreads`; 1 while
 * the machine counts as loaded (a call's thread arrived late lately); and,
 * for the tests, counting it as loaded for `seconds` from now (0: not). */
int fa_threads_for(int nthreads, double work, int64_t nitems);
int fa_busy(void);
void fa_set_busy(double seconds);
/* A call on nt threads that began at `start` (fa_now(), seconds) has ended,
 * its last thread `wait` seconds after it began: the record the rule reads. */
void fa_note_wait(double start, double wait, int nt);
/* The length in microseconds of a window of load that begins at now_us,
 * the last one ending (or having ended) at until_us after span_us (0, 0:
 * none yet): FA_BUSY_MIN_S after a while without load, else four times the
 * last one, up to FA_BUSY_S (fa_internal.h). fa_busy_window: the records
 * it reads, the last window's end and length (for the tests; fa_set_busy
 * sets both, and with 0 also forgets a late call). */
int64_t fa_busy_span(int64_t now_us, int64_t until_us, int64_t span_us);
void fa_busy_window(int64_t *until_us, int64_t *span_us);
double fa_now(void);

/* Build and runtime facts for show_config(). */
int fa_built_with_openmp(void);
int fa_omp_max_threads(void);
const char *fa_compiler(void);
const char *fa_simd_kernel(void);
/* The bytes of level-2 cache a core has, as sysconf reports them (1 MiB where
 * it does not): the work units' planning reads it. */
int64_t fa_l2_cache_bytes(void);

/* Memory for result arrays of at least FA_RESULT_MIN_BYTES (results.c):
 * fa_result_bytes(nbytes): the size of the block an array of nbytes takes
 * (rounded up to 2 MiB), or -1 below FA_RESULT_MIN_BYTES (the caller
 * allocates as usual) or where it cannot be rounded; fa_result_alloc(bytes):
 * a block of that size, from the cache of freed ones where one is there,
 * else new (NULL: out of memory); fa_result_free(p, bytes): the block back,
 * into the cache where it fits under the limit (the oldest blocks freed to
 * make room), else freed; fa_result_cache(limit, &held): sets the cache's
 * limit in bytes (limit >= 0; 0 frees every cached block and keeps none)
 * and returns the previous one; held: the bytes it holds now. */
#define FA_RESULT_MIN_BYTES ((int64_t)4 << 20)
#define FA_RESULT_CACHE_DEFAULT ((int64_t)512 << 20)
int64_t fa_result_bytes(int64_t nbytes);
void *fa_result_alloc(int64_t bytes);
void fa_result_free(void *p, int64_t bytes);
int64_t fa_result_cache(int64_t limit, int64_t *held);

#ifdef __cplusplus
}
#endif

#endif /* FASTATTN_H */
