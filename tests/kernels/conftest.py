"""Shared fixtures of the kernel tests."""

from __future__ import annotations

import pytest


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
