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
def run(artifact, inputs_path, outputs_path, dims):
    """Check ARTIFACT (hashes, host, inputs) and run it once."""
    from ..report import print_outputs
    from ..runtime.loader import load, random_inputs

    lm = load(artifact)
    feeds = _load_npz(inputs_path) if inputs_path else random_inputs(lm.inputs, options.parse_dims(dims))
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
