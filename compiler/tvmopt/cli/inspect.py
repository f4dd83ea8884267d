"""`tvmopt inspect`: opset, inputs/outputs, ops, parameters, FLOPs and unsupported ops of a model."""

from __future__ import annotations

import json

import click

from . import options


@click.command()
@options.model_argument()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@options.wide()
def inspect(model, as_json):
    """Describe MODEL (.onnx, or a torch.export .pt2): format, inputs/outputs, ops, parameters,
    FLOPs, unsupported ops."""
    from ..frontend.model_file import describe
    from ..report import print_model_info

    info = describe(model or options.default_model())
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=2))
    else:
        print_model_info(info)
