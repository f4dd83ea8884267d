"""The one rich console every report prints to (stdout), and one for progress on stderr."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Piped or logged output has no terminal width; rich would assume 80 columns and squeeze the
# tables into ellipses, so give it room. A real terminal keeps its own width, and COLUMNS set
# by the user is honoured either way.
console = Console(highlight=False, width=None if sys.stdout.isatty() or
                  os.environ.get("COLUMNS", "").isdigit() else 150)
err_console = Console(stderr=True)

# --wide: every column of every table, lines as long as they need to be
_wide = False


def set_wide(wide: bool = True) -> None:
    global _wide
    _wide = wide
    if wide:
        console.width = 10_000


def fitted_table(columns, rows, drop_order=(), **table_kw):
    """A rich Table of `columns` ((header, justify) pairs) and `rows` (lists of cells, markup
    allowed) that fits the console: columns in `drop_order` are left out, first to last, until
    the table's natural width fits (the rest wrap); the caption names what was left out.
    With --wide (set_wide) every column is kept."""
    from rich.table import Table
    from rich.text import Text

    def width(i):
        cells = [Text.from_markup(str(r[i])).cell_len for r in rows]
        return max([Text(columns[i][0]).cell_len, *cells]) + 2  # padding

    keep = list(range(len(columns)))
    dropped = []
    if not _wide:
        for name in drop_order:
            if sum(width(i) for i in keep) + len(keep) - 1 <= console.width:
                break
            idx = next((i for i in keep if columns[i][0] == name), None)
            if idx is not None:
                keep.remove(idx)
                dropped.append(name)
    if dropped:
        table_kw.setdefault("caption", f"left out to fit: {', '.join(dropped)} (--wide shows all)")
    t = Table(show_edge=False, **table_kw)
    for i in keep:
        t.add_column(columns[i][0], justify=columns[i][1], overflow="fold")
    for r in rows:
        t.add_row(*[r[i] for i in keep])
    return t
