"""The suite tests this checkout's code, not an installed copy of an older one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tvmopt

SOURCE = Path(__file__).resolve().parents[1] / "compiler" / "tvmopt"


def test_the_imported_package_is_the_checkouts_source():
    imported = Path(tvmopt.__file__).resolve().parent
    assert imported == SOURCE, (
        f"tests import tvmopt from {imported}, not from this checkout ({SOURCE}): "
        "install it editable (pip install -e '.[test]') so tests run the source")


def test_a_fresh_interpreter_imports_the_source_too():
    # The CLI's worker processes and `python -m tvmopt` start fresh interpreters: only an
    # editable install (not pytest's sys.path) makes them run the checkout's code.
    out = subprocess.run([sys.executable, "-c", "import tvmopt; print(tvmopt.__file__)"],
                         capture_output=True, text=True, cwd="/", check=True).stdout.strip()
    assert Path(out).resolve().parent == SOURCE, (
        f"a new interpreter imports tvmopt from {out}: run pip install -e '.[test]'")


def test_the_data_folders_are_the_checkouts():
    from tvmopt._data import data_dir

    root = SOURCE.parents[1]
    assert data_dir("targets") == root / "targets"
    assert data_dir("schedules") == root / "schedules"
