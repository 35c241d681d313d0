/* The AVX-512 kernels (F, VL, BW, DQ, with AVX2 + FMA + F16C): the AVX2 variant's
 * code (kernels_avx2.c, compiled again for this target: its exponentials,
 * reductions, packing and few-rows kernels) with a micro-kernel of 16-lane
 * registers, FA_MR rows of FA_NR = 16 columns, one zmm accumulator per row.
 * Each element is the same sum as the AVX2 micro-kernel's (one fused
 * multiply-add per step of d, d ascending from 0), so this variant gives
 * the AVX2 variant's bits, faster. Chosen at run time by dispatch.c. */
#include "fa_kernels.h"

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>

#define FA_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define FA_NAME(x) x##_avx512
#define FA_VARIANT_NAME "avx512"
#define FA_MR 12 /* twelve zmm accumulators: enough independent FMAs for two ports */

#if FA_NR != 16
#error "the AVX-512 micro-kernel holds one row of FA_NR = 16 columns in one register"
#endif

/* One FA_MR x 16 block of C = A . B: row r of A broadcast, one row of B per
 * step of d loaded once for all the rows. */
#define FA_HAVE_GEMM_BLOCK 1
static FA_TARGET void gemm_block_avx512(const float *a, int64_t lda, const float *b,
                                        int64_t ldb, int64_t K, float *c, int64_t ldc)
{
    __m512 acc[FA_MR];
    int64_t d;
    int r;
    for (r = 0; r < FA_MR; r++)
        acc[r] = _mm512_setzero_ps();
    for (d = 0; d < K; d++) {
        const __m512 bv = _mm512_loadu_ps(b + d * ldb);
        for (r = 0; r < FA_MR; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + d]), bv, acc[r]);
    }
    for (r = 0; r < FA_MR; r++)
        _mm512_storeu_ps(c + r * ldc, acc[r]);
}

#include "kernels_avx2.c"
#else
typedef int fa_no_avx512_variant; /* ISO C forbids an empty translation unit */
#endif
