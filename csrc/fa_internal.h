/*
 * fa_internal.h -- helpers shared by the kernels (not part of the C contract).
 *
 * A file that compiles a SIMD variant defines FA_TARGET (a target attribute)
 * before including this header, so that these helpers are compiled for, and
 * inlined into, that variant's functions.
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "fastattn.h"
#include "fa_kernels.h" /* FA_BK */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef FA_TARGET
#define FA_TARGET
#endif

/* FA_ASAN: an AddressSanitizer build (tools/sanitize.sh), which also fills
 * each new scratch with NaNs and checks some invariants of the kernels. */
#if defined(__SANITIZE_ADDRESS__)
#define FA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_ASAN 1
#endif
#endif

#ifndef INFINITY
#define INFINITY (1.0f / 0.0f)
#endif
#ifndef NAN
#define NAN (0.0f / 0.0f)
#endif

/*
 * p * 2**n for the exponentials below: y = n + 1.5 * 2**23 holds the integer
 * n in [-151, 128] in its low bits; 2**n is applied as two exact power-of-two
 * factors (each a normal float), so a subnormal result is rounded once.
 */
static inline FA_TARGET float fa_scale_pow2(float p, float y)
{
    uint32_t u, b1, b2;
    int32_t ni, n1, n2;
    float s1, s2;
    memcpy(&u, &y, sizeof u);
    ni = (int32_t)(u - 0x4B400000u); /* the integer n, from the low bits of y */
    n1 = ni / 2;
    n2 = ni - n1;
    b1 = (uint32_t)(n1 + 127) << 23; /* unsigned shifts: defined for any input */
    b2 = (uint32_t)(n2 + 127) << 23;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return (p * s1) * s2;
}

/*
 * exp(x - m) in float32 for a finite m >= x (a row's maximum), x = -inf
 * included (exactly 0). The difference is split exactly into s + err (Knuth's
 * TwoSum), reduced as s = n ln2 + r (Cody-Waite, ln2 in two parts; n by the
 * 1.5 * 2**23 rounding trick), exp(r + err) by its degree-7 Taylor polynomial
 * (truncation < 5e-9 relative), and 2**n by fa_scale_pow2. Within 2 ulp of
 * exp(x - m) taken exactly (the tests hold every SIMD variant to that).
 * Branch-free float32 code, so the compiler can vectorise the loops that call
 * it; kernels_avx2.c has the same reduction in intrinsics, with a degree-6
 * polynomial and fused multiply-adds.
 */
static inline FA_TARGET float fa_exp_diff(float x, float m)
{
    const float shift = 12582912.0f; /* 1.5 * 2**23 */
    const float s = x - m;
    const float bb = s - x;
    const float err = (x - (s - bb)) + (-m - bb);
    const int under = s < -104.0f; /* exp(-104) rounds to 0 in float32 */
    const int not_nan = s == s;
    const float sc = under ? -104.0f : (not_nan ? s : 0.0f);
    const float y = sc * 1.44269504088896341f + shift; /* round(sc / ln2) in its low bits */
    const float n = y - shift;
    float r, p;
    r = sc - n * 0.693359375f;          /* exact: ln2's first 9 bits */
    r = r - n * -2.12194440e-4f;        /* the rest of ln2 */
    r = r + (under ? 0.0f : err);
    p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120
        + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    return under ? 0.0f : (not_nan ? fa_scale_pow2(p, y) : s);
}

/*
 * 2**x in float32 arithmetic, for the attention kernels' exponentials
 * (exp(s - m) = 2**((s - m) log2 e), see FA_LOG2E).
 *
 * x = n + f with n = round(x), |f| <= 1/2 (exact); 2**f = exp(f ln2) by its
 * degree-7 Taylor polynomial (truncation < 5e-9 relative); 2**n by
 * fa_scale_pow2. Within 2 ulp of 2**x (the tests hold it to that); -inf gives exactly 0,
 * +inf gives +inf, NaN gives NaN. Branch-free, float32 only: it vectorises
 * 8 or 16 wide.
 */
static inline FA_TARGET float fa_exp2f(float x)
{
    const float shift = 12582912.0f; /* 1.5 * 2**23 */
    const float c1 = 0.693147180559945f, c2 = 0.240226506959101f,
                c3 = 0.0555041086648216f, c4 = 0.00961812910762848f,
                c5 = 0.00133335581464284f, c6 = 0.000154035303933816f,
                c7 = 1.52527338040598e-05f;
    int not_nan = (x == x);
    float xc = not_nan ? x : 0.0f;
    float y, n, f, p;
    xc = xc < -151.0f ? -151.0f : xc; /* 2**-151 rounds to 0 */
    xc = xc > 128.0f ? 128.0f : xc;   /* 2**128 rounds to +inf */
    y = xc + shift;
    n = y - shift;
    f = xc - n;
    p = 1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
    return not_nan ? fa_scale_pow2(p, y) : x;
}

/* ------------------------------------------------------------------------- */
/* Element types of k and v (FA_DTYPE_*): the conversions every variant uses.  */

#if defined(__GNUC__) || defined(__clang__)
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FA_ALWAYS_INLINE __forceinline
#else
#define FA_ALWAYS_INLINE inline
#endif

static inline FA_TARGET float fa_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bfloat16 -> float32: exact (the bfloat16 bits are the top half of the float). */
static inline FA_TARGET float fa_bf16_to_f32(uint16_t h)
{
    return fa_bits_f32((uint32_t)h << 16);
}

/*
 * IEEE binary16 -> float32, exact for every input, branch-free (so it
 * vectorises): normal numbers re-biased (15 -> 127), subnormals as the exact
 * product m * 2**-24 (no float32 subnormal is involved, so flush-to-zero modes
 * cannot change it), inf and NaN with their sign and payload, as numpy's
 * float16 -> float32 cast gives.
 */
static inline FA_TARGET float fa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    const uint32_t em = (uint32_t)h & 0x7FFFu;
    const uint32_t normal = (em << 13) + 0x38000000u; /* exponent + (127 - 15) */
    const uint32_t special = (em << 13) | 0x7F800000u;
    const float subf = (float)(int32_t)em * 5.9604644775390625e-8f; /* em * 2**-24 */
    uint32_t sub, bits;
    memcpy(&sub, &subf, sizeof sub);
    bits = em >= 0x7C00u ? special : (em >= 0x0400u ? normal : sub);
    return fa_bits_f32(sign | bits);
}

/* Element i of a row of each type as float32, exactly (dtypes.h's `at`). */
static FA_ALWAYS_INLINE FA_TARGET float fa_f32_at(const void *p, int64_t i)
{
    return ((const float *)p)[i];
}

static FA_ALWAYS_INLINE FA_TARGET float fa_f16_at(const void *p, int64_t i)
{
    return fa_f16_to_f32(((const uint16_t *)p)[i]);
}

static FA_ALWAYS_INLINE FA_TARGET float fa_bf16_at(const void *p, int64_t i)
{
    return fa_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* A block's float16 scale (little-endian, as GGUF stores it) as float32. */
static FA_ALWAYS_INLINE FA_TARGET float fa_block_scale(const unsigned char *blk)
{
    return fa_f16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
}

/* Element i of a row of blocks (dtypes.h's FA_BLOCK_DTYPES): the integer,
 * converted exactly, times the block's scale, one rounding-free product. */
static FA_ALWAYS_INLINE FA_TARGET float fa_q8_0_at(const void *p, int64_t i)
{
    const unsigned char *blk = (const unsigned char *)p + (i / 32) * 34;
    return (float)(signed char)blk[2 + i % 32] * fa_block_scale(blk);
}

static FA_ALWAYS_INLINE FA_TARGET float fa_q4_0_at(const void *p, int64_t i)
{
    const unsigned char *blk = (const unsigned char *)p + (i / 32) * 18;
    const int nib = (blk[2 + i % 16] >> (i % 32 < 16 ? 0 : 4)) & 15;
    return (float)(nib - 8) * fa_block_scale(blk);
}

/* FA_DTYPE_SWITCH(dt): FA_DTYPE_CALL(t) (a macro the caller defines) with t
 * the constant code equal to dt, for each element type of dtypes.h, so that
 * a kernel is inlined once per type with its conversions known; nothing for
 * another code (attention.c's check_args refuses unknown codes first; the
 * block formats never reach a kernel: unit_common.inc's kv_rows and v_tile
 * convert their rows to float32). */
#define FA_DTYPE_CASE(NAME, code, name, bytes, block, at)                                          \
    case FA_DTYPE_##NAME:                                                                          \
        FA_DTYPE_CALL(FA_DTYPE_##NAME);                                                            \
        break;
#define FA_DTYPE_SWITCH(dt)                                                                        \
    switch (dt) {                                                                                  \
        FA_ELEM_DTYPES(FA_DTYPE_CASE)                                                              \
    default:                                                                                       \
        break;                                                                                     \
    }

/* Bytes per element of dtype dt; 0 for a code not in dtypes.h (and for a
 * block format, whose elements have no size of their own). */
static inline size_t fa_dtype_size(int dt)
{
    switch (dt) {
#define FA_DTYPE_BYTES(NAME, code, name, bytes, block, at)                                         \
    case FA_DTYPE_##NAME:                                                                          \
        return (block) == 1 ? (size_t)(bytes) : 0;
        FA_DTYPES(FA_DTYPE_BYTES)
#undef FA_DTYPE_BYTES
    default:
        return 0;
    }
}

/* Bytes of one unit of dtype dt, what offsets and strides count: an element,
 * or a block of a block format; 0 for a code not in dtypes.h. */
static inline int64_t fa_dtype_unit(int dt)
{
    switch (dt) {
#define FA_DTYPE_UNIT(NAME, code, name, bytes, block, at)                                          \
    case FA_DTYPE_##NAME:                                                                          \
        return (bytes);
        FA_DTYPES(FA_DTYPE_UNIT)
#undef FA_DTYPE_UNIT
    default:
        return 0;
    }
}

/* Elements of one unit of dtype dt: 1, or a block format's block (0 for a
 * code not in dtypes.h). */
static inline int64_t fa_dtype_block(int dt)
{
    switch (dt) {
#define FA_DTYPE_BLOCK(NAME, code, name, bytes, block, at)                                         \
    case FA_DTYPE_##NAME:                                                                          \
        return (block);
        FA_DTYPES(FA_DTYPE_BLOCK)
#undef FA_DTYPE_BLOCK
    default:
        return 0;
    }
}

/* Element i of p, of dtype dt, as a float32 (exact). */
static FA_ALWAYS_INLINE FA_TARGET float fa_load_elem(const void *p, int64_t i, int dt)
{
    switch (dt) {
#define FA_DTYPE_AT(NAME, code, name, bytes, block, at)                                            \
    case FA_DTYPE_##NAME:                                                                          \
        return at(p, i);
        FA_DTYPES(FA_DTYPE_AT)
#undef FA_DTYPE_AT
    default:
        return NAN;
    }
}

/*
 * Where key tile [j0, j0 + FA_BK) of batch item b starts in k (v: v != 0): a
 * pointer to key row j0, whose rows follow each other a->k_rs (a->v_rs)
 * units apart (elements, or a block format's blocks: fa_dtype_unit). A tile
 * never straddles two pages (block_size is a multiple of the tile, checked in
 * attention.c), so paging costs one look-up per tile.
 */
static inline const void *fa_kv_tile(const fa_attn_args *a, int64_t b, int v, int64_t j0)
{
    const int dt = v ? a->v_dtype : a->k_dtype;
    const int64_t rs = v ? a->v_rs : a->k_rs;
    int64_t off = (v ? a->v_off : a->k_off)[b];
    if (a->block_table) {
        const int64_t page = a->block_table[a->bt_off[b] + j0 / a->block_size];
        off += page * (v ? a->v_ps : a->k_ps) + (j0 % a->block_size) * rs;
    } else {
        off += j0 * rs;
    }
    return (const char *)(v ? a->v : a->k) + off * fa_dtype_unit(dt);
}

/* A flag byte that several threads may read and write (each writes the value
 * any of them would: a record, not a lock). */
static inline unsigned char fa_flag_get(const unsigned char *f)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(f, __ATOMIC_RELAXED);
#else
    return *(const volatile unsigned char *)f;
#endif
}

static inline void fa_flag_set(unsigned char *f, unsigned char v)
{
#if defined(__GNUC__) || defined(__clang__)
    __atomic_store_n(f, v, __ATOMIC_RELAXED);
#else
    *(volatile unsigned char *)f = v;
#endif
}

/* Asks the cache for the line at byte offset `off` from p (the address is
 * formed as an integer). A hint only: no result depends on it. The callers
 * keep it inside the array (fa_kv_room): a prefetch never faults, but one of
 * an address that is not mapped can cost a page walk each time. */
static inline void fa_prefetch(const void *p, int64_t off)
{
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch((const void *)((uintptr_t)p + (uintptr_t)off), 0, 3);
#else
    (void)p;
    (void)off;
#endif
}

/* Output rows that lie apart in memory (a packed (T, H, Dv) batch) are
 * written without fetching their cache lines first: non-temporal stores of
 * four floats where the CPU has them (SSE2; dst 16-byte aligned, n a
 * multiple of 4: fa_can_stream), and fa_stream_fence once the rows are
 * written, so that they are seen before the threads' join. Elsewhere
 * fa_can_stream is 0 and the rows are stored as usual. */
static inline int fa_can_stream(const float *dst, int64_t n)
{
#if defined(__SSE2__)
    return n % 4 == 0 && ((uintptr_t)dst & 15) == 0;
#else
    (void)dst;
    (void)n;
    return 0;
#endif
}

static inline void fa_stream4(float *dst, const float *src)
{
#if defined(__SSE2__)
    _mm_stream_ps(dst, _mm_loadu_ps(src));
#else
    memcpy(dst, src, 4 * sizeof(float));
#endif
}

static inline void fa_stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* CALL(n) with n the constant equal to nr (1 .. 8; FA_CONST_ROWS6: 1 .. 6,
 * more taken as 6), so that each of a variant's few-rows kernels is inlined
 * once per row count, its accumulators in registers. */
#define FA_ROWS_CASES5(CALL)                                                                   \
    case 1: CALL(1); break;                                                                    \
    case 2: CALL(2); break;                                                                    \
    case 3: CALL(3); break;                                                                    \
    case 4: CALL(4); break;                                                                    \
    case 5: CALL(5); break;
#define FA_CONST_ROWS6(nr, CALL)                                                               \
    switch (nr) {                                                                              \
    FA_ROWS_CASES5(CALL)                                                                       \
    default: CALL(6); break;                                                                   \
    }
#define FA_CONST_ROWS8(nr, CALL)                                                               \
    switch (nr) {                                                                              \
    FA_ROWS_CASES5(CALL)                                                                       \
    case 6: CALL(6); break;                                                                    \
    case 7: CALL(7); break;                                                                    \
    default: CALL(8); break;                                                                   \
    }

/*
 * The few-rows (decoding) kernels fetch the key rows ahead as they read a
 * tile: rows that follow each other (a contiguous cache, whose stream the
 * hardware prefetchers also follow) FA_AHEAD_CONTIG tiles ahead into the
 * level-2 cache; rows that lie apart (the kv heads of a (B, S, H, D) cache
 * interleaved) into level 1, as many rows ahead as hold FA_AHEAD_ROW_BYTES
 * of the rows' own elements (at least one, at most a tile). (On the Xeon of
 * docs/performance.rst, a level-1 fetch of contiguous rows held the loads up more than
 * it gave, and a level-2 one of interleaved rows came too late.) fa_ahead:
 * the distance in bytes (0: none) for a tile whose rows are rs elements of
 * esz bytes apart, rows of n elements, and which room rows follow
 * (fa_kv_room); fa_prefetch_rows: the fetch it goes with.
 */
#define FA_AHEAD_CONTIG 2
#define FA_AHEAD_MAX 2 /* tiles: the farthest any kernel fetches ahead */

/* 1 if the value rows of a tile (dtype dt, rs elements apart, Dv floats a
 * row) are read in place by the micro-kernel: float32, Dv a multiple of
 * FA_NR, and rows that follow each other or lie apart by other than a
 * multiple of 1 KiB (a packed (T, H, D) batch or a (B, S, H, D) view of 8
 * heads of 128: 4 KiB). The micro-kernel reads each NR-column slice of the
 * tile's rows once per block of MR query rows, and rows that far apart fall
 * into the same few L1 sets (64 sets of 64 bytes: 4 KiB), which then hold
 * only a fraction of the tile. Otherwise each unit copies (converts) every
 * value tile it meets into its scratch (unit_common.inc's v_tile), and units of
 * FA_BQ rather than FA_BQ_IN_PLACE rows make half the copies a row (on the
 * Xeon of docs/performance.rst, 1.03-1.10x for (B, L, H, D) views and
 * half-precision values at L = S = 2048-4096; units of 192 rows that read
 * their values in place lost up to 3 % on causal prefill). */
static inline int fa_v_in_place(int dt, int64_t rs, int64_t Dv)
{
    return dt == FA_DTYPE_F32 && Dv % FA_NR == 0
           && (rs == Dv || (rs * (int64_t)sizeof(float)) % 1024 != 0);
}

/* The distance in bytes of up to `tiles` key tiles ahead, as many as the room
 * rows after the tile hold (fa_kv_room), rows rs elements of esz bytes apart:
 * every kernel's fetches ahead are bounded here. */
static inline int64_t fa_ahead_tiles(int64_t room, int64_t tiles, int64_t rs, int64_t esz)
{
    while (tiles > 0 && room < tiles * FA_BK)
        tiles--;
    return tiles * FA_BK * rs * esz;
}

/* Interleaved rows are fetched this many bytes of their own elements ahead.
 * On the Xeon of docs/performance.rst (48 KiB of L1 data cache),
 * decoding 32/8 heads 16 keys at a time for all kv heads (sdpa_unit's
 * FA_FEW_SUBK), 4 KiB against a whole tile ahead (what this replaced, for
 * tiles of at most 32 KiB, none for bigger ones): float32 D = 128
 * 1.07-1.09x, float16 and bfloat16 1.01-1.03x, float32 D = 64 1.06-1.07x,
 * D = 256 the same; 2 KiB was slower for float16 (0.95x), 8 KiB for float32
 * D = 256 (0.92x). */
#define FA_AHEAD_ROW_BYTES 4096

static inline int64_t fa_ahead(int64_t room, int64_t rs, int64_t n, int64_t esz)
{
    int64_t rows;
    if (rs == n)
        return fa_ahead_tiles(room, FA_AHEAD_CONTIG, rs, esz);
    rows = n * esz > 0 ? FA_AHEAD_ROW_BYTES / (n * esz) : FA_BK;
    rows = rows < 1 ? 1 : (rows > FA_BK ? FA_BK : rows);
    return room >= rows ? rows * rs * esz : 0;
}

/* Rows of a block format (dtypes.h's FA_BLOCK_DTYPES) converted to float32:
 * dst[0..n) = the first n elements (a multiple of 32) of the row of blocks at
 * src, each exactly its integer times its block's scale; returns 1 if all
 * are finite (a block's elements are where its scale is: the integers are
 * small). ahead (0: none): bytes past the blocks read to fetch ahead. One
 * loop a format over a block's integers, which the compiler vectorises for
 * each variant's target; every variant converts through here, so the
 * float32 rows are the same everywhere. */
FA_BLOCK_DTYPES_KNOWN(fa_block_row_knows_q8_0_q4_0, 2);

static FA_ALWAYS_INLINE FA_TARGET int fa_q8_0_row(const unsigned char *blk, int64_t n, float *dst,
                                                  int64_t ahead)
{
    int64_t b, i;
    int finite = 1;
    for (b = 0; b < n / 32; b++, blk += 34, dst += 32) {
        const float d = fa_block_scale(blk);
        if (ahead && (b & 1) == 0)
            fa_prefetch(blk, ahead);
        finite &= d - d == 0.0f;
        for (i = 0; i < 32; i++)
            dst[i] = (float)(signed char)blk[2 + i] * d;
    }
    return finite;
}

static FA_ALWAYS_INLINE FA_TARGET int fa_q4_0_row(const unsigned char *blk, int64_t n, float *dst,
                                                  int64_t ahead)
{
    int64_t b, i;
    int finite = 1;
    for (b = 0; b < n / 32; b++, blk += 18, dst += 32) {
        const float d = fa_block_scale(blk);
        if (ahead && (b & 3) == 0)
            fa_prefetch(blk, ahead);
        finite &= d - d == 0.0f;
        for (i = 0; i < 16; i++) {
            dst[i] = (float)((blk[2 + i] & 15) - 8) * d;
            dst[i + 16] = (float)((blk[2 + i] >> 4) - 8) * d;
        }
    }
    return finite;
}

static FA_ALWAYS_INLINE FA_TARGET int fa_block_row(const void *src, int dt, int64_t n, float *dst,
                                                   int64_t ahead)
{
    if (dt == FA_DTYPE_Q8_0)
        return fa_q8_0_row((const unsigned char *)src, n, dst, ahead);
    return fa_q4_0_row((const unsigned char *)src, n, dst, ahead);
}

/*
 * The key rows after tile [j0, j0 + nk) of batch item b's k (v: v != 0) that
 * the kernels may fetch ahead as they read it: those that continue its rows
 * in memory, up to the item's last key or (paged) to the end of the tile's
 * page, whose rows all lie in the cache, and on over the pages after it
 * that follow it in memory (an ordered block_table) as far as a fetch
 * reaches; none after a short tile (the last). Fetches past an array's end
 * reach addresses that may not be mapped, and there each costs a page walk:
 * decoding 14 query heads over 2 kv heads of 256 keys ran 1.6x slower with k
 * and v allocated to their last byte than with memory after them.
 */
static inline int64_t fa_kv_room(const fa_attn_args *a, int v, int64_t b, int64_t j0, int64_t nk)
{
    int64_t end = a->S;
    if (nk != FA_BK)
        return 0;
    if (a->block_table) {
        const int64_t *bt = a->block_table + a->bt_off[b];
        const int64_t bs = a->block_size, run = bs * (v ? a->v_rs : a->k_rs);
        int64_t pg = j0 / bs;
        end = (pg + 1) * bs;
        while (end - j0 - nk < FA_AHEAD_MAX * FA_BK && end < a->S
               && (v ? a->v_ps : a->k_ps) == run && bt[pg + 1] == bt[pg] + 1) {
            pg++; /* (a page that holds keys below S: one of the checked entries) */
            end += bs;
        }
    }
    return end - j0 - nk;
}

static inline void fa_prefetch_rows(const void *p, int64_t off, int contig)
{
#if defined(__GNUC__) || defined(__clang__)
    if (contig)
        __builtin_prefetch((const void *)((uintptr_t)p + (uintptr_t)off), 0, 2);
    else
        __builtin_prefetch((const void *)((uintptr_t)p + (uintptr_t)off), 0, 3);
#else
    (void)p;
    (void)off;
    (void)contig;
#endif
}

/* exp(x) = 2**(x log2 e): the attention kernels keep their scores in natural
 * units (a finite score stays finite) and move only differences s - m <= 0 to
 * base 2, inside the exponential. */
#define FA_LOG2E 1.44269504088896341f

/*
 * tanh(x) in float32, for soft-capped scores (c tanh(s / c)). |x| < 0.625
 * (FA_TANH_SMALL): x + x**3 P(x**2) with P of degree 4 fitted for the least
 * relative error on [0, 0.625] (0.8 ulp in float32 evaluation; fa_tanh_small,
 * on |x|); elsewhere (1 - t) / (1 + t) with t = exp(-2|x|) = 2**(-2 log2(e)
 * |x|) from fa_exp2f (t <= 0.29: no cancellation); both on |x|, the sign (of
 * zero too) copied from x. Within 4 ulp of tanh (the tests hold every SIMD
 * variant to that); +-inf give +-1, NaN gives NaN. Branch-free: both forms are
 * computed and one is selected, so loops over it vectorise. A loop whose
 * arguments all lie below FA_TANH_SMALL in magnitude may call
 * copysignf(fa_tanh_small(|x|), x) instead: the same bits, without the
 * exponential and the division.
 */
#define FA_TANH_SMALL 0.625f

static inline FA_TARGET float fa_tanh_small(float ax)
{
    const float x2 = ax * ax;
    return ax + (ax * x2) * (-0.3333324194f + x2 * (0.1333059072f + x2 * (-0.05367867276f
           + x2 * (0.02046200633f + x2 * -0.005525179673f))));
}

static inline FA_TARGET float fa_tanhf(float x)
{
    const float ax = fabsf(x);
    const float p = fa_tanh_small(ax);
    const float t = fa_exp2f(ax * -2.88539008f);
    const float big = (1.0f - t) / (1.0f + t);
    return copysignf(ax < FA_TANH_SMALL ? p : big, x);
}

/*
 * The thread policy (config.c). fa_threads_for: the threads a call of `work`
 * units (multiply-adds, or 8 a row element for the row-wise ops) may use,
 * given a cap and its number of work items: one thread below 2 x
 * FA_MIN_WORK_PER_THREAD, and at most one thread a FA_MIN_WORK_PER_THREAD
 * (on an idle 2-core AMD EPYC a call of 2.1 M units, 69 us on one thread,
 * took 37 us on two). While the machine is loaded (fa_note_wait saw a call's
 * thread arrive FA_LATE_S or more after the call began, within a window of
 * FA_BUSY_MIN_S after a time without load, else four times the last window,
 * up to FA_BUSY_S: fa_busy_span), a call below FA_BUSY_WORK units runs on
 * one thread: a thread that is not scheduled holds up the whole call by a
 * scheduler time slice (with three busy processes on two cores, a 0.24 ms
 * call averaged 1.3-1.6 ms on two threads, 0.48 ms on one). Only attention
 * calls (plan_run) time their threads. A late thread counts when the call
 * began within FA_HOT_S of the last such call's end, while the OpenMP
 * threads still wait awake (GNU libgomp's spin for some milliseconds), and
 * the last call was late too, in the same way, or other threads fill the
 * cores (below): the host of a virtual machine takes a core for a
 * millisecond now and then (an idle virtual 2-core Xeon, back-to-back calls:
 * one late call three times in ten seconds; counted loaded on two in a row,
 * none in twenty; a stall over two calls opened the window, so it starts
 * short: after the Whisper encoder's case, the first two decoding calls of
 * `bench --models` took 7.8 and 4.4 ms, and a half-second window had kept
 * every timed call on one thread, 0.6x torch). Under lasting load the
 * windows grow to FA_BUSY_S at the fourth try (20, 80, 320, 500 ms; two and
 * three busy processes on the two cores, decoding calls back to back: the
 * same mean times as a fixed half second, within the runs' spread). After a
 * longer pause they sleep, and waking one takes over FA_LATE_S on some idle
 * machines (a virtual 2-core Xeon: after 50 ms idle, 18-20 calls of 20;
 * after 2 ms none), so there it counts only where other threads fill the
 * cores (Linux: /proc/loadavg's running threads, less the call's own, at
 * least the cores the machine has online; elsewhere always). With two busy
 * processes on those two cores and a 3 ms pause before each decoding call,
 * the calls were counted loaded 99 % of the time. The thread count never
 * changes a bit of a result.
 *
 * An attention call's work (attention.c's plan_build) is its multiply-adds
 * plus FA_KEY_READ_WORK for each element of a key or value row that a unit
 * reads: a unit of one or a few query rows (decoding) reads every row of
 * its k and v for a handful of products, and costs far more than its
 * multiply-adds say. On that EPYC, one thread: a decoding call of 8 heads x
 * 1024 keys, D = 64 (1 M multiply-adds) took 161 us, 153 ps a multiply-add,
 * where full attention of 8 heads x 128 x 128 (17 M) took 485 us, 29 ps:
 * 4.3 multiply-adds' time per element read. Counted so, a decoding call of
 * 8 heads x 512 keys (2.6 M; 82 us on one thread) takes 48 us on two; with
 * the multiply-adds alone (0.5 M) it kept to one thread, as did any
 * decoding step of 8 heads over fewer than 2048 keys at D = 64.
 */
#define FA_MIN_WORK_PER_THREAD 1048576.0
#define FA_KEY_READ_WORK 4.0
#define FA_BUSY_WORK 268435456.0 /* ~8 ms on one thread of that EPYC */
#define FA_LATE_S 0.001
#define FA_HOT_S 0.002
#define FA_BUSY_S 0.5
#define FA_BUSY_MIN_S 0.02
/* (fa_threads_for, fa_busy, fa_set_busy, fa_note_wait, fa_busy_span,
 * fa_busy_window and fa_now -- omp_get_wtime's seconds: a monotonic clock
 * under GNU libgomp, the wall clock under LLVM's libomp; 0 in a build
 * without OpenMP -- are in fastattn.h, for the tests.) */

/* attention.c's shared pieces: the argument checks of every entry point
 * (weights: the output is the L x S weights and v is not read; with_lse: lse
 * is written), the test that the elements off + i st1 + j st2 + [0, width)
 * (i < n1, j < n2) lie in a span, and a thread's working memory: one
 * allocation carved into n <= FA_ARENA_MAX buffers of the given sizes in
 * bytes, *slots[i] = buffer i, each 64-byte aligned and followed by a gap
 * (poisoned under AddressSanitizer: an overrun of any buffer is reported);
 * the allocation to free, or NULL. */
#define FA_ARENA_MAX 32
int fa_check_args(const fa_attn_args *a, int nthreads, int weights, int with_lse);
int fa_in_span(fa_span s, int64_t off, int64_t n1, int64_t st1, int64_t n2, int64_t st2,
               int64_t width);
void *fa_arena(const size_t *sizes, int n, void **const *slots);

/* A packed batch's cu_seqlens (nondecreasing from 0) and the options it
 * cannot take; then the arguments of its sequence s alone, whose ALiBi
 * slopes and sinks lengths count the entries left from that sequence on, so
 * that fa_check_args bounds them. */
int fa_check_cu_seqlens(const fa_attn_args *a, int64_t nseq, const int64_t *cu_q,
                        const int64_t *cu_k);
void fa_varlen_sequence(const fa_attn_args *a, const int64_t *cu_q, const int64_t *cu_k,
                        int64_t s, fa_attn_args *q);

#endif /* FA_INTERNAL_H */
