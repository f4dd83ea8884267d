"""`tvmopt db prune`: inspect or shrink a tuning database folder."""

from __future__ import annotations

import click


@click.group()
def db():
    """Inspect or shrink a tuning database folder."""


@db.command("prune")
@click.argument("folder", type=click.Path(file_okay=False, exists=True))
@click.option("--top-k", type=int, default=1, show_default=True)
def db_prune(folder, top_k):
    """Keep only the best TOP_K valid records per task (what gets committed)."""
    from pathlib import Path

    from ..tuning.database import prune

    before, after = prune(Path(folder), top_k)
    click.echo(f"{folder}: {before} -> {after} records")
