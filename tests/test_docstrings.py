"""The examples in the public docstrings run as doctests of the installed package."""
import doctest

import pytest

import fastattn
import fastattn._api
import fastattn._config


@pytest.mark.parametrize("module", [fastattn._api, fastattn._config], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, "no docstring example found"
    assert result.failed == 0
