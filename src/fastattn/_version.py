"""fastattn's version: one line, which the package and show_config() both read."""
__version__ = "0.1.0"
