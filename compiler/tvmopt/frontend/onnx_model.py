"""Loading and describing ONNX models, without TVM: used by `inspect` and before import."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ModelError, ShapeError, UnsupportedOpError, error_line
from ..tensor_info import TensorInfo


def load_onnx(path: str | Path):
    """Load and validate an ONNX model file.

    Raises:
        ModelError: the file is missing, not an ONNX protobuf, truncated, or structurally invalid.
    """
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, expected an .onnx file")
    data = p.read_bytes()
    if not data:
        raise ModelError(f"{p}: file is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelError(f"{p}: not a valid ONNX file (protobuf decode failed: {err}); "
                         "is it truncated or a different format?") from None
    # protobuf is lenient: arbitrary bytes can decode into an almost-empty message.
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.output:
        raise ModelError(f"{p}: not a valid ONNX model (no ir_version or graph outputs); "
                         "is it truncated or a different format?")
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    # every tensor, Constant attributes and subgraph initializers included: one left unloaded
    # would reach the importer with no data. onnx refuses locations outside the model's folder
    # (absolute, '..', symbolic links), so a model cannot read other files through them.
    if any(uses_external_data(t) for t in _get_all_tensors(model)):
        try:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(model, str(p.parent))
        except Exception as err:
            raise ModelError(f"{p}: cannot load external tensor data: {err}") from None
    _check_tensor_sizes(model, p)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, UnicodeDecodeError) as err:  # a string field's bytes
        raise ModelError(f"{p}: invalid ONNX model: {error_line(err, 'invalid model')}") from None
    return model


# Bits per element of the types onnx packs below a byte.
_PACKED_BITS = {21: 4, 22: 4, 23: 4, 24: 2, 25: 2}  # uint4, int4, float4e2m1, int2, uint2


def _check_tensor_sizes(model, path) -> None:
    """Refuse a tensor whose raw bytes do not hold exactly its dims' elements of its type (the
    checker does not look; the importer would fail on a reshape far from the cause).

    Raises:
        ModelError: naming the tensor, its type and dims, and both byte counts.
    """
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    for t in _get_all_tensors(model):
        if not t.HasField("raw_data") or t.data_type in (0, onnx.TensorProto.STRING):
            continue
        n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        try:
            bits = _PACKED_BITS.get(t.data_type) or 8 * np.dtype(
                onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor '{t.name}' has unknown data_type {t.data_type}") from None
        need = (n * bits + 7) // 8
        if len(t.raw_data) != need:
            type_name = onnx.TensorProto.DataType.Name(t.data_type).lower()
            raise ModelError(f"{path}: tensor '{t.name}' ({type_name}, dims {list(t.dims)}) holds "
                             f"{len(t.raw_data)} bytes of data, its type and dims need {need}")


def nonfinite_weights(model) -> list[str]:
    """Initializers and Constant values holding NaN or Inf, one line each ("initializer
    'beta': 1 NaN of 6 values"): almost always a broken export, and where NaN meets Relu, Clip,
    Max or Min TVM returns the other operand, where onnxruntime propagates the NaN."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import _get_all_tensors

    out = []
    for t in _get_all_tensors(model):
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                               onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            continue
        try:
            a = numpy_helper.to_array(t).astype(np.float32)
        except (ValueError, OSError, onnx.checker.ValidationError):
            # Unreadable data (a value count its dims do not take, an external file missing or
            # outside the model's folder) has no values to check; refusing it is load_onnx's.
            continue
        line = nonfinite_line(a, f"initializer '{t.name or '<constant>'}'")
        if line:
            out.append(line)
    return out


def infer_shapes_or_as_is(model, data_prop: bool = False):
    """`model` with ONNX shape inference's value_info, or `model` itself where inference
    refuses it: every caller reads the types and shapes it finds and treats the rest as
    unknown, so a refusal is the answer "nothing inferred"."""
    import onnx
    from google.protobuf.message import EncodeError

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, EncodeError):
        # Inference's and onnx's checker's refusals, and a model over protobuf's 2 GB, which
        # cannot be serialized for the C++ inference.
        return model


def nonfinite_line(a: np.ndarray, label: str) -> str | None:
    """`label: 3 NaN, 1 Inf of 64 values` for a float array holding either, else None."""
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    if not (nan or inf):
        return None
    parts = [f"{k} {what}" for k, what in ((nan, "NaN"), (inf, "Inf")) if k]
    return f"{label}: {', '.join(parts)} of {a.size} values"


def _dtype_name(elem_type: int) -> str:
    import onnx

    if elem_type == 0:
        return "unknown"
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    return {"bool": "bool"}.get(str(np_dtype), str(np_dtype))


def _value_info(vi) -> TensorInfo:
    tt = vi.type.tensor_type
    dtype = _dtype_name(tt.elem_type)
    if not tt.HasField("shape"):
        return TensorInfo(vi.name, None, dtype)
    return TensorInfo(vi.name, tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                     for d in tt.shape.dim), dtype)


def graph_inputs(model) -> list[TensorInfo]:
    """The real inputs: graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    return [_value_info(vi) for vi in model.graph.input if vi.name not in inits]


def graph_outputs(model) -> list[TensorInfo]:
    return [_value_info(vi) for vi in model.graph.output]


def parse_shape_spec(spec: str) -> tuple[str, tuple[int, ...]]:
    """Parse a --shape argument 'NAME=1x3x224x224' (also 'NAME=1,3,224,224' or 'NAME=' for scalar)."""
    if "=" not in spec:
        raise ShapeError(f"--shape '{spec}': expected NAME=DIMxDIMx... e.g. input=1x3x224x224")
    name, dims = spec.rsplit("=", 1)
    dims = dims.strip()
    if not dims:
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.replace(",", "x").split("x"))
    except ValueError:
        raise ShapeError(f"--shape '{spec}': dimensions must be integers, e.g. {name}=1x3x224x224") from None
    if any(d <= 0 for d in shape):
        raise ShapeError(f"--shape '{spec}': dimensions must be positive")
    return name, shape


def parse_shapes(specs) -> dict[str, tuple[int, ...]]:
    """Parse every --shape argument (see parse_shape_spec) into {input name: shape}.

    The one parser of shape specs: compile, plan, tune and bench all read --shape through it.

    Raises:
        ShapeError: a malformed spec, or the same input named twice.
    """
    parsed: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, shape = parse_shape_spec(spec)
        if name in parsed:
            raise ShapeError(f"--shape given twice for '{name}'")
        parsed[name] = shape
    return parsed


def fixed_named_dims(inputs: list[TensorInfo], overrides: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Named dims an override fixes: `--shape input_ids=1x1` over `[batch, seq]` fixes batch
    and seq to 1, in every input that names them (a decoder's past `[batch, heads, past, d]`
    then has batch 1 too, as it must). A name given two values by two overrides is left as it
    is declared elsewhere."""
    given: dict[str, set[int]] = {}
    for inp in inputs:
        shape = overrides.get(inp.name)
        if shape is None or inp.shape is None or len(shape) != len(inp.shape):
            continue
        for declared, value in zip(inp.shape, shape):
            if isinstance(declared, str):
                given.setdefault(declared, set()).add(int(value))
    return {name: next(iter(values)) for name, values in given.items() if len(values) == 1}


def resolve_input_shapes(model, overrides: dict[str, tuple[int, ...]]) -> list[TensorInfo]:
    """Apply --shape overrides to the graph inputs and check them.

    Named symbolic dims stay symbolic (Relax keeps them, so the artifact runs any size), except
    those an override fixes (`fixed_named_dims`): fixed in every input that names them.
    Unnamed unknown dims and unknown ranks need an override.

    Raises:
        ShapeError: an override names no input or has the wrong rank, or a dim is unknown.
    """
    _check_tensor_inputs(model)
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    for name in overrides:
        if name not in names:
            raise ShapeError(f"--shape names '{name}', which is not a model input "
                             f"(inputs: {', '.join(names)})")
    fixed = fixed_named_dims(inputs, overrides)
    out = []
    for inp in inputs:
        if inp.name not in overrides and inp.shape is not None and \
                any(isinstance(d, str) and d in fixed for d in inp.shape):
            inp = TensorInfo(inp.name, tuple(fixed.get(d, d) if isinstance(d, str) else d
                                             for d in inp.shape), inp.dtype)
        if inp.name in overrides:
            shape = overrides[inp.name]
            if inp.shape is not None and len(inp.shape) != len(shape):
                raise ShapeError(f"--shape {inp.name}: rank {len(shape)} given, the model's input "
                                 f"has rank {len(inp.shape)} ({inp.shape_str()})")
            for i, (given, declared) in enumerate(zip(shape, inp.shape or shape)):
                if isinstance(declared, int) and declared != given:
                    raise ShapeError(f"--shape {inp.name}: dimension {i} is fixed to {declared} "
                                     f"by the model, {given} given")
            out.append(TensorInfo(inp.name, tuple(shape), inp.dtype))
            continue
        if inp.shape is None:
            raise ShapeError(f"input '{inp.name}' has unknown rank; pass --shape "
                             f"{inp.name}=DIMxDIMx...")
        unknown = [i for i, d in enumerate(inp.shape) if d is None]
        if unknown:
            example = "x".join("N" if d is None else str(d) for d in inp.shape)
            raise ShapeError(f"input '{inp.name}' dimension {unknown[0]} is dynamic and unnamed, so "
                             f"it cannot stay symbolic; pass --shape {inp.name}={example} "
                             "with N a number")
        out.append(inp)
    return out


_KINDS = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
          "sparse_tensor_type": "a sparse tensor"}


def _check_tensor_inputs(model) -> None:
    """Refuse a graph input that is not a dense tensor by name and kind (otherwise it reads as a
    tensor of unknown rank, and the user is told to pass a --shape that cannot help).

    Raises:
        UnsupportedOpError: naming the input and what it is.
    """
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        kind = vi.type.WhichOneof("value")
        if vi.name not in inits and kind in _KINDS:
            raise UnsupportedOpError(f"input '{vi.name}' is {_KINDS[kind]}: only tensor inputs "
                                     "are supported")
