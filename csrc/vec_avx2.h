/*
 * vec_avx2.h -- the vector vocabulary (see vec_math.h) for AVX2 + FMA: eight float
 * lanes in a ymm register, masks as vectors of all-ones / zero lanes.
 *
 * The including file defines FA_TARGET (a target attribute with AVX2 and
 * FMA) first; a unit includes one vocabulary.
 */
#ifndef FA_VEC_H
#define FA_VEC_H

#include "x86_lanes8.h"

#include <immintrin.h>
#include <stdint.h>

#define FA_VL 8 /* lanes */
typedef __m256 fa_vf;  /* float32 lanes */
typedef __m256i fa_vi; /* int32 lanes */
typedef __m256 fa_vm;  /* a mask: a lane all ones (set) or all zeros */

#define FA_V static FA_ALWAYS_INLINE FA_TARGET

FA_V fa_vf vf_set1(float x) { return _mm256_set1_ps(x); }
FA_V fa_vf vf_zero(void) { return _mm256_setzero_ps(); }
FA_V fa_vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
FA_V void vf_store(float *p, fa_vf v) { _mm256_storeu_ps(p, v); }
/* Lanes [0, n) of p, zero lanes after (n > 0; n >= FA_VL: all). */
FA_V fa_vf vf_load_first(const float *p, int64_t n)
{
    return _mm256_maskload_ps(p, n >= 8 ? _mm256_set1_epi32(-1) : tail_mask_avx2(n));
}
/* Stores lanes [0, n) of v (n > 0; n >= FA_VL: all). */
FA_V void vf_store_first(float *p, int64_t n, fa_vf v)
{
    _mm256_maskstore_ps(p, n >= 8 ? _mm256_set1_epi32(-1) : tail_mask_avx2(n), v);
}
FA_V fa_vf vf_add(fa_vf a, fa_vf b) { return _mm256_add_ps(a, b); }
FA_V fa_vf vf_sub(fa_vf a, fa_vf b) { return _mm256_sub_ps(a, b); }
FA_V fa_vf vf_mul(fa_vf a, fa_vf b) { return _mm256_mul_ps(a, b); }
/* a * b + c, one rounding */
FA_V fa_vf vf_fma(fa_vf a, fa_vf b, fa_vf c) { return _mm256_fmadd_ps(a, b, c); }
/* The SSE rules: the second operand where either is NaN (or both are zeros). */
FA_V fa_vf vf_min(fa_vf a, fa_vf b) { return _mm256_min_ps(a, b); }
FA_V fa_vf vf_max(fa_vf a, fa_vf b) { return _mm256_max_ps(a, b); }
/* Reductions, each in a fixed order of this vocabulary's own. */
FA_V float vf_hmax(fa_vf v) { return hmax_avx2(v); }
FA_V float vf_hsum(fa_vf v) { return hsum_avx2(v); }

FA_V fa_vi vi_set1(int32_t x) { return _mm256_set1_epi32(x); }
FA_V fa_vi vi_zero(void) { return _mm256_setzero_si256(); }
FA_V fa_vi vi_add(fa_vi a, fa_vi b) { return _mm256_add_epi32(a, b); }
FA_V fa_vi vi_sub(fa_vi a, fa_vi b) { return _mm256_sub_epi32(a, b); }
FA_V fa_vi vi_and(fa_vi a, fa_vi b) { return _mm256_and_si256(a, b); }
FA_V fa_vi vi_or(fa_vi a, fa_vi b) { return _mm256_or_si256(a, b); }
#define vi_shl(a, n) _mm256_slli_epi32((a), (n)) /* by a constant */
#define vi_shr(a, n) _mm256_srli_epi32((a), (n)) /* logical */
#define vi_sar(a, n) _mm256_srai_epi32((a), (n)) /* arithmetic */
FA_V fa_vi vi_shlv(fa_vi a, fa_vi n) { return _mm256_sllv_epi32(a, n); }
FA_V fa_vi vi_shrv(fa_vi a, fa_vi n) { return _mm256_srlv_epi32(a, n); }
/* The bits of one as the other */
FA_V fa_vi vf_bits(fa_vf a) { return _mm256_castps_si256(a); }
FA_V fa_vf vi_bits(fa_vi a) { return _mm256_castsi256_ps(a); }

FA_V fa_vm vm_nan(fa_vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
FA_V fa_vm vm_eq(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
FA_V fa_vm vm_ne(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_UQ); }
FA_V fa_vm vm_ge(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
/* not a >= b: a < b, or either NaN */
FA_V fa_vm vm_nge(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_NGE_UQ); }
FA_V fa_vm vm_le(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
/* not a <= b: a > b, or either NaN */
FA_V fa_vm vm_nle(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_NLE_UQ); }
FA_V fa_vm vm_igt(fa_vi a, fa_vi b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
FA_V fa_vm vm_none(void) { return _mm256_setzero_ps(); }
FA_V fa_vm vm_or(fa_vm a, fa_vm b) { return _mm256_or_ps(a, b); }
FA_V fa_vm vm_and(fa_vm a, fa_vm b) { return _mm256_and_ps(a, b); }
FA_V int vm_all(fa_vm m) { return _mm256_movemask_ps(m) == 0xFF; }
FA_V int vm_any(fa_vm m) { return _mm256_movemask_ps(m) != 0; }
/* m ? t : f, lane by lane */
FA_V fa_vf vf_select(fa_vm m, fa_vf t, fa_vf f) { return _mm256_blendv_ps(f, t, m); }
FA_V fa_vi vi_select(fa_vm m, fa_vi t, fa_vi f)
{
    return _mm256_blendv_epi8(f, t, _mm256_castps_si256(m));
}
/* m ? a : 0, lane by lane */
FA_V fa_vf vf_keep(fa_vm m, fa_vf a) { return _mm256_and_ps(m, a); }

#undef FA_V
#endif /* FA_VEC_H */
