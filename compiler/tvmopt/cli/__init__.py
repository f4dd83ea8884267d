"""The `tvmopt` command line: a thin layer over the Python API (one module per command)."""

from .main import main

__all__ = ["main"]
