"""Bundled models, generated reproducibly by tools/make_models.py."""

from pathlib import Path

_DIR = Path(__file__).resolve().parent
DEFAULT = "mobile_cnn"


def bundled() -> dict[str, Path]:
    """Name -> path of every bundled .onnx model."""
    return {p.stem: p for p in sorted(_DIR.glob("*.onnx"))}


def default_model_path() -> Path:
    return _DIR / f"{DEFAULT}.onnx"
