/*
 * vec_math.h -- the kernels' math written once over a vector vocabulary:
 * 2**x and exp(s - m) in FA_VL lanes, the tile softmax step and 2**x of an
 * array. A variant's kernel file includes its vocabulary, then this file.
 *
 * The vocabulary (vec_avx2.h, vec_avx512.h; one per unit) gives:
 *   FA_VL                       the lanes of a register
 *   fa_vf, fa_vi, fa_vm         float32 lanes, int32 lanes, a mask of lanes
 *   vf_set1 zero load store load_first store_first add sub mul fma min max
 *   vf_hmax vf_hsum             reductions, each in a fixed order of its own
 *   vi_set1 zero add sub and or shl shr sar shlv shrv, vf_bits vi_bits
 *   vm_nan eq ne ge nge le nle igt none or and all any
 *   vf_select vi_select vf_keep
 * Every operation is one IEEE operation per lane (vf_fma: one rounding;
 * vf_min / vf_max: the SSE rules), so the functions below give every
 * vocabulary the same bits lane for lane; only the reductions' order (and
 * so a tile's sum) is a vocabulary's own.
 *
 * The including file defines FA_TARGET, FA_NAME and FA_ALWAYS_INLINE
 * (fa_internal.h) first.
 */
#ifndef FA_VEC_MATH_H
#define FA_VEC_MATH_H

#include "fa_internal.h"

/* 2**x is a normal float for x >= FA_EXP2_NORMAL_LO (and x <= 0):
 * vf_exp2_normal serves. */
#define FA_EXP2_NORMAL_LO -124.0f

/* 2**f for |f| <= 1/2 (a little beyond is fine): fa_exp2f's polynomial with
 * fused multiply-adds. */
static inline FA_TARGET fa_vf vf_exp2_poly(fa_vf f)
{
    fa_vf p = vf_set1(1.52527338040598e-05f);
    p = vf_fma(p, f, vf_set1(0.000154035303933816f));
    p = vf_fma(p, f, vf_set1(0.00133335581464284f));
    p = vf_fma(p, f, vf_set1(0.00961812910762848f));
    p = vf_fma(p, f, vf_set1(0.0555041086648216f));
    p = vf_fma(p, f, vf_set1(0.240226506959101f));
    p = vf_fma(p, f, vf_set1(0.693147180559945f));
    return vf_fma(p, f, vf_set1(1.0f));
}

/* 2**x: fa_exp2f's algorithm (2**n applied as two exact power-of-two
 * factors, so that a subnormal result is rounded once). */
static inline FA_TARGET fa_vf vf_exp2(fa_vf x)
{
    const fa_vf shift = vf_set1(12582912.0f); /* 1.5 * 2**23 */
    const fa_vi bias = vi_set1(127);
    const fa_vm nan = vm_nan(x);
    const fa_vf xc = vf_max(vf_min(x, vf_set1(128.0f)), vf_set1(-151.0f));
    const fa_vf y = vf_add(xc, shift);
    fa_vf p = vf_exp2_poly(vf_sub(xc, vf_sub(y, shift)));
    const fa_vi n = vi_sub(vf_bits(y), vi_set1(0x4B400000));
    const fa_vi n1 = vi_sar(n, 1), n2 = vi_sub(n, n1);
    p = vf_mul(p, vi_bits(vi_shl(vi_add(n1, bias), 23)));
    p = vf_mul(p, vi_bits(vi_shl(vi_add(n2, bias), 23)));
    return vf_select(nan, x, p);
}

/* 2**x for FA_EXP2_NORMAL_LO <= x <= 0, where the result is a normal float:
 * 2**n is added to the exponent field (y's low bits hold n, so y << 23 is
 * n << 23). Bit for bit the value vf_exp2 gives. */
static inline FA_TARGET fa_vf vf_exp2_normal(fa_vf x)
{
    const fa_vf shift = vf_set1(12582912.0f);
    const fa_vf y = vf_add(x, shift);
    const fa_vf p = vf_exp2_poly(vf_sub(x, vf_sub(y, shift)));
    return vi_bits(vi_add(vf_bits(p), vi_shl(vf_bits(y), 23)));
}

/* 2**x for x <= 0 (-inf and NaN included), bit for bit vf_exp2's value,
 * without its multiplications into the subnormal range (which x86 CPUs
 * finish in microcode: ~7.7 ns a value against 0.45). A lane whose result
 * p 2**n is normal takes vf_exp2_normal's exponent addition; below that,
 * the result is p's 24-bit significand M shifted right by sh = -126 - n - e
 * (p = M 2**(e - 23), e in {-1, 0}) with round-half-to-even, which is the
 * bit pattern of p 2**n rounded once (a shifted-out result of 2**23 is the
 * least normal float, its bits those of the integer). */
static inline FA_TARGET fa_vf vf_exp2_nonpos(fa_vf x)
{
    const fa_vf shift = vf_set1(12582912.0f);
    const fa_vi one = vi_set1(1);
    const fa_vm nan = vm_nan(x);
    const fa_vf xc = vf_max(x, vf_set1(-151.0f)); /* (x <= 0) */
    const fa_vf y = vf_add(xc, shift);
    const fa_vf p = vf_exp2_poly(vf_sub(xc, vf_sub(y, shift)));
    const fa_vi pb = vf_bits(p);
    const fa_vi n = vi_sub(vf_bits(y), vi_set1(0x4B400000));
    const fa_vi e = vi_sub(vi_shr(pb, 23), vi_set1(127));
    const fa_vi sh = vi_sub(vi_set1(-126), vi_add(n, e)); /* > 0: subnormal */
    const fa_vi m = vi_or(vi_and(pb, vi_set1(0x7FFFFF)), vi_set1(0x800000));
    const fa_vi half = vi_shlv(one, vi_sub(sh, one));
    const fa_vi odd = vi_and(vi_shrv(m, sh), one);
    const fa_vi sub = vi_shrv(vi_add(m, vi_add(vi_sub(half, one), odd)), sh);
    const fa_vi nrm = vi_add(pb, vi_shl(n, 23));
    const fa_vf r = vi_bits(vi_select(vm_igt(sh, vi_zero()), sub, nrm));
    return vf_select(nan, x, r);
}

/* exp(x - m) = 2**((x - m) log2 e) of the scores x of a register (mv = m,
 * a row's maximum), a score of -inf (a masked key, the padding of a short
 * tile) exactly 0: lanes whose argument is at least lo = FA_EXP2_NORMAL_LO
 * (a normal result; not NaN) take vf_exp2_normal, others vf_exp2_nonpos.
 * Where every argument is (the common case) no lane is -inf and the mask is
 * not formed: the same bits. */
static FA_ALWAYS_INLINE FA_TARGET fa_vf vf_exp2_masked(fa_vf x, fa_vf mv, fa_vf log2e, fa_vf ninf,
                                                      fa_vf lo)
{
    const fa_vf y = vf_mul(vf_sub(x, mv), log2e);
    const fa_vm slow = vm_nge(y, lo); /* below lo, or NaN */
    fa_vm live;
    if (!vm_any(slow)) /* (then no x is -inf) */
        return vf_exp2_normal(y);
    live = vm_ne(x, ninf);
    return vf_keep(live, vm_any(vm_and(slow, live)) ? vf_exp2_nonpos(y)
                                                    : vf_exp2_normal(y)); /* -inf: 0 */
}

typedef char FA_NAME(tile_is_whole_registers)[FA_BK % FA_VL == 0 ? 1 : -1];
/* The tile softmax step (see the portable versions in kernels_generic.c), FA_VL
 * lanes at a time: the larger of m and a tile's row of scores s[0..nc) (NaN
 * if any is NaN; nc a multiple of FA_VL). */
static FA_TARGET float FA_NAME(tile_max)(const float *s, int64_t nc, float m)
{
    fa_vf mx = vf_set1(-INFINITY);
    fa_vm nan = vm_none();
    float r;
    int64_t jj;
    for (jj = 0; jj < nc; jj += FA_VL) {
        const fa_vf x = vf_load(s + jj);
        mx = vf_max(mx, x); /* a NaN x leaves mx; caught by `nan` */
        nan = vm_or(nan, vm_nan(x));
    }
    if (vm_any(nan) || m != m)
        return NAN;
    r = vf_hmax(mx);
    return r > m ? r : m;
}

/* s[0..nc) -> exp(s - m) = 2**((s - m) log2 e) in place (vf_exp2_masked;
 * exactly 0 for -inf), and their sum: the lanes' sums, then vf_hsum. */
static FA_TARGET double FA_NAME(tile_exp)(float *s, int64_t nc, float m)
{
    const fa_vf mv = vf_set1(m), log2e = vf_set1(FA_LOG2E);
    const fa_vf ninf = vf_set1(-INFINITY), lo = vf_set1(FA_EXP2_NORMAL_LO);
    fa_vf sum = vf_zero();
    int64_t jj;
    for (jj = 0; jj < nc; jj += FA_VL) {
        const fa_vf p = vf_exp2_masked(vf_load(s + jj), mv, log2e, ninf, lo);
        vf_store(s + jj, p);
        sum = vf_add(sum, p);
    }
    return (double)vf_hsum(sum);
}

/* 2**x of an array, FA_VL at a time, as the attention kernels take it:
 * vf_exp2_normal where a register's lanes all lie in [FA_EXP2_NORMAL_LO, 0],
 * else vf_exp2_nonpos where none is above 0 (or NaN), else vf_exp2 (the
 * same bits each; the tests reach all three). */
static FA_TARGET void FA_NAME(exp2_array)(const float *x, float *y, int64_t n)
{
    const fa_vf lo = vf_set1(FA_EXP2_NORMAL_LO), zero = vf_zero();
    int64_t j;
    for (j = 0; j < n; j += FA_VL) {
        const fa_vf v = vf_load_first(x + j, n - j); /* lanes past n: 0 */
        const fa_vm ok = vm_and(vm_ge(v, lo), vm_le(v, zero));
        const int nonpos = !vm_any(vm_nle(v, zero));
        vf_store_first(y + j, n - j,
                       vm_all(ok) ? vf_exp2_normal(v) : nonpos ? vf_exp2_nonpos(v) : vf_exp2(v));
    }
}

#endif /* FA_VEC_MATH_H */
