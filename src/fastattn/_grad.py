"""Gradients back to the shapes of the arguments, shared by the attention
backward of fastattn and of its reference.

A gradient is computed at the shape the forward worked at: the broadcast
batch (and, under grouped-query attention, one head per query head). The
gradient of an argument that NumPy broadcast to that shape is the sum over
the axes it was broadcast along, as NumPy's rules and PyTorch's autograd
make it; under GQA a kv head's gradient is the sum over the query heads it
serves.
"""
from typing import Sequence

import numpy as np

__all__ = ["sum_to_shape"]


def sum_to_shape(grad: np.ndarray, shape: Sequence[int], group: int = 1) -> np.ndarray:
    """`grad` summed back to `shape`, the shape of the argument it is the gradient of.

    `grad` has the broadcast shape the forward computed at; `shape` must
    broadcast to it by NumPy's rules (after the grouping below). The axes
    `grad` has in front of `shape`'s are summed away, and every axis where
    `shape` has length 1 and `grad` more is summed with its length kept at 1.
    With ``group > 1`` (grouped-query attention: query head ``h`` reads kv
    head ``h // group``) axis -3 of `grad` holds ``Hkv * group`` query heads,
    first summed in groups of `group` consecutive heads to ``Hkv``.

    The sums are ``np.sum`` over those axes in `grad`'s own dtype: the same
    array in gives the same bits out (deterministic, whatever the threads).
    Returns a C-contiguous array of exactly `shape`: `grad` itself when
    nothing is summed and it is one already. ValueError when `shape` does
    not broadcast to `grad`'s shape (a caller's mistake, not a user's).
    """
    shape = tuple(int(n) for n in shape)
    if group > 1:
        if grad.ndim < 3 or grad.shape[-3] % group:
            raise ValueError(f"a gradient of shape {grad.shape} has no head axis of a "
                             f"multiple of group={group} heads")
        grad = grad.reshape(grad.shape[:-3] + (grad.shape[-3] // group, group)
                            + grad.shape[-2:]).sum(axis=-3)
    lead = grad.ndim - len(shape)
    if lead < 0 or any(n != 1 and n != m for n, m in zip(shape, grad.shape[lead:])):
        raise ValueError(f"shape {shape} does not broadcast to the gradient's shape "
                         f"{grad.shape}")
    if lead:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, grad.shape)) if n == 1 and m != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    # (np.asarray: a full sum is a NumPy scalar, and ascontiguousarray makes 0-d 1-d)
    return np.asarray(grad, order="C")
