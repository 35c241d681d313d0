"""Every code block that a reader may paste into a file runs as a script.

The blocks are the ```python blocks of README.md and, in the documentation's
pages (docs/**/*.rst), the ``.. code-block:: python`` blocks and the ``::``
literal blocks (Python is the pages' default language: output and other
languages go in ``.. code-block:: text``, ``bash`` and so on). Each block is
written to a file of its own in a temporary folder and run there by a fresh
interpreter, as a reader who pastes it would run it; it must exit with
status 0. So a block has to be complete: its imports, its data, and the
``if __name__ == "__main__":`` guard that starting worker processes needs.

Left out: blocks of doctests (``>>>``), which tests/test_docs_examples.py and
``make -C docs doctest`` run, and blocks marked ``:class: signature``, which
show how a function is called rather than code to run. A block that imports
an optional package (Dask, PyTorch, ...) is skipped, saying which, when that
package is not installed. Skipped where the README and docs/ are not at hand
(the installed wheel tested from outside the source tree).
"""
import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import DOCS, ROOT

README = ROOT / "README.md"
TIMEOUT = 300  # seconds a block may take (the Dask ones start a local cluster)

PYTHON_LANGUAGES = {"python", "python3", "py"}
DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\. (?:code-block|code|sourcecode)::\s*(?P<lang>\S*)\s*$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")


class Block:
    """One code block: where it is, its text, and what it is."""

    def __init__(self, path, line, code, kind):
        self.path, self.line, self.code, self.kind = path, line, code, kind

    @property
    def id(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _indent(line):
    return len(line) - len(line.lstrip())


def _indented_body(lines, start, base):
    """The lines from `start` on that are blank or indented deeper than
    `base`, dedented, with the 1-based number of the first of them."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    body = lines[start:end]
    while body and not body[-1].strip():
        body.pop()
    first = start
    while first < end and not lines[first].strip():
        first += 1
    return textwrap.dedent("\n".join(body)).strip("\n") + "\n", first + 1


def rst_blocks(path):
    """The Python blocks of one reST page: code-block directives (with their
    options) and literal blocks introduced by a paragraph ending in ``::``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = DIRECTIVE.match(line)
        if m:
            base = len(m.group("indent"))
            j = i + 1
            options = {}
            while j < len(lines) and lines[j].strip().startswith(":") and _indent(lines[j]) > base:
                name, _, value = lines[j].strip()[1:].partition(":")
                options[name.strip()] = value.strip()
                j += 1
            code, first = _indented_body(lines, j, base)
            if m.group("lang").lower() in PYTHON_LANGUAGES:
                kind = "signature" if "signature" in options.get("class", "").split() else "code"
                blocks.append(Block(path, first, code, kind))
            i = j
            continue
        stripped = line.strip()
        if stripped.endswith("::") and not stripped.startswith(".."):
            code, first = _indented_body(lines, i + 1, _indent(line))
            if code.strip():
                blocks.append(Block(path, first, code, "code"))
        i += 1
    return blocks


def readme_blocks(path):
    """The ```python blocks of a Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group("lang"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if m.group("lang").lower() in PYTHON_LANGUAGES:
                blocks.append(Block(path, i + 2, "\n".join(lines[i + 1:j]) + "\n", "code"))
            i = j + 1
        else:
            i += 1
    return blocks


def all_blocks():
    blocks = readme_blocks(README) if README.is_file() else []
    if DOCS.is_dir():
        for page in sorted(DOCS.rglob("*.rst")):
            if not {"_build", "generated", "auto_examples"} & set(page.relative_to(DOCS).parts):
                blocks += rst_blocks(page)
    return blocks


BLOCKS = all_blocks()
SCRIPTS = [b for b in BLOCKS if b.kind == "code" and ">>>" not in b.code]


def missing_modules(code):
    """Top-level modules the code imports that are not installed."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


@pytest.mark.skipif(not SCRIPTS, reason="needs the source tree's README.md and docs/")
@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.id)
def test_block_runs_as_a_script(block, tmp_path):
    try:
        missing = missing_modules(block.code)
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: not Python ({exc}); a block of another language or of "
                    f"output goes in '.. code-block:: text' (or bash, ...)")
    if missing:
        pytest.skip(f"{block.id} needs {', '.join(missing)}, not installed")
    script = tmp_path / "snippet.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    try:
        run = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} ran past {TIMEOUT} s")
    assert run.returncode == 0, (
        f"{block.id}, run as a script, exited with {run.returncode}:\n{block.code}\n"
        f"--- stdout (end) ---\n{run.stdout[-3000:]}\n--- stderr (end) ---\n{run.stderr[-3000:]}")


@pytest.mark.skipif(not BLOCKS, reason="needs the source tree's README.md and docs/")
def test_blocks_are_found():
    # the extraction itself: the README's tour, FlashAttention and Dask blocks,
    # and the docs' runnable block and signatures
    readme = [b for b in SCRIPTS if b.path == README]
    docs = [b for b in SCRIPTS if b.path != README]
    assert len(readme) >= 3, [b.id for b in readme]
    assert any("import fastattn" in b.code for b in readme)
    assert len(docs) >= 1, [b.id for b in BLOCKS]
    assert sum(b.kind == "signature" for b in BLOCKS) >= 4


@pytest.mark.skipif(not BLOCKS, reason="needs the source tree's README.md and docs/")
def test_signature_blocks_show_signatures():
    # ':class: signature' is for a function's call form only, not a way out
    # of running a block: each of its statements starts with `name(`
    for block in (b for b in BLOCKS if b.kind == "signature"):
        starts = [line for line in block.code.splitlines()
                  if line.strip() and _indent(line) == 0]
        assert starts and all(re.match(r"[A-Za-z_][\w.]*\(", s) for s in starts), block.id


def test_extraction_of_rst(tmp_path):
    page = tmp_path / "page.rst"
    page.write_text(textwrap.dedent("""\
        Title
        =====

        .. code-block:: python
           :caption: a script

           import numpy as np
           print(np.zeros(2))

        .. code-block:: python
           :class: signature

           f(x, *, out=None)

        .. code-block:: bash

           echo not python

        A literal block::

            x = 1
              # indented deeper

        .. doctest::

           >>> 1
           1

        - A list item with a block:

          .. code-block:: python

             y = 2

        Text after.
        """), encoding="utf-8")
    got = [(b.line, b.kind, b.code) for b in rst_blocks(page)]
    assert got == [(7, "code", "import numpy as np\nprint(np.zeros(2))\n"),
                   (13, "signature", "f(x, *, out=None)\n"),
                   (21, "code", "x = 1\n  # indented deeper\n"),
                   (33, "code", "y = 2\n")]


def test_extraction_of_markdown(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# T\n\n```bash\necho hi\n```\n\n```python\nimport os\nprint(os.sep)\n```\n\n"
                    "```\nplain\n```\n", encoding="utf-8")
    assert [(b.line, b.code) for b in readme_blocks(page)] == [(8, "import os\nprint(os.sep)\n")]
