"""`tvmopt inspect`: what a model holds, before any compilation (no TVM needed for most of it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import sha256_file
from ..tensor_info import TensorInfo
from .onnx_model import graph_inputs, graph_outputs, infer_shapes_or_as_is


@dataclass
class ModelInfo:
    path: str
    sha256: str
    opset: int
    ir_version: int
    producer: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    op_histogram: dict[str, int]
    node_count: int
    parameter_count: int
    parameter_bytes: int
    flops: int
    flops_note: str
    unsupported: dict[str, list[str]] = field(default_factory=dict)
    opset_refusal: str | None = None  # why the opset is refused (newer than the importer knows)
    format: str = "onnx"  # or "torch.export" (frontend.torch_program.describe): no opset, no IR
    nonfinite_weights: list[str] = field(default_factory=list)  # initializers with NaN/Inf

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["inputs"] = [i.to_json() for i in self.inputs]
        d["outputs"] = [o.to_json() for o in self.outputs]
        return d


def _shape_map(model, dim_value: int) -> dict[str, tuple]:
    """Static shapes of every value after shape inference, symbolic dims set to `dim_value`."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.dim_value = dim_value
    m = infer_shapes_or_as_is(m, data_prop=True)
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    for t in m.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def estimate_flops(model, dim_value: int = 1) -> tuple[int, int]:
    """Multiply-adds x2 of MatMul/Gemm/Conv/ConvTranspose/attention-like nodes, plus one op per
    output element for the rest. Returns (flops, nodes whose shapes were unknown)."""
    shapes = _shape_map(model, dim_value)
    total, unknown = 0, 0
    for node in model.graph.node:
        ins = [shapes.get(i) for i in node.input]
        outs = [shapes.get(o) for o in node.output]
        out = outs[0] if outs else None
        op = node.op_type
        try:
            if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
                a = ins[0] if op != "QLinearMatMul" else ins[0]
                k = a[-1]
                total += 2 * int(np.prod(out)) * k
            elif op == "Gemm":
                a = ins[0]
                k = a[0] if _attr(node, "transA", 0) else a[1]
                total += 2 * int(np.prod(out)) * k
            elif op in ("Conv", "ConvInteger", "QLinearConv"):
                w = ins[1] if op != "QLinearConv" else ins[3]
                total += 2 * int(np.prod(out)) * int(np.prod(w[1:]))
            elif op == "ConvTranspose":
                w = ins[1]
                total += 2 * int(np.prod(ins[0])) * int(np.prod(w[1:]))
            elif out is not None:
                total += int(np.prod(out))
            else:
                unknown += 1
        except (TypeError, IndexError):
            unknown += 1
    return total, unknown


def inspect_model(path: str | Path, model=None) -> ModelInfo:
    """Describe a model: signature, op histogram, parameters, FLOPs, unsupported ops."""
    import onnx

    from .. import stage

    stage.enter("inspect", str(path))

    from .importer import model_opset, opset_verdict, unsupported_ops
    from .narrow_types import by_onnx
    from .onnx_model import load_onnx, nonfinite_weights

    model = model if model is not None else load_onnx(path)
    params = 0
    pbytes = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if t.dims else 1
        params += n
        narrow = by_onnx(t.data_type)  # int4/int2/float4 are packed in the file
        if narrow is not None:
            pbytes += (n * narrow.bits + 7) // 8
            continue
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        pbytes += n * itemsize
    flops, unknown = estimate_flops(model)
    inputs = graph_inputs(model)
    symbolic = sorted({d for i in inputs for d in (i.shape or ()) if isinstance(d, str)})
    note = "per inference"
    if symbolic:
        note += f", with symbolic dims {', '.join(symbolic)} = 1"
    if unknown:
        note += f"; {unknown} nodes with unknown shapes not counted"
    return ModelInfo(
        path=str(path), sha256=sha256_file(path), opset=model_opset(model),
        ir_version=model.ir_version, producer=f"{model.producer_name} {model.producer_version}".strip(),
        inputs=inputs, outputs=graph_outputs(model),
        op_histogram=dict(Counter(n.op_type for n in model.graph.node).most_common()),
        node_count=len(model.graph.node), parameter_count=params, parameter_bytes=pbytes,
        flops=flops, flops_note=note, unsupported=unsupported_ops(model),
        opset_refusal=opset_verdict(model), nonfinite_weights=nonfinite_weights(model),
    )
