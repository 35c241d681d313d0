"""show_config(): what fastattn was built with and what it runs with."""
import os

from fastattn import _core


def _openmp_runtime():
    """The OpenMP runtime loaded in this process, as threadpoolctl sees it."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    for info in threadpool_info():
        if info.get("user_api") == "openmp":
            return {k: info.get(k) for k in ("internal_api", "version", "filepath")}
    return None


def show_config(print_=True):
    """Print and return fastattn's build and runtime configuration.

    Parameters
    ----------
    print_ : bool, default True
        Print the configuration, one ``key: value`` line each.

    Returns
    -------
    dict
        ``version``; ``compiler`` (that built the core); ``openmp`` (built
        with OpenMP); ``openmp_runtime`` (the runtime threadpoolctl finds
        loaded: its internal_api, version and file, or None); ``simd`` (the
        kernel path selected at run time); ``num_threads`` (the effective
        thread count, :func:`fastattn.get_num_threads`); ``OMP_NUM_THREADS``
        (the environment variable, or None).

    Examples
    --------
    >>> import fastattn
    >>> config = fastattn.show_config(print_=False)
    >>> sorted(config)  # doctest: +NORMALIZE_WHITESPACE
    ['OMP_NUM_THREADS', 'compiler', 'num_threads', 'openmp', 'openmp_runtime', 'simd',
     'version']
    """
    from fastattn import __version__
    from fastattn._api import get_num_threads

    build = _core.build_info()
    config = {
        "version": __version__,
        "compiler": build["compiler"],
        "openmp": build["openmp"],
        "openmp_runtime": _openmp_runtime(),
        "simd": build["simd"],
        "num_threads": get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }
    if print_:
        for key, value in config.items():
            print(f"{key}: {value}")
    return config
