/*
 * kernel_driver.c -- the compiled kernels checked from C, on every SIMD variant.
 *
 * For each variant this CPU and build run (fa_simd_available), selected with
 * fa_select_simd, the driver computes a set of attention cases through
 * fa_sdpa_f32 and rows through fa_rowwise_f32, compares every result with a
 * straightforward double-precision computation written here from the
 * documented rules, checks that the result does not change with the thread
 * count, and checks that all variants agree closely with the first one; for
 * each case also the gradients (fa_attention_backward_f32) against the
 * double-precision backward, and across thread counts. It
 * prints one line per variant and case and exits 0 when every check holds, 1
 * when one fails, 2 when a kernel refuses its arguments or memory runs out.
 *
 * It needs nothing but a C99 compiler and the sources of csrc/ (no Python),
 * so it can run wherever those compile, emulators included. From the
 * repository's root (without -fopenmp the kernels run on one thread):
 */
// cc -O2 -std=c99 -fopenmp -Icsrc csrc/*.c tests/c/kernel_driver.c -lm -o kernel_driver
/*
 * Only the public header's API is used: fastattn.h.
 */
#include "fastattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds for a float32 result against the float64 computation, for inputs of
 * unit scale (as the Python suite's SDPA_TOL), and for two variants against
 * each other (their summation orders differ, their exponentials by <= 2 ulp). */
#define OUT_RTOL 3e-5
#define OUT_ATOL 3e-6
/* Gradients (float32 sums of many products) against the double computation:
 * relative, and absolute in units of the gradient's largest magnitude (as
 * tests/test_backward.py holds them). */
#define BWD_RTOL 2e-4
#define BWD_ATOL 2e-5
#define AGREE_RTOL 1e-5
#define AGREE_ATOL 1e-6
#define MAX_VARIANTS 8
#define NTHREADS 3 /* compared bit for bit with one thread */

/* ------------------------------------------------------------------ inputs */

static uint64_t rng_state;

static double uniform(void)
{
    /* xorshift64*: the same inputs on every machine */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static float normal(void)
{
    const double two_pi = 6.283185307179586;
    const double u = 1.0 - uniform(), w = uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(two_pi * w));
}

/* IEEE binary16 <-> double, rounding to nearest even (exact the other way). */
static uint16_t to_f16(float f)
{
    double x = fabs((double)f), m;
    uint16_t sign = (uint16_t)(signbit(f) ? 0x8000 : 0);
    int e;
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00);
    if (x < ldexp(1.0, -14)) /* subnormal (or 0): units of 2**-24 */
        return (uint16_t)(sign | (uint16_t)rint(x * ldexp(1.0, 24)));
    (void)frexp(x, &e); /* x = f 2**e, f in [0.5, 1) */
    e -= 1;
    m = rint((x / ldexp(1.0, e) - 1.0) * 1024.0);
    if (m == 1024.0) {
        m = 0.0;
        e += 1;
    }
    if (e + 15 >= 31)
        return (uint16_t)(sign | 0x7c00);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)m);
}

static double from_f16(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0)
        return s * ldexp((double)m, -24);
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return s * ldexp(1024.0 + m, e - 25);
}

/* bfloat16: the top 16 bits of a float32, rounded to nearest even. */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------- cases */

enum { MASK_NONE, MASK_BOOL, MASK_FLOAT };

typedef struct {
    const char *name;
    int64_t B;        /* batch items: query heads */
    int64_t G;        /* query heads per kv head (consecutive items share k and v) */
    int64_t L, S, D, Dv;
    int is_causal;
    int64_t win_left, win_right; /* < 0: unbounded */
    int mask;                    /* MASK_*: one (L, S) mask per item */
    int masked_row;              /* >= 0: this query row of item 0 has no allowed key */
    int kv_dtype;                /* FA_DTYPE_* of k and v */
    int options;                 /* softcap, ALiBi slopes and sinks */
} acase;

static const acase CASES[] = {
    {"plain", 3, 1, 37, 70, 24, 20, 0, -1, -1, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"causal", 2, 1, 100, 130, 32, 32, 1, -1, -1, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"window", 2, 1, 90, 90, 16, 24, 0, 13, 2, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"gqa", 8, 4, 19, 150, 64, 64, 1, -1, -1, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"float-mask", 2, 1, 33, 77, 40, 8, 0, -1, -1, MASK_FLOAT, -1, FA_DTYPE_F32, 0},
    {"bool-mask", 2, 1, 25, 200, 8, 13, 0, -1, -1, MASK_BOOL, -1, FA_DTYPE_F32, 0},
    {"decode", 8, 4, 1, 1500, 64, 64, 0, -1, -1, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"decode-window", 4, 1, 1, 2100, 32, 16, 1, 1100, 0, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"masked-row", 2, 1, 12, 40, 16, 16, 0, -1, -1, MASK_BOOL, 5, FA_DTYPE_F32, 0},
    {"masked-row-float", 2, 1, 12, 40, 16, 16, 0, -1, -1, MASK_FLOAT, 0, FA_DTYPE_F32, 0},
    {"float16-kv", 4, 2, 45, 130, 64, 48, 1, -1, -1, MASK_NONE, -1, FA_DTYPE_F16, 0},
    {"bfloat16-kv", 4, 2, 1, 1100, 64, 64, 0, -1, -1, MASK_NONE, -1, FA_DTYPE_BF16, 0},
    {"options", 4, 2, 30, 90, 32, 32, 1, -1, -1, MASK_FLOAT, -1, FA_DTYPE_F32, 1},
    {"L>S", 2, 1, 20, 7, 8, 8, 1, -1, -1, MASK_NONE, -1, FA_DTYPE_F32, 0},
    {"q8_0-kv", 4, 2, 37, 150, 64, 32, 1, -1, -1, MASK_NONE, -1, FA_DTYPE_Q8_0, 0},
    {"q8_0-decode", 8, 4, 1, 1100, 128, 128, 0, -1, -1, MASK_NONE, -1, FA_DTYPE_Q8_0, 0},
    {"q4_0-kv", 4, 2, 30, 90, 32, 64, 1, -1, -1, MASK_FLOAT, -1, FA_DTYPE_Q4_0, 1},
    {"q4_0-decode", 4, 4, 1, 700, 64, 64, 1, 600, 0, MASK_NONE, -1, FA_DTYPE_Q4_0, 0},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

typedef struct {
    float *q;
    void *k, *v;        /* float32 or 16-bit elements */
    double *kd, *vd;    /* their values, for the computation here */
    uint8_t *bmask;
    float *fmask;
    float *slopes, *sinks;
    int64_t *q_off, *kv_off, *mask_off;
    float *out, *lse, *out2, *lse2; /* one thread, NTHREADS threads */
    double *want_out, *want_lse;
} abuf;

static void *alloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "kernel_driver: out of memory\n");
        exit(2);
    }
    return p;
}

static void free_abuf(abuf *b)
{
    free(b->q); free(b->k); free(b->v); free(b->kd); free(b->vd);
    free(b->bmask); free(b->fmask); free(b->slopes); free(b->sinks);
    free(b->q_off); free(b->kv_off); free(b->mask_off);
    free(b->out); free(b->lse); free(b->out2); free(b->lse2);
    free(b->want_out); free(b->want_lse);
}

/* The elements of a block format's unit (1 for an element type). */
static int64_t block_of(int dt)
{
    return dt == FA_DTYPE_Q8_0 || dt == FA_DTYPE_Q4_0 ? 32 : 1;
}

static void fill_kv(const acase *c, void **dst, double **vals, int64_t n)
{
    int64_t i;
    *vals = alloc((size_t)n * sizeof(double));
    if (block_of(c->kv_dtype) > 1) { /* random integers and float16 scales, as stored */
        const int q8 = c->kv_dtype == FA_DTYPE_Q8_0;
        const int64_t bb = q8 ? 34 : 18;
        unsigned char *x = alloc((size_t)(n / 32 * bb));
        int64_t blk, e;
        for (blk = 0; blk < n / 32; blk++) {
            unsigned char *p = x + blk * bb;
            const uint16_t h = to_f16((float)(0.004 + 0.008 * uniform())); /* values within 1.5 */
            const double d = from_f16(h);
            p[0] = (unsigned char)(h & 0xFF);
            p[1] = (unsigned char)(h >> 8);
            for (i = 2; i < bb; i++)
                p[i] = (unsigned char)(uniform() * 256.0);
            for (e = 0; e < 32; e++) {
                const int qv = q8 ? (int)(signed char)p[2 + e]
                                  : ((p[2 + e % 16] >> (e < 16 ? 0 : 4)) & 15) - 8;
                (*vals)[blk * 32 + e] = qv * d;
            }
        }
        *dst = x;
    } else if (c->kv_dtype == FA_DTYPE_F32) {
        float *x = alloc((size_t)n * sizeof(float));
        for (i = 0; i < n; i++)
            (*vals)[i] = x[i] = normal();
        *dst = x;
    } else {
        uint16_t *x = alloc((size_t)n * sizeof(uint16_t));
        for (i = 0; i < n; i++) {
            const float f = normal();
            x[i] = c->kv_dtype == FA_DTYPE_F16 ? to_f16(f) : to_bf16(f);
            (*vals)[i] = c->kv_dtype == FA_DTYPE_F16 ? from_f16(x[i]) : from_bf16(x[i]);
        }
        *dst = x;
    }
}

static void make_inputs(const acase *c, abuf *b)
{
    const int64_t nkv = c->B / c->G, LS = c->L * c->S;
    int64_t i, j, it;
    memset(b, 0, sizeof *b);
    b->q = alloc((size_t)(c->B * c->L * c->D) * sizeof(float));
    for (i = 0; i < c->B * c->L * c->D; i++)
        b->q[i] = normal();
    fill_kv(c, &b->k, &b->kd, nkv * c->S * c->D);
    fill_kv(c, &b->v, &b->vd, nkv * c->S * c->Dv);
    b->q_off = alloc((size_t)c->B * sizeof(int64_t));
    b->kv_off = alloc((size_t)c->B * 2 * sizeof(int64_t)); /* k's, then v's */
    b->mask_off = alloc((size_t)c->B * sizeof(int64_t));
    for (it = 0; it < c->B; it++) { /* (k and v in units: elements or blocks) */
        b->q_off[it] = it * c->L * c->D;
        b->kv_off[it] = (it / c->G) * c->S * (c->D / block_of(c->kv_dtype));
        b->kv_off[c->B + it] = (it / c->G) * c->S * (c->Dv / block_of(c->kv_dtype));
        b->mask_off[it] = it * LS;
    }
    if (c->mask == MASK_BOOL) {
        b->bmask = alloc((size_t)(c->B * LS));
        for (i = 0; i < c->B * LS; i++)
            b->bmask[i] = uniform() < 0.7;
        if (c->masked_row >= 0)
            memset(b->bmask + c->masked_row * c->S, 0, (size_t)c->S);
    } else if (c->mask == MASK_FLOAT) {
        b->fmask = alloc((size_t)(c->B * LS) * sizeof(float));
        for (i = 0; i < c->B * LS; i++)
            b->fmask[i] = uniform() < 0.15 ? -INFINITY : normal();
        if (c->masked_row >= 0)
            for (j = 0; j < c->S; j++)
                b->fmask[c->masked_row * c->S + j] = -INFINITY;
    }
    if (c->options) {
        b->slopes = alloc((size_t)c->B * sizeof(float));
        b->sinks = alloc((size_t)c->B * sizeof(float));
        for (it = 0; it < c->B; it++) {
            b->slopes[it] = (float)(0.05 + 0.1 * uniform());
            b->sinks[it] = normal();
        }
    }
    b->out = alloc((size_t)(c->B * c->L * c->Dv) * sizeof(float));
    b->out2 = alloc((size_t)(c->B * c->L * c->Dv) * sizeof(float));
    b->lse = alloc((size_t)(c->B * c->L) * sizeof(float));
    b->lse2 = alloc((size_t)(c->B * c->L) * sizeof(float));
    b->want_out = alloc((size_t)(c->B * c->L * c->Dv) * sizeof(double));
    b->want_lse = alloc((size_t)(c->B * c->L) * sizeof(double));
}

#define SOFTCAP 5.0f

static float case_scale(const acase *c)
{
    return (float)(1.0 / sqrt((double)c->D));
}

/* The documented computation, in double, row by row. */
static void reference(const acase *c, abuf *b)
{
    const double scale = case_scale(c);
    double *s = alloc((size_t)c->S * sizeof(double));
    unsigned char *ok = alloc((size_t)c->S);
    int64_t it, i, j, d;
    for (it = 0; it < c->B; it++) {
        const double *kd = b->kd + b->kv_off[it] * block_of(c->kv_dtype);
        const double *vd = b->vd + b->kv_off[c->B + it] * block_of(c->kv_dtype);
        for (i = 0; i < c->L; i++) {
            const int64_t p = i + c->S - c->L; /* bottom-right alignment */
            const float *qi = b->q + b->q_off[it] + i * c->D;
            double *o = b->want_out + (it * c->L + i) * c->Dv;
            double mx = -INFINITY, sum = 0.0;
            for (j = 0; j < c->S; j++) {
                const int64_t m = b->mask_off[it] + i * c->S + j;
                double dot = 0.0;
                ok[j] = (!b->bmask || b->bmask[m]) && (!c->is_causal || j <= p)
                        && (c->win_left < 0 || j >= p - c->win_left)
                        && (c->win_right < 0 || j <= p + c->win_right);
                if (!ok[j])
                    continue;
                for (d = 0; d < c->D; d++)
                    dot += (double)qi[d] * kd[j * c->D + d];
                s[j] = scale * dot;
                if (c->options) {
                    s[j] = SOFTCAP * tanh(s[j] / SOFTCAP);
                    s[j] -= b->slopes[it] * fabs((double)(p - j));
                }
                if (b->fmask)
                    s[j] += b->fmask[m];
                if (s[j] > mx)
                    mx = s[j];
            }
            if (b->sinks && b->sinks[it] > mx)
                mx = b->sinks[it];
            for (d = 0; d < c->Dv; d++)
                o[d] = 0.0;
            if (mx == -INFINITY) { /* no allowed key, or only -inf scores */
                b->want_lse[it * c->L + i] = -INFINITY;
                continue;
            }
            for (j = 0; j < c->S; j++) {
                double w;
                if (!ok[j] || s[j] == -INFINITY)
                    continue;
                w = exp(s[j] - mx);
                sum += w;
                for (d = 0; d < c->Dv; d++)
                    o[d] += w * vd[j * c->Dv + d];
            }
            if (b->sinks)
                sum += exp(b->sinks[it] - mx); /* a key of value 0 */
            for (d = 0; d < c->Dv; d++)
                o[d] /= sum;
            b->want_lse[it * c->L + i] = mx + log(sum);
        }
    }
    free(s);
    free(ok);
}

/* The forward's arguments of case c over its buffers (out and lse spans
 * included; the backward reads the same record). */
static fa_attn_args case_args(const acase *c, const abuf *b)
{
    const int64_t nkv = c->B / c->G, LS = c->L * c->S;
    fa_attn_args a;
    memset(&a, 0, sizeof a);
    a.nbatch = c->B;
    a.L = c->L;
    a.S = c->S;
    a.D = c->D;
    a.Dv = c->Dv;
    a.q = b->q;
    a.k = b->k;
    a.v = b->v;
    a.k_dtype = a.v_dtype = c->kv_dtype;
    a.q_off = b->q_off;
    a.k_off = b->kv_off;
    a.v_off = b->kv_off + c->B;
    a.q_rs = c->D;
    a.k_rs = c->D / block_of(c->kv_dtype);
    a.v_rs = c->Dv / block_of(c->kv_dtype);
    a.mask_kind = b->bmask ? FA_MASK_BOOL : b->fmask ? FA_MASK_FLOAT : FA_MASK_NONE;
    a.bool_mask = b->bmask;
    a.float_mask = b->fmask;
    a.mask_off = a.mask_kind != FA_MASK_NONE ? b->mask_off : NULL;
    a.mask_sl = c->S;
    a.mask_ss = 1;
    a.is_causal = c->is_causal;
    a.win_left = c->win_left;
    a.win_right = c->win_right;
    a.scale = case_scale(c);
    a.softcap = c->options ? SOFTCAP : 0.0f;
    a.alibi_slopes = b->slopes;
    a.sinks = b->sinks;
    a.q_span.hi = c->B * c->L * c->D;
    a.k_span.hi = nkv * c->S * c->D / block_of(c->kv_dtype);
    a.v_span.hi = nkv * c->S * c->Dv / block_of(c->kv_dtype);
    a.mask_span.hi = a.mask_kind != FA_MASK_NONE ? c->B * LS : 0;
    a.out_span.hi = c->B * c->L * c->Dv;
    a.lse_span.hi = c->B * c->L;
    a.slopes_len = b->slopes ? c->B : 0;
    a.sinks_len = b->sinks ? c->B : 0;
    return a;
}

static int run_sdpa(const acase *c, abuf *b, float *out, float *lse, int nthreads)
{
    const fa_attn_args a = case_args(c, b);
    return fa_sdpa_f32(&a, out, lse, nthreads);
}

/* ------------------------------------------------------------- gradients */

/* The gradients of sum(dout * out) in double from the documented rules
 * (FlashAttention-2's backward with the exact lse of reference(), which
 * must have run): per item, row and allowed key, P = exp(s - lse), dS =
 * P (dout . v - Delta), times 1 - tanh^2 under the soft cap. gq: B L D,
 * gk: B/G S D, gv: B/G S Dv, gs: B (sinks). */
static void reference_backward(const acase *c, const abuf *b, const float *dout, double *gq,
                               double *gk, double *gv, double *gs)
{
    const double scale = case_scale(c);
    const int64_t nkv = c->B / c->G;
    int64_t it, i, j, d;
    memset(gq, 0, (size_t)(c->B * c->L * c->D) * sizeof(double));
    memset(gk, 0, (size_t)(nkv * c->S * c->D) * sizeof(double));
    memset(gv, 0, (size_t)(nkv * c->S * c->Dv) * sizeof(double));
    memset(gs, 0, (size_t)c->B * sizeof(double));
    for (it = 0; it < c->B; it++) {
        const double *kd = b->kd + b->kv_off[it] * block_of(c->kv_dtype);
        const double *vd = b->vd + b->kv_off[c->B + it] * block_of(c->kv_dtype);
        double *dk = gk + (it / c->G) * c->S * c->D, *dv = gv + (it / c->G) * c->S * c->Dv;
        for (i = 0; i < c->L; i++) {
            const int64_t p = i + c->S - c->L;
            const float *qi = b->q + b->q_off[it] + i * c->D;
            const float *dy = dout + (it * c->L + i) * c->Dv;
            const double lse = b->want_lse[it * c->L + i];
            double delta = 0.0;
            if (lse == -INFINITY)
                continue;
            for (d = 0; d < c->Dv; d++)
                delta += (double)dy[d] * b->want_out[(it * c->L + i) * c->Dv + d];
            if (b->sinks)
                gs[it] -= exp(b->sinks[it] - lse) * delta;
            for (j = 0; j < c->S; j++) {
                const int64_t m = b->mask_off[it] + i * c->S + j;
                double dot = 0.0, s, P, dp = 0.0, ds, f = 1.0;
                if ((b->bmask && !b->bmask[m]) || (c->is_causal && j > p)
                    || (c->win_left >= 0 && j < p - c->win_left)
                    || (c->win_right >= 0 && j > p + c->win_right)
                    || (b->fmask && b->fmask[m] == -INFINITY))
                    continue;
                for (d = 0; d < c->D; d++)
                    dot += (double)qi[d] * kd[j * c->D + d];
                s = scale * dot;
                if (c->options) {
                    const double t = tanh(s / SOFTCAP);
                    f = 1.0 - t * t;
                    s = SOFTCAP * t - b->slopes[it] * fabs((double)(p - j));
                }
                if (b->fmask)
                    s += b->fmask[m];
                P = exp(s - lse);
                for (d = 0; d < c->Dv; d++) {
                    dp += (double)dy[d] * vd[j * c->Dv + d];
                    dv[j * c->Dv + d] += P * dy[d];
                }
                ds = P * (dp - delta) * f * scale;
                for (d = 0; d < c->D; d++) {
                    gq[(it * c->L + i) * c->D + d] += ds * kd[j * c->D + d];
                    dk[j * c->D + d] += ds * qi[d];
                }
            }
        }
    }
}

static int run_backward(const acase *c, abuf *b, const float *dout, float *gq, float *gk,
                        float *gv, float *gs, int nthreads)
{
    const int64_t nkv = c->B / c->G;
    int64_t *dq_off = alloc((size_t)c->B * sizeof(int64_t));
    int64_t *dkv_off = alloc((size_t)nkv * 2 * sizeof(int64_t));
    fa_attn_args a;
    fa_bwd_args g;
    int64_t it;
    int status;
    memset(&g, 0, sizeof g);
    for (it = 0; it < c->B; it++)
        dq_off[it] = it * c->L * c->D;
    for (it = 0; it < nkv; it++) {
        dkv_off[it] = it * c->S * c->D;
        dkv_off[nkv + it] = it * c->S * c->Dv;
    }
    a = case_args(c, b);
    g.group = c->G;
    g.dout = dout;
    g.out = b->out;
    g.lse = b->lse;
    g.dq = gq;
    g.dk = gk;
    g.dv = gv;
    g.dsinks = b->sinks ? gs : NULL;
    g.dq_off = dq_off;
    g.dk_off = dkv_off;
    g.dv_off = dkv_off + nkv;
    g.dq_rs = c->D;
    g.dk_rs = c->D;
    g.dv_rs = c->Dv;
    g.dout_span.hi = g.out_span.hi = c->B * c->L * c->Dv;
    g.lse_span.hi = c->B * c->L;
    g.dq_span.hi = c->B * c->L * c->D;
    g.dk_span.hi = nkv * c->S * c->D;
    g.dv_span.hi = nkv * c->S * c->Dv;
    g.dsinks_len = b->sinks ? c->B : 0;
    status = fa_attention_backward_f32(&a, &g, nthreads);
    free(dq_off);
    free(dkv_off);
    return status;
}

/* ------------------------------------------------------------ comparisons */

typedef struct {
    double worst; /* the largest error in units of its bound (<= 1: within) */
    int64_t bad;  /* elements outside their bound */
} verdict;

/* got against want: the same non-finite value, or within atol + rtol |want|. */
static void judge(verdict *v, double got, double want, double rtol, double atol)
{
    double err;
    if (isnan(want) || isinf(want)) {
        if (!(isnan(want) ? isnan(got) : got == want))
            v->bad++;
        return;
    }
    err = fabs(got - want) / (atol + rtol * fabs(want));
    if (!(err <= 1.0)) { /* (NaN too) */
        v->bad++;
        err = isnan(err) ? INFINITY : err;
    }
    if (err > v->worst)
        v->worst = err;
}

static int same_bits(const float *x, const float *y, int64_t n)
{
    return n == 0 || memcmp(x, y, (size_t)n * sizeof(float)) == 0;
}

/* A row that the case leaves with no allowed key must be exactly 0 with lse
 * -inf (with sinks: lse = the sink). */
static int64_t empty_rows_wrong(const acase *c, const abuf *b)
{
    int64_t it, i, d, wrong = 0;
    for (it = 0; it < c->B; it++)
        for (i = 0; i < c->L; i++) {
            if (b->want_lse[it * c->L + i] != -INFINITY)
                continue;
            if (b->lse[it * c->L + i] != -INFINITY)
                wrong++;
            for (d = 0; d < c->Dv; d++)
                if (b->out[(it * c->L + i) * c->Dv + d] != 0.0f)
                    wrong++;
        }
    return wrong;
}

/* -------------------------------------------------------------- row-wise */

typedef struct {
    const char *name;
    int64_t nrows, n;
    double magnitude; /* the inputs' scale */
    double neginf;    /* the share of -inf entries (a row keeps a finite one) */
} rcase;

static const rcase RCASES[] = {
    {"rows-short", 9, 7, 3.0, 0.0},
    {"rows-long", 4, 1000, 3.0, 0.0},
    {"rows-huge", 3, 333, 1e30, 0.0},
    {"rows-neginf", 5, 129, 5.0, 0.3},
    {"rows-length-1", 6, 1, 1.0, 0.0},
};
#define NRCASES ((int)(sizeof RCASES / sizeof RCASES[0]))
static const char *const OP_NAMES[] = {"softmax", "log_softmax", "logsumexp"};

static void make_rows(const rcase *r, float *x)
{
    int64_t i, j;
    for (i = 0; i < r->nrows; i++) {
        for (j = 0; j < r->n; j++)
            x[i * r->n + j] = (float)(r->magnitude * normal());
        for (j = 1; j < r->n; j++) /* entry 0 stays finite */
            if (uniform() < r->neginf)
                x[i * r->n + j] = -INFINITY;
    }
}

/* softmax / log_softmax / logsumexp of one row in double. */
static void row_reference(const float *x, int64_t n, int op, double *want)
{
    double mx = -INFINITY, sum = 0.0;
    int64_t j;
    for (j = 0; j < n; j++)
        if (x[j] > mx)
            mx = x[j];
    for (j = 0; j < n; j++)
        sum += exp((double)x[j] - mx);
    if (op == FA_OP_LOGSUMEXP) {
        want[0] = mx + log(sum);
        return;
    }
    for (j = 0; j < n; j++)
        want[j] = op == FA_OP_SOFTMAX ? exp((double)x[j] - mx) / sum
                                      : ((double)x[j] - mx) - log(sum);
}

/* The bound of an element of a row-wise result: a few float32 ulps of the
 * value; log_softmax and logsumexp also carry the rounding of x - max, of
 * the size of the row's largest magnitude. */
static void judge_row(verdict *v, int op, double got, double want, double xmax)
{
    if (op == FA_OP_SOFTMAX)
        judge(v, got, want, 8 * 1.1920929e-7, 1e-44);
    else
        judge(v, got, want, 8 * 1.1920929e-7, 4 * 1.1920929e-7 * (1.0 + xmax));
}

/* -------------------------------------------------------------------- main */

static int failures;

static void report(const char *variant, const char *name, const char *detail, int ok)
{
    printf("%-8s %-20s %-52s %s\n", variant, name, detail, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

int main(void)
{
    char variants[MAX_VARIANTS][32];
    const char *avail = fa_simd_available();
    int nv = 0, vi, ci, op;
    float *first_out[NCASES], *first_lse[NCASES], *first_rows[NRCASES][3];

    /* the variants, from "generic,avx2,..." */
    while (*avail && nv < MAX_VARIANTS) {
        size_t len = strcspn(avail, ",");
        if (len >= sizeof variants[0])
            len = sizeof variants[0] - 1;
        memcpy(variants[nv], avail, len);
        variants[nv][len] = '\0';
        nv++;
        avail += len;
        avail += *avail == ',';
    }
    printf("kernel_driver: %d variant(s): %s; compiler %s, %s\n", nv, fa_simd_available(),
           fa_compiler(), fa_built_with_openmp() ? "OpenMP" : "no OpenMP");
    memset(first_out, 0, sizeof first_out);
    memset(first_lse, 0, sizeof first_lse);
    memset(first_rows, 0, sizeof first_rows);

    for (vi = 0; vi < nv; vi++) {
        if (fa_select_simd(variants[vi]) != FA_OK) {
            report(variants[vi], "select", "fa_select_simd refused a listed variant", 0);
            continue;
        }
        if (strcmp(fa_simd_kernel(), variants[vi]) != 0)
            report(variants[vi], "select", "fa_simd_kernel names another variant", 0);

        for (ci = 0; ci < NCASES; ci++) {
            const acase *c = &CASES[ci];
            const int64_t nout = c->B * c->L * c->Dv, nlse = c->B * c->L;
            char detail[160];
            verdict v = {0.0, 0};
            abuf b;
            int64_t i, wrong;
            int st1, st2, threads_same;
            rng_state = 0x9e3779b97f4a7c15ULL + (uint64_t)ci; /* the same inputs per variant */
            make_inputs(c, &b);
            reference(c, &b);
            st1 = run_sdpa(c, &b, b.out, b.lse, 1);
            st2 = run_sdpa(c, &b, b.out2, b.lse2, NTHREADS);
            if (st1 != FA_OK || st2 != FA_OK) {
                fprintf(stderr, "kernel_driver: %s %s: status %d, %d\n", variants[vi], c->name,
                        st1, st2);
                return 2;
            }
            for (i = 0; i < nout; i++)
                judge(&v, b.out[i], b.want_out[i], OUT_RTOL, OUT_ATOL);
            for (i = 0; i < nlse; i++)
                judge(&v, b.lse[i], b.want_lse[i], OUT_RTOL, OUT_ATOL);
            wrong = empty_rows_wrong(c, &b);
            threads_same = same_bits(b.out, b.out2, nout) && same_bits(b.lse, b.lse2, nlse);
            snprintf(detail, sizeof detail,
                     "B=%lld L=%lld S=%lld D=%lld: err %.2f of bound%s%s",
                     (long long)c->B, (long long)c->L, (long long)c->S, (long long)c->D,
                     v.worst, wrong ? ", empty rows not 0/-inf" : "",
                     threads_same ? "" : ", threads change bits");
            report(variants[vi], c->name, detail, v.bad == 0 && wrong == 0 && threads_same);

            if (block_of(c->kv_dtype) > 1) {
                /* a block format: the bits of the float32 call on the values
                 * it stands for (exact floats), and no backward */
                acase cf = *c;
                abuf bf = b;
                const int64_t nk = c->B / c->G * c->S;
                float *kf = alloc((size_t)(nk * c->D) * sizeof(float));
                float *vf = alloc((size_t)(nk * c->Dv) * sizeof(float));
                float *of = alloc((size_t)nout * sizeof(float)), *lf = alloc((size_t)nlse * sizeof(float));
                int64_t it2;
                for (i = 0; i < nk * c->D; i++)
                    kf[i] = (float)b.kd[i];
                for (i = 0; i < nk * c->Dv; i++)
                    vf[i] = (float)b.vd[i];
                cf.kv_dtype = FA_DTYPE_F32;
                bf.k = kf;
                bf.v = vf;
                bf.kv_off = alloc((size_t)c->B * 2 * sizeof(int64_t));
                for (it2 = 0; it2 < 2 * c->B; it2++)
                    bf.kv_off[it2] = b.kv_off[it2] * 32;
                st1 = run_sdpa(&cf, &bf, of, lf, 1);
                snprintf(detail, sizeof detail, "bits of the float32 call on its values");
                report(variants[vi], c->name, detail,
                       st1 == FA_OK && same_bits(b.out, of, nout) && same_bits(b.lse, lf, nlse));
                {
                    float *g = alloc((size_t)(c->B * c->L * c->D) * sizeof(float));
                    float *gk = alloc((size_t)(nk * c->D) * sizeof(float));
                    float *gvv = alloc((size_t)(nk * c->Dv) * sizeof(float));
                    float *gs = alloc((size_t)c->B * sizeof(float));
                    report(variants[vi], c->name, "backward refuses a block format",
                           run_backward(c, &b, of, g, gk, gvv, gs, 1) == FA_ERR_ARG);
                    free(g); free(gk); free(gvv); free(gs);
                }
                free(kf); free(vf); free(of); free(lf); free(bf.kv_off);
            } else { /* the gradients: against the double computation, across threads */
                const int64_t nkv = c->B / c->G;
                const int64_t n[4] = {c->B * c->L * c->D, nkv * c->S * c->D,
                                      nkv * c->S * c->Dv, c->B};
                float *dout = alloc((size_t)nout * sizeof(float)), *got[2][4];
                double *want[4];
                verdict gv = {0.0, 0};
                int gsame = 1, t, e, gst = FA_OK;
                for (i = 0; i < nout; i++)
                    dout[i] = normal();
                for (e = 0; e < 4; e++) {
                    want[e] = alloc((size_t)n[e] * sizeof(double));
                    for (t = 0; t < 2; t++)
                        got[t][e] = alloc((size_t)n[e] * sizeof(float));
                }
                reference_backward(c, &b, dout, want[0], want[1], want[2], want[3]);
                for (t = 0; t < 2 && gst == FA_OK; t++)
                    gst = run_backward(c, &b, dout, got[t][0], got[t][1], got[t][2], got[t][3],
                                       t ? NTHREADS : 1);
                if (gst != FA_OK) {
                    fprintf(stderr, "kernel_driver: %s %s backward: status %d\n", variants[vi],
                            c->name, gst);
                    return 2;
                }
                for (e = 0; e < (b.sinks ? 4 : 3); e++) {
                    double big = 1.0;
                    for (i = 0; i < n[e]; i++)
                        big = fabs(want[e][i]) > big ? fabs(want[e][i]) : big;
                    for (i = 0; i < n[e]; i++)
                        judge(&gv, got[0][e][i], want[e][i], BWD_RTOL, BWD_ATOL * big);
                    gsame &= same_bits(got[0][e], got[1][e], n[e]);
                }
                snprintf(detail, sizeof detail, "gradients: err %.2f of bound%s", gv.worst,
                         gsame ? "" : ", threads change bits");
                report(variants[vi], c->name, detail, gv.bad == 0 && gsame);
                free(dout);
                for (e = 0; e < 4; e++) {
                    free(want[e]);
                    free(got[0][e]);
                    free(got[1][e]);
                }
            }

            if (vi == 0) { /* keep the first variant's results */
                first_out[ci] = b.out;
                first_lse[ci] = b.lse;
                b.out = b.lse = NULL;
            } else if (first_out[ci]) {
                verdict agree = {0.0, 0};
                for (i = 0; i < nout; i++)
                    judge(&agree, b.out[i], first_out[ci][i], AGREE_RTOL, AGREE_ATOL);
                for (i = 0; i < nlse; i++)
                    judge(&agree, b.lse[i], first_lse[ci][i], AGREE_RTOL, AGREE_ATOL);
                snprintf(detail, sizeof detail, "against %s: diff %.2f of bound", variants[0],
                         agree.worst);
                report(variants[vi], c->name, detail, agree.bad == 0);
            }
            free_abuf(&b);
        }

        for (ci = 0; ci < NRCASES; ci++) {
            const rcase *r = &RCASES[ci];
            const int64_t n = r->nrows * r->n;
            float *x = alloc((size_t)n * sizeof(float));
            float *got = alloc((size_t)n * sizeof(float)), *got2 = alloc((size_t)n * sizeof(float));
            double *want = alloc((size_t)r->n * sizeof(double));
            rng_state = 0x2545f4914f6cdd1dULL + (uint64_t)ci;
            make_rows(r, x);
            for (op = 0; op < 3; op++) {
                const int64_t nres = op == FA_OP_LOGSUMEXP ? r->nrows : n;
                char name[48], detail[160];
                verdict v = {0.0, 0};
                int64_t i, j;
                int threads_same;
                if (fa_rowwise_f32(x, got, r->nrows, r->n, op, 1) != FA_OK
                    || fa_rowwise_f32(x, got2, r->nrows, r->n, op, NTHREADS) != FA_OK) {
                    fprintf(stderr, "kernel_driver: %s %s: fa_rowwise_f32 failed\n",
                            variants[vi], r->name);
                    return 2;
                }
                for (i = 0; i < r->nrows; i++) {
                    double xmax = 0.0;
                    for (j = 0; j < r->n; j++)
                        if (isfinite(x[i * r->n + j]) && fabs(x[i * r->n + j]) > xmax)
                            xmax = fabs(x[i * r->n + j]);
                    row_reference(x + i * r->n, r->n, op, want);
                    for (j = 0; j < (op == FA_OP_LOGSUMEXP ? 1 : r->n); j++)
                        judge_row(&v, op, got[op == FA_OP_LOGSUMEXP ? i : i * r->n + j], want[j],
                                  xmax);
                }
                threads_same = same_bits(got, got2, nres);
                snprintf(name, sizeof name, "%s %s", OP_NAMES[op], r->name + 5);
                snprintf(detail, sizeof detail, "rows=%lld n=%lld: err %.2f of bound%s",
                         (long long)r->nrows, (long long)r->n, v.worst,
                         threads_same ? "" : ", threads change bits");
                report(variants[vi], name, detail, v.bad == 0 && threads_same);
                if (vi == 0) {
                    first_rows[ci][op] = alloc((size_t)nres * sizeof(float));
                    memcpy(first_rows[ci][op], got, (size_t)nres * sizeof(float));
                } else {
                    verdict agree = {0.0, 0};
                    for (i = 0; i < nres; i++)
                        judge(&agree, got[i], first_rows[ci][op][i], AGREE_RTOL,
                              op == FA_OP_SOFTMAX ? 1e-30 : AGREE_ATOL);
                    snprintf(detail, sizeof detail, "against %s: diff %.2f of bound",
                             variants[0], agree.worst);
                    report(variants[vi], name, detail, agree.bad == 0);
                }
            }
            free(x);
            free(got);
            free(got2);
            free(want);
        }
    }
    fa_select_simd("auto");
    for (ci = 0; ci < NCASES; ci++) {
        free(first_out[ci]);
        free(first_lse[ci]);
    }
    for (ci = 0; ci < NRCASES; ci++)
        for (op = 0; op < 3; op++)
            free(first_rows[ci][op]);
    printf("kernel_driver: %s (%d failure%s)\n", failures ? "FAILED" : "all checks passed",
           failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
