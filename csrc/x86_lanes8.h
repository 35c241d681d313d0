/*
 * x86_lanes8.h -- reductions and tail masks of eight float lanes (AVX), for
 * the x86 variants' eight-lane code: the AVX2 vector vocabulary (vec_avx2.h)
 * and the row kernels both x86 variants compile (x86_rows.h).
 *
 * The including file defines FA_TARGET (a target attribute with AVX2) first.
 */
#ifndef FA_X86_LANES8_H
#define FA_X86_LANES8_H

#include <immintrin.h>
#include <stdint.h>

/* Largest and smallest of the eight lanes (callers check for NaN apart). */
static inline FA_TARGET float hmax_avx2(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

static inline FA_TARGET float hmin_avx2(__m256 v)
{
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_min_ss(h, _mm_movehdup_ps(h)));
}

/* Sum of the eight lanes, in a fixed order. */
static inline FA_TARGET float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes [0, n) of eight (n < 8), as a mask for maskload / maskstore. */
static inline FA_TARGET __m256i tail_mask_avx2(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#endif /* FA_X86_LANES8_H */
