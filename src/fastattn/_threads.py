"""Thread control: set_num_threads, get_num_threads, and the OpenMP runtime.

The one place that knows how many threads the next kernel call may use: the
operation modules ask get_num_threads() at each call, show_config() reports it.
"""
from __future__ import annotations  # help() shows the annotations as written

import os as _os
from typing import Any, Dict, Optional

import numpy as np

from fastattn import _core

__all__ = ["set_num_threads", "get_num_threads"]

_num_threads = None  # set_num_threads(n); None = OpenMP's default
MAX_THREADS = 4096

# GNU libgomp does not survive fork(): in a child made by fork after the parent
# has run an OpenMP parallel region, the next parallel region waits forever for
# worker threads that only existed in the parent (LLVM's libomp re-initialises
# at fork). So in a forked child under libgomp (or an unknown runtime) fastattn
# runs single-threaded: the same bits, only slower. spawn / forkserver children
# start a fresh runtime and use threads as usual.
_forked = False
_fork_safe = None  # cached: does the OpenMP runtime survive fork?


def _after_fork_in_child():
    global _forked
    _forked = True


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def openmp_runtime() -> Optional[Dict[str, Any]]:
    """The OpenMP runtime loaded in this process, as threadpoolctl sees it."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    for info in threadpool_info():
        if info.get("user_api") == "openmp":
            return {k: info.get(k) for k in ("internal_api", "version", "filepath")}
    return None


def _runtime_survives_fork():
    global _fork_safe
    if _fork_safe is None:
        if not _core.build_info()["openmp"]:
            _fork_safe = True
        else:
            path = (openmp_runtime() or {}).get("filepath") or ""
            _fork_safe = "libomp" in path or "libiomp" in path
    return _fork_safe


def set_num_threads(n: Optional[int]) -> None:
    """Set the number of OpenMP threads fastattn's kernels may use.

    Parameters
    ----------
    n : int or None
        A count in [1, 4096], or None to return to OpenMP's default (``OMP_NUM_THREADS``,
        or a ``threadpoolctl.threadpool_limits(..., user_api="openmp")`` limit,
        read at each call).

    Raises
    ------
    TypeError
        If `n` is not an int or None.
    ValueError
        If `n` is not in [1, 4096].

    Notes
    -----
    The setting is fastattn's alone and process-wide; like
    ``torch.set_num_threads`` it takes priority over threadpoolctl limits.
    Results are bitwise identical for every thread count.

    Examples
    --------
    >>> import fastattn
    >>> fastattn.set_num_threads(1)
    >>> fastattn.get_num_threads()
    1
    >>> fastattn.set_num_threads(None)
    """
    global _num_threads
    _num_threads = checked_num_threads(n)


def checked_num_threads(n: Optional[int]) -> Optional[int]:
    """n as set_num_threads takes it (an int or None), or its TypeError / ValueError.

    For a count that is checked here and used elsewhere (fastattn.dask's
    worker plugin checks it in the client, sets it in the workers)."""
    if n is None:
        return None
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int >= 1 or None, got {type(n).__name__}")
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"n must be an int in [1, {MAX_THREADS}] or None, got {n}")
    return int(n)


def get_num_threads() -> int:
    """The number of threads fastattn's kernels may use for the next call.

    Returns
    -------
    int
        The value given to :func:`set_num_threads`, or else OpenMP's current
        default (``omp_get_max_threads()``, which honours ``OMP_NUM_THREADS`` and
        threadpoolctl); 1 in a build without OpenMP. Problems too small to gain
        from threads run on one thread whatever this says. In a child process
        made by ``fork`` it is 1 when the OpenMP runtime is GNU libgomp, whose
        threads cannot run after a fork (they would hang); children made by
        ``spawn`` or ``forkserver`` use threads as usual.
    """
    if _forked and not _runtime_survives_fork():
        return 1
    if _num_threads is not None:
        return _num_threads
    return min(MAX_THREADS, max(1, int(_core.omp_max_threads())))

