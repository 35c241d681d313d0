"""Result memory: set_result_cache, and the cache's state for show_config.
The one place that allocates result arrays is _validate.new_array; from 4 MiB
on it takes their memory from _core.result_array, which keeps the memory of
freed results for the next ones (csrc/results.c).
"""
from __future__ import annotations  # help() shows the annotations as written

import operator
from typing import Dict

from fastattn import _core

__all__ = ["set_result_cache"]


def set_result_cache(max_bytes: int) -> int:
    """Set how much memory of freed result arrays fastattn keeps for reuse.

    A new array of tens of megabytes costs more than its computation
    suggests: the operating system maps its pages fresh and zeroes each one
    when it is first written (a new 128 MiB softmax result took about 1.5x
    the time of writing into an existing array). So the memory of a result
    of at least 4 MiB (of the softmax functions, attention outputs and lse,
    merges) goes, once the last array on it (the result and any view of it)
    is gone, to a cache of at most four blocks and `max_bytes` bytes, from
    which the next result of the same size (rounded up to 2 MiB) takes it,
    already mapped. ONNX Runtime's memory arena does the same for its
    results. Memory still in use is never reused, and arrays passed as
    ``out=`` are never touched. Attention weights and gradients (which
    start from zeros) are plain NumPy arrays.

    Parameters
    ----------
    max_bytes : int
        The most bytes the cache holds, ``>= 0`` (default: 512 MiB). ``0``
        frees every cached block at once and keeps none from then on: every
        large result then gets fresh memory from the system, and gives it
        back when it is gone. A smaller limit frees the oldest blocks over it
        at once.

    Returns
    -------
    int
        The previous limit, in bytes.

    Raises
    ------
    TypeError
        If `max_bytes` is not an int.
    ValueError
        If `max_bytes` is negative.

    See Also
    --------
    show_config : ``result_cache`` reports the limit and the bytes held.

    Notes
    -----
    Results below 4 MiB are plain ``numpy.empty`` arrays (the allocator
    reuses their memory anyway). A result on cached memory is a NumPy array
    like any other (C-contiguous, writable, aligned to 2 MiB), except that it
    does not own its memory (``flags.owndata`` is False and ``ndarray.resize``
    refuses it, as for a view): the memory belongs to an object that returns
    it to the cache when the last array on it is gone. On Linux the blocks,
    aligned to 2 MiB, are offered to transparent huge pages (NumPy offers its
    large arrays too, unaligned: on a Linux machine with huge pages on
    request, a 128 MiB ``numpy.empty`` array got none, a result block all).
    ``tracemalloc`` counts a result's bytes while an array holds them, not
    the blocks kept. A block serves only results of its own rounded size.

    Examples
    --------
    >>> import fastattn
    >>> previous = fastattn.set_result_cache(0)  # fresh memory for every result
    >>> fastattn.show_config(mode="dicts")["result_cache"]
    {'max_bytes': 0, 'held_bytes': 0}
    >>> _ = fastattn.set_result_cache(previous)
    """
    if isinstance(max_bytes, bool):
        raise TypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}")
    try:
        limit = operator.index(max_bytes)
    except TypeError:
        raise TypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}") from None
    if limit < 0:
        raise ValueError(f"max_bytes must be >= 0, got {limit}")
    limit = min(limit, 2**63 - 1)
    return _core.result_cache(limit)[0]


def result_cache_info() -> Dict[str, int]:
    """The cache's limit and the bytes it holds now (show_config)."""
    limit, held = _core.result_cache()
    return {"max_bytes": limit, "held_bytes": held}
