/*
 * decode_ceiling.c -- what the decoding (few-rows) kernels cost a key on one
 * thread, for each dtype of k and v: the scores (few_scores: ROWS query rows
 * against the key rows, read in place) and the P.V product (few_pv) over
 * KEYS keys (one buffer read as k and as v), tile by tile as sdpa_unit calls
 * them, each walk over the same rows. With the default 1024 keys they sit in
 * the level-2 cache, and this is the arithmetic a decoding step cannot go
 * below, whatever the memory: the float32 figure against the half-precision
 * ones says how much of a half-precision cache's halved traffic a decoding
 * step can turn into speed; more keys read from farther away.
 *
 *   gcc -O3 -std=gnu11 -ffp-contract=off -fopenmp -Icsrc tools/decode_ceiling.c \
 *       -o /tmp/decode_ceiling -lm
 *   /tmp/decode_ceiling [D [ROWS [KEYS [REPS]]]]   (AVX-512 kernels; defaults 128 4 1024 200)
 *
 * With -DCEILING_AVX2 it times the AVX2 kernels instead.
 *
 * ROWS is the query rows that share a kv head (the GQA group: 4 for 32/8
 * heads). A measuring tool only: not part of the package build.
 */
#include "../csrc/peak.c"
#ifdef CEILING_AVX2 /* the AVX2 kernels instead (-DCEILING_AVX2) */
#include "../csrc/kernels_avx2.c"
#define CEIL_SCORES few_scores_avx2
#define CEIL_PV few_pv_avx2
#define CEIL_LANES 8
#define CEIL_CPU_HAS() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#else
#include "../csrc/kernels_avx512.c"
#define CEIL_SCORES few_scores_avx512
#define CEIL_PV few_pv_avx512
#define CEIL_LANES 16
#define CEIL_CPU_HAS() (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_only.h"

/* x's bits (its top 16: x as bfloat16, exact for these values) */
static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void *buffer(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes + 64) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* Seconds a key of the scores (t[0]) and of P.V (t[1]), best of REPS walks
 * over the KEYS key (value) rows of dtype dt. */
static FA_TARGET void time_dtype(int dt, int64_t D, int nr, int64_t keys, long reps,
                                 double t[2])
{
    const int64_t esz = (int64_t)fa_dtype_size(dt);
    unsigned char *kv = buffer((size_t)(keys * D * esz));
    float *q = buffer(sizeof(float) * (size_t)(FA_FEW_ROWS * D));
    float *p = buffer(sizeof(float) * (size_t)(FA_FEW_ROWS * FA_BK));
    float *s = buffer(sizeof(float) * (size_t)(FA_FEW_ROWS * FA_BK));
    float *tile = buffer(sizeof(float) * (size_t)(FA_FEW_ROWS * D));
    volatile float sink = 0.0f;
    int64_t i, j;
    long r;
    int which;
    for (i = 0; i < keys * D; i++) { /* values of 1/8 to 2: normal in every dtype */
        const float x = 0.125f + (float)(i % 15) * 0.125f;
        if (dt == FA_DTYPE_F32)
            ((float *)kv)[i] = x;
        else
            ((uint16_t *)kv)[i] = dt == FA_DTYPE_F16 ? (uint16_t)_cvtss_sh(x, 0)
                                                     : (uint16_t)(bits_of(x) >> 16);
    }
    for (i = 0; i < FA_FEW_ROWS * D; i++)
        q[i] = (float)(i % 7) * 0.01f;
    for (i = 0; i < FA_FEW_ROWS * FA_BK; i++)
        p[i] = (float)(i % 11) * 0.001f;
    for (which = 0; which < 2; which++) {
        t[which] = 1e30;
        for (r = 0; r < reps; r++) {
            const double t0 = peak_now();
            double dt_s;
            for (j = 0; j < keys; j += FA_BK) {
                const unsigned char *kt = kv + j * D * esz;
                const int64_t room = keys - j - FA_BK; /* the rows after this tile */
                if (which == 0)
                    CEIL_SCORES(q, nr, kt, dt, D, D, FA_BK, room, s);
                else
                    CEIL_PV(p, nr, kt, dt, D, D, FA_BK, room, j > 0, tile);
            }
            dt_s = (peak_now() - t0) / (double)keys;
            t[which] = dt_s < t[which] ? dt_s : t[which];
        }
    }
    sink += s[1] + tile[1];
    (void)sink;
    free(kv);
    free(q);
    free(p);
    free(s);
    free(tile);
}

int main(int argc, char **argv)
{
    static const char *const names[3] = {"float32", "float16", "bfloat16"};
    const int64_t D = argc > 1 ? atoi(argv[1]) : 128;
    const int nr = argc > 2 ? atoi(argv[2]) : 4;
    const int64_t keys = argc > 3 ? atol(argv[3]) : 1024;
    const long reps = argc > 4 ? atol(argv[4]) : 200;
    const long peak_iters = reps < 100 ? 100000 * reps : 20000000; /* (short runs: tests) */
    double peak = 0.0, base = 0.0;
    int dt, rep;
    if (D < 1 || D > 4096 || nr < 1 || nr > FA_FEW_ROWS || keys < FA_BK || keys % FA_BK != 0
        || keys > (1L << 24) || reps < 1) {
        fprintf(stderr, "D: 1 to 4096; ROWS: 1 to %d; KEYS: a multiple of %d up to 2**24; "
                        "REPS: at least 1\n", FA_FEW_ROWS, FA_BK);
        return 2;
    }
    if (!(CEIL_CPU_HAS()
          && __builtin_cpu_supports("f16c"))) {
        printf("this CPU lacks the kernels' instructions\n");
        return 0;
    }
    for (rep = 0; rep < 3; rep++) {
        const double g = fa_fma_peak_gflops(CEIL_LANES, 1, peak_iters);
        peak = g > peak ? g : peak;
    }
    printf("%d-lane decoding kernels, one thread, %d query rows, %ld keys (k: %.2f MiB "
           "float32), D = %d, the same rows each walk; FMA peak %.1f GFLOP/s\n", CEIL_LANES, nr,
           (long)keys,
           keys * D * 4 / 1048576.0, (int)D, peak);
    for (dt = 0; dt < 3; dt++) {
        double t[2];
        time_dtype(dt, D, nr, keys, reps, t);
        if (dt == 0)
            base = t[0] + t[1];
        /* 2 nr D flops a key in each product */
        printf("%-9s scores %6.2f ns a key, P.V %6.2f ns a key: %6.1f GFLOP/s = %3.0f %% of "
               "the peak; float32 time / this %.2fx\n", names[dt], t[0] * 1e9, t[1] * 1e9,
               4.0 * nr * D / (t[0] + t[1]) / 1e9,
               100.0 * 4.0 * nr * D / (t[0] + t[1]) / 1e9 / peak, base / (t[0] + t[1]));
    }
    return 0;
}
