/*
 * fma_peak.c -- the float32 FMA peak of this CPU (GFLOP/s) per thread count,
 * for AVX2 + FMA (8 lanes) and AVX-512F (16 lanes) where the CPU has them:
 * the ceiling no attention or matmul kernel can pass. The measuring loop is
 * csrc/peak.c, the one `python -m fastattn bench` uses (fastattn._core).
 *
 *   gcc -O2 -fopenmp -Icsrc tools/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 *
 * A measuring tool only: not part of the package build.
 */
#include "../csrc/peak.c"

#include <stdio.h>

int main(void)
{
    const long iters = 100000000;
    const int lanes[2] = {8, 16};
    const char *isa[2] = {"AVX2+FMA", "AVX-512F"};
    int threads, rep, w;
    for (w = 0; w < 2; w++) {
        for (threads = 1; threads <= omp_get_max_threads(); threads++) {
            double best = 0.0;
            for (rep = 0; rep < 3; rep++) {
                const double g = fa_fma_peak_gflops(lanes[w], threads, iters);
                best = g > best ? g : best;
            }
            if (best <= 0.0) {
                printf("%s: not available on this CPU or build\n", isa[w]);
                break;
            }
            printf("%s %d thread(s): %.1f GFLOP/s float32 FMA peak\n", isa[w], threads, best);
        }
    }
    return 0;
}
