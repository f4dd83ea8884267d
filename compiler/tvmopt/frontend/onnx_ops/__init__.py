"""tvmopt's ONNX op converters, layered over TVM's Relax ONNX frontend.

Each module here registers converters (functions, or classes shaped like TVM's
`OnnxOpConverter`) with `@register`; an entry replaces TVM's converter of the same op type, or
adds a missing one. `converter_map()` is TVM's map with ours on top: the importer in
`tvmopt.frontend.importer` uses it for every node.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

_REGISTRY: dict[str, type] = {}


class _FunctionConverter:
    """A plain `convert(bb, inputs, attr, params, opset)` behind TVM's `get_converter(opset)`."""

    def __init__(self, fn):
        self.fn = fn

    def get_converter(self, opset):
        return functools.partial(self.fn, opset=opset)


def register(*op_types: str):
    """Decorator: use this converter for the given ONNX op types.

    It takes a converter class as TVM writes them (`get_converter(opset)` returning
    `convert(bb, inputs, attr, params)`), or a plain function `convert(bb, inputs, attr, params,
    opset)`, which is returned unchanged. An op type has one converter, covering every opset: a
    converter that builds on another calls it rather than registering the same op again.

    Raises:
        ValueError: an op type already has a converter (otherwise the module imported last would
            silently win).
    """

    def wrap(obj):
        entry = obj if isinstance(obj, type) else _FunctionConverter(obj)
        for op in op_types:
            if op in _REGISTRY:
                raise ValueError(f"ONNX op {op} already has a converter: "
                                 f"{_describe(_REGISTRY[op])}; not registering {_describe(entry)}")
        for op in op_types:
            _REGISTRY[op] = entry
        return obj

    return wrap


def _describe(entry) -> str:
    obj = entry.fn if isinstance(entry, _FunctionConverter) else entry
    return f"{obj.__module__}.{obj.__qualname__}"


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


def converter_map() -> dict[str, object]:
    """TVM's converter map with tvmopt's converters on top."""
    from tvm.relax.frontend.onnx import onnx_frontend

    _load_all()
    merged = dict(onnx_frontend._get_convert_map())
    merged.update(_REGISTRY)
    return merged


def tvmopt_converters() -> dict[str, object]:
    """Only the converters tvmopt adds or replaces."""
    _load_all()
    return dict(_REGISTRY)
