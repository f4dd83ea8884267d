"""A model file of either format, by suffix: `.pt2` is a torch.export program, anything else
ONNX. The one place the rest of tvmopt loads, describes and imports models through."""

from __future__ import annotations

from pathlib import Path

from ..tensor_info import TensorInfo
from . import torch_program

ONNX = "onnx"
TORCH = torch_program.FORMAT
# What `bench` and the bundled-model lookup accept as a model rather than an artifact.
MODEL_SUFFIXES = (".onnx", *torch_program.SUFFIXES)


def model_format(path) -> str:
    return TORCH if torch_program.is_torch_program(path) else ONNX


def is_model_file(path) -> bool:
    return Path(str(path)).suffix.lower() in MODEL_SUFFIXES


def load(path):
    """The loaded model: an onnx.ModelProto or a torch ExportedProgram.

    Raises:
        ModelError: missing, unreadable or not a model of its format.
    """
    if model_format(path) == TORCH:
        return torch_program.load_program(path)
    from .onnx_model import load_onnx

    return load_onnx(path)


def inputs_of(loaded) -> list[TensorInfo]:
    """The model's declared inputs (symbolic dims as names)."""
    if is_program(loaded):
        return torch_program.program_inputs(loaded)
    from .onnx_model import graph_inputs

    return graph_inputs(loaded)


def model_inputs(path) -> list[TensorInfo]:
    return inputs_of(load(path))


def import_loaded(loaded, shapes: dict | None = None, allow_newer_opset: bool = False):
    """Import a loaded model into Relax (see importer.import_onnx, torch_program.import_program).

    Returns:
        importer.ImportedModel.
    """
    if is_program(loaded):
        return torch_program.import_program(loaded, shapes)
    from .importer import import_onnx

    return import_onnx(loaded, shapes, allow_newer_opset=allow_newer_opset)


def import_model(path, shapes: dict | None = None, allow_newer_opset: bool = False):
    return import_loaded(load(path), shapes, allow_newer_opset)


def describe(path):
    """`tvmopt inspect`'s ModelInfo for a model file of either format."""
    if model_format(path) == TORCH:
        return torch_program.describe(path)
    from .model_info import inspect_model

    return inspect_model(path)


def manifest_entry(path, loaded, imported, allow_newer_opset: bool) -> dict:
    """The artifact manifest's `model` section."""
    from ..files import sha256_file

    entry = {"file": Path(path).name, "sha256": sha256_file(path), "format": model_format(path)}
    if is_program(loaded):
        import torch

        entry["torch_version"] = torch.__version__.split("+")[0]
        return entry
    from .importer import model_opset

    entry.update(opset=imported.opset, declared_opset=model_opset(loaded),
                 allow_newer_opset=allow_newer_opset)
    return entry


def is_program(loaded) -> bool:
    """Whether a loaded model is a torch ExportedProgram (not an onnx.ModelProto)."""
    return not hasattr(loaded, "opset_import")  # an onnx.ModelProto has one
