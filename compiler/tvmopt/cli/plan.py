"""`tvmopt plan`: the per-kernel roofline plan and precision decisions for a model on a target."""

from __future__ import annotations

import json

import click

from . import options


@click.command()
@options.model_argument()
@options.target()
@options.precision()
@options.shapes("Fix an input's shape (repeatable).")
@options.dims("Value of a symbolic dim (default 1): FLOPs need numbers.")
@options.dispatch()
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@options.wide()
def plan(model, target, precision, shapes, dims, dispatch, as_json):
    """Per fused kernel: ops, FLOPs, bytes, intensity, bound, precision and predicted time."""
    from ..interface.compile import CompileOptions
    from ..interface.plan_model import plan_model
    from ..pipeline import DEFAULT_DISPATCH
    from ..report import print_plan
    from ..targets.registry import get_target

    opts = CompileOptions(model=model or options.default_model(), target=target, shapes=list(shapes))
    p = plan_model(opts.model, get_target(target), precision, dims=options.parse_dims(dims),
                  shapes=opts.shapes, dispatch=dispatch or DEFAULT_DISPATCH)
    if as_json:
        click.echo(json.dumps(p.to_json(), indent=2))
    else:
        print_plan(p, opts.model)
