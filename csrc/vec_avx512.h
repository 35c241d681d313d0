/*
 * vec_avx512.h -- the vector vocabulary (see vec_math.h) for AVX-512 (F, VL,
 * BW, DQ): sixteen float lanes in a zmm register, masks in mask registers.
 *
 * The including file defines FA_TARGET (a target attribute with AVX-512)
 * first; a unit includes one vocabulary.
 */
#ifndef FA_VEC_H
#define FA_VEC_H

#include <immintrin.h>
#include <stdint.h>

#define FA_VL 16 /* lanes */
typedef __m512 fa_vf;    /* float32 lanes */
typedef __m512i fa_vi;   /* int32 lanes */
typedef __mmask16 fa_vm; /* a mask: a bit a lane */

#define FA_V static FA_ALWAYS_INLINE FA_TARGET

FA_V fa_vf vf_set1(float x) { return _mm512_set1_ps(x); }
FA_V fa_vf vf_zero(void) { return _mm512_setzero_ps(); }
FA_V fa_vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
FA_V void vf_store(float *p, fa_vf v) { _mm512_storeu_ps(p, v); }
/* Lanes [0, n) of p, zero lanes after (n > 0; n >= FA_VL: all). */
FA_V fa_vf vf_load_first(const float *p, int64_t n)
{
    return _mm512_maskz_loadu_ps(n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u), p);
}
/* Stores lanes [0, n) of v (n > 0; n >= FA_VL: all). */
FA_V void vf_store_first(float *p, int64_t n, fa_vf v)
{
    _mm512_mask_storeu_ps(p, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u), v);
}
FA_V fa_vf vf_add(fa_vf a, fa_vf b) { return _mm512_add_ps(a, b); }
FA_V fa_vf vf_sub(fa_vf a, fa_vf b) { return _mm512_sub_ps(a, b); }
FA_V fa_vf vf_mul(fa_vf a, fa_vf b) { return _mm512_mul_ps(a, b); }
/* a * b + c, one rounding */
FA_V fa_vf vf_fma(fa_vf a, fa_vf b, fa_vf c) { return _mm512_fmadd_ps(a, b, c); }
/* The SSE rules: the second operand where either is NaN (or both are zeros). */
FA_V fa_vf vf_min(fa_vf a, fa_vf b) { return _mm512_min_ps(a, b); }
FA_V fa_vf vf_max(fa_vf a, fa_vf b) { return _mm512_max_ps(a, b); }
/* Reductions, each in a fixed order of this vocabulary's own. */
FA_V float vf_hmax(fa_vf v) { return _mm512_reduce_max_ps(v); }
/* t[i] = v[i + 8] + v[i], then u[i] = t[i + 4] + t[i], then (u[0] + u[2]) +
 * (u[1] + u[3]) */
FA_V float vf_hsum(fa_vf v)
{
    const __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u)); /* u[0] + u[2], u[1] + u[3] */
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

FA_V fa_vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
FA_V fa_vi vi_zero(void) { return _mm512_setzero_si512(); }
FA_V fa_vi vi_add(fa_vi a, fa_vi b) { return _mm512_add_epi32(a, b); }
FA_V fa_vi vi_sub(fa_vi a, fa_vi b) { return _mm512_sub_epi32(a, b); }
FA_V fa_vi vi_and(fa_vi a, fa_vi b) { return _mm512_and_si512(a, b); }
FA_V fa_vi vi_or(fa_vi a, fa_vi b) { return _mm512_or_si512(a, b); }
#define vi_shl(a, n) _mm512_slli_epi32((a), (n)) /* by a constant */
#define vi_shr(a, n) _mm512_srli_epi32((a), (n)) /* logical */
#define vi_sar(a, n) _mm512_srai_epi32((a), (n)) /* arithmetic */
FA_V fa_vi vi_shlv(fa_vi a, fa_vi n) { return _mm512_sllv_epi32(a, n); }
FA_V fa_vi vi_shrv(fa_vi a, fa_vi n) { return _mm512_srlv_epi32(a, n); }
/* The bits of one as the other */
FA_V fa_vi vf_bits(fa_vf a) { return _mm512_castps_si512(a); }
FA_V fa_vf vi_bits(fa_vi a) { return _mm512_castsi512_ps(a); }

FA_V fa_vm vm_nan(fa_vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
FA_V fa_vm vm_eq(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
FA_V fa_vm vm_ne(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ); }
FA_V fa_vm vm_ge(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
/* not a >= b: a < b, or either NaN */
FA_V fa_vm vm_nge(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NGE_UQ); }
FA_V fa_vm vm_le(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
/* not a <= b: a > b, or either NaN */
FA_V fa_vm vm_nle(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NLE_UQ); }
FA_V fa_vm vm_igt(fa_vi a, fa_vi b) { return _mm512_cmpgt_epi32_mask(a, b); }
FA_V fa_vm vm_none(void) { return 0; }
FA_V fa_vm vm_or(fa_vm a, fa_vm b) { return (fa_vm)(a | b); }
FA_V fa_vm vm_and(fa_vm a, fa_vm b) { return (fa_vm)(a & b); }
FA_V int vm_all(fa_vm m) { return m == 0xFFFF; }
FA_V int vm_any(fa_vm m) { return m != 0; }
/* m ? t : f, lane by lane */
FA_V fa_vf vf_select(fa_vm m, fa_vf t, fa_vf f) { return _mm512_mask_mov_ps(f, m, t); }
FA_V fa_vi vi_select(fa_vm m, fa_vi t, fa_vi f) { return _mm512_mask_mov_epi32(f, m, t); }
/* m ? a : 0, lane by lane */
FA_V fa_vf vf_keep(fa_vm m, fa_vf a) { return _mm512_maskz_mov_ps(m, a); }

#undef FA_V
#endif /* FA_VEC_H */
