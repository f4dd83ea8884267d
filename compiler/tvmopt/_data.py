"""Where the data folders (targets/, schedules/) live: inside the wheel or in the source tree."""

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the folder `name` ('targets' or 'schedules') for this install.

    A wheel carries them as tvmopt/_data/<name>; an editable install (the package at
    compiler/tvmopt/) reads the repository's.
    """
    packaged = _PKG / "_data" / name
    if packaged.is_dir():
        return packaged
    return _PKG.parents[1] / name
