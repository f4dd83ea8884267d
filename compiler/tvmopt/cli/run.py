"""`tvmopt run`: check an artifact (hashes, host, inputs) and run it once."""

from __future__ import annotations

from pathlib import Path

import click

from . import options


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False),
              help="An .npz with one array per input name [default: random inputs].")
@click.option("--outputs", "outputs_path", type=click.Path(dir_okay=False),
              help="Write the outputs to this .npz.")
@options.dims("Value of a symbolic dim for random inputs (default 1).")
@click.option("--require-finite", is_flag=True,
              help="Refuse inputs holding NaN or Inf, and exit 1 when an output holds any "
                   "(by default both are warned about in one line and the run goes on).")
def run(artifact, inputs_path, outputs_path, dims, require_finite):
    """Check ARTIFACT (hashes, host, inputs) and run it once."""
    from ..errors import ShapeError, VerificationError
    from ..report import print_outputs
    from ..runtime.loader import check_inputs, load, nonfinite, random_inputs

    lm = load(artifact)
    # Random inputs take a ranged dim's lower bound unless told (1 may be outside its range).
    dim_values = {**{k: lo for k, (lo, _) in lm.dim_bounds.items()}, **options.parse_dims(dims)}
    feeds = _load_npz(inputs_path) if inputs_path else random_inputs(lm.inputs, dim_values)
    if inputs_path and not feeds:
        raise ShapeError(f"{inputs_path}: holds no arrays (expected: "
                         f"{', '.join(i.name for i in lm.inputs)})")
    from ..frontend.narrow_types import from_npz  # np.savez keeps 8/4/2-bit arrays as raw bytes

    dtypes = {i.name: i.dtype for i in lm.inputs}
    feeds = {k: from_npz(v, dtypes.get(k, "")) for k, v in feeds.items()}
    check_inputs(lm.inputs, feeds, lm.dim_bounds)
    bad_in = nonfinite(feeds, "input")
    if bad_in and require_finite:
        raise ShapeError(f"non-finite input values ({'; '.join(bad_in)}); --require-finite "
                         "refuses them")
    if bad_in:
        _warn(f"{'; '.join(bad_in)}; running anyway (--require-finite refuses them)")
    outs = lm.run(feeds, check=False)
    if outputs_path:
        import numpy as np

        np.savez(outputs_path, **outs)
    print_outputs(outs, outputs_path)
    bad_out = nonfinite(outs, "output")
    if bad_out:
        why = ("from non-finite inputs" if bad_in else
               "with finite inputs: the model or its build produces them")
        msg = f"{'; '.join(bad_out)} ({why})"
        if require_finite:
            raise VerificationError(f"non-finite outputs: {msg}")
        _warn(msg)


def _warn(msg: str) -> None:
    click.echo(f"tvmopt: warning: {msg}", err=True)


def _load_npz(path) -> dict:
    import zipfile

    import numpy as np

    from ..errors import ShapeError

    p = Path(path)
    if not p.exists():
        raise ShapeError(f"{p}: no such inputs file")
    try:
        data = np.load(p, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ShapeError(f"{p}: holds one unnamed array (.npy); save the inputs by name "
                             "with numpy.savez(path, NAME=array, ...)")
        with data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ShapeError(f"{p}: not a readable .npz of arrays ({str(err) or 'empty file'})") from None
