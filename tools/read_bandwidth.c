/*
 * read_bandwidth.c -- how fast this machine reads a buffer of 32, 64 and 128
 * MiB (the size of a decoding step's float16 and float32 K/V cache at 32/8
 * heads, S=16384, D=128) on 1 and 2 threads, each thread summing its half
 * with 512-bit loads (AVX-512F) and, optionally, software prefetches the
 * given number of bytes ahead: the ceiling a bandwidth-bound decoding step
 * cannot pass. The buffer is read repeatedly, so a size that fits the
 * last-level cache reads at the cache's speed (as a benchmark that repeats
 * one call does); "cold" reads a 512 MiB buffer between reads (as when other
 * calls' data went through the cache in between).
 *
 *   gcc -O2 -fopenmp tools/read_bandwidth.c -o /tmp/read_bw && /tmp/read_bw [prefetch_bytes] [cold]
 *
 * A measuring tool only (x86-64 with AVX-512F, gcc or clang): not part of the package build.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((target("avx512f"))) static float sum_range(const float *p, size_t n, long pf)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i;
    for (i = 0; i + 64 <= n; i += 64) {
        if (pf) {
            int l;
            for (l = 0; l < 4; l++)
                __builtin_prefetch((const char *)(p + i) + pf + 64 * l, 0, 2);
        }
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

int main(int argc, char **argv)
{
    const long pf = argc > 1 ? atol(argv[1]) : 0;
    const int cold = argc > 2 && atoi(argv[2]) != 0;
    const size_t sizes[3] = {(size_t)32 << 20, (size_t)64 << 20, (size_t)128 << 20};
    const size_t nflush = (size_t)512 << 20;
    float *buf = aligned_alloc(64, sizes[2]);
    unsigned char *flush = cold ? malloc(nflush) : NULL;
    volatile float sink = 0.0f;
    int s, nt, rep;
    if (!buf || (cold && !flush)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(buf, 0, sizes[2]);
    if (flush)
        memset(flush, 1, nflush);
    for (s = 0; s < 3; s++)
        for (nt = 1; nt <= 2; nt++) {
            const size_t n = sizes[s] / sizeof(float);
            double best = 1e30, total = 0.0;
            for (rep = 0; rep < 15; rep++) {
                double t0, dt;
                float got = 0.0f;
                if (flush) {
                    unsigned long acc = 0;
                    size_t j;
                    for (j = 0; j < nflush; j += 64)
                        acc += flush[j];
                    sink += (float)acc;
                }
                t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : got)
                {
                    const size_t t = (size_t)omp_get_thread_num(), lo = n / nt * t,
                                 hi = n / nt * (t + 1);
                    got += sum_range(buf + lo, hi - lo, pf);
                }
                dt = omp_get_wtime() - t0;
                sink += got;
                if (rep > 0) { /* (the first: page faults, thread start) */
                    best = dt < best ? dt : best;
                    total += dt;
                }
            }
            printf("%4zu MiB, %d thread(s), prefetch %ld B ahead%s: best %.2f ms = %.1f GB/s, "
                   "mean %.1f GB/s\n", sizes[s] >> 20, nt, pf, cold ? ", cold" : "", best * 1e3,
                   (double)sizes[s] / best / 1e9, (double)sizes[s] / (total / 14) / 1e9);
        }
    return 0;
}
