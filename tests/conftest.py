"""Shared fixtures. Model builders live in tests/models.py, the run-and-compare helpers in
tests/harness.py."""

from __future__ import annotations

import onnx
import pytest
from click.testing import CliRunner

from tests.onednn_required import require_onednn


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
    """tvmopt.library.onednn with its extension built and loaded: the module's tests fail on
    an x86 host where it cannot be, and skip on another arch (tests/onednn_required.py)."""
    return require_onednn()
