/*
 * dtypes.h -- the element types of k and v, one row each: the one table that
 * the C code (codes, sizes, conversions, the per-type dispatch of the
 * kernels), fastattn._core (fa_dtype_table) and, through it,
 * fastattn._validate read.
 *
 *   X(NAME, code, name, bytes, block, at)
 *
 * NAME   FA_DTYPE_<NAME>, the code of fa_attn_args's k_dtype and v_dtype
 * name   the NumPy dtype's name (bfloat16: ml_dtypes')
 * bytes  bytes a block of `block` elements: 1 element for the types here; a
 *        block format (32 elements that share a scale, say) has more, and
 *        offsets and strides then count whole blocks
 * at     the function that reads element i of a row as float32, exactly
 *        (fa_internal.h)
 *
 * Adding a type: a row here, its `at` function, and its branch in each
 * kernel with conversions of its own (FA_DTYPES_KNOWN marks them; docs/dev/
 * add-element-type.rst).
 */
#ifndef FA_DTYPES_H
#define FA_DTYPES_H

#define FA_DTYPES(X)                                                                               \
    X(F32, 0, "float32", 4, 1, fa_f32_at)   /* float32 */                                          \
    X(F16, 1, "float16", 2, 1, fa_f16_at)   /* IEEE 754 binary16, as its uint16 bits */            \
    X(BF16, 2, "bfloat16", 2, 1, fa_bf16_at) /* the top 16 bits of a float32, as uint16 bits */

/* The rows of the table. Kernels with conversions of their own for each
 * type assert the count they know (FA_DTYPES_KNOWN), so that a new row stops
 * the build there until they learn it, rather than reading it as another. */
#define FA_DTYPE_PLUS_ONE(NAME, code, name, bytes, block, at) +1
#define FA_DTYPE_COUNT (0 FA_DTYPES(FA_DTYPE_PLUS_ONE))
#define FA_DTYPES_KNOWN(tag, n) typedef char tag[FA_DTYPE_COUNT == (n) ? 1 : -1]

#endif /* FA_DTYPES_H */
