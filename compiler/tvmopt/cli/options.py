"""Shared click options and helpers: each option and its choices are declared once here.

Command modules take what they need (`@options.target()`, `@options.shapes()`, ...) and never
import each other.
"""

from __future__ import annotations

import click

from ..console import console, err_console  # noqa: F401 - the one console of the CLI


def default_model() -> str:
    """The bundled model, used when a command is given no MODEL."""
    from ..models import default_model_path

    return str(default_model_path())


def model_argument():
    return click.argument("model", type=click.Path(dir_okay=False), required=False)


def target(help: str = "Target name or alias from targets/ ('tvmopt targets' lists them), "
                       "or 'host'."):
    return click.option("--target", "-t", default="x86", show_default=True, help=help)


def shapes(help: str = "Fix an input's shape (repeatable). Named dynamic dims stay symbolic "
                       "otherwise."):
    return click.option("--shape", "shapes", multiple=True, metavar="NAME=1x3x224x224", help=help)


def dims(help: str = "Value of a symbolic dim (default 1)."):
    return click.option("--dim", "dims", multiple=True, metavar="NAME=N", help=help)


def precision(help: str = "auto: the plan picks per target ('tvmopt plan' shows why)."):
    from ..precision.policy import CHOICES

    return click.option("--precision", "-p", default="auto", show_default=True,
                        type=click.Choice(CHOICES), help=help)


def dispatch(help: str = "Who computes conv2d/matmul on CPU: codegen (tvmopt's default "
                         "schedules), library (oneDNN wherever it takes the kernel), auto (each "
                         "kernel timed both ways on this host, the faster kept). Default: the "
                         "--db database's setting, else auto."):
    from ..pipeline import DEFAULT_DISPATCH, DISPATCH

    return click.option("--dispatch", default=None, show_default=DEFAULT_DISPATCH,
                        type=click.Choice(DISPATCH), help=help)


def max_error(help: str = "Accuracy gate: the largest error allowed for a lower precision, as "
                          "max|out - fp32 reference| / max|reference| over the outputs on sample "
                          "inputs. bf16 library kernels default to 0.02 and are given back to "
                          "fp32 kernel by kernel past it; for fp16/int8 a breach fails the "
                          "compile."):
    return click.option("--max-error", type=float, default=None, help=help)


def calibration(help: str = "An .npz of sample inputs (one array per model input, by name) for "
                            "the accuracy gate, instead of seeded random inputs."):
    return click.option("--calibration", type=click.Path(exists=True, dir_okay=False), help=help)


def allow_newer_opset():
    return click.option("--allow-newer-opset", is_flag=True,
                        help="Import a model whose ai.onnx opset is newer than the importer knows "
                             "as the newest it knows (recorded in the manifest).")


def wide():
    """--wide: every column of the tables, however wide (applied by the callback)."""

    def apply(ctx, param, value):
        if value:
            from ..console import set_wide

            set_wide()
        return value

    return click.option("--wide", is_flag=True, expose_value=False, callback=apply,
                        help="Every table column, however wide (tables otherwise fit the "
                             "terminal, or COLUMNS).")


def dim_ranges(help: str = "Value of a symbolic dim for --verify (NAME=N, default 1), or "
                           "its range (NAME=LO..HI): memory is then planned once for HI, and "
                           "the artifact refuses inputs outside the range."):
    return click.option("--dim", "dims", multiple=True, metavar="NAME=N|NAME=LO..HI", help=help)


def parse_dims(items) -> dict[str, int]:
    """--dim NAME=N values -> {name: n}."""
    out = {}
    for item in items:
        k, v = _split_dim(item)
        out[k] = _dim_int(item, v)
    return out


def parse_dim_ranges(items) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """--dim NAME=N and NAME=LO..HI values -> ({name: n}, {name: (lo, hi)})."""
    values, ranges = {}, {}
    for item in items:
        k, v = _split_dim(item)
        if ".." not in v:
            values[k] = _dim_int(item, v)
            continue
        lo, hi = (_dim_int(item, part) for part in v.split("..", 1))
        # LO may be 0: a decoder's past is empty at the prefill
        if not (0 <= lo <= hi and hi >= 1):
            raise click.BadParameter(f"'{item}': expected 0 <= LO <= HI and HI >= 1",
                                     param_hint="--dim")
        ranges[k] = (lo, hi)
    return values, ranges


def _split_dim(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise click.BadParameter(f"'{item}': expected NAME=VALUE", param_hint="--dim")
    return tuple(item.split("=", 1))


def _dim_int(item: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"'{item}': values must be integers", param_hint="--dim") from None
