"""`tvmopt targets`: list the hardware targets, or show one (no TVM import)."""

from __future__ import annotations

import json

import click

from . import options


@click.command()
@click.argument("show", required=False, type=click.Choice(["show"]))
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
@options.wide()
def targets(show, name, as_json):
    """List the hardware targets, or 'targets show NAME' for one entry."""
    from ..report import print_target, print_targets
    from ..targets.registry import get_target, load_targets

    if show:
        if not name:
            raise click.UsageError("targets show NAME: a target name is required")
        t = get_target(name)
        click.echo(json.dumps(t.summary(), indent=2)) if as_json else print_target(t)
        return
    ts = list(load_targets().values())
    if as_json:
        click.echo(json.dumps([t.summary() for t in ts], indent=2))
    else:
        print_targets(ts)
