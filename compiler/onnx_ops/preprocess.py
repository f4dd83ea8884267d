"""Graph-level rewrites applied to the ONNX model before import."""

from __future__ import annotations


def run(model):
    """Return a model the importer takes; the input is not modified."""
    return model
