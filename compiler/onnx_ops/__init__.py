"""tvmopt's ONNX op converters, layered over TVM's Relax ONNX frontend.

Each module here registers converters (subclasses of TVM's `OnnxOpConverter`) with `@register`;
an entry replaces TVM's converter of the same op type, or adds a missing one. `converter_map()`
is TVM's map with ours on top: the importer in `tvmopt.frontend` uses it for every node.
"""

from __future__ import annotations

import importlib
import pkgutil

_REGISTRY: dict[str, type] = {}


def register(*op_types: str):
    """Class decorator: use this converter for the given ONNX op types."""

    def wrap(cls):
        for op in op_types:
            _REGISTRY[op] = cls
        return cls

    return wrap


_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def tvm_converter(op_type: str, opset: int):
    """TVM's own converter function for `op_type` at `opset`: what tvmopt's converters fall back
    to (or wrap) for the cases they leave alone."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()[op_type].get_converter(opset)


def converter_map() -> dict[str, type]:
    """TVM's converter map with tvmopt's converters on top."""
    from tvm.relax.frontend.onnx import onnx_frontend

    _load_all()
    merged = dict(onnx_frontend._get_convert_map())
    merged.update(_REGISTRY)
    return merged


def tvmopt_converters() -> dict[str, type]:
    """Only the converters tvmopt adds or replaces."""
    _load_all()
    return dict(_REGISTRY)
