"""The `tvmopt` command line: parse -> options -> call the Python API -> print.

TVM is imported inside commands so `tvmopt --help` stays instant. Every TvmoptError becomes one
line on stderr and exit code 1; set TVMOPT_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..errors import TvmoptError


def _fail(msg: str, code: int = 1):
    click.echo(f"tvmopt: error: {msg}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turns domain errors into one line, and any other exception into one line too."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TvmoptError as err:
            if os.environ.get("TVMOPT_DEBUG"):
                raise
            msg = str(err)
            if err.hint:
                msg += f" ({err.hint})"
            _fail(msg)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as err:  # an unexpected failure still gets one line, not a traceback
            if os.environ.get("TVMOPT_DEBUG"):
                raise
            text = (str(err).strip().splitlines() or [""])[-1]
            _fail(f"internal error: {type(err).__name__}: {text} "
                  "(set TVMOPT_DEBUG=1 for the traceback, TVMOPT_SAVE_TEMPS=DIR for the IR)", 2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tvmopt")
def main():
    """tvmopt: compile ONNX models with Apache TVM (Relax), tuned and verified per target."""


def _default_model() -> str:
    from ..models import default_model_path

    return str(default_model_path())


# ------------------------------------------------------------------------------------ inspect
@main.command()
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def inspect(model, as_json):
    """Describe MODEL.onnx: opset, inputs/outputs, ops, parameters, FLOPs, unsupported ops."""
    from ..frontend.model_info import inspect_model
    from ..report import print_model_info

    info = inspect_model(model or _default_model())
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=2))
    else:
        print_model_info(info)


# ------------------------------------------------------------------------------------ compile
def _parse_dims(items) -> dict[str, int]:
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"'{item}': expected NAME=VALUE", param_hint="--dim")
        k, v = item.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            raise click.BadParameter(f"'{item}': VALUE must be an integer", param_hint="--dim") from None
    return out


@main.command()
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--target", "-t", default="x86", show_default=True,
              help="Target name or alias from targets/ ('tvmopt targets' lists them), or 'host'.")
@click.option("-o", "--output", type=click.Path(), help="Artifact folder [default: MODEL.tvmopt].")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix an input's shape (repeatable). Named dynamic dims stay symbolic otherwise.")
@click.option("--verify", is_flag=True, help="Compare with onnxruntime on random inputs.")
@click.option("--atol", type=float, default=1e-4, show_default=True)
@click.option("--rtol", type=float, default=1e-3, show_default=True)
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Value of a symbolic dim for --verify (default 1).")
@click.option("--precision", "-p", default="auto", show_default=True,
              type=click.Choice(["auto", "fp32", "fp16", "bf16", "int8"]),
              help="auto: the plan picks per target ('tvmopt plan' shows why).")
@click.option("--max-error", type=float, default=None,
              help="Fail when a non-fp32 build's max abs error vs the fp32 build exceeds this.")
@click.option("--db", type=click.Path(file_okay=False),
              help="Replay this tuning database (from `tvmopt tune`).")
@click.option("--require-db", is_flag=True, help="Fail if --db misses any task.")
def compile(model, target, output, shapes, verify, atol, rtol, dims, precision, max_error, db,
            require_db):
    """Compile MODEL.onnx into a deployable artifact folder."""
    from ..build.compile import CompileOptions, compile_model
    from ..report import print_compile_result
    from ..runtime.verify import Tolerance

    opts = CompileOptions(model=model or _default_model(), target=target, output=output,
                          shapes=list(shapes), verify=verify, tolerance=Tolerance(atol, rtol),
                          verify_dims=_parse_dims(dims), precision=precision, max_error=max_error,
                          db=db, require_db=require_db)
    result = compile_model(opts)
    print_compile_result(result)
    if result.replay is not None:
        from ..tuning.report import print_replay

        print_replay(result.replay)


# ------------------------------------------------------------------------------------ run
@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False),
              help="An .npz with one array per input name [default: random inputs].")
@click.option("--outputs", "outputs_path", type=click.Path(dir_okay=False),
              help="Write the outputs to this .npz.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Value of a symbolic dim for random inputs (default 1).")
def run(artifact, inputs_path, outputs_path, dims):
    """Check ARTIFACT (hashes, host, inputs) and run it once."""
    from ..report import print_outputs
    from ..runtime.loader import load, random_inputs

    lm = load(artifact)
    feeds = _load_npz(inputs_path) if inputs_path else random_inputs(lm.inputs, _parse_dims(dims))
    from ..frontend.narrow_types import from_npz  # np.savez keeps 8/4/2-bit arrays as raw bytes

    dtypes = {i.name: i.dtype for i in lm.inputs}
    feeds = {k: from_npz(v, dtypes.get(k, "")) for k, v in feeds.items()}
    outs = lm.run(feeds)
    if outputs_path:
        import numpy as np

        np.savez(outputs_path, **outs)
    print_outputs(outs, outputs_path)


def _load_npz(path) -> dict:
    import zipfile

    import numpy as np

    from ..errors import ShapeError

    p = Path(path)
    if not p.exists():
        raise ShapeError(f"{p}: no such inputs file")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as err:
        raise ShapeError(f"{p}: not a readable .npz of arrays ({err})") from None


# ------------------------------------------------------------------------------------ targets
@main.command()
@click.argument("show", required=False, type=click.Choice(["show"]))
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
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


# ------------------------------------------------------------------------------------ demo
@main.command()
@click.option("--target", "-t", default="x86", show_default=True)
@click.option("-o", "--output", type=click.Path(), default="tvmopt-out/default.tvmopt",
              show_default=True)
@click.option("--runs", type=int, default=50, show_default=True)
def demo(target, output, runs):
    """The main job on the bundled model: compile, verify against onnxruntime, run, time."""
    # The latency table runs onnxruntime with threads = cores; give TVM's pool the same (its
    # default is half the logical cores), before compiling starts the pool.
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    from ..build.compile import CompileOptions, compile_model
    from ..bench.quick import latency_summary
    from ..report import print_compile_result, print_latency_summary

    from ..models import DEFAULT
    from ..targets.registry import get_target
    from ..tuning.tune import bundled_db_dir, read_manifest

    # The committed tuning database for this model and target, replayed with the shapes it was
    # tuned at; without one, the default (dlight) schedules.
    db = bundled_db_dir(DEFAULT, get_target(target).name)
    db_manifest = read_manifest(db) if db.is_dir() else None
    shapes = ([f"{k}={'x'.join(map(str, v))}" for k, v in db_manifest.get("shapes", {}).items()]
              if db_manifest else [])
    if not db_manifest:
        click.echo(f"no committed tuning database for {DEFAULT} on {target}: default schedules")
    opts = CompileOptions(model=_default_model(), target=target, output=output, verify=True,
                          shapes=shapes, db=str(db) if db_manifest else None)
    result = compile_model(opts)
    print_compile_result(result)
    if result.replay is not None:
        from ..tuning.report import print_replay

        print_replay(result.replay)
    print_latency_summary(latency_summary(result.artifact.path, opts.model, runs=runs))


from . import bench  # noqa: E402,F401
from . import plan  # noqa: E402,F401
from . import tune  # noqa: E402,F401

if __name__ == "__main__":
    main()
