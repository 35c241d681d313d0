"""varlen_attention: attention over packed sequences of different lengths.

Validated by fastattn._validate.varlen_inputs and run by fastattn._kernel.run
(a batch item per sequence and query head, every sequence's rows where they
lie in the packed arrays).
"""
from __future__ import annotations  # help() shows the annotations as written

from typing import Any, Optional

from numpy.typing import ArrayLike

from fastattn._kernel import run
from fastattn._typing import AttentionResult, Float32Array, Window
from fastattn._validate import (as_bool, foreign_keywords, reject_foreign, new_array,
                                varlen_inputs, result_array)

__all__ = ["varlen_attention"]


@foreign_keywords
def varlen_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                     cu_seqlens_k: ArrayLike, *, is_causal: bool = False, window: Window = None,
                     scale: Optional[float] = None, softcap: Optional[float] = None,
                     alibi_slopes: Optional[ArrayLike] = None,
                     sinks: Optional[ArrayLike] = None, return_lse: bool = False,
                     out: Optional[Float32Array] = None, **_foreign: Any) -> AttentionResult:
    """Attention over packed sequences of different lengths (FlashAttention's varlen form).

    The sequences lie one after another along the token axis; sequence ``b``
    is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` against keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``, each with its own bottom-right
    alignment (``p_i = i + S_b - L_b``). No padding is computed: the work is
    ``sum_b L_b * S_b``.

    Parameters
    ----------
    q : array_like, shape (total_q, Hq, D), real floating dtype
        The queries of all sequences, token-major.
    k : array_like, shape (total_k, Hkv, D), real floating dtype
        The keys; ``Hq % Hkv == 0`` (grouped-query heads follow from the
        shapes: query head ``h`` reads kv head ``h // (Hq // Hkv)``). May be
        float16 or bfloat16, read as stored.
    v : array_like, shape (total_k, Hkv, Dv), real floating dtype
        The values, as `k`.
        q, k and v are read in place when their last axis is contiguous.
    cu_seqlens_q, cu_seqlens_k : array_like of int, shape (B + 1,)
        Cumulative sequence lengths: start at 0, non-decreasing, end at
        ``total_q`` and ``total_k``. Empty sequences are allowed. Any NumPy
        integer dtype (a list of Python ints as NumPy reads it; one with
        offsets of 2**63 or more as uint64).
    is_causal, window, scale, softcap
        As in :func:`scaled_dot_product_attention`, for each sequence.
    alibi_slopes, sinks : array_like of real floats, optional
        Broadcasting to (B, Hq): one value per query head, e.g. shape (Hq,),
        or one per sequence and head.
    return_lse : bool, default False
        Also return ``lse`` of shape (total_q, Hq) (FlashAttention's
        ``softmax_lse`` is its transpose).
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape (total_q, Hq, Dv), not
        sharing memory with any input; receives the output and is returned.

    Returns
    -------
    out : ndarray, float32, shape (total_q, Hq, Dv)
    lse : ndarray, float32, shape (total_q, Hq)
        Only with `return_lse`: returned as ``(out, lse)``.

    Raises
    ------
    TypeError
        If q, k or v are not real floating arrays, `cu_seqlens_q` or
        `cu_seqlens_k` are not integer arrays, `alibi_slopes` or `sinks` are
        not real floats, a flag is not a bool, an argument is a
        ``numpy.ma.MaskedArray``, or `out` is not a float32 ndarray (or a
        keyword is unknown, as in :func:`scaled_dot_product_attention`).
    ValueError
        If q, k or v are not 3-d, D < 1 or differs, k and v disagree, ``Hq %
        Hkv != 0``, a `cu_seqlens` is not 1-d or is empty, holds an offset
        outside [0, 2**64), does not start at 0, decreases, does not end at
        the total, or the two differ in length, or another
        argument is out of range as in :func:`scaled_dot_product_attention`
        (`out` may overlap no argument, `cu_seqlens` as given included).

    Notes
    -----
    Each sequence's rows are bitwise identical to
    :func:`scaled_dot_product_attention` on that sequence alone
    (``q[cq[b]:cq[b+1]].swapaxes(0, 1)`` against the same slices of k and v,
    with ``enable_gqa=True``): a row's arithmetic depends only on its own
    sequence. The work units (up to 96 query rows of one head, or of the
    heads of a GQA group; up to 192 where each value tile is copied, as for
    float16 values or value rows a multiple of 1 KiB apart, or where a full
    (non-causal) sequence's k and v overflow half of a core's level-2
    cache) of all sequences
    are handed to the threads from one pool, the biggest first, so the
    threads stay busy when one sequence is much longer than the others. The
    score rules, non-finite values and sinks are those of
    :func:`scaled_dot_product_attention`.

    References
    ----------
    .. [1] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism
       and Work Partitioning", ICLR 2024 (``flash_attn_varlen_func``).

    Examples
    --------
    Two sequences of 2 and 3 tokens, one head, causal: the first token of each
    sequence sees only itself.

    >>> import numpy as np, fastattn
    >>> x = np.zeros((5, 1, 4))
    >>> v = np.arange(5.0).reshape(5, 1, 1)
    >>> cu = np.array([0, 2, 5])
    >>> fastattn.varlen_attention(x, x, v, cu, cu, is_causal=True).ravel()
    array([0. , 0.5, 2. , 2.5, 3. ], dtype=float32)
    """
    if _foreign:
        reject_foreign(varlen_attention, _foreign)
    a = varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, window, scale, softcap,
                      alibi_slopes, sinks)
    total_q = a.q.shape[0]
    shape = (total_q, a.Hq, a.Dv)
    return_lse = as_bool(return_lse, "return_lse")
    out = result_array(out, shape, [("q", q), ("k", k), ("v", v),
                                    ("cu_seqlens_q", cu_seqlens_q),
                                    ("cu_seqlens_k", cu_seqlens_k),
                                    ("alibi_slopes", alibi_slopes), ("sinks", sinks)]
                       + a.arrays())
    lse = new_array((total_q, a.Hq), "lse") if return_lse else None
    run(a, out, lse)
    if lse is not None:
        return out, lse
    return out
