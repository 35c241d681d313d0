"""attention_backward, varlen_attention_backward: the gradients of attention.

Validated by fastattn._validate.backward_inputs (the forward's checks, then
do, o and lse) and run by fastattn._kernel.run_backward: the compiled
kernels compute every gradient at the forward's broadcast batch, and
fastattn._grad.sum_to_shape sums each back to its argument's own shape.
"""
from __future__ import annotations  # help() shows the annotations as written

import math
from typing import Any, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike

from fastattn._grad import sum_to_shape
from fastattn._kernel import run_backward
from fastattn._typing import Float32Array, SegmentIds, Window
from fastattn._validate import (backward_inputs, foreign_keywords, reject_foreign,
                                varlen_backward_inputs)

__all__ = ["attention_backward", "varlen_attention_backward"]

def _gradients(b, dq, dk, dv, dsinks, group: int):
    """The kernels' gradients (at the broadcast batch) summed back to the
    arguments' shapes."""
    a = b.a
    Hkv = a.batch[-1] // group if a.batch else 1
    kv_batch = a.batch[:-1] + (Hkv,) if a.batch else ()
    out = [sum_to_shape(dq.reshape(a.batch + (a.L, a.D)), b.q_shape),
           sum_to_shape(dk.reshape(kv_batch + (a.S, a.D)), b.k_shape),
           sum_to_shape(dv.reshape(kv_batch + (a.S, a.Dv)), b.v_shape)]
    if dsinks is not None:
        assert b.sinks_shape is not None
        out.append(sum_to_shape(dsinks.reshape(a.batch), b.sinks_shape))
    return tuple(out)


@foreign_keywords
def attention_backward(do: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, o: ArrayLike,
                       lse: ArrayLike, attn_mask: Optional[ArrayLike] = None, *,
                       is_causal: bool = False, window: Window = None,
                       scale: Optional[float] = None, softcap: Optional[float] = None,
                       alibi_slopes: Optional[ArrayLike] = None,
                       sinks: Optional[ArrayLike] = None, segment_ids: SegmentIds = None,
                       enable_gqa: bool = False, **_foreign: Any) -> Tuple[Float32Array, ...]:
    """The gradients of :func:`scaled_dot_product_attention` with respect to q, k, v (and sinks).

    Given ``o, lse = scaled_dot_product_attention(q, k, v, attn_mask, ...,
    return_lse=True)`` and ``do``, the gradient of a loss with respect to
    ``o``, returns the gradients of that loss with respect to q, k and v
    (and the sinks): the backward pass of attention, for training.

    Parameters
    ----------
    do : array_like, shape batch + (L, Dv), real floating dtype
        The gradient of the loss with respect to the output.
    q, k, v, attn_mask
        The forward's arguments, as given to it.
    o : array_like, shape batch + (L, Dv)
        The forward's output.
    lse : array_like, shape batch + (L,)
        The forward's log-sum-exp (``return_lse=True``).
    is_causal, window, scale, softcap, alibi_slopes, sinks, segment_ids, enable_gqa
        The forward's keywords, with their meaning there.

    Returns
    -------
    dq : ndarray, float32, q's shape
    dk : ndarray, float32, k's shape
    dv : ndarray, float32, v's shape
    dsinks : ndarray, float32, the shape of `sinks`
        Only when `sinks` is given: returned as ``(dq, dk, dv, dsinks)``.

    Where an argument was broadcast against the others (batch axes of
    length 1 or missing), its gradient is summed over the broadcast axes;
    under grouped-query attention the gradients of a kv head sum those of
    the query heads it serves. float16 and bfloat16 k and v are read as
    stored; their gradients are float32. Masks and ALiBi slopes are
    constants: they have no gradient.

    Raises
    ------
    TypeError, ValueError
        For the forward's arguments, as :func:`scaled_dot_product_attention`
        raises them; if `do`, `o` or `lse` is not a real floating array, or
        `do` or `o` is not of shape ``batch + (L, Dv)``, or `lse` of shape
        ``batch + (L,)``, the shapes the forward returned.

    Notes
    -----
    The backward of FlashAttention-2 [1]_ (its Algorithm 2): with the scores
    s of the forward (scale, soft cap, ALiBi, mask), ``P = exp(s - lse)``
    recomputed tile by tile and ``Delta_i = sum_c do_ic o_ic``,

    - ``dv_j = sum_i P_ij do_i``
    - ``dS_ij = P_ij (do_i . v_j - Delta_i)``, times ``1 - tanh^2(scale q_i .
      k_j / softcap)`` with a soft cap (the derivative of ``c tanh(x / c)``)
    - ``dq_i = scale sum_j dS_ij k_j`` and ``dk_j = scale sum_i dS_ij q_i``
    - with sinks, ``dsinks = -sum_i exp(sinks - lse_i) Delta_i`` over the
      rows of each head.

    Only the (query, key) pairs of nonzero weight enter a sum: masked keys
    (and keys outside the causal or window bounds, of another document) are
    never read, so NaN or infinity in their rows of k or v reaches no
    gradient; an allowed key of weight exactly 0 in a row (its exponential
    underflowed) adds nothing to that row's sums, though a NaN in its row of
    v is in the forward's ``o`` and so in that row's ``Delta``. A row with
    ``lse = -inf`` (no allowed key and no sink: the forward gave 0)
    contributes nothing and gets ``dq = 0``; a row with ``lse = +inf`` (an
    allowed score of +inf: the forward gave NaN) has the weight NaN on every
    key it may see. Otherwise the formulas are applied as written, and
    non-finite values propagate (IEEE). With ``Dv = 0`` the gradients are
    zeros.

    The gradients are bitwise identical for every thread count: the
    gradients of k and v are summed by work units that each own one tile of
    64 keys of one kv head, over that head's query heads and rows in order,
    those of q by units that each own a block of query rows, over the keys
    in order; no two units add to the same element (FlashAttention-2's
    backward sums dq with atomic additions across threads instead). Memory:
    the gradients, one float per query row, and a fixed scratch per thread;
    no L x S matrix. P is recomputed tile by tile from lse, so the backward
    does about 2.5 times the forward's products (those of dk and dv, of dq,
    and the scores and dout . v twice).

    References
    ----------
    .. [1] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism
       and Work Partitioning", ICLR 2024, Algorithm 2.

    Examples
    --------
    The gradient of ``sum(o)`` for one query against two keys that score
    equally: the weights are 1/2 each, so each value row's gradient is 1/2.

    >>> import numpy as np, fastattn
    >>> q, k = np.zeros((1, 2)), np.zeros((2, 2))
    >>> v = np.array([[1.0], [3.0]])
    >>> o, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> dq, dk, dv = fastattn.attention_backward(np.ones_like(o), q, k, v, o, lse)
    >>> dv.ravel()
    array([0.5, 0.5], dtype=float32)
    """
    if _foreign:
        reject_foreign(attention_backward, _foreign)
    b = backward_inputs(do, q, k, v, o, lse, attn_mask, is_causal, window, scale, enable_gqa,
                        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                        segment_ids=segment_ids)
    a = b.a
    nbatch, group = math.prod(a.batch), a.group
    dq = np.zeros((nbatch, a.L, a.D), np.float32)
    dk = np.zeros((nbatch // group, a.S, a.D), np.float32)
    dv = np.zeros((nbatch // group, a.S, a.Dv), np.float32)
    dsinks = np.zeros(nbatch, np.float32) if a.sinks is not None else None
    run_backward(a, np.ascontiguousarray(b.do), np.ascontiguousarray(b.o),
                 np.ascontiguousarray(b.lse), dq, dk, dv, dsinks)
    return _gradients(b, dq, dk, dv, dsinks, group)


@foreign_keywords
def varlen_attention_backward(do: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike,
                              o: ArrayLike, lse: ArrayLike, cu_seqlens_q: ArrayLike,
                              cu_seqlens_k: ArrayLike, *, is_causal: bool = False,
                              window: Window = None, scale: Optional[float] = None,
                              softcap: Optional[float] = None,
                              alibi_slopes: Optional[ArrayLike] = None,
                              sinks: Optional[ArrayLike] = None,
                              **_foreign: Any) -> Tuple[Float32Array, ...]:
    """The gradients of :func:`varlen_attention` with respect to q, k, v (and sinks).

    Parameters
    ----------
    do : array_like, shape (total_q, Hq, Dv)
        The gradient of the loss with respect to the output.
    q, k, v, cu_seqlens_q, cu_seqlens_k
        The forward's arguments, as given to it.
    o : array_like, shape (total_q, Hq, Dv)
        The forward's output.
    lse : array_like, shape (total_q, Hq)
        The forward's log-sum-exp (``return_lse=True``).
    is_causal, window, scale, softcap, alibi_slopes, sinks
        The forward's keywords, with their meaning there.

    Returns
    -------
    dq : ndarray, float32, shape (total_q, Hq, D)
    dk : ndarray, float32, shape (total_k, Hkv, D)
    dv : ndarray, float32, shape (total_k, Hkv, Dv)
    dsinks : ndarray, float32, the shape of `sinks`
        Only when `sinks` is given: returned as ``(dq, dk, dv, dsinks)``.

    Raises
    ------
    TypeError, ValueError
        For the forward's arguments, as :func:`varlen_attention` raises
        them; if `do`, `o` or `lse` is not a real floating array of the shape
        the forward returned.

    Notes
    -----
    Each sequence's gradients are those of :func:`attention_backward` on
    that sequence alone; the formulas and rules are its own. The work units
    of all sequences run in one pool of threads.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.zeros((5, 1, 4))
    >>> v = np.arange(5.0).reshape(5, 1, 1)
    >>> cu = np.array([0, 2, 5])
    >>> o, lse = fastattn.varlen_attention(x, x, v, cu, cu, is_causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.varlen_attention_backward(np.ones_like(o), x, x, v, o, lse, cu, cu,
    ...                                                 is_causal=True)
    >>> dv.ravel().round(4)  # key j weighs 1/(i + 1) in each row i >= j of its sequence
    array([1.5   , 0.5   , 1.8333, 0.8333, 0.3333], dtype=float32)
    """
    if _foreign:
        reject_foreign(varlen_attention_backward, _foreign)
    b = varlen_backward_inputs(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, is_causal,
                               window, scale, softcap, alibi_slopes, sinks)
    a = b.a
    dq = np.zeros((a.q.shape[0], a.Hq, a.D), np.float32)
    dk = np.zeros((a.k.shape[0], a.Hkv, a.D), np.float32)
    dv = np.zeros((a.v.shape[0], a.Hkv, a.Dv), np.float32)
    dsinks = None
    if a.sinks is not None:
        dsinks = np.zeros(a.sinks.shape, np.float32)
    run_backward(a, np.ascontiguousarray(b.do), np.ascontiguousarray(b.o),
                 np.ascontiguousarray(b.lse), dq, dk, dv, dsinks)
    if dsinks is not None:
        assert b.sinks_shape is not None
        return dq, dk, dv, sum_to_shape(dsinks, b.sinks_shape)
    return dq, dk, dv

