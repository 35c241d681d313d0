/*
 * peak.c -- the float32 fused multiply-add peak of this CPU (GFLOP/s): the
 * ceiling no attention or matmul kernel can pass, which the benchmarks divide
 * by. Twelve independent chains of FMAs per thread (enough to cover the FMA
 * latency on two ports), 8 lanes wide (AVX2 + FMA) or 16 lanes wide (AVX-512F),
 * each compiled by target attribute and run only where the CPU has it.
 * A measuring aid for `python -m fastattn bench` and tools/fma_peak.c, not a kernel.
 */
#include "fastattn.h"
#include "fa_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#else
#include <time.h>
#endif

#if defined(FA_HAVE_X86_VARIANTS)
#include <immintrin.h>
#endif

static double peak_now(void)
{
#ifdef _OPENMP
    return omp_get_wtime();
#else
    return (double)clock() / CLOCKS_PER_SEC;
#endif
}

#define FA_PEAK_CHAINS 12

#if defined(FA_HAVE_X86_VARIANTS)
/* The chains of one thread; returns their sum so that nothing is optimised out. */
#define FA_PEAK_BODY(VT, SET1, FMA, ADD, LANES_TO_FLOAT)                                 \
    {                                                                                    \
        const VT a = SET1(0.999999f), b = SET1(1e-7f);                                   \
        VT c[FA_PEAK_CHAINS];                                                            \
        long i;                                                                          \
        int j;                                                                           \
        for (j = 0; j < FA_PEAK_CHAINS; j++)                                             \
            c[j] = SET1((float)j);                                                       \
        for (i = 0; i < iters; i++) {                                                    \
            c[0] = FMA(c[0], a, b);                                                      \
            c[1] = FMA(c[1], a, b);                                                      \
            c[2] = FMA(c[2], a, b);                                                      \
            c[3] = FMA(c[3], a, b);                                                      \
            c[4] = FMA(c[4], a, b);                                                      \
            c[5] = FMA(c[5], a, b);                                                      \
            c[6] = FMA(c[6], a, b);                                                      \
            c[7] = FMA(c[7], a, b);                                                      \
            c[8] = FMA(c[8], a, b);                                                      \
            c[9] = FMA(c[9], a, b);                                                      \
            c[10] = FMA(c[10], a, b);                                                    \
            c[11] = FMA(c[11], a, b);                                                    \
        }                                                                                \
        for (j = 1; j < FA_PEAK_CHAINS; j++)                                             \
            c[0] = ADD(c[0], c[j]);                                                      \
        return LANES_TO_FLOAT(c[0]);                                                     \
    }

static __attribute__((target("avx2,fma"))) float fa_peak_chains8(long iters)
FA_PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)

static __attribute__((target("avx512f"))) float fa_peak_chains16(long iters)
FA_PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32)
#endif

double fa_fma_peak_gflops(int lanes, int nthreads, long iters)
{
#if defined(FA_HAVE_X86_VARIANTS)
    double t0, t;
    float sink = 0.0f;
    __builtin_cpu_init();
    if (nthreads < 1 || iters < 1)
        return -1.0;
    if (lanes == 8 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return -1.0;
    if (lanes == 16 && !__builtin_cpu_supports("avx512f"))
        return -1.0;
    if (lanes != 8 && lanes != 16)
        return -1.0;
    t0 = peak_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : sink)
#endif
    sink += lanes == 8 ? fa_peak_chains8(iters) : fa_peak_chains16(iters);
    t = peak_now() - t0;
#ifndef _OPENMP
    nthreads = 1;
#endif
    if (sink == 12345.0f) /* never: keeps the sum alive */
        t += 1e-9;
    return 2.0 * lanes * FA_PEAK_CHAINS * (double)iters * nthreads / t / 1e9;
#else
    (void)lanes;
    (void)nthreads;
    (void)iters;
    return -1.0;
#endif
}
