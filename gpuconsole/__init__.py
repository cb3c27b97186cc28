"""gpuconsole: a terminal operations console for GPU servers."""

__version__ = "0.1.0"
