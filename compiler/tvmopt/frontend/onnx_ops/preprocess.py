"""Graph-level rewrites applied to the ONNX model before import.

`fold_constants`: shape-aware constant folding. Exported graphs and expanded ONNX function bodies
compute reshape targets, axes and pads from `Shape(x)`; when x's shape is static (after ONNX
shape inference), those subgraphs are constants, and folding them here gives TVM's converters
the constant operands they handle best. Symbolic dims are left alone: `Shape` of a tensor with a
symbolic dim is not folded, so TVM keeps it as a symbolic ShapeExpr. Each foldable node is
evaluated with ONNX's reference implementation (`onnx.reference`), so semantics are the spec's.
"""

from __future__ import annotations

import warnings

from ..onnx_model import infer_shapes_or_as_is

# Ops never folded: non-deterministic, with subgraphs, or stateful.
_NO_FOLD = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
            "Bernoulli", "Multinomial", "If", "Loop", "Scan", "SequenceMap", "Optional",
            "OptionalGetElement", "OptionalHasElement", "SequenceConstruct", "SequenceEmpty",
            "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength",
            "SplitToSequence", "ConcatFromSequence", "Constant"}
# Fold only when every input is this small (elements): shape arithmetic, not weight transforms.
_MAX_INPUT_ELEMENTS = 4096
_MAX_OUTPUT_ELEMENTS = 1 << 16


def run(model):
    """Return a model the importer takes; the input is not modified."""
    from . import converter_map

    try:
        model = expand_functions(model, set(converter_map()) | {"If", "Constant"})
    except Exception as err:  # noqa: BLE001 - leave the op to the unsupported-op report
        warnings.warn(f"tvmopt: function expansion skipped: {err}")
    try:
        return fold_constants(model)
    except Exception as err:  # noqa: BLE001 - folding is an optimisation; import still proceeds
        warnings.warn(f"tvmopt: constant folding skipped: {err}")
        return model


def _function_body(node, schema, opset: int, input_types):
    """The FunctionProto defining `node` at `opset` (plain or context-dependent), else None."""
    from onnx import FunctionProto

    versions = [v for v in schema.function_opset_versions if v <= opset]
    ctx_versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    proto = FunctionProto()
    if versions and (not ctx_versions or max(versions) >= max(ctx_versions)):
        proto.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    elif ctx_versions:
        if any(t is None for t in input_types):
            return None
        proto.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(ctx_versions), node.SerializeToString(),
            [t.SerializeToString() for t in input_types]))
    else:
        return None
    return proto


def expand_functions(model, supported: set[str], rounds: int = 3):
    """Replace nodes of ops with no converter by their ONNX function body, when the spec has one.

    Many newer ops (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss, CenterCropPad, Swish,
    RotaryEmbedding, ...) are defined in the spec as functions of simpler ops; expanding them is
    the spec's own semantics. Nested function ops are expanded over a few rounds.
    """
    import onnx
    from onnx import TypeProto, defs
    # onnx's own renaming helper for function bodies (used by its backend test generator).
    from onnx.backend.test.case.node import function_expand_helper

    opset = _default_opset(model)
    for round_ in range(rounds):
        todo = [n for n in model.graph.node if n.domain in ("", "ai.onnx")
                and n.op_type not in supported]
        if not todo:
            return model
        inferred = infer_shapes_or_as_is(model)
        types = {vi.name: vi.type for g in [inferred.graph]
                 for vi in list(g.input) + list(g.value_info) + list(g.output)}
        new_nodes, changed = [], False
        for k, node in enumerate(model.graph.node):
            body = None
            if node in todo:
                try:
                    schema = defs.get_schema(node.op_type, opset, node.domain)
                except defs.SchemaError:  # no such op at this opset: reported later
                    schema = None
                if schema is not None and (schema.has_function or
                                           schema.has_context_dependent_function):
                    full = onnx.NodeProto()
                    full.CopyFrom(node)
                    for name, a in schema.attributes.items():  # defaults the body refers to
                        if a.default_value and a.default_value.name and \
                                name not in {x.name for x in full.attribute}:
                            full.attribute.append(a.default_value)
                    in_types = [types.get(i, TypeProto()) if i else TypeProto()
                                for i in full.input]
                    body = _function_body(full, schema, opset, in_types)
            if body is None:
                new_nodes.append(node)
                continue
            prefix = f"{node.name or node.op_type}_{round_}_{k}__"
            new_nodes.extend(function_expand_helper(full, body, prefix))
            changed = True
        if not changed:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[:]
        out.graph.node.extend(new_nodes)
        model = out
    return model


def _inferred_shapes(model) -> dict[str, tuple[int | None, ...]]:
    """The shape of every value ONNX shape inference can type, None for a dim it cannot
    tell as a number (a symbolic `batch`)."""
    inferred = infer_shapes_or_as_is(model, data_prop=True)
    shapes = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        shapes[vi.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else None
                                for d in t.shape.dim)
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def _static_dims_read(node, partial: dict, values: dict):
    """The output of a Gather or Slice that reads only static dims out of a shape with some
    symbolic ones (`Shape(x)[2]` of a (batch, C, 16, 16) feature map), else None.

    torch writes `math.ceil(h / patch) * patch` over a static image size (MobileViT's
    unfolding) as Shape -> Gather -> Cast -> Div -> Ceil -> ...; with the 16 known here the
    whole chain folds, and the reshape it computes gets constant dims instead of dims known
    only at run time, which later ops (a LayerNorm over a static width) could not match.
    """
    import numpy as np
    from onnx import helper

    dims = partial.get(node.input[0])
    if dims is None:
        return None
    shape = np.array([-1 if d is None else d for d in dims], dtype=np.int64)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        if node.op_type == "Gather":
            if int(attrs.get("axis", 0)) != 0 or node.input[1] not in values:
                return None
            picked = np.take(shape, values[node.input[1]].astype(np.int64))
        else:  # Slice: starts, ends, [axes], [steps] as constant inputs
            args = [values.get(i) if i else None for i in list(node.input[1:]) + [""] * 4][:4]
            starts, ends, axes, steps = args
            if starts is None or ends is None or (node.input[3:4] and node.input[3] and
                                                  axes is None) or \
                    (node.input[4:5] and node.input[4] and steps is None):
                return None
            if axes is not None and [int(a) for a in np.ravel(axes)] not in ([0], [-1]):
                return None
            step = int(np.ravel(steps)[0]) if steps is not None else 1
            picked = shape[slice(int(np.ravel(starts)[0]), int(np.ravel(ends)[0]), step)]
    except (IndexError, ValueError):
        return None
    if (picked < 0).any():
        return None
    return [np.asarray(picked, dtype=np.int64)]


def _default_opset(model) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return 1


def _evaluate(node, values: dict, opset: int):
    """Run one node with ONNX's reference evaluator; None if it cannot."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inputs = [i for i in node.input if i]
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(values[i].dtype),
                                       values[i].shape) for i in inputs],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    del numpy_helper
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = ReferenceEvaluator(model).run(None, {i: values[i] for i in inputs})
    except Exception:  # noqa: BLE001 - onnx.reference raises any type on operands it refuses
        return None  # the node stays in the graph, for TVM to compute
    return outs


def range_length(start: float, limit: float, delta: float) -> int:
    """Elements of ONNX Range(start, limit, delta): max(ceil((limit - start) / delta), 0);
    0 for a zero delta (which Range itself refuses)."""
    import math

    return max(math.ceil((limit - start) / delta), 0) if delta else 0


def _output_elements(node, values: dict, shapes: dict) -> int:
    """The most elements an output of `node` will have, where that is known before running it
    (0 where it is not): from shape inference, or from the input values of the ops whose output
    size is one (ConstantOfShape, Expand, Tile, Range). Small inputs can ask for a huge output,
    which the reference evaluator would build in full before the size check sees it."""
    import math

    import numpy as np

    sizes = [math.prod(shapes[o]) for o in node.output if o in shapes]
    ins = [values.get(i) for i in node.input]
    try:
        if node.op_type == "ConstantOfShape" and ins and ins[0] is not None:
            sizes.append(math.prod(int(d) for d in ins[0].reshape(-1)))
        elif node.op_type == "Expand" and len(ins) == 2 and None not in ins:
            sizes.append(math.prod(np.broadcast_shapes(
                ins[0].shape, tuple(int(d) for d in ins[1].reshape(-1)))))
        elif node.op_type == "Tile" and len(ins) >= 2 and None not in ins[:2]:
            sizes.append(ins[0].size * math.prod(int(r) for r in ins[1].reshape(-1)))
        elif node.op_type == "Range" and len(ins) == 3 and None not in ins:
            sizes.append(range_length(*(float(v.reshape(-1)[0]) for v in ins)))
    except (ValueError, OverflowError, TypeError):
        pass  # the evaluator refuses these operands itself
    return max(sizes, default=0)


def fold_constants(model):
    """Replace nodes computable at compile time (static shapes, constants) with Constants."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    if any(n.domain not in ("", "ai.onnx") for n in graph.node):
        return model  # custom domains: leave their inputs untouched
    opset = _default_opset(model)
    inferred = _inferred_shapes(model)
    shapes = {k: v for k, v in inferred.items() if all(d is not None for d in v)}
    partial: dict[str, tuple[int | None, ...]] = {}  # Shape outputs with symbolic dims
    values: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if np.prod(init.dims, dtype=np.int64) <= _MAX_INPUT_ELEMENTS:
            values[init.name] = numpy_helper.to_array(init)
    graph_inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}

    new_nodes, folded = [], 0
    for node in graph.node:
        outs = None
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            outs = _evaluate(node, values, opset)
            if outs is not None:
                values.update(zip(node.output, outs))
            new_nodes.append(node)
            continue
        if node.op_type in ("Shape", "Size") and node.input[0] in shapes and \
                node.input[0] not in values:
            shape = np.array(shapes[node.input[0]], dtype=np.int64)
            if node.op_type == "Size":
                outs = [np.array(int(np.prod(shape)), dtype=np.int64)]
            else:
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                outs = [shape[attrs.get("start", 0):attrs.get("end", None)]]
        elif node.op_type == "Shape" and node.input[0] in inferred and \
                node.input[0] not in values:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            partial[node.output[0]] = \
                inferred[node.input[0]][attrs.get("start", 0):attrs.get("end", None)]
        elif node.op_type in ("Gather", "Slice") and node.input[0] in partial:
            outs = _static_dims_read(node, partial, values)
        elif node.op_type not in _NO_FOLD and node.domain in ("", "ai.onnx") and \
                not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for a in node.attribute) and \
                all((not i) or (i in values and i not in graph_inputs) for i in node.input) and \
                all(values[i].size <= _MAX_INPUT_ELEMENTS for i in node.input if i) and \
                _output_elements(node, values, shapes) <= _MAX_OUTPUT_ELEMENTS:
            outs = _evaluate(node, values, opset)
            if outs is not None and any(not isinstance(o, np.ndarray) or o.dtype == object or
                                        o.size > _MAX_OUTPUT_ELEMENTS for o in outs):
                outs = None
        if outs is None:
            new_nodes.append(node)
            continue
        folded += 1
        for name, arr in zip(node.output, outs):
            if not name:
                continue
            values[name] = arr
            new_nodes.append(helper.make_node("Constant", [], [name],
                                              value=numpy_helper.from_array(np.asarray(arr), name)))
    if not folded:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(_prune(new_nodes, [o.name for o in graph.output]))
    return out


def _prune(nodes, outputs):
    """Drop nodes whose outputs nothing uses (the folded subgraphs' leftover Constants)."""
    used = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(o in used for o in node.output) or not node.output:
            keep.append(node)
            used.update(i for i in node.input if i)
            for attr in node.attribute:  # names read by subgraphs
                for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    used.update(_subgraph_reads(g))
    return list(reversed(keep))


def _subgraph_reads(graph):
    names = set()
    for node in graph.node:
        names.update(i for i in node.input if i)
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names.update(_subgraph_reads(g))
    return names
