"""Sphinx configuration of fastattn's documentation.

Build: ``make -C docs html`` (warnings are errors, nitpicky), doctests:
``make -C docs doctest``. The API pages document the installed package, so
install it first (``pip install ".[docs]"``).
"""
import importlib.util
import os
import sys

import fastattn

project = "fastattn"
author = "the fastattn developers"
copyright = "2026, the fastattn developers"
version = release = fastattn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "gallery"]
templates_path = ["_templates"]
nitpicky = True

# -- API pages: autosummary over the installed package ------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"          # the numpydoc sections give the types
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()
add_module_names = False
# fastattn.torch imports PyTorch, and fastattn.transformers also transformers,
# which the docs extra leaves out: without them the modules' pages are built
# from stand-ins (their examples are skipped below)
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
autodoc_mock_imports = (([] if HAVE_TORCH else ["torch"])
                        + ([] if HAVE_TRANSFORMERS else ["transformers"]))

# -- doctests: the pages' examples and the docstrings' Examples --------------
doctest_global_setup = """
import importlib.util
import numpy as np
import fastattn
no_torch = importlib.util.find_spec("torch") is None  # (a doctest's :skipif: no_torch)
np.set_printoptions(precision=4, suppress=True)
try:  # the docstring example of this class names it bare, as its module does
    from fastattn.dask import FastattnThreads
except ImportError:
    pass
"""
import doctest as _doctest  # noqa: E402

doctest_default_flags = _doctest.ELLIPSIS | _doctest.NORMALIZE_WHITESPACE

# -- the gallery: plots rendered at build time --------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    "show_memory": False,
    "image_scrapers": ("matplotlib",),
}
os.environ.setdefault("MPLBACKEND", "Agg")

# -- HTML: the NumPy/SciPy look ----------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"fastattn {release}"
html_static_path = ["_static"]
html_css_files = ["fastattn.css"]
html_js_files = ["fastattn.js"]
html_show_sourcelink = False
html_theme_options = {
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "logo": {"text": "fastattn"},
}
html_sidebars = {"index": [], "install": [], "changelog": [], "performance": [], "dev/index": []}
html_context = {"default_mode": "light"}

sys.path.insert(0, os.path.abspath("."))
