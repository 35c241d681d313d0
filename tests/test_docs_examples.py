"""The examples of the documentation's pages (docs/**/*.rst) run as doctests,
with the same setup and flags as ``make -C docs doctest`` (which also runs
every docstring's Examples); and the table of docs/dev/testing.rst names
tests and sections that exist. Skipped where the docs are not at hand (the
installed wheel tested from outside the source tree)."""
import doctest
import fnmatch
import re

import numpy as np
import pytest

import fastattn

from conftest import DOCS, ROOT

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


def _test_files():
    """{file name: (its test functions, its section titles in lower case)}:
    a section opens with "# ---- title" or with a "# ----" line above "# Title"."""
    files = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        src = path.read_text(encoding="utf-8")
        tests = set(re.findall(r"^def (test_\w+)\(", src, re.M))
        titles = (re.findall(r"^# -{4,} (.+)$", src, re.M)
                  + re.findall(r"^# -{4,}\n# (.+)$", src, re.M))
        files[path.name] = (tests, [t.strip().lower() for t in titles])
    return files


def test_testing_page_names_tests_and_sections_that_exist():
    page = DOCS / "dev" / "testing.rst"
    if not page.exists() or not (ROOT / "tests").is_dir():
        pytest.skip("needs the source tree's docs/ and tests/")
    text = page.read_text(encoding="utf-8")
    table = " ".join(text[text.index(".. list-table::"):].split())
    files = _test_files()
    wrong, current = [], None
    # ``file.py``: section, section; ``test_name``, ``test_*`` ...
    for m in re.finditer(r"``([^`]+)``(?:: ([A-Za-z][^;`(]*?)(?=;|\(| ``|$))?", table):
        name, sections = m.group(1), m.group(2)
        if name.endswith(".py"):
            current = name if name.startswith("test_") else None
            if current is not None and current not in files:
                wrong.append(f"no file {name}")
                current = None
            for title in (sections or "").split(","):
                title = title.strip().lower()
                if current and title not in ("", "the") and not any(
                        t.startswith(title) for t in files[current][1]):
                    wrong.append(f"no section {title!r} in {current}")
        elif name.startswith("test_") and current is not None:
            if not fnmatch.filter(files[current][0], name):
                wrong.append(f"no test {name} in {current}")
    assert not wrong, wrong
