"""merge_attention: the log-sum-exp merge of attention results over disjoint keys.

The partials are validated by fastattn._validate.merge_inputs and read in
place by _core.merge (their own kernel: no attention record).
"""
from __future__ import annotations  # help() shows the annotations as written

import math
from typing import Any, Optional

from numpy.typing import ArrayLike

from fastattn import _core
from fastattn._threads import get_num_threads
from fastattn._typing import Float32Array, WithLse
from fastattn._validate import (foreign_keywords, reject_foreign, merge_inputs, new_array,
                                result_array)

__all__ = ["merge_attention"]


@foreign_keywords
def merge_attention(outs: ArrayLike, lses: ArrayLike, *,
                    out: Optional[Float32Array] = None, **_foreign: Any) -> WithLse:
    """Merge attention results computed over disjoint sets of keys.

    With the keys split into parts and ``o_p, lse_p =
    scaled_dot_product_attention(q, k_p, v_p, ..., return_lse=True)`` for each
    part, the merge gives the result over all keys (to float32 rounding): the
    log-sum-exp combination of FlashAttention's split-KV ("flash-decoding")
    and of ring attention.

    Parameters
    ----------
    outs : sequence of array_like, or array_like, real floating dtype
        P partial outputs, each of shape (..., L, Dv): a sequence of arrays, or
        one array of shape (P, ..., L, Dv) with the partials on its first axis.
        Converted to float32; C-contiguous float32 arrays (and the slices
        ``outs[p]`` of one such array) are read in place, never copied.
    lses : sequence of array_like, or array_like, real floating dtype
        The P matching log-sum-exps, each of shape (..., L) (or one array of
        shape (P, ..., L)).
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape (..., L, Dv), not sharing
        memory with any partial; receives the merged output and is returned.

    Returns
    -------
    o : ndarray, float32, shape (..., L, Dv)
        ``sum_p exp(lse_p - lse) * o_p``.
    lse : ndarray, float32, shape (..., L)
        ``log(sum_p exp(lse_p))``.

    Raises
    ------
    TypeError
        If `outs` or `lses` is neither a list or tuple nor an array (a
        generator, None), a partial is not of a real floating dtype or is a
        ``numpy.ma.MaskedArray``, or `out` is not a float32 ndarray.
    ValueError
        If outs and lses hold different numbers of partials, there is no
        partial (an empty sequence), the partial outputs do not all have the
        same shape (..., L, Dv) with at least 2 dimensions, a partial lse's
        shape is not (..., L), or `out` has the wrong shape or layout, is
        read-only or overlaps a partial (as given, e.g. a float64 partial
        that is read through its float32 copy, or as converted).

    Notes
    -----
    Per row, with ``m = max_p lse_p``: ``lse = m + log(sum_p exp(lse_p - m))``
    in float64, and ``o = sum_p c_p * o_p`` with ``c_p = exp(lse_p - lse)``,
    summed in float32 (as attention accumulates its output), both sums in the
    order p = 0, 1, ..., P - 1, so the same inputs give the same bits whatever
    the thread count. Partials merge associatively up to rounding: merging
    merged results (a tree, as :mod:`fastattn.dask` does) agrees with one
    merge of all the partials to float32 rounding.

    Non-finite values, per row: a partial whose ``lse_p`` is -inf (no
    allowed key in its part) is skipped and its ``o_p`` row is never read (it
    may hold anything); when every ``lse_p`` is -inf (or P = 0) the row is
    ``o = 0``, ``lse = -inf``, as attention gives a row with no allowed key; a
    NaN ``lse_p`` gives ``o`` NaN and ``lse`` NaN; otherwise a +inf ``lse_p``
    gives ``o`` NaN and ``lse`` +inf. A NaN inside a read ``o_p`` propagates.

    Time O(P x rows x Dv), memory-bound (each partial is read once); rows are
    split over OpenMP threads with the GIL released. No working memory.

    References
    ----------
    .. [1] M. Milakov and N. Gimelshein, "Online normalizer calculation for
       softmax", 2018 (the log-sum-exp rescaling).
    .. [2] T. Dao et al., "Flash-Decoding for long-context inference", 2023
       (split-KV partials merged by their log-sum-exp).

    Examples
    --------
    Attention over 6 keys equals the merge of attention over keys 0-3 and 4-5:

    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((2, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 4))
    >>> o1, l1 = fastattn.scaled_dot_product_attention(q, k[:4], v[:4], return_lse=True)
    >>> o2, l2 = fastattn.scaled_dot_product_attention(q, k[4:], v[4:], return_lse=True)
    >>> o, lse = fastattn.merge_attention([o1, o2], [l1, l2])
    >>> full, full_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> bool(np.allclose(o, full, atol=1e-6)), bool(np.allclose(lse, full_lse, atol=1e-6))
    (True, True)

    A part with no allowed key (lse -inf) is never read:

    >>> o, lse = fastattn.merge_attention([np.full((1, 2), np.nan), [[1.0, 2.0]]],
    ...                                   [[-np.inf], [0.5]])
    >>> o, lse
    (array([[1., 2.]], dtype=float32), array([0.5], dtype=float32))
    """
    if _foreign:
        reject_foreign(merge_attention, _foreign)
    parts, part_lses, shape = merge_inputs(outs, lses)
    out = result_array(out, shape, [("outs", parts), ("lses", part_lses), ("outs", outs),
                                    ("lses", lses)])
    lse = new_array(shape[:-1], "lse")
    _core.merge([a.reshape(-1) for a in parts], [a.reshape(-1) for a in part_lses],
                math.prod(shape[:-1]), shape[-1], out.reshape(-1), lse.reshape(-1),
                get_num_threads())
    return out, lse
