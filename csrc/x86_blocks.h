/*
 * x86_blocks.h -- the few-rows (decoding) scores over the block formats
 * (dtypes.h's q8_0 and q4_0) in eight lanes, which kernels_avx2.c calls from
 * its few_scores for those formats (FA_HAVE_FEW_BLOCKS), and the block
 * columns its few_pv reads (block8_at_avx2); kernels_avx512.c compiles the
 * same block loads (block_ints8_avx2, block_scales8_avx2) for its
 * sixteen-lane scores. Each element is converted in registers to exactly the float32
 * that fa_block_row gives (its integer, converted, times its block's scale,
 * one exact product), then goes through the products of the float32
 * few-rows kernels, in their order (a fused multiply-add per key and step of
 * d, d ascending from 0; a fused multiply-add per key for P.V, keys
 * ascending), so the sums are those of the float32 rows, without a pass
 * that writes and reads them back.
 *
 * The including file defines FA_TARGET and FA_NAME and includes
 * fa_internal.h first.
 */
#ifndef FA_X86_BLOCKS_H
#define FA_X86_BLOCKS_H

#include "fa_internal.h"

#include <immintrin.h>

FA_BLOCK_DTYPES_KNOWN(fa_x86_blocks_know_q8_0_q4_0, 2);

/* Eight integers of a block (elements e .. e + 7, e a multiple of 8) as
 * signed bytes in the low 64 bits: q8_0's as stored; q4_0's nibbles (low
 * ones for e < 16, high ones after) less 8. */
static FA_ALWAYS_INLINE FA_TARGET __m128i block_ints8_avx2(const unsigned char *blk, int64_t e,
                                                          int dt)
{
    if (dt == FA_DTYPE_Q8_0)
        return _mm_loadl_epi64((const __m128i *)(blk + 2 + e));
    {
        __m128i x = _mm_loadl_epi64((const __m128i *)(blk + 2 + (e & 15)));
        if (e >= 16)
            x = _mm_srli_epi16(x, 4);
        return _mm_sub_epi8(_mm_and_si128(x, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    }
}

/* The scale of the block at byte off of each of the eight rows row[l], lane l. */
static FA_ALWAYS_INLINE FA_TARGET __m256 block_scales8_avx2(const unsigned char *const row[8],
                                                           int64_t off)
{
    uint16_t h[8];
    int l;
    for (l = 0; l < 8; l++)
        h[l] = (uint16_t)(row[l][off] | (row[l][off + 1] << 8));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_blocks_avx2(const float *q, const int nr,
                                                             const void *k, const int dt,
                                                             int64_t rs, int64_t D, int64_t nk,
                                                             int64_t ahead, float *s)
{
    const int64_t bb = fa_dtype_unit(dt), rsb = rs * bb;
    const int contig = rs == D / 32;
    int64_t jb, blk, e;
    int r, i, l;
    for (jb = 0; jb < nk; jb += 8) {
        const unsigned char *kr[8];
        __m256 acc[FA_FEW_ROWS];
        for (i = 0; i < 8; i++) /* keys past nk: any row (their scores are masked) */
            kr[i] = (const unsigned char *)k + (jb + i < nk ? jb + i : nk - 1) * rsb;
        for (r = 0; r < nr; r++)
            acc[r] = _mm256_setzero_ps();
        if (ahead && contig) { /* the eight rows ahead, one run: each line once */
            int64_t o;
            for (o = 0; o < 8 * rsb; o += 64)
                fa_prefetch_rows(kr[0], ahead + o, 1);
        }
        for (blk = 0; blk < D / 32; blk++) {
            const __m256 sc = block_scales8_avx2(kr, blk * bb);
            if (ahead && !contig) /* rows apart: each block's first and last byte, as it is read */
                for (i = 0; i < 8; i++) {
                    fa_prefetch_rows(kr[i], ahead + blk * bb, 0);
                    fa_prefetch_rows(kr[i], ahead + blk * bb + bb - 1, 0);
                }
            for (e = 0; e < 32; e += 8) { /* elements e .. e + 7 of the eight keys */
                __m128i x[8], a[4], b[4], c[4];
                for (l = 0; l < 8; l++)
                    x[l] = block_ints8_avx2(kr[l] + blk * bb, e, dt);
                for (l = 0; l < 4; l++) /* keys 2l, 2l + 1 side by side, element by element */
                    a[l] = _mm_unpacklo_epi8(x[2 * l], x[2 * l + 1]);
                b[0] = _mm_unpacklo_epi16(a[0], a[1]); /* elements 0-3 of keys 0-3 */
                b[1] = _mm_unpackhi_epi16(a[0], a[1]); /* 4-7 of keys 0-3 */
                b[2] = _mm_unpacklo_epi16(a[2], a[3]); /* 0-3 of keys 4-7 */
                b[3] = _mm_unpackhi_epi16(a[2], a[3]);
                c[0] = _mm_unpacklo_epi32(b[0], b[2]); /* elements 0 and 1 of all eight */
                c[1] = _mm_unpackhi_epi32(b[0], b[2]); /* 2, 3 */
                c[2] = _mm_unpacklo_epi32(b[1], b[3]); /* 4, 5 */
                c[3] = _mm_unpackhi_epi32(b[1], b[3]); /* 6, 7 */
                for (i = 0; i < 8; i++) {
                    const __m128i w = i & 1 ? _mm_unpackhi_epi64(c[i / 2], c[i / 2]) : c[i / 2];
                    const __m256 x8 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w)), sc);
                    for (r = 0; r < nr; r++)
                        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + r * D + blk * 32 + e + i),
                                                 x8, acc[r]);
                }
            }
        }
        for (r = 0; r < nr; r++)
            _mm256_storeu_ps(s + r * FA_BK + jb, acc[r]);
    }
}

static FA_ALWAYS_INLINE FA_TARGET void few_scores_bdt_avx2(const float *q, int64_t nr,
                                                          const void *k, const int dt, int64_t rs,
                                                          int64_t D, int64_t nk, int64_t room,
                                                          float *s)
{
    const int64_t ahead = fa_ahead(room, rs, D / 32, fa_dtype_unit(dt));
#define FA_CALL(n) few_scores_blocks_avx2(q, n, k, dt, rs, D, nk, ahead, s)
    FA_CONST_ROWS8(nr, FA_CALL)
#undef FA_CALL
}

/* Eight elements col .. col + 7 (col a multiple of 8) of a row of blocks
 * at `row` as float32: their integers times their block's scale, the values
 * fa_block_row gives. */
static FA_ALWAYS_INLINE FA_TARGET __m256 block8_at_avx2(const unsigned char *row, int64_t col,
                                                       int dt)
{
    const unsigned char *blk = row + col / 32 * fa_dtype_unit(dt);
    const __m256 sc = _mm256_set1_ps(_cvtsh_ss((unsigned short)(blk[0] | (blk[1] << 8))));
    return _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(block_ints8_avx2(blk, col % 32, dt))), sc);
}

#endif /* FA_X86_BLOCKS_H */
