/*
 * loop_ceiling.c -- how close the full-attention kernels' inner loops come to
 * the float32 FMA peak with their data in cache, on one thread: the score
 * loop (qt_scores), the tile softmax (qt_exp) and the P.V product (the
 * micro-kernel as qt_tile calls it) for one unit of 96 query rows against
 * one key tile of 64 keys, each repeated on the same buffers. Their sum is
 * the time of one tile of a unit in full (non-causal) attention with no
 * memory traffic at all, and 2 products over it the highest FMA-peak
 * fraction those loops allow the call (the grid of `python -m fastattn
 * bench` aims at 72 % for L=S=4096 D=128).
 *
 * With TILES, also one unit's walk over TILES different key and value
 * tiles (k and v of TILES * 64 rows each, rows D floats apart, as in a
 * contiguous (B, H, S, D) head): the three loops a tile, so that the walk
 * reads k and v from wherever they fit (the level-2 cache, or beyond it).
 *
 *   gcc -O2 -fopenmp -std=gnu11 -Icsrc tools/loop_ceiling.c -o /tmp/loop_ceiling -lm
 *   /tmp/loop_ceiling [D [REPS [TILES]]]   (the AVX-512 kernels; -DCEILING_AVX2: AVX2)
 *
 * A measuring tool only: not part of the package build.
 */
#include "../csrc/peak.c"

#ifdef CEILING_AVX2
#include "../csrc/kernels_avx2.c"
#define CEIL(x) x##_avx2
#define CEIL_LANES 8
#define CEIL_CPU (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#else
#include "../csrc/kernels_avx512.c"
#define CEIL(x) x##_avx512
#define CEIL_LANES 16
#define CEIL_CPU (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
#endif

#include <stdio.h>
#include <stdlib.h>

#include "kernels_only.h"

#define ROWS 96 /* one unit's rows (FA_BQ_IN_PLACE) */

static void *buffer(size_t floats)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, floats * sizeof(float) + 64) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* One unit's buffers: its rows' packed queries, `keys` key and value rows of
 * D floats, the score tile, the accumulators and the rows' statistics. */
typedef struct {
    float *qt, *k, *v, *pt, *acc, *m, *mnew, *alpha, *sum;
} unit_buffers;

/* The buffers with their fixed contents; every row's running maximum m0. */
static unit_buffers buffers_make(int64_t D, int64_t keys, float m0)
{
    unit_buffers b;
    int64_t i;
    b.qt = buffer(ROWS * D);
    b.k = buffer(keys * D);
    b.v = buffer(keys * D);
    b.pt = buffer(ROWS * FA_BK);
    b.acc = buffer(ROWS * D);
    b.m = buffer(ROWS);
    b.mnew = buffer(ROWS);
    b.alpha = buffer(ROWS);
    b.sum = buffer(ROWS);
    for (i = 0; i < ROWS * D; i++) {
        b.qt[i] = (float)(i % 7) * 0.01f;
        b.acc[i] = 0.0f;
    }
    for (i = 0; i < keys * D; i++) {
        b.k[i] = (float)(i % 5) * 0.01f;
        b.v[i] = (float)(i % 3) * 0.1f;
    }
    for (i = 0; i < ROWS; i++) {
        b.m[i] = m0;
        b.alpha[i] = 1.0f;
    }
    return b;
}

static void buffers_free(unit_buffers *b)
{
    free(b->qt);
    free(b->k);
    free(b->v);
    free(b->pt);
    free(b->acc);
    free(b->m);
    free(b->mnew);
    free(b->alpha);
    free(b->sum);
}

/* Seconds per call of each loop, best of 5 runs of reps calls. */
static FA_TARGET void time_loops(int64_t D, long reps, double t[3])
{
    const int64_t nk = FA_BK;
    unit_buffers b = buffers_make(D, nk, -INFINITY);
    volatile int sink = 0;
    int run, which;
    for (which = 0; which < 3; which++) {
        t[which] = 1e30;
        for (run = 0; run < 5; run++) {
            const double t0 = peak_now();
            double dt;
            long r;
            for (r = 0; r < reps; r++) {
                if (which == 0)
                    sink += CEIL(qt_scores)(b.qt, ROWS, D, b.k, D, 0.1f, b.m, b.pt, ROWS, b.mnew,
                                            NULL, NULL, NULL, NULL, nk);
                else if (which == 1) /* (the scores it leaves are the next call's input) */
                    sink += CEIL(qt_exp)(b.pt, ROWS, ROWS, b.mnew, b.sum, nk);
                else
                    CEIL(gemm)(b.pt, 1, ROWS, 1, b.v, D, ROWS, D, nk, b.acc, D, b.alpha, 1.0f);
            }
            dt = (peak_now() - t0) / (double)reps;
            t[which] = dt < t[which] ? dt : t[which];
        }
    }
    (void)sink;
    buffers_free(&b);
}

/* Seconds per tile of one unit's walk over `tiles` key and value tiles
 * (scores, softmax, P.V each tile), best of 5 walks. Every row's maximum is
 * 1, above its scores, so that every weight is a normal number, as in a
 * real walk. */
static FA_TARGET double time_walk(int64_t D, int64_t tiles)
{
    unit_buffers b = buffers_make(D, tiles * FA_BK, 1.0f);
    volatile int sink = 0;
    double best = 1e30;
    int64_t t;
    int run;
    for (run = 0; run < 5; run++) {
        const double t0 = peak_now();
        double dt;
        for (t = 0; t < tiles; t++) {
            const float *kt = b.k + t * FA_BK * D, *vt = b.v + t * FA_BK * D;
            sink += CEIL(qt_scores)(b.qt, ROWS, D, kt, D, 0.1f, b.m, b.pt, ROWS, b.mnew, NULL,
                                    NULL, NULL, NULL, FA_BK);
            sink += CEIL(qt_exp)(b.pt, ROWS, ROWS, b.m, b.sum, FA_BK);
            CEIL(gemm)(b.pt, 1, ROWS, 1, vt, D, ROWS, D, FA_BK, b.acc, D, b.alpha, 1.0f);
        }
        dt = (peak_now() - t0) / (double)tiles;
        best = dt < best ? dt : best;
    }
    (void)sink;
    buffers_free(&b);
    return best;
}

int main(int argc, char **argv)
{
    const int64_t D = argc > 1 ? atoi(argv[1]) : 128;
    const long reps = argc > 2 ? atol(argv[2]) : 20000;
    const int64_t tiles = argc > 3 ? atol(argv[3]) : 0;
    const long peak_iters = reps < 20000 ? 5000 * reps : 100000000;
    const double flops = 2.0 * ROWS * FA_BK * (double)D; /* one product */
    double t[3], peak = 0.0, g;
    int rep;
    if (D < 16 || D % 16 != 0 || reps < 1 || tiles < 0 || tiles > 4096) {
        fprintf(stderr, "D: a multiple of 16, at least 16; REPS: at least 1; TILES: 0 to 4096\n");
        return 2;
    }
    if (!CEIL_CPU) {
        printf("this CPU lacks the kernels' instructions\n");
        return 0;
    }
    for (rep = 0; rep < 3; rep++) {
        g = fa_fma_peak_gflops(CEIL_LANES, 1, peak_iters);
        peak = g > peak ? g : peak;
    }
    time_loops(D, reps, t);
    printf("%d-lane kernels, one thread, one unit of %d rows x %d keys, D = %d, in cache\n",
           CEIL_LANES, ROWS, FA_BK, (int)D);
    printf("FMA peak:          %7.1f GFLOP/s\n", peak);
    printf("scores (qt_scores) %7.1f GFLOP/s = %3.0f %% of the peak\n", flops / t[0] / 1e9,
           100.0 * flops / t[0] / 1e9 / peak);
    printf("P.V (gemm)         %7.1f GFLOP/s = %3.0f %% of the peak\n", flops / t[2] / 1e9,
           100.0 * flops / t[2] / 1e9 / peak);
    printf("softmax (qt_exp)   %7.2f us a tile = %3.0f %% of the tile's time\n", t[1] * 1e6,
           100.0 * t[1] / (t[0] + t[1] + t[2]));
    g = 2.0 * flops / (t[0] + t[1] + t[2]) / 1e9;
    printf("the three, a tile: %7.1f GFLOP/s = %3.0f %% of the peak (the ceiling of these loops)\n",
           g, 100.0 * g / peak);
    if (tiles > 0) {
        const double tw = time_walk(D, tiles);
        g = 2.0 * flops / tw / 1e9;
        printf("a walk of %d tiles (k and v: %.2f MiB): %.2f us a tile, %7.1f GFLOP/s = %3.0f %% "
               "of the peak\n", (int)tiles, 2.0 * tiles * FA_BK * D * 4 / 1048576.0, tw * 1e6, g,
               100.0 * g / peak);
    }
    return 0;
}
