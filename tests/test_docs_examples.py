"""The examples of the documentation's pages (docs/**/*.rst) run as doctests,
with the same setup and flags as ``make -C docs doctest`` (which also runs
every docstring's Examples). Skipped where the docs are not at hand (the
installed wheel tested from outside the source tree)."""
import doctest

import numpy as np
import pytest

import fastattn

from conftest import DOCS
PAGES = sorted(p for p in DOCS.rglob("*.rst")
               if "_build" not in p.parts and "generated" not in p.parts
               and "auto_examples" not in p.parts) if DOCS.is_dir() else []


@pytest.mark.skipif(not PAGES, reason="needs the source tree's docs/")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples(page):
    old = np.get_printoptions()
    np.set_printoptions(precision=4, suppress=True)
    try:
        result = doctest.testfile(str(page), module_relative=False,
                                  globs={"np": np, "fastattn": fastattn},
                                  optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    finally:
        np.set_printoptions(**old)
    assert result.failed == 0


def test_docs_have_examples():
    if not PAGES:
        pytest.skip("needs the source tree's docs/")
    assert sum(doctest.DocTestParser().get_examples(p.read_text()) != [] for p in PAGES) >= 8
