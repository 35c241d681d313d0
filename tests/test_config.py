"""Package surface: __version__, show_config, the reference mirroring the
public API."""

import inspect
import re

import pytest

import fastattn
from fastattn import reference as ref

COMPUTE = ["softmax", "log_softmax", "logsumexp", "scaled_dot_product_attention", "causal_attention",
           "sliding_window_attention", "attention_weights", "attention_backward",
           "varlen_attention_backward"]


def test_version():
    assert isinstance(fastattn.__version__, str)
    assert re.match(r"^\d+\.\d+", fastattn.__version__)


def test_public_api_exported():
    for name in COMPUTE + ["set_num_threads", "get_num_threads", "show_config"]:
        assert callable(getattr(fastattn, name)), name


def test_reference_mirrors_public_signatures():
    for name in COMPUTE:
        assert inspect.signature(getattr(ref, name)) == inspect.signature(getattr(fastattn, name)), name


def test_show_config_stdout_prints_once_and_returns_none(capsys, threads):
    threads(7)
    result = fastattn.show_config()
    printed = capsys.readouterr().out
    assert result is None  # as numpy.show_config: the prompt shows it once
    assert fastattn.__version__ in printed
    text = printed.lower()
    for item in ("version", "compiler", "openmp", "simd", "thread"):
        assert item in text, item
    assert "num_threads: 7" in printed  # the effective thread count
    assert fastattn.show_config(mode="stdout") is None
    assert capsys.readouterr().out == printed


def test_show_config_dicts_returns_without_printing(capsys, threads):
    threads(7)
    config = fastattn.show_config(mode="dicts")
    assert capsys.readouterr().out == ""
    assert config["version"] == fastattn.__version__
    assert config["num_threads"] == 7
    assert config["openmp"] in (True, False)
    assert config["simd"] in fastattn._core.simd_available()
    # the older spelling
    assert fastattn.show_config(print_=False) == config
    assert capsys.readouterr().out == ""


def test_show_config_bad_mode():
    with pytest.raises(ValueError, match="mode must be 'stdout' or 'dicts', got 'dict'"):
        fastattn.show_config(mode="dict")


def test_show_config_says_single_threaded_build(capsys, monkeypatch):
    real = fastattn._core.build_info()
    monkeypatch.setattr(fastattn._core, "build_info", lambda: {**real, "openmp": False})
    fastattn.show_config()
    printed = capsys.readouterr().out
    assert "openmp: False" in printed
    assert "single-threaded" in printed
    if real["openmp"]:
        monkeypatch.setattr(fastattn._core, "build_info", lambda: real)
        fastattn.show_config()
        assert "single-threaded" not in capsys.readouterr().out


def test_public_names_are_the_api_plus_config():
    from fastattn import (_attention, _backward, _memory, _merge, _quant, _softmax, _threads,
                          _varlen)

    api = set().union(*(m.__all__ for m in (_softmax, _attention, _varlen, _merge, _threads,
                                            _memory, _backward, _quant)))
    assert set(fastattn.__all__) == api | {"show_config", "__version__"}
    for name in fastattn.__all__:
        assert hasattr(fastattn, name)
