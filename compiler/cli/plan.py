"""`tvmopt plan`: the per-kernel roofline plan and precision decisions for a model on a target."""

from __future__ import annotations

import json

import click

from .main import _default_model, _parse_dims, main
from ..precision.plan import CHOICES


@main.command()
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--target", "-t", default="x86", show_default=True,
              help="Target name or alias ('tvmopt targets' lists them), or 'host'.")
@click.option("--precision", "-p", type=click.Choice(CHOICES), default="auto", show_default=True)
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix an input's shape (repeatable).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Value of a symbolic dim (default 1): FLOPs need numbers.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(model, target, precision, shapes, dims, as_json):
    """Per fused kernel: ops, FLOPs, bytes, intensity, bound, precision and predicted time."""
    from ..build.compile import CompileOptions
    from ..precision.plan import make_plan
    from ..report import print_plan
    from ..targets.registry import get_target

    opts = CompileOptions(model=model or _default_model(), target=target, shapes=list(shapes))
    p = make_plan(opts.model, get_target(target), precision, dims=_parse_dims(dims),
                  shapes=opts.shapes)
    if as_json:
        click.echo(json.dumps(p.to_json(), indent=2))
    else:
        print_plan(p, opts.model)
