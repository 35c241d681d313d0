/*
 * fma_peak.c -- the float32 FMA peak of this CPU (GFLOP/s), the ceiling that
 * no attention or matmul kernel can pass. Twelve independent chains of 8-lane
 * fused multiply-adds per thread, enough to cover the FMA latency.
 *
 *   gcc -O2 -mavx2 -mfma -fopenmp tools/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 *
 * A measuring tool only: not part of the package build.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

#define CHAINS 12

static double run(int threads, long iters)
{
    double t0 = omp_get_wtime();
    float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        __m256 c0 = _mm256_set1_ps(0.f), c1 = _mm256_set1_ps(1.f), c2 = _mm256_set1_ps(2.f);
        __m256 c3 = _mm256_set1_ps(3.f), c4 = _mm256_set1_ps(4.f), c5 = _mm256_set1_ps(5.f);
        __m256 c6 = _mm256_set1_ps(6.f), c7 = _mm256_set1_ps(7.f), c8 = _mm256_set1_ps(8.f);
        __m256 c9 = _mm256_set1_ps(9.f), c10 = _mm256_set1_ps(10.f), c11 = _mm256_set1_ps(11.f);
        long i;
        for (i = 0; i < iters; i++) { /* twelve independent chains, one FMA each */
            c0 = _mm256_fmadd_ps(c0, a, b);
            c1 = _mm256_fmadd_ps(c1, a, b);
            c2 = _mm256_fmadd_ps(c2, a, b);
            c3 = _mm256_fmadd_ps(c3, a, b);
            c4 = _mm256_fmadd_ps(c4, a, b);
            c5 = _mm256_fmadd_ps(c5, a, b);
            c6 = _mm256_fmadd_ps(c6, a, b);
            c7 = _mm256_fmadd_ps(c7, a, b);
            c8 = _mm256_fmadd_ps(c8, a, b);
            c9 = _mm256_fmadd_ps(c9, a, b);
            c10 = _mm256_fmadd_ps(c10, a, b);
            c11 = _mm256_fmadd_ps(c11, a, b);
        }
        c0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
        c0 = _mm256_add_ps(c0, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
        sink += _mm256_cvtss_f32(c0);
    }
    if (sink == 12345.0f)
        printf(" ");
    return 2.0 * 8 * CHAINS * (double)iters * threads / (omp_get_wtime() - t0) / 1e9;
}

int main(void)
{
    const long iters = 100000000;
    int threads, rep;
    for (threads = 1; threads <= omp_get_max_threads(); threads++) {
        double best = 0.0;
        for (rep = 0; rep < 3; rep++) {
            const double g = run(threads, iters);
            best = g > best ? g : best;
        }
        printf("%d thread(s): %.1f GFLOP/s float32 FMA peak\n", threads, best);
    }
    return 0;
}
