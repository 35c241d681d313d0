"""GGUF's q8_0 and q4_0 block formats for quantized KV caches.

Keys and values are quantized along their last axis (the head dimension D, a
multiple of 32) in blocks of 32 elements, each block one float16 scale and 32
small integers, byte for byte as ggml's reference quantizer (ggml-quants.c,
``quantize_row_q8_0_ref`` and ``quantize_row_q4_0_ref``) and gguf-py's
``gguf.quants.quantize`` write them, so that caches and GGUF tensors can be
exchanged without conversion. The NumPy arithmetic below is float32 step for
step as the reference does it (no float64 intermediate, no fused
multiply-add), which is what makes the bytes identical.
"""
from __future__ import annotations  # help() shows the annotations as written

import math
import operator
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

__all__ = ["QuantizedArray", "quantize_kv"]

BLOCK_SIZE = 32
FORMATS: Dict[str, Tuple[int, int]] = {"q8_0": (34, BLOCK_SIZE), "q4_0": (18, BLOCK_SIZE)}
"""Format name -> (bytes per block, elements per block)."""

# Blocks converted per step, so that the float32 temporaries of a large cache
# stay a few MB whatever its size.
_CHUNK_BLOCKS = 1 << 15

# The largest |x| each format holds is bounded by its float16 scale: the
# scale d = max|x| / 127 (q8_0) or max / -8 (q4_0) rounds to float16 inf from
# 65520 (halfway between 65504, float16's largest, and 65536) on.
_SCALE_DIVISOR = {"q8_0": 127, "q4_0": 8}
_F16_OVERFLOW = 65520.0

_LE_F16 = np.dtype("<f2")  # GGUF is little-endian whatever the machine
# a block as one item: the unit in which the kernels count k's and v's strides
_BLOCK_ITEM = {bb: np.dtype((np.void, bb)) for bb, _ in FORMATS.values()}


def _check_format(format: Any) -> str:
    if not isinstance(format, str):
        raise TypeError(f"format must be a str, one of {_format_list()}, "
                        f"got {type(format).__name__}")
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: expected one of {_format_list()}")
    return format


def _format_list() -> str:
    return ", ".join(repr(name) for name in FORMATS)


def _real(x: ArrayLike, name: str) -> NDArray[Any]:
    """x as an ndarray of real numbers (TypeError naming it else)."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from None
    if arr.dtype.kind in "cSUMm":
        raise TypeError(f"{name} must be of a real numeric dtype, got {arr.dtype}")
    return arr


def _as_float32(x: ArrayLike, name: str) -> NDArray[np.float32]:
    """x as float32, as gguf-py converts before quantizing (ints included)."""
    arr = _real(x, name)
    try:
        # float64 beyond float32's range turns inf here, reported below
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(np.float32)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}: "
                        f"{exc}") from None
    if out.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension (the quantized last axis), "
                         f"got a 0-d array")
    return out


def _check_values(x32: NDArray[np.float32], source: Any, name: str, format: str) -> None:
    """Refuse what no block holds: non-finite values, scales beyond float16."""
    if x32.size == 0 or bool(np.isfinite(x32).all()):
        return
    # A finite float64 beyond float32's range turns inf only in the
    # conversion: that is a magnitude too large for the scale, not a NaN/inf.
    try:
        source_finite = bool(np.isfinite(np.asarray(source)).all())
    except TypeError:
        source_finite = False
    if source_finite:
        raise _too_large(name, format, math.inf)
    raise ValueError(f"{name} has non-finite values (NaN or inf); {format} blocks hold "
                     f"finite values only")


def _too_large(name: str, format: str, amax: float) -> ValueError:
    divisor = _SCALE_DIVISOR[format]
    how = "max|x| / 127" if format == "q8_0" else "max / -8 (max: the value of largest |x|)"
    return ValueError(
        f"{name} has values too large for {format}: max |{name}| = {amax:.6g} makes a block "
        f"scale d = {how} overflow float16; |{name}| must stay below about "
        f"{_F16_OVERFLOW * divisor:.6g} (65520 * {divisor})")


def _blocks_of(x32: NDArray[np.float32], name: str) -> NDArray[np.float32]:
    """The (n_blocks, 32) C-contiguous rows of blocks of x32."""
    d = x32.shape[-1]
    if d % BLOCK_SIZE:
        raise ValueError(f"{name}'s last axis has length {d}, not a multiple of {BLOCK_SIZE}: "
                         f"the head dimension is quantized in blocks of {BLOCK_SIZE}")
    n = x32.size // BLOCK_SIZE
    return np.ascontiguousarray(x32).reshape(n, BLOCK_SIZE)


def _quantize_chunk(xb: NDArray[np.float32], format: str,
                    out: NDArray[np.uint8]) -> Optional[float]:
    """Quantize the blocks xb (n, 32) into out (n, block_bytes).

    Returns None, or the largest |x| when a scale overflows float16 (out is
    then partly written).
    """
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if format == "q8_0":
            d = np.max(np.abs(xb), axis=1, keepdims=True) / np.float32(127)
        else:
            # The signed value of largest magnitude (the first of equal ones,
            # as argmax takes it) is mapped to -8, the one end of [-8, 7].
            at = np.argmax(np.abs(xb), axis=1)[:, None]
            d = np.take_along_axis(xb, at, axis=1) / np.float32(-8)
        d16 = d.astype(_LE_F16)
        if bool(np.isinf(d16).any()):
            return float(np.max(np.abs(xb)))
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        p = xb * inv
        # Blocks of max|x| below about 3.7e-37 have a 1/d that overflows
        # float32, hence products inf or NaN, whose conversion to an integer
        # ggml leaves to the machine: on x86-64 (and in gguf-py there) it
        # gives 0. Their float16 scale is 0, so their values are 0 whatever q.
        finite = np.isfinite(p)
        if format == "q8_0":
            # round half away from zero (C's roundf): p - trunc(p) is exact
            t = np.trunc(p)
            q = t + np.where(np.abs(p - t) >= np.float32(0.5), np.sign(p), np.float32(0))
            q = np.where(finite, q, np.float32(0))
            out[:, 2:] = q.astype(np.int8).view(np.uint8)
        else:
            # trunc(p + 8.5) in float32: p + 8.5 may round, as in the reference
            q = np.trunc(p + np.float32(8.5))
            q = np.where(finite, np.clip(q, np.float32(0), np.float32(15)), np.float32(0))
            nib = q.astype(np.uint8)
            half = BLOCK_SIZE // 2
            out[:, 2:] = nib[:, :half] | (nib[:, half:] << np.uint8(4))
    out[:, :2] = d16.view(np.uint8)
    return None


def _quantize_float32(x32: NDArray[np.float32], source: Any, name: str,
                      format: str) -> NDArray[np.uint8]:
    """Validated float32 x32 (..., D) -> C-contiguous blocks (..., D // 32 * block_bytes)."""
    xb = _blocks_of(x32, name)
    _check_values(x32, source, name, format)
    block_bytes = FORMATS[format][0]
    n = xb.shape[0]
    out = np.empty((n, block_bytes), dtype=np.uint8)
    for start in range(0, n, _CHUNK_BLOCKS):
        stop = min(start + _CHUNK_BLOCKS, n)
        if _quantize_chunk(xb[start:stop], format, out[start:stop]) is not None:
            raise _too_large(name, format, float(np.max(np.abs(xb))))
    return out.reshape(x32.shape[:-1] + (x32.shape[-1] // BLOCK_SIZE * block_bytes,))


def _dequantize_blocks(blocks: NDArray[np.uint8], format: str) -> NDArray[np.float32]:
    """Blocks (..., n * block_bytes) -> new C-contiguous float32 (..., n * 32)."""
    block_bytes = FORMATS[format][0]
    nb = blocks.shape[-1] // block_bytes
    out = np.empty(blocks.shape[:-1] + (nb * BLOCK_SIZE,), dtype=np.float32)
    n = out.size // BLOCK_SIZE
    rows = np.ascontiguousarray(blocks).reshape(n, block_bytes)
    flat = out.reshape(n, BLOCK_SIZE)
    for start in range(0, n, _CHUNK_BLOCKS):
        b = rows[start:start + _CHUNK_BLOCKS]
        d = np.ascontiguousarray(b[:, :2]).view(_LE_F16).astype(np.float32)
        if format == "q8_0":
            q = b[:, 2:].view(np.int8).astype(np.float32)
        else:
            nib = np.concatenate([b[:, 2:] & np.uint8(0x0F), b[:, 2:] >> np.uint8(4)], axis=1)
            q = (nib.astype(np.int8) - np.int8(8)).astype(np.float32)
        # q has at most 8 significant bits and d 11: the product is exact
        # (foreign bytes may hold an inf or NaN scale: 0 * inf is NaN, quietly)
        with np.errstate(invalid="ignore"):
            np.multiply(q, d, out=flat[start:start + _CHUNK_BLOCKS])
    return out


def quantize_kv(x: ArrayLike, format: str = "q8_0") -> "QuantizedArray":
    """Quantize keys or values along their last axis to GGUF q8_0 or q4_0 blocks.

    Parameters
    ----------
    x : array_like, real numbers, shape (..., D)
        At least 1 dimension; D, the last axis (the head dimension), a
        multiple of 32. Any real dtype (float16, bfloat16, float32, float64,
        integers): converted to float32 first, as gguf-py does. Every value
        finite, and each block's scale within float16 (see Raises).
    format : {'q8_0', 'q4_0'}, default 'q8_0'
        The block format (see Notes).

    Returns
    -------
    QuantizedArray
        Of x's shape, over a new C-contiguous uint8 array of blocks
        (:attr:`QuantizedArray.blocks`, shape ``(..., D // 32 *
        block_bytes)``), the blocks of each row in order along the last
        axis: 34 bytes per block of 32 values for q8_0 (8.5 bits per value),
        18 bytes for q4_0 (4.5 bits per value). Those bytes are byte for byte
        what ``gguf.quants.quantize(x.astype(np.float32), qtype)`` returns.

    Raises
    ------
    TypeError
        If `format` is not a str, or `x` is not an array of real numbers
        (complex, strings, ...).
    ValueError
        If `format` is not one of the formats; `x` is 0-d; its last axis is
        not a multiple of 32; it has a NaN or an infinity; or a block's scale
        overflows float16, which happens for ``abs(x)`` from about 8.32e6
        (65520 * 127) in q8_0 and 5.24e5 (65520 * 8) in q4_0.

    See Also
    --------
    QuantizedArray : the blocks with their logical float32 shape, sliceable
        and writable in place.

    Notes
    -----
    The formats are GGML's (and GGUF's) ``Q8_0`` and ``Q4_0``, and the
    arithmetic is that of ggml's reference quantizer (ggml-quants.c,
    ``quantize_row_q8_0_ref`` and ``quantize_row_q4_0_ref``), every step in
    float32. Each block of 32 consecutive values x of the last axis is stored
    as a float16 scale d (2 bytes, little-endian; the float32 d rounded to
    nearest even) followed by:

    - q8_0: 32 int8 ``q = round(x * id)`` (halves away from zero), where
      ``d = max(abs(x)) / 127`` and ``id = 1 / d`` (0 when d is 0). Value
      ``q * d``.
    - q4_0: 16 bytes of 4-bit ``q = min(trunc(x * id + 8.5), 15)``, where
      ``d = m / -8``, m the value of largest magnitude (the first one if
      several), and ``id = 1 / d`` (0 when d is 0); byte i holds q[i] in its
      low nibble and q[i + 16] in its high nibble. Value ``(q - 8) * d``.

    Rounding to nearest, q8_0 is within d/2 of each value and q4_0 within d
    (the range [-8, 7] is asymmetric around 0: the value m is -8 exactly).
    Note that the scale is the float32 d while the stored one is its float16
    rounding, so both bounds hold up to that rounding (a relative 2**-11).

    A block of ``abs(x)`` below about 3.7e-37 has a 1/d that overflows float32; its
    float16 scale is 0 and its q are stored as 0 (what ggml and gguf-py give
    on x86-64), so its values dequantize to 0.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> k = np.random.default_rng(0).standard_normal((2, 4, 64)).astype(np.float32)
    >>> kq = fastattn.quantize_kv(k)
    >>> kq
    QuantizedArray(shape=(2, 4, 64), format='q8_0', nbytes=544)
    >>> kq.blocks.shape, kq.blocks.dtype
    ((2, 4, 68), dtype('uint8'))
    >>> err = np.abs(kq.dequantize() - k)
    >>> bool(err.max() <= np.abs(k).max() / 127 / 2 * 1.001)
    True
    """
    return quantize_rows(x, format, "x")


def quantize_rows(x: ArrayLike, format: str, name: str) -> "QuantizedArray":
    """quantize_kv(x, format), its errors naming the argument `name`."""
    format = _check_format(format)
    if isinstance(x, QuantizedArray):
        if x.format == format:
            return x
        x = x.dequantize()
    x32 = _as_float32(x, name)
    return QuantizedArray._wrap(_quantize_float32(x32, x, name, format), format)


class QuantizedArray:
    """GGUF q8_0 or q4_0 blocks seen as the float32 array they stand for.

    A read-mostly view of a uint8 array of blocks (..., n * block_bytes), for
    instance a quantized KV cache, with the logical shape (..., n * 32) of the
    values. It dequantizes on demand (:meth:`dequantize`, ``np.asarray``),
    slices its leading axes without copying, and quantizes in place on
    assignment, so that a cache can be filled row by row.

    Build one with :meth:`from_blocks` (or ``QuantizedArray(blocks,
    format)``, the same); :func:`quantize_kv` makes the blocks.

    Parameters
    ----------
    blocks : ndarray of uint8, shape (..., n * block_bytes)
        At least 1 dimension; the blocks of each row along the last axis,
        which must be contiguous (stride 1); the leading axes may have any
        strides (a slice of a larger cache). Wrapped, never copied.
    format : {'q8_0', 'q4_0'}
        The block format: 34 bytes per block (q8_0) or 18 (q4_0); see
        :func:`quantize_kv` for the byte layout.

    Attributes
    ----------
    format : str
        'q8_0' or 'q4_0'.
    blocks : ndarray, uint8
        The wrapped bytes (shares memory with the array given).
    shape : tuple of int
        The logical shape, ``blocks.shape[:-1] + (n * 32,)``.
    ndim, size : int
        Of the logical shape.
    dtype : numpy.dtype
        float32, the dtype of the values the blocks stand for (and of
        :meth:`dequantize`), not that of the storage (uint8).
    nbytes : int
        ``blocks.nbytes``: 34/32 bytes per value in q8_0, 18/32 in q4_0.
    block_size : int
        32, values per block.
    block_bytes : int
        34 (q8_0) or 18 (q4_0), bytes per block.

    Raises
    ------
    TypeError
        If `format` is not a str or `blocks` is not of dtype uint8.
    ValueError
        If `format` is unknown, `blocks` is 0-d, its last axis length is not a
        multiple of the block size in bytes, or its last axis is not
        contiguous.

    Notes
    -----
    Indexing (``qa[key]``, ``qa[key] = value``) takes indices of the leading
    axes: ints, slices, one Ellipsis, integer arrays, and tuples of those,
    with NumPy's meaning; the last axis, whose values are packed in blocks,
    can be selected only whole (left out of the key, covered by the
    Ellipsis, or ``:``). ``qa[key]`` is a QuantizedArray sharing memory with
    `qa` for basic keys (of ndim 1, the row, when every leading axis takes an
    int), of copied blocks with integer arrays, as NumPy's indexing.
    ``qa[key] = value`` broadcasts `value` to the selected shape and writes
    its blocks in place, with :func:`quantize_kv`'s rules. :meth:`swapaxes`,
    :meth:`transpose` and :meth:`reshape` rearrange the leading axes (views
    where NumPy's would be).

    Arithmetic and NumPy's ufuncs are refused (TypeError): they would work
    on dequantized copies (NumPy functions that convert their argument with
    ``np.asarray`` first, ``np.mean`` say, see the dequantized values; fastattn's
    functions take it as ``k`` and ``v`` only). Equality is identity (``==`` is not elementwise):
    compare ``qa.dequantize()`` or ``qa.blocks``.

    Examples
    --------
    A cache of 2 heads, 16 positions, D = 64, filled two positions at a time:

    >>> import numpy as np, fastattn
    >>> cache = fastattn.QuantizedArray.from_blocks(np.zeros((2, 16, 68), np.uint8), "q8_0")
    >>> cache
    QuantizedArray(shape=(2, 16, 64), format='q8_0', nbytes=2176)
    >>> rows = np.random.default_rng(0).standard_normal((2, 2, 64))
    >>> cache[:, 4:6] = rows
    >>> part = cache[:, 4:6]
    >>> part.shape, bool(np.shares_memory(part.blocks, cache.blocks))
    ((2, 2, 64), True)
    >>> bool(np.array_equal(part.blocks, fastattn.quantize_kv(rows).blocks))
    True
    >>> bool(np.abs(np.asarray(part) - rows).max() < 0.02)
    True
    """

    __slots__ = ("_blocks", "_format", "_block_bytes")

    # NumPy's ufuncs and operators refuse it (TypeError) rather than
    # dequantize it behind the caller's back; this also marks it as an array
    # to Dask, which then keeps its chunks as they are
    __array_ufunc__ = None

    _blocks: NDArray[np.uint8]
    _format: str
    _block_bytes: int

    def __init__(self, blocks: ArrayLike, format: str) -> None:
        format = _check_format(format)
        if isinstance(blocks, QuantizedArray):
            raise TypeError(f"blocks is a QuantizedArray already ({blocks.format}): pass its "
                            f".blocks (bytes), or the QuantizedArray itself where it is used")
        if isinstance(blocks, bytes):
            arr = np.frombuffer(blocks, dtype=np.uint8)
        else:
            arr = np.asarray(blocks)  # an ndarray as it is: no copy
        if arr.dtype != np.uint8:
            raise TypeError(f"blocks must be of dtype uint8 (the bytes of {format} blocks), "
                            f"got {arr.dtype}")
        if arr.ndim == 0:
            raise ValueError("blocks must have at least 1 dimension (the blocks' bytes), "
                             "got a 0-d array")
        block_bytes = FORMATS[format][0]
        if arr.shape[-1] % block_bytes:
            raise ValueError(f"blocks' last axis has length {arr.shape[-1]}, not a multiple "
                             f"of {block_bytes} (the bytes of a {format} block)")
        if arr.shape[-1] > 1 and arr.strides[-1] != 1:
            raise ValueError(f"blocks' last axis must be contiguous (stride 1), got stride "
                             f"{arr.strides[-1]}: a block's bytes are read in a run")
        self._blocks = arr
        self._format = format
        self._block_bytes = block_bytes

    @classmethod
    def from_blocks(cls, blocks: ArrayLike, format: str) -> QuantizedArray:
        """Wrap blocks of GGUF q8_0 or q4_0 bytes, without copying them.

        Parameters
        ----------
        blocks : ndarray of uint8, shape (..., n * block_bytes)
            At least 1 dimension, the last axis contiguous (stride 1), the
            others with any strides; e.g. :func:`quantize_kv`'s result, a
            GGUF tensor's data, or a slice of a larger cache. A uint8 ndarray
            is wrapped as it is (the result's :attr:`blocks` shares its
            memory); other array-likes go through ``np.asarray`` (``bytes``
            through ``np.frombuffer``) and must then be uint8 too.
        format : {'q8_0', 'q4_0'}
            The block format (34 or 18 bytes per block of 32 values).

        Returns
        -------
        QuantizedArray
            Of logical shape ``blocks.shape[:-1] + (n * 32,)``, float32.

        Raises
        ------
        TypeError
            If `format` is not a str, or `blocks` is not of dtype uint8.
        ValueError
            If `format` is unknown, `blocks` is 0-d, its last axis length is
            not a multiple of the block bytes (34 or 18), or its last axis is
            not contiguous.

        Examples
        --------
        >>> import numpy as np, fastattn
        >>> blocks = fastattn.quantize_kv(np.ones((3, 32)), "q4_0").blocks
        >>> qa = fastattn.QuantizedArray.from_blocks(blocks, "q4_0")
        >>> qa.shape, qa.nbytes, qa.blocks is blocks
        ((3, 32), 54, True)
        >>> qa.dequantize()[0, :4]
        array([1., 1., 1., 1.], dtype=float32)
        """
        return cls(blocks, format)

    @classmethod
    def _wrap(cls, blocks: NDArray[np.uint8], format: str) -> QuantizedArray:
        # views of a validated array are valid: skip the checks
        self = object.__new__(cls)
        self._blocks = blocks
        self._format = format
        self._block_bytes = FORMATS[format][0]
        return self

    @property
    def format(self) -> str:
        """The block format, 'q8_0' or 'q4_0'."""
        return self._format

    @property
    def blocks(self) -> NDArray[np.uint8]:
        """The uint8 array of blocks (..., n * block_bytes), wrapped as given."""
        return self._blocks

    @property
    def shape(self) -> Tuple[int, ...]:
        """The logical shape (..., n * 32) of the values."""
        b = self._blocks
        return b.shape[:-1] + (b.shape[-1] // self._block_bytes * BLOCK_SIZE,)

    @property
    def ndim(self) -> int:
        """Number of dimensions (of the logical shape and of the blocks)."""
        return self._blocks.ndim

    @property
    def size(self) -> int:
        """Number of values, the product of :attr:`shape`."""
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype[np.float32]:
        """float32: the dtype of the values the blocks stand for (storage is uint8)."""
        return np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks, ``blocks.nbytes``."""
        return int(self._blocks.nbytes)

    @property
    def block_size(self) -> int:
        """Values per block, 32."""
        return BLOCK_SIZE

    @property
    def block_bytes(self) -> int:
        """Bytes per block: 34 (q8_0) or 18 (q4_0)."""
        return self._block_bytes

    def __len__(self) -> int:
        return int(self._blocks.shape[0]) if self.ndim > 1 else self.shape[0]

    def __iter__(self) -> Iterator[QuantizedArray]:
        if self.ndim < 2:
            raise TypeError("iteration over a 1-d QuantizedArray would index its quantized "
                            "axis; iterate over dequantize() instead")
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return (f"QuantizedArray(shape={self.shape}, format={self._format!r}, "
                f"nbytes={self.nbytes})")

    def dequantize(self) -> NDArray[np.float32]:
        """The values the blocks stand for.

        Returns
        -------
        ndarray, float32, shape :attr:`shape`
            New C-contiguous array: ``q * d`` (q8_0) or ``(q - 8) * d``
            (q4_0) per value, with d the block's float16 scale as float32 (an
            exact product); bit for bit ``gguf.quants.dequantize``.

        Examples
        --------
        >>> import numpy as np, fastattn
        >>> x = np.array([np.arange(32) - 16.0])
        >>> qa = fastattn.quantize_kv(x, "q4_0")
        >>> qa.dequantize()[0, :4]
        array([-16., -14., -14., -12.], dtype=float32)
        """
        return _dequantize_blocks(self._blocks, self._format)

    def _items(self) -> NDArray[Any]:
        """The blocks viewed as one item per block, shape (..., D // 32):
        what the kernels read, their strides in blocks."""
        return self._blocks.view(_BLOCK_ITEM[self._block_bytes])

    def copy(self) -> QuantizedArray:
        """A QuantizedArray of a C-contiguous copy of the blocks."""
        return QuantizedArray._wrap(self._blocks.copy(order="C"), self._format)

    def __array__(self, dtype: Optional[DTypeLike] = None,
                  copy: Optional[bool] = None) -> NDArray[Any]:
        if copy is False:
            raise ValueError("a QuantizedArray cannot be viewed as an ndarray without a "
                             "copy: its values are dequantized")
        values = self.dequantize()
        if dtype is not None:
            return values.astype(dtype, copy=False)
        return values

    def _blocks_key(self, key: Any) -> Tuple[Any, ...]:
        """The key of the blocks for a basic key of the leading axes."""
        items = key if isinstance(key, tuple) else (key,)
        n_ellipsis = 0
        for item in items:
            if item is Ellipsis:
                n_ellipsis += 1
                if n_ellipsis > 1:
                    raise IndexError("an index can only have a single ellipsis ('...')")
            elif item is None:
                raise IndexError("QuantizedArray does not take None (np.newaxis) in an "
                                 "index: only ints, slices and Ellipsis of the leading axes")
            elif isinstance(item, (list, np.ndarray)):
                if np.asarray(item).dtype.kind not in "iu" and np.asarray(item).size:
                    raise IndexError(
                        f"QuantizedArray takes integer arrays of its leading axes, not "
                        f"{np.asarray(item).dtype} ones (no boolean indexing): index "
                        f"qa.dequantize() for those")
            elif isinstance(item, (bool, np.bool_)) or not isinstance(
                    item, (int, np.integer, slice)):
                raise IndexError(
                    f"QuantizedArray takes ints, slices, integer arrays and Ellipsis of its "
                    f"leading axes only, not {type(item).__name__} (no boolean indexing): "
                    f"index qa.dequantize() for those")
        n = len(items) - n_ellipsis
        if n > self.ndim:
            raise IndexError(f"too many indices for a QuantizedArray of {self.ndim} "
                             f"dimension{'s' if self.ndim > 1 else ''}: {n} were indexed")
        full: List[Any] = []
        for item in items:
            if item is Ellipsis:
                full.extend([slice(None)] * (self.ndim - n))
            elif isinstance(item, (list, np.ndarray)):
                full.append(np.asarray(item, dtype=np.intp))
            else:
                full.append(item)
        full.extend([slice(None)] * (self.ndim - len(full)))
        last = full[-1]
        d = self.shape[-1]
        if not (isinstance(last, slice) and last.indices(d) == (0, d, 1)):
            raise IndexError(
                f"the index reaches the last axis (the quantized axis of {d} values, packed "
                f"in {self._format} blocks of {BLOCK_SIZE}), which can only be taken whole: "
                f"QuantizedArray indexes its leading axes; index qa.dequantize() instead")
        full[-1] = slice(None)
        return tuple(full)

    def __getitem__(self, key: Any) -> QuantizedArray:
        view = self._blocks[self._blocks_key(key)]
        return QuantizedArray._wrap(view, self._format)

    def __setitem__(self, key: Any, value: ArrayLike) -> None:
        bkey = self._blocks_key(key)
        # the selection's shape, from a one-byte view of each row (its bounds
        # checked as the blocks' would be; no copy of the blocks)
        rows = np.broadcast_to(np.zeros(1, np.uint8), self._blocks.shape[:-1] + (1,))
        picked = rows[bkey].shape[:-1]
        if not self._blocks.flags.writeable:
            raise ValueError("the blocks of this QuantizedArray are read-only")
        shape = picked + (self.shape[-1],)
        if isinstance(value, QuantizedArray) and value.format == self._format:
            if value.shape[-1] != shape[-1]:
                raise ValueError(f"value of shape {value.shape} cannot be broadcast to the "
                                 f"selected shape {shape}")
            try:  # (its bytes as they are: quantizing its values again could change them)
                self._blocks[bkey] = np.broadcast_to(value.blocks, picked
                                                     + value.blocks.shape[-1:])
            except ValueError:
                raise ValueError(f"value of shape {value.shape} cannot be broadcast to the "
                                 f"selected shape {shape}") from None
            return
        arr = _real(value, "value")
        try:
            arr = np.broadcast_to(arr, shape)
        except ValueError:
            raise ValueError(f"value of shape {arr.shape} cannot be broadcast to the selected "
                             f"shape {shape}") from None
        v32 = _as_float32(arr, "value")
        new = _quantize_float32(v32, value, "value", self._format)
        self._blocks[bkey] = new

    def _leading_axis(self, axis: Any, name: str) -> int:
        try:
            ax = operator.index(axis)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(axis).__name__}") from None
        if not -self.ndim <= ax < self.ndim:
            raise ValueError(f"{name} {axis} is out of range for {self.ndim} dimensions")
        ax %= self.ndim
        if ax == self.ndim - 1:
            raise ValueError(f"{name} {axis} is the last axis, whose values are packed in "
                             f"blocks: only the leading axes can be moved")
        return ax

    def swapaxes(self, axis1: int, axis2: int) -> QuantizedArray:
        """The view with two leading axes interchanged (``numpy.swapaxes``);
        ValueError if either is the last axis."""
        a1 = self._leading_axis(axis1, "axis1")
        a2 = self._leading_axis(axis2, "axis2")
        return QuantizedArray._wrap(self._blocks.swapaxes(a1, a2), self._format)

    def transpose(self, *axes: Any) -> QuantizedArray:
        """The view with the leading axes permuted (``numpy.transpose``): `axes`
        a permutation of all axes that keeps the last one last (none: the
        leading axes reversed)."""
        if len(axes) == 1 and axes[0] is None:
            axes = ()
        elif len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0])
        lead = self.ndim - 1
        if not axes:
            perm = tuple(range(lead - 1, -1, -1)) + (lead,)
        else:
            perm = tuple(operator.index(a) % self.ndim if -self.ndim <= operator.index(a)
                         < self.ndim else -1 for a in axes)
            if sorted(perm) != list(range(self.ndim)) or perm[-1] != lead:
                raise ValueError(f"axes must be a permutation of the {self.ndim} axes that keeps "
                                 f"the last (packed) axis last, got {axes}")
        return QuantizedArray._wrap(self._blocks.transpose(perm), self._format)

    def reshape(self, *shape: Any) -> QuantizedArray:
        """The leading axes reshaped (``numpy.reshape``: a view where NumPy's
        would be one, else a copy); the last axis stays D (given as D or -1
        among the leading axes' sizes)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        new = tuple(operator.index(n) for n in shape)
        d = self.shape[-1]
        if not new or new[-1] != d:
            raise ValueError(f"a QuantizedArray's reshape keeps the last axis ({d} values, "
                             f"packed in blocks): the new shape must end with {d}, got {new}")
        return QuantizedArray._wrap(
            self._blocks.reshape(new[:-1] + (self._blocks.shape[-1],)), self._format)
