/*
 * dtypes.h -- the element types of k and v, one row each: the one table that
 * the C code (codes, sizes, conversions, the per-type dispatch of the
 * kernels), fastattn._core (fa_dtype_table) and, through it,
 * fastattn._validate read.
 *
 *   X(NAME, code, name, bytes, block, at)
 *
 * NAME   FA_DTYPE_<NAME>, the code of fa_attn_args's k_dtype and v_dtype
 * name   the NumPy dtype's name (bfloat16: ml_dtypes'); a block format's GGUF
 *        name (fastattn.QuantizedArray's format)
 * bytes  bytes of a block of `block` elements: one element for the element
 *        types; a block format (32 elements that share a scale) has more,
 *        and offsets and strides of its arrays count whole blocks
 * at     the function that reads element i of a row as float32, exactly
 *        (fa_internal.h)
 *
 * Adding a type: a row here, its `at` function, and its branch in each
 * kernel with conversions of its own (FA_DTYPES_KNOWN marks them; docs/dev/
 * add-element-type.rst); a block format: a row of FA_BLOCK_DTYPES, its `at`
 * and its branch of fa_block_row (fa_internal.h).
 */
#ifndef FA_DTYPES_H
#define FA_DTYPES_H

#define FA_ELEM_DTYPES(X)                                                                          \
    X(F32, 0, "float32", 4, 1, fa_f32_at)   /* float32 */                                          \
    X(F16, 1, "float16", 2, 1, fa_f16_at)   /* IEEE 754 binary16, as its uint16 bits */            \
    X(BF16, 2, "bfloat16", 2, 1, fa_bf16_at) /* the top 16 bits of a float32, as uint16 bits */

/* The block formats: GGUF's (ggml's) q8_0 and q4_0, byte for byte. A block
 * is 32 elements of a row along D: a float16 scale d (little-endian), then
 * q8_0: 32 int8 q, element i = q[i] d; q4_0: 16 bytes, byte i holding
 * element i in its low nibble and element i + 16 in its high one, element =
 * (nibble - 8) d. Each element is a product of an integer of at most 8 bits
 * and a float16, so float32 holds it exactly. The kernels never read these
 * in place: a unit converts the rows it reads to float32 first
 * (fa_block_row), and from there on they are float32 rows. */
#define FA_BLOCK_DTYPES(X)                                                                         \
    X(Q8_0, 3, "q8_0", 34, 32, fa_q8_0_at)                                                         \
    X(Q4_0, 4, "q4_0", 18, 32, fa_q4_0_at)

#define FA_DTYPES(X) FA_ELEM_DTYPES(X) FA_BLOCK_DTYPES(X)

/* The rows of the table. Kernels with conversions of their own for each
 * element type assert the count they know (FA_DTYPES_KNOWN), so that a new
 * row stops the build there until they learn it, rather than reading it as
 * another; fa_block_row likewise for the block formats
 * (FA_BLOCK_DTYPES_KNOWN). */
#define FA_DTYPE_PLUS_ONE(NAME, code, name, bytes, block, at) +1
#define FA_DTYPE_COUNT (0 FA_DTYPES(FA_DTYPE_PLUS_ONE))
#define FA_ELEM_DTYPE_COUNT (0 FA_ELEM_DTYPES(FA_DTYPE_PLUS_ONE))
#define FA_BLOCK_DTYPE_COUNT (0 FA_BLOCK_DTYPES(FA_DTYPE_PLUS_ONE))
#define FA_DTYPES_KNOWN(tag, n) typedef char tag[FA_ELEM_DTYPE_COUNT == (n) ? 1 : -1]
#define FA_BLOCK_DTYPES_KNOWN(tag, n) typedef char tag[FA_BLOCK_DTYPE_COUNT == (n) ? 1 : -1]

#endif /* FA_DTYPES_H */
