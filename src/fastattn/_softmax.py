"""softmax, log_softmax and logsumexp: each one pass of the row kernel.

x is converted to an aligned C-contiguous float32 array (fastattn._validate),
its axis is moved last where it is not (one contiguous copy), and
_core.rowwise runs the operation over the rows with the GIL released.
"""
from __future__ import annotations  # help() shows the annotations as written

import math
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fastattn import _core
from fastattn._docs import ROWWISE_NOTES, ROWWISE_RAISES, fill
from fastattn._threads import get_num_threads
from fastattn._validate import (as_bool, as_float32, check_out, foreign_keywords, reject_foreign,
                                new_array, normalize_axis)

__all__ = ["softmax", "log_softmax", "logsumexp"]


def _rowwise(x, axis, out, op, keepdims=False):
    xa = as_float32(x, "x")
    ax = normalize_axis(axis, xa.ndim)
    if op == _core.OP_LOGSUMEXP:
        dims = list(xa.shape)
        if keepdims:
            dims[ax] = 1
        else:
            del dims[ax]
        shape = tuple(dims)
    else:
        shape = xa.shape
    if out is not None:
        check_out(out, shape, [("x", x), ("x", xa)])
    last = ax == xa.ndim - 1
    # xa is C-contiguous: along the last axis its rows are already in place.
    rows = xa if last else np.ascontiguousarray(np.moveaxis(xa, ax, -1))
    n = rows.shape[-1]
    nrows = math.prod(rows.shape[:-1])
    if op == _core.OP_LOGSUMEXP or last:
        # The result's memory order is that of `rows`: write it in place.
        result = out if out is not None else new_array(shape, "the result")
        _core.rowwise(rows.reshape(-1), result.reshape(-1), nrows, n, op, get_num_threads())
        return result
    tmp = new_array(rows.shape, "the result")
    _core.rowwise(rows.reshape(-1), tmp.reshape(-1), nrows, n, op, get_num_threads())
    if out is None:
        out = new_array(shape, "the result")
    np.copyto(out, np.moveaxis(tmp, -1, ax))
    return out


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def softmax(x: ArrayLike, axis: int = -1, *,
            out: Optional[NDArray[np.float32]] = None, **_foreign: Any) -> NDArray[np.float32]:
    """Numerically stable softmax along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis along which the weights sum to 1; negative counts from the end.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape ``x.shape``, not sharing
        memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape``
        ``exp(x - m) / sum(exp(x - m))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    References
    ----------
    .. [1] J. S. Bridle, "Probabilistic interpretation of feedforward
       classification network outputs", 1990 (the softmax).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.softmax(np.array([1.0, 2.0, 3.0])).round(4)
    array([0.09  , 0.2447, 0.6652], dtype=float32)
    >>> fastattn.softmax(np.array([1e30, -np.inf, 0.0]))
    array([1., 0., 0.], dtype=float32)
    """
    if _foreign:
        reject_foreign(softmax, _foreign)
    return _rowwise(x, axis, out, _core.OP_SOFTMAX)


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def log_softmax(x: ArrayLike, axis: int = -1, *,
                out: Optional[NDArray[np.float32]] = None, **_foreign: Any) -> NDArray[np.float32]:
    """Numerically stable log of the softmax along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis of the softmax; negative counts from the end.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape ``x.shape``, not sharing
        memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape``
        ``(x - m) - log(sum(exp(x - m)))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.log_softmax(np.array([0.0, 0.0])).round(4)
    array([-0.6931, -0.6931], dtype=float32)
    """
    if _foreign:
        reject_foreign(log_softmax, _foreign)
    return _rowwise(x, axis, out, _core.OP_LOG_SOFTMAX)


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def logsumexp(x: ArrayLike, axis: int = -1, *, keepdims: bool = False,
              out: Optional[NDArray[np.float32]] = None, **_foreign: Any) -> NDArray[np.float32]:
    """Numerically stable ``log(sum(exp(x)))`` along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis reduced; negative counts from the end.
    keepdims : bool, default False
        Keep the reduced axis with length 1, as in NumPy reductions.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of the result's shape, not
        sharing memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape`` without `axis` (length 1 with keepdims)
        ``m + log(sum(exp(x - m)))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.logsumexp(np.array([[0.0, 0.0], [1e30, 1e30]])).round(4)
    array([6.931e-01, 1.000e+30], dtype=float32)
    >>> fastattn.logsumexp(np.zeros((2, 0)))
    array([-inf, -inf], dtype=float32)
    """
    if _foreign:
        reject_foreign(logsumexp, _foreign)
    keepdims = as_bool(keepdims, "keepdims")
    return _rowwise(x, axis, out, _core.OP_LOGSUMEXP, keepdims=keepdims)
