"""Shared fixtures. Model builders live in tests/models.py, the run-and-compare helpers in
tests/harness.py."""

from __future__ import annotations

import onnx
import pytest
from click.testing import CliRunner


@pytest.fixture
def save(tmp_path):
    """save(model, 'name') -> path of the written .onnx file."""

    def _save(model, name="model"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        return path

    return _save


@pytest.fixture
def cli():
    """invoke(*args) -> click Result of `tvmopt args...` (in process)."""
    from tvmopt.cli.main import main

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return invoke


@pytest.fixture(scope="module")
def onednn_extension():
    """The oneDNN extension, built and loaded; the module's tests skip, naming why, where it
    cannot be."""
    od = pytest.importorskip("tvmopt.kernels.onednn")
    try:
        od.load_extension()
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"oneDNN extension unavailable here: {err}")
    return od
