"""FlashAttention's ``flash_attn.layers.rotary.apply_rotary_emb`` on NumPy arrays.

>>> from fastattn.flash_attn.layers.rotary import apply_rotary_emb  # instead of flash_attn's

The rotation itself is the one :func:`fastattn.flash_attn.flash_attn_with_kvcache`
applies to its ``rotary_cos`` and ``rotary_sin`` (one implementation for both:
the same bits for the same positions). ``apply_rotary_emb_func`` is the
older name FlashAttention keeps for it.
"""
import numpy as np

from fastattn._validate import check_cu_seqlens
from fastattn.flash_attn import (_array, _bool, _check_max_seqlen, _index_array, _int,
                                 _rotary_tables, _rotate)

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func"]


def _offsets(seqlen_offsets, B):
    """seqlen_offsets (an int, or one int per sequence) as an int64 (B,) array, >= 0."""
    if np.ndim(seqlen_offsets) == 0:
        # (through the array form: an int beyond int64 is named there, not wrapped)
        return _offsets([_int(seqlen_offsets, "seqlen_offsets")] * B, B)
    offsets = _index_array(seqlen_offsets, "seqlen_offsets", (B,))
    if (offsets < 0).any():
        b = int(np.argmax(offsets < 0))
        raise ValueError(f"seqlen_offsets must be >= 0, got {int(offsets[b])} for sequence {b}")
    return offsets


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """FlashAttention's ``apply_rotary_emb``: the rotary position embedding (RoPE).

    The first ``rotary_dim = 2 * cos.shape[1]`` features of each head are
    turned in pairs, token ``t`` of sequence ``b`` by the angle of row
    ``seqlen_offsets[b] + t`` of the tables (``cos`` and ``sin`` of that
    angle); the other features are kept.

    Parameters
    ----------
    x : array_like, shape (B, T, H, D) or, with `cu_seqlens`, (total, H, D)
        Queries or keys, real floating dtype. With `inplace`, a writeable
        NumPy array or CPU torch tensor.
    cos, sin : array_like, shape (seqlen_ro, rotary_dim / 2), real floating dtype
        The tables: row ``p`` holds ``cos`` (``sin``) of the angles of
        position ``p``; ``1 <= rotary_dim <= D``. Read as float32.
    interleaved : bool, default False
        False: pairs ``(i, i + rotary_dim / 2)`` (GPT-NeoX, Llama); True:
        pairs ``(2i, 2i + 1)`` (GPT-J).
    inplace : bool, default False
        Write the result into `x` and return `x`.
    seqlen_offsets : int or array_like of int, shape (B,), default 0
        The position of each sequence's first token (a KV cache's length
        when decoding); >= 0.
    cu_seqlens : array_like of int, shape (B + 1,), optional
        `x` holds B sequences packed one after the other: sequence ``b`` is
        ``x[cu_seqlens[b]:cu_seqlens[b + 1]]``, its tokens at positions
        ``seqlen_offsets[b] + 0, 1, ...``. Starts at 0, does not decrease,
        ends at total.
    max_seqlen : int, optional
        With `cu_seqlens` (needed then): at least the longest sequence.
        Ignored without `cu_seqlens`, as in FlashAttention.

    Returns
    -------
    out : ndarray, x's dtype and shape
        A new array, or `x` itself (as passed) with `inplace`. The rotated
        features are computed in float32 and rounded to x's dtype once.

    Raises
    ------
    TypeError
        If `x`, `cos` or `sin` does not have a real floating dtype, the
        offsets or `cu_seqlens` are not integers, a flag is not a bool, or
        `x` is neither a NumPy array nor a CPU torch tensor with `inplace`.
    ValueError
        If `x` does not have 4 dimensions (3 with `cu_seqlens`), `cos` and
        `sin` differ in shape or give a rotary_dim outside ``[1, D]``,
        `seqlen_offsets` has the wrong shape or a negative value,
        `cu_seqlens` is not as described, `max_seqlen` is missing or smaller
        than a sequence, a position used is outside the tables, or `x` is
        read-only with `inplace`.

    See Also
    --------
    fastattn.flash_attn.flash_attn_with_kvcache : rotates q and the new k by
        the same rule (``rotary_cos``, ``rotary_sin``; its default layout is
        ``rotary_interleaved=True``, this function's is False, as in
        FlashAttention).

    Notes
    -----
    Signature, defaults and layouts are those of FlashAttention 2.x's
    ``flash_attn/layers/rotary.py``; the arithmetic is that of its kernel
    (``flash_attn/ops/triton/rotary.py``): x, cos and sin read as float32,
    ``x1 cos - x2 sin`` and ``x1 sin + x2 cos``, stored in x's dtype.
    Deliberate differences: every position used must lie in the tables
    (FlashAttention's kernel leaves a token past them unrotated when
    `seqlen_offsets` is an array, and for an int offset requires
    ``seqlen_offsets + seqlen <= seqlen_ro``, seqlen being x's sequence
    axis or `max_seqlen`, whatever the sequences' own lengths);
    a sequence longer than `max_seqlen` is a ValueError (FlashAttention
    sizes its grid from `max_seqlen` and leaves the rest unrotated); there is
    no bound on the head dimension (FlashAttention: 256).

    Examples
    --------
    Llama-style tables for D = 8 and 16 positions:

    >>> import numpy as np
    >>> from fastattn.flash_attn.layers.rotary import apply_rotary_emb
    >>> D = 8
    >>> inv_freq = 1.0 / 10000 ** (np.arange(0, D, 2) / D)
    >>> angles = np.outer(np.arange(16), inv_freq)            # (seqlen_ro, D / 2)
    >>> cos, sin = np.cos(angles), np.sin(angles)
    >>> x = np.random.default_rng(0).standard_normal((2, 5, 3, D), dtype=np.float32)
    >>> y = apply_rotary_emb(x, cos, sin)
    >>> y.shape, y.dtype
    ((2, 5, 3, 8), dtype('float32'))
    >>> bool(np.array_equal(y[:, 0], x[:, 0]))                # position 0: angle 0
    True
    >>> norm = lambda a: np.hypot(a[..., :4], a[..., 4:])     # each pair keeps its length
    >>> bool(np.allclose(norm(y), norm(x), atol=1e-6))
    True

    The same tokens later in a sequence, and packed as two sequences:

    >>> later = apply_rotary_emb(x[:, 2:], cos, sin, seqlen_offsets=2)
    >>> bool(np.array_equal(later, y[:, 2:]))
    True
    >>> packed = apply_rotary_emb(x.reshape(10, 3, D), cos, sin,
    ...                           cu_seqlens=np.array([0, 5, 10]), max_seqlen=5)
    >>> bool(np.array_equal(packed, y.reshape(10, 3, D)))
    True
    >>> z = x.copy()
    >>> apply_rotary_emb(z, cos, sin, inplace=True) is z, bool(np.array_equal(z, y))
    (True, True)
    """
    inplace = _bool(inplace, "inplace")
    interleaved = _bool(interleaved, "interleaved")
    varlen = cu_seqlens is not None
    given = x
    x = _array(x, "x", 3 if varlen else 4, writeable="it is rotated in place" if inplace else "")
    cos, sin = _rotary_tables(cos, sin, x.shape[-1], "cos", "sin")
    if varlen:
        cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", x.shape[0], "total (x.shape[0])")
        lengths = np.diff(cu)
        if max_seqlen is None:
            raise ValueError("max_seqlen is needed with cu_seqlens (the longest sequence)")
        _check_max_seqlen(max_seqlen, "max_seqlen", lengths)
    else:
        lengths = np.full(x.shape[0], x.shape[1], np.int64)
        if max_seqlen is not None:
            _int(max_seqlen, "max_seqlen")
    offsets = _offsets(seqlen_offsets, lengths.size)
    # (compared as offset > seqlen_ro - length: no sum that could wrap)
    past = (lengths > 0) & (offsets > cos.shape[0] - lengths)
    if past.any():
        b = int(np.argmax(past))
        first, n = int(offsets[b]), int(lengths[b])
        raise ValueError(f"cos and sin have {cos.shape[0]} positions; sequence {b} needs "
                         f"positions {first} to {first + n - 1} (seqlen_offsets + its tokens)")
    if varlen:  # token i of the pack, in sequence b: offsets[b] + i - cu[b]
        seq = np.repeat(np.arange(lengths.size), lengths)
        pos = np.arange(x.shape[0]) - cu[seq] + offsets[seq]
    else:
        pos = offsets[:, None] + np.arange(x.shape[1])
    if inplace:
        _rotate(x, cos, sin, pos, interleaved, out=x)
        return given
    return _rotate(x, cos, sin, pos, interleaved, out=np.array(x, copy=True))


apply_rotary_emb_func = apply_rotary_emb  # (FlashAttention's older name, kept there too)
