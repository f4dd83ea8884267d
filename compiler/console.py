"""The one rich console every report prints to (stdout), and one for progress on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped or logged output has no terminal width; rich would assume 80 columns and squeeze the
# tables into ellipses, so give it room. A real terminal keeps its own width.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)
