"""FlashAttention's ``flash_attn.bert_padding`` on NumPy arrays.

>>> from fastattn.flash_attn.bert_padding import unpad_input, pad_input  # instead of flash_attn's

:func:`unpad_input` packs the valid tokens of a padded batch ``(batch,
seqlen, ...)`` one after the other, with the offsets that
:func:`fastattn.flash_attn.flash_attn_varlen_func` and its packed variants
take; :func:`pad_input` puts results back in the padded layout;
:func:`index_first_axis` is the gather they use. The work is that of the
valid tokens (no attention over padding), and every result is a new NumPy
array in the input's dtype.
"""
import numpy as np

from fastattn._validate import as_array, index_int64, int_array, new_array
from fastattn.flash_attn import _first_repeat, _int

__all__ = ["index_first_axis", "pad_input", "unpad_input"]

_INT32_MAX = 2**31 - 1


def _indices(indices, n, what):
    """indices as a 1-d int64 array, each in [0, n) (`what` names n)."""
    arr = int_array(indices, "indices")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be an array of integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"indices must be 1-d, got shape {arr.shape}")
    arr = index_int64(arr, "indices")
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"indices must lie in [0, {n}) ({what}), got {int(arr[i])} at {i}")
    return arr


def index_first_axis(input, indices, /):
    """FlashAttention's ``index_first_axis``: the rows ``input[indices]``.

    Parameters
    ----------
    input : array_like, shape (N, ...)
        Any dtype.
    indices : array_like of int, shape (M,)
        Rows to take, each in ``[0, N)``; may repeat.

    Returns
    -------
    out : ndarray, shape (M, ...), input's dtype
        A new array.

    Raises
    ------
    TypeError
        If `indices` is not integers.
    ValueError
        If `input` is 0-d, or `indices` is not 1-d or holds a value outside
        ``[0, N)`` (negative ones included: NumPy would count them from the
        end, torch's gather refuses them).

    Notes
    -----
    As FlashAttention 2.x's ``flash_attn/bert_padding.py``, which gathers with
    ``torch.gather``; its arguments are positional (it is an autograd
    function's ``apply``). A 1-d `input` is accepted here (FlashAttention
    asserts 2 or more dimensions).

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.flash_attn.bert_padding import index_first_axis
    >>> index_first_axis(np.arange(12).reshape(6, 2), np.array([4, 0]))
    array([[8, 9],
           [0, 1]])
    """
    arr = as_array(input, "input")
    if arr.ndim < 1:
        raise ValueError(f"input must have at least 1 dimension, got shape {arr.shape}")
    idx = _indices(indices, arr.shape[0], "input.shape[0]")
    return np.take(arr, idx, axis=0)


def _mask(mask, name, shape=None):
    """A padding mask (batch, seqlen) of bools or of the integers 0 and 1, as bool."""
    arr = as_array(mask, name)
    if arr.dtype.kind not in "biu":
        raise TypeError(f"{name} must hold bools or the integers 0 and 1, got dtype {arr.dtype}")
    if arr.ndim != 2 or (shape is not None and arr.shape != shape):
        want = "(batch, seqlen)" if shape is None else f"(batch, seqlen) = {shape}"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    if arr.dtype.kind != "b":
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            b, s = (int(i[0]) for i in np.nonzero(bad))
            raise ValueError(f"{name} must hold 0 (padding) and 1 (a token), got "
                             f"{arr[b, s].item()!r} at [{b}, {s}]")
    return arr.astype(bool)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """FlashAttention's ``unpad_input``: a padded batch packed without its padding.

    Parameters
    ----------
    hidden_states : array_like, shape (batch, seqlen, ...)
        Any dtype (activations, token ids).
    attention_mask : array_like of bool or int, shape (batch, seqlen)
        1 (True) for a token, 0 for padding, anywhere in the row (left or
        right padding).
    unused_mask : array_like of bool or int, shape (batch, seqlen), optional
        1 for positions that are allocated but unused (e.g. room left for
        tokens to come): packed with the tokens and counted in `cu_seqlens`,
        but not in `seqused`. Must not mark a token of `attention_mask`.

    Returns
    -------
    hidden_states : ndarray, shape (total_nnz, ...), hidden_states' dtype
        The selected positions (tokens and unused ones) of every row, in
        order, one row after the other.
    indices : ndarray of int64, shape (total_nnz,)
        Where each came from in the flattened ``(batch * seqlen)`` layout:
        what :func:`pad_input` takes.
    cu_seqlens : ndarray of int32, shape (batch + 1,)
        Offsets of each row's positions in the packed array.
    max_seqlen_in_batch : int
        The most positions in a row (0 for an empty batch).
    seqused : ndarray of int32, shape (batch,)
        The number of tokens (`attention_mask` alone) of each row.

    Raises
    ------
    TypeError
        If a mask holds neither bools nor integers.
    ValueError
        If a mask is not 2-d, holds a value other than 0 and 1, the masks'
        shapes differ from each other or from ``hidden_states.shape[:2]``, a
        position is marked in both masks, or more than ``2**31 - 1``
        positions are selected (`cu_seqlens` is int32, as FlashAttention's
        kernels take it).

    Notes
    -----
    The five return values and `unused_mask` are those of FlashAttention's
    ``flash_attn/bert_padding.py`` since 2.7.0 (2.6 and earlier returned the
    first four). There, the counts are sums of the masks and the positions
    their nonzero entries, which disagree for a mask value other than 0 or 1
    or a position marked twice: both are ValueErrors here.

    Examples
    --------
    Two rows, the second with one padded position on the right:

    >>> import numpy as np
    >>> from fastattn.flash_attn.bert_padding import unpad_input, pad_input
    >>> x = np.arange(12.0).reshape(2, 3, 2)                   # (batch, seqlen, hidden)
    >>> mask = np.array([[1, 1, 1], [1, 1, 0]])
    >>> packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    >>> packed.shape, indices.tolist(), cu_seqlens.tolist(), max_seqlen, seqused.tolist()
    ((5, 2), [0, 1, 2, 3, 4], [0, 3, 5], 3, [3, 2])
    >>> cu_seqlens.dtype, seqused.dtype
    (dtype('int32'), dtype('int32'))
    >>> pad_input(packed, indices, 2, 3)[1]                     # zeros where the padding was
    array([[6., 7.],
           [8., 9.],
           [0., 0.]])
    """
    given = as_array(hidden_states, "hidden_states")
    valid = _mask(attention_mask, "attention_mask")
    if given.ndim < 2 or given.shape[:2] != valid.shape:
        raise ValueError(f"hidden_states must have shape (batch, seqlen, ...) with (batch, "
                         f"seqlen) = attention_mask's shape {valid.shape}, got {given.shape}")
    selected = valid
    if unused_mask is not None:
        unused = _mask(unused_mask, "unused_mask", valid.shape)
        both = valid & unused
        if both.any():
            b, s = (int(i[0]) for i in np.nonzero(both))
            raise ValueError(f"unused_mask marks [{b}, {s}], a token of attention_mask: a "
                             f"position is either a token or unused")
        selected = valid | unused
    rows, cols = np.nonzero(selected)  # (row-major: the flattened order)
    if rows.size > _INT32_MAX:
        raise ValueError(f"the masks select {rows.size} positions, more than cu_seqlens' "
                         f"int32 holds (2**31 - 1)")
    seqlens = selected.sum(axis=-1)
    cu_seqlens = np.zeros(seqlens.size + 1, np.int32)
    np.cumsum(seqlens, out=cu_seqlens[1:])
    max_seqlen = int(seqlens.max(initial=0))
    seqused = valid.sum(axis=-1).astype(np.int32)
    indices = rows * np.int64(valid.shape[1]) + cols
    return given[rows, cols], indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """FlashAttention's ``pad_input``: packed rows put back in a padded batch.

    Parameters
    ----------
    hidden_states : array_like, shape (total_nnz, ...)
        Any dtype; row ``i`` goes to position ``indices[i]``.
    indices : array_like of int, shape (total_nnz,)
        Positions in the flattened ``(batch * seqlen)`` layout, as
        :func:`unpad_input` returns them; each in ``[0, batch * seqlen)``,
        none repeated.
    batch, seqlen : int
        The padded shape.

    Returns
    -------
    out : ndarray, shape (batch, seqlen, ...), hidden_states' dtype
        A new array, zero where no row was put.

    Raises
    ------
    TypeError
        If `indices` is not integers, or `batch` or `seqlen` is not an int.
    ValueError
        If `hidden_states` is 0-d, `batch` or `seqlen` is negative, `indices`
        is not 1-d, does not have one entry per row of `hidden_states`, holds
        a value outside ``[0, batch * seqlen)`` or repeats one.

    Notes
    -----
    As FlashAttention 2.x's ``flash_attn/bert_padding.py``. A repeated index
    is an error here: the result would depend on the order of the writes
    (FlashAttention scatters on the GPU without saying which write wins).

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.flash_attn.bert_padding import pad_input
    >>> pad_input(np.array([[1.0], [2.0], [3.0]]), np.array([0, 2, 3]), 2, 2)[..., 0]
    array([[1., 0.],
           [2., 3.]])
    """
    arr = as_array(hidden_states, "hidden_states")
    if arr.ndim < 1:
        raise ValueError(f"hidden_states must have shape (total_nnz, ...), got shape {arr.shape}")
    batch, seqlen = _int(batch, "batch"), _int(seqlen, "seqlen")
    n = batch * seqlen
    idx = _indices(indices, n, f"batch * seqlen = {batch} * {seqlen}")
    if idx.size != arr.shape[0]:
        raise ValueError(f"indices must have one entry per row of hidden_states "
                         f"({arr.shape[0]}), got {idx.size}")
    # (the result first: where it does not fit, its error names it)
    out = new_array((n,) + arr.shape[1:], "the padded hidden_states", arr.dtype, fill=0)
    # (np.unique sorts; a bool per position finds a repeat in one pass)
    seen = np.zeros(n, bool)
    seen[idx] = True
    if np.count_nonzero(seen) != idx.size:
        r = _first_repeat(idx)
        raise ValueError(f"indices repeats {int(idx[r])} (at {r} and earlier): two rows "
                         f"would be put at one position")
    out[idx] = arr
    return out.reshape((batch, seqlen) + arr.shape[1:])
