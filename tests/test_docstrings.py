"""The examples in the public docstrings run as doctests of the installed package."""
import doctest
import importlib

import pytest

MODULES = ["fastattn._softmax", "fastattn._attention", "fastattn._varlen", "fastattn._merge",
           "fastattn._threads", "fastattn._config", "fastattn._quant", "fastattn.flash_attn",
           "fastattn.flash_attn.bert_padding", "fastattn.flash_attn.layers.rotary",
           "fastattn.dask"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name == "fastattn.dask":
        pytest.importorskip("dask")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0, "no docstring example found"
    assert result.failed == 0
