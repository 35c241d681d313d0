"""Package surface: __version__, show_config, the reference mirroring the
public API (SPEC sec. 5)."""

import inspect
import re

import fastattn
from fastattn import reference as ref

COMPUTE = ["softmax", "log_softmax", "logsumexp", "scaled_dot_product_attention", "causal_attention",
           "sliding_window_attention", "attention_weights"]


def test_version():
    assert isinstance(fastattn.__version__, str)
    assert re.match(r"^\d+\.\d+", fastattn.__version__)


def test_public_api_exported():
    for name in COMPUTE + ["set_num_threads", "get_num_threads", "show_config"]:
        assert callable(getattr(fastattn, name)), name


def test_reference_mirrors_public_signatures():
    for name in COMPUTE:
        assert inspect.signature(getattr(ref, name)) == inspect.signature(getattr(fastattn, name)), name


def test_show_config_prints_and_returns(capsys, threads):
    threads(7)
    result = fastattn.show_config()
    printed = capsys.readouterr().out
    assert isinstance(result, (dict, str))
    assert result
    assert printed.strip()
    assert fastattn.__version__ in printed and fastattn.__version__ in str(result)
    text = printed.lower()
    for item in ("version", "compiler", "openmp", "simd", "thread"):
        assert item in text, item
    # the effective thread count
    assert "7" in printed
    if isinstance(result, dict):
        assert 7 in result.values() or "7" in str(result)


def test_public_names_are_the_api_plus_config():
    import fastattn._api

    assert set(fastattn.__all__) == set(fastattn._api.__all__) | {"show_config", "__version__"}
    for name in fastattn.__all__:
        assert hasattr(fastattn, name)
