/*
 * microkernels.h -- what a SIMD variant's kernel file gives the unit driver
 * (driver.inc): its geometry and its micro-kernels.
 *
 * A kernel file (csrc/kernels_<name>.c, one line of variants.def) defines
 * FA_TARGET (a target attribute, or nothing), FA_NAME(x) (x with the
 * variant's suffix), FA_VARIANT_NAME and FA_MR, includes fa_internal.h and
 * this file, defines every function declared below (static, named by
 * FA_NAME) and FA_EXP_DIFF, then includes driver.inc, which builds the
 * variant's table (fa_kernels_<name>) from them. A function declared here
 * and not defined stops the build where the driver uses it.
 *
 * Conventions: k and v elements are of dtype dt (FA_DTYPE_*, converted to
 * float32 exactly); rs: elements between rows; room: key rows after the tile
 * that may be fetched ahead (fa_kv_room); ahead: bytes past the rows read
 * to fetch ahead (0: none). Every product is a sum from +0, one term at a
 * time in d (or key) order; a variant may fuse each multiply-add (one
 * rounding) or not, but its few-rows kernels and its micro-kernel must give
 * a row the same bits (see op_sdpa.inc's sdpa_unit).
 */
#ifndef FA_MICROKERNELS_H
#define FA_MICROKERNELS_H

#include "fa_internal.h"

/* ------------------------------------------------------------------------- */
/* Geometry (FA_BQ, FA_BK, FA_NR and FA_CK are fa_kernels.h's, shared by all) */

#define BQ FA_BQ
#define BK FA_BK
#define NR FA_NR
#define MR FA_MR
/* The variant's geometry: whole MR-row blocks fill a unit's BQ rows, and
 * pv_one_row's MR x BK row buffer fits the scratch (a negative array size
 * stops the build otherwise). */
typedef char FA_NAME(fa_geometry_check)[(FA_BQ % MR == 0 && MR <= FA_MAX_MR
                                         && FA_FEW_ROWS <= FA_MAX_MR) ? 1 : -1];
/* Independent sums of the portable loops (LANES-wide, so that the compiler
 * vectorises them without reassociating anything). */
#define LANES 16
/* The tile softmax works on a tile's keys rounded up to this many columns
 * (whole SIMD registers of every variant, whole LANES groups). */
#define FA_TILE_COLS 16
typedef char FA_NAME(tile_cols_check)[(BK % FA_TILE_COLS == 0 && FA_TILE_COLS % LANES == 0)
                                      ? 1 : -1];

/* ------------------------------------------------------------------------- */
/* Every variant's micro-kernels                                             */

/* FA_EXP_DIFF(x, m): exp(x - m) of one float for a finite row maximum m >= x
 * (a macro naming the variant's scalar function; exp_diff_array's values). */

/* softmax / log_softmax / logsumexp (op: FA_OP_*) of one row of n floats
 * (the rules of rowwise.c); next: the n floats this thread reads next (or
 * NULL), which may be fetched ahead. */
static FA_TARGET void FA_NAME(rowwise_row)(const float *x, float *out, int64_t n, int op,
                                           const float *next);

/* y[j] = 2**x[j], each within 2 ulp (fa_exp2f's algorithm). */
static FA_TARGET void FA_NAME(exp2_array)(const float *x, float *y, int64_t n);

/* One MR x NR block of C = (A . B) scale: A(r, d) = a[r * ars + d * ads],
 * B's row d at b + d * ldb, C's row r at c + r * ldc; with alpha (a factor
 * a row) C = C * alpha + A . B (two roundings). Inlined where it is called. */
static FA_ALWAYS_INLINE FA_TARGET void FA_NAME(gemm_block)(const float *a, int64_t ars,
                                                          int64_t ads, const float *b,
                                                          int64_t ldb, int64_t K, float *c,
                                                          int64_t ldc, const float *alpha,
                                                          float scale);

/* kt[d * BK + jj] = key row jj's element d (rows from k, rs elements apart)
 * for jj < nk; zero for jj from nk to nk rounded up to NR. */
static FA_TARGET void FA_NAME(pack_kt)(const void *k, int dt, int64_t rs, int64_t D, int64_t nk,
                                       int64_t room, float *kt);

/* The tile softmax step. tile_max: the larger of m and s[0..nc), NaN if any
 * is NaN; tile_exp: s[j] = exp(s[j] - m) in place (exactly 0 for -inf) and
 * their sum in a fixed order (nc: a multiple of FA_TILE_COLS). */
static FA_TARGET float FA_NAME(tile_max)(const float *s, int64_t nc, float m);
static FA_TARGET double FA_NAME(tile_exp)(float *s, int64_t nc, float m);

/* dst[0..n) = src[0..n) as float32; 1 if all are finite. */
static FA_TARGET int FA_NAME(load_row)(const void *src, int dt, int64_t n, float *dst,
                                       int64_t ahead);

/* 1 if x[0..n) are all finite. */
static FA_TARGET int FA_NAME(row_finite)(const float *x, int64_t n, int64_t ahead);

/* The few-rows (decoding) kernels, k and v read in place, each element the
 * micro-kernel's sum. few_scores: s[r * BK + jj] = q_r . k_jj for r < nr
 * (q's rows D floats apart), jj < nk. few_pv: tile[r * Dvp + c] = sum over
 * jj < nk of p[r * BK + jj] v[jj * ld + c], from tile's values (from = 1)
 * or from +0. */
static FA_TARGET void FA_NAME(few_scores)(const float *q, int64_t nr, const void *k, int dt,
                                          int64_t rs, int64_t D, int64_t nk, int64_t room,
                                          float *s);
static FA_TARGET void FA_NAME(few_pv)(const float *p, int64_t nr, const void *v, int dt,
                                      int64_t ld, int64_t Dvp, int64_t nk, int64_t room,
                                      int from, float *tile);

/* ------------------------------------------------------------------------- */
/* Optional: a variant that has them defines the macro first                 */

/* FA_HAVE_GEMM_BLOCK2: gemm_block2, a block of 2 NR columns (each element
 *   gemm_block's sum; fewer loads of A a product). */
/* FA_HAVE_PACK_BLOCK: pack_block(rows, n, D, dst, lanes): n <= lanes rows
 *   (n real, the rest zero) copied d by d into dst (element d of row r at
 *   d lanes + r). */
/* FA_HAVE_QT_TILE, with FA_QT_LANES and FA_QT_ROWS: the rows-as-lanes tile
 *   kernels qt_scores and qt_exp (see unit_common.inc's qt_tile for their
 *   contract). */

#endif /* FA_MICROKERNELS_H */
