# Declarations of the C contract (csrc/fastattn.h), for fastattn/_core.pyx.
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "fastattn.h" nogil:
    int FA_OK
    int FA_ERR_ARG
    int FA_ERR_NOMEM
    int FA_ERR_INTERNAL
    int FA_OP_SOFTMAX
    int FA_OP_LOG_SOFTMAX
    int FA_OP_LOGSUMEXP
    int FA_MASK_NONE
    int FA_MASK_BOOL
    int FA_MASK_FLOAT
    int FA_DTYPE_F32
    int FA_DTYPE_F16
    int FA_DTYPE_BF16
    int FA_KEY_TILE
    int fa_dtype_count()
    void fa_dtype_row(int i, int *code, const char **name, int *bytes, int *block)

    ctypedef struct fa_span:
        int64_t lo, hi

    ctypedef struct fa_attn_args:
        int64_t nbatch, L, S, D, Dv
        const float *q
        const void *k
        const void *v
        int k_dtype, v_dtype
        const int64_t *q_off
        const int64_t *k_off
        const int64_t *v_off
        int64_t q_rs, k_rs, v_rs
        const int64_t *block_table
        const int64_t *bt_off
        int64_t block_size, num_pages
        int64_t k_ps, v_ps
        int mask_kind
        const uint8_t *bool_mask
        const float *float_mask
        const int64_t *mask_off
        int64_t mask_sl, mask_ss
        int is_causal
        int64_t win_left, win_right
        float scale
        float softcap
        const float *alibi_slopes
        int64_t alibi_shift
        const float *sinks
        const int64_t *seg_q
        const int64_t *seg_k
        const int64_t *seg_q_off
        const int64_t *seg_k_off
        int64_t seg_q_sl, seg_k_ss
        int seg_sorted
        const int64_t *o_off
        const int64_t *lse_off
        int64_t o_rs, lse_rs
        fa_span q_span, k_span, v_span, mask_span, seg_q_span, seg_k_span, out_span, lse_span
        int64_t bt_len, slopes_len, sinks_len

    int fa_rowwise_f32(const float *x, float *out, int64_t nrows, int64_t n, int op,
                       int nthreads)
    int fa_sdpa_f32(const fa_attn_args *a, float *out, float *lse, int nthreads)
    int fa_varlen_f32(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                      const int64_t *cu_k, float *out, float *lse, int nthreads)
    int fa_attention_weights_f32(const fa_attn_args *a, float *weights, int nthreads)

    ctypedef struct fa_bwd_args:
        int64_t group
        const float *dout
        const float *out
        const float *lse
        float *dq
        float *dk
        float *dv
        float *dsinks
        const int64_t *dq_off
        const int64_t *dk_off
        const int64_t *dv_off
        int64_t dq_rs, dk_rs, dv_rs
        fa_span dout_span, out_span, lse_span, dq_span, dk_span, dv_span
        int64_t dsinks_len

    int fa_attention_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int nthreads)
    int fa_varlen_backward_f32(const fa_attn_args *a, const fa_bwd_args *g, int64_t nseq,
                               const int64_t *cu_q, const int64_t *cu_k, int nthreads)
    int fa_exp_diff_f32(const float *x, float m, float *y, int64_t n)
    int fa_exp2_f32(const float *x, float *y, int64_t n)
    int fa_tanh_f32(const float *x, float *y, int64_t n)
    int fa_select_simd(const char *name)
    const char *fa_simd_available()
    int fa_threads_for(int nthreads, double work, int64_t nitems)
    int fa_busy()
    void fa_set_busy(double seconds)
    void fa_note_wait(double start, double wait, int nt)
    int64_t fa_busy_span(int64_t now_us, int64_t until_us, int64_t span_us)
    void fa_busy_window(int64_t *until_us, int64_t *span_us)
    double fa_now()
    int fa_built_with_openmp()
    int fa_omp_max_threads()
    const char *fa_compiler()
    const char *fa_simd_kernel()
    int64_t fa_l2_cache_bytes()
    int64_t FA_RESULT_MIN_BYTES
    int64_t fa_result_bytes(int64_t nbytes)
    void *fa_result_alloc(int64_t bytes)
    void fa_result_free(void *p, int64_t bytes)
    int64_t fa_result_cache(int64_t limit, int64_t *held)
    int fa_merge_f32(const float *const *outs, const float *const *lses, int64_t P,
                     int64_t nrows, int64_t Dv, float *o, float *lse, int nthreads)
    double fa_fma_peak_gflops(int lanes, int nthreads, long iters)
