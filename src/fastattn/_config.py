"""show_config(): what fastattn was built with and what it runs with."""
import os
from typing import Any, Dict, Literal, Optional, overload

from fastattn import _core
from fastattn._memory import result_cache_info
from fastattn._threads import get_num_threads, openmp_runtime
from fastattn._version import __version__

_MODES = ("stdout", "dicts")


def _config() -> Dict[str, Any]:
    build = _core.build_info()
    return {
        "version": __version__,
        "compiler": build["compiler"],
        "openmp": build["openmp"],
        "openmp_runtime": openmp_runtime(),
        "simd": build["simd"],
        "num_threads": get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "result_cache": result_cache_info(),
    }


@overload
def show_config(mode: Literal["stdout"] = ..., *, print_: None = ...) -> None: ...
@overload
def show_config(mode: Literal["dicts"], *, print_: None = ...) -> Dict[str, Any]: ...
@overload
def show_config(mode: str = ..., *, print_: Optional[bool] = ...) -> Optional[Dict[str, Any]]: ...


def show_config(mode: str = "stdout", *, print_: Optional[bool] = None) -> Optional[Dict[str, Any]]:
    """Show fastattn's build and runtime configuration.

    Modelled on ``numpy.show_config``: ``mode="stdout"`` prints and returns
    None (so the prompt shows it once), ``mode="dicts"`` returns the dict and
    prints nothing.

    Parameters
    ----------
    mode : {"stdout", "dicts"}, default "stdout"
        ``"stdout"``: print one ``key: value`` line each, plus a note when the
        core was built without OpenMP. ``"dicts"``: return the dict.
    print_ : bool, optional
        The older spelling: ``print_=False`` is ``mode="dicts"``,
        ``print_=True`` is ``mode="stdout"``.

    Returns
    -------
    dict or None
        With ``mode="dicts"``: ``version``; ``compiler`` (that built the core);
        ``openmp`` (built with OpenMP: False for a single-threaded core, built
        with ``FASTATTN_DISABLE_OPENMP=1``); ``openmp_runtime`` (the runtime
        threadpoolctl finds loaded: its internal_api, version and file, or
        None); ``simd`` (the kernel path selected at run time); ``num_threads``
        (the effective thread count, :func:`fastattn.get_num_threads`);
        ``OMP_NUM_THREADS`` (the environment variable, or None); ``result_cache``
        (``max_bytes``, the limit of the memory kept for result arrays, and
        ``held_bytes``, what it holds now: :func:`fastattn.set_result_cache`).
        With ``mode="stdout"``: None.

    Raises
    ------
    ValueError
        If `mode` is not ``"stdout"`` or ``"dicts"``.

    Examples
    --------
    >>> import fastattn
    >>> config = fastattn.show_config(mode="dicts")
    >>> sorted(config)  # doctest: +NORMALIZE_WHITESPACE
    ['OMP_NUM_THREADS', 'compiler', 'num_threads', 'openmp', 'openmp_runtime',
     'result_cache', 'simd', 'version']
    >>> config["num_threads"] == fastattn.get_num_threads()
    True
    """
    if print_ is not None:
        mode = "stdout" if print_ else "dicts"
    if mode not in _MODES:
        raise ValueError(f"mode must be 'stdout' or 'dicts', got {mode!r}")
    config = _config()
    if mode == "dicts":
        return config
    for key, value in config.items():
        print(f"{key}: {value}")
    if not config["openmp"]:
        print("note: this core was built without OpenMP (single-threaded); rebuild with a "
              "compiler that has OpenMP for threads (see the installation guide)")
    return None
