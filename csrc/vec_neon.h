/*
 * vec_neon.h -- the vector vocabulary (see vec_math.h) for AArch64's Advanced
 * SIMD (NEON): four float lanes in a 128-bit register, masks as vectors of
 * all-ones / zero lanes.
 *
 * Each operation keeps the vocabulary's rule of one IEEE operation per lane.
 * Two need more than one instruction here: vf_min / vf_max follow the SSE
 * rules (the second operand where either is NaN or both are zeros), which
 * NEON's fmin / fmax (NaN out) and fminnm / fmaxnm (the number out) do not,
 * so they are a compare and a select; and the partial loads and stores of
 * vf_load_first / vf_store_first go through a small buffer (NEON has no
 * masked loads; they serve only the ends of arrays).
 *
 * The including file defines FA_TARGET (empty: NEON is AArch64's baseline)
 * first; a unit includes one vocabulary.
 */
#ifndef FA_VEC_H
#define FA_VEC_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#define FA_VL 4 /* lanes */
typedef float32x4_t fa_vf; /* float32 lanes */
typedef int32x4_t fa_vi;   /* int32 lanes */
typedef uint32x4_t fa_vm;  /* a mask: a lane all ones (set) or all zeros */

#define FA_V static FA_ALWAYS_INLINE FA_TARGET

FA_V fa_vf vf_set1(float x) { return vdupq_n_f32(x); }
FA_V fa_vf vf_zero(void) { return vdupq_n_f32(0.0f); }
FA_V fa_vf vf_load(const float *p) { return vld1q_f32(p); }
FA_V void vf_store(float *p, fa_vf v) { vst1q_f32(p, v); }
/* Lanes [0, n) of p, zero lanes after (n > 0; n >= FA_VL: all). */
FA_V fa_vf vf_load_first(const float *p, int64_t n)
{
    float buf[FA_VL] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (n >= FA_VL)
        return vld1q_f32(p);
    memcpy(buf, p, (size_t)n * sizeof(float));
    return vld1q_f32(buf);
}
/* Stores lanes [0, n) of v (n > 0; n >= FA_VL: all). */
FA_V void vf_store_first(float *p, int64_t n, fa_vf v)
{
    float buf[FA_VL];
    if (n >= FA_VL) {
        vst1q_f32(p, v);
        return;
    }
    vst1q_f32(buf, v);
    memcpy(p, buf, (size_t)n * sizeof(float));
}
FA_V fa_vf vf_add(fa_vf a, fa_vf b) { return vaddq_f32(a, b); }
FA_V fa_vf vf_sub(fa_vf a, fa_vf b) { return vsubq_f32(a, b); }
FA_V fa_vf vf_mul(fa_vf a, fa_vf b) { return vmulq_f32(a, b); }
/* a * b + c, one rounding */
FA_V fa_vf vf_fma(fa_vf a, fa_vf b, fa_vf c) { return vfmaq_f32(c, a, b); }
/* The SSE rules: a < b ? a : b and a > b ? a : b (b where either is NaN). */
FA_V fa_vf vf_min(fa_vf a, fa_vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
FA_V fa_vf vf_max(fa_vf a, fa_vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
/* Reductions, each in a fixed order of this vocabulary's own: the halves
 * lane by lane, then the two lanes left (as the x86 vocabularies' last
 * 128 bits). */
FA_V float vf_hmax(fa_vf v)
{
    const float32x2_t h = vget_low_f32(vf_max(v, vcombine_f32(vget_high_f32(v), vget_high_f32(v))));
    const float a = vget_lane_f32(h, 0), b = vget_lane_f32(h, 1);
    return a > b ? a : b;
}
FA_V float vf_hsum(fa_vf v)
{
    const float32x2_t h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

FA_V fa_vi vi_set1(int32_t x) { return vdupq_n_s32(x); }
FA_V fa_vi vi_zero(void) { return vdupq_n_s32(0); }
FA_V fa_vi vi_add(fa_vi a, fa_vi b) { return vaddq_s32(a, b); }
FA_V fa_vi vi_sub(fa_vi a, fa_vi b) { return vsubq_s32(a, b); }
FA_V fa_vi vi_and(fa_vi a, fa_vi b) { return vandq_s32(a, b); }
FA_V fa_vi vi_or(fa_vi a, fa_vi b) { return vorrq_s32(a, b); }
#define vi_shl(a, n) vshlq_n_s32((a), (n)) /* by a constant */
#define vi_shr(a, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), (n))) /* logical */
#define vi_sar(a, n) vshrq_n_s32((a), (n)) /* arithmetic */
/* By a count per lane, as AVX2's sllv / srlv: a count of 32 or more gives 0
 * (NEON's ushl shifts right for a negative count: counts outside [0, 31]
 * are only used where their lane is discarded, as in vf_exp2_nonpos). */
FA_V fa_vi vi_shlv(fa_vi a, fa_vi n)
{
    return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a), n));
}
FA_V fa_vi vi_shrv(fa_vi a, fa_vi n)
{
    return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a), vnegq_s32(n)));
}
/* The bits of one as the other */
FA_V fa_vi vf_bits(fa_vf a) { return vreinterpretq_s32_f32(a); }
FA_V fa_vf vi_bits(fa_vi a) { return vreinterpretq_f32_s32(a); }

FA_V fa_vm vm_nan(fa_vf a) { return vmvnq_u32(vceqq_f32(a, a)); }
FA_V fa_vm vm_eq(fa_vf a, fa_vf b) { return vceqq_f32(a, b); }
FA_V fa_vm vm_ne(fa_vf a, fa_vf b) { return vmvnq_u32(vceqq_f32(a, b)); }
FA_V fa_vm vm_ge(fa_vf a, fa_vf b) { return vcgeq_f32(a, b); }
/* not a >= b: a < b, or either NaN */
FA_V fa_vm vm_nge(fa_vf a, fa_vf b) { return vmvnq_u32(vcgeq_f32(a, b)); }
FA_V fa_vm vm_le(fa_vf a, fa_vf b) { return vcleq_f32(a, b); }
/* not a <= b: a > b, or either NaN */
FA_V fa_vm vm_nle(fa_vf a, fa_vf b) { return vmvnq_u32(vcleq_f32(a, b)); }
FA_V fa_vm vm_igt(fa_vi a, fa_vi b) { return vcgtq_s32(a, b); }
FA_V fa_vm vm_none(void) { return vdupq_n_u32(0); }
FA_V fa_vm vm_or(fa_vm a, fa_vm b) { return vorrq_u32(a, b); }
FA_V fa_vm vm_and(fa_vm a, fa_vm b) { return vandq_u32(a, b); }
FA_V int vm_all(fa_vm m) { return vminvq_u32(m) != 0; }
FA_V int vm_any(fa_vm m) { return vmaxvq_u32(m) != 0; }
/* m ? t : f, lane by lane */
FA_V fa_vf vf_select(fa_vm m, fa_vf t, fa_vf f) { return vbslq_f32(m, t, f); }
FA_V fa_vi vi_select(fa_vm m, fa_vi t, fa_vi f) { return vbslq_s32(m, t, f); }
/* m ? a : 0, lane by lane */
FA_V fa_vf vf_keep(fa_vm m, fa_vf a)
{
    return vreinterpretq_f32_u32(vandq_u32(m, vreinterpretq_u32_f32(a)));
}

#undef FA_V
#endif /* FA_VEC_H */
