"""ONNX -> Relax import: TVM's ONNX frontend with tvmopt's converters and error reporting."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from dataclasses import dataclass

from ..errors import ImportFailure, ShapeError, TvmoptError, UnsupportedOpError, error_line
from ..tensor_info import TensorInfo
from .onnx_model import graph_outputs, resolve_input_shapes

# Ops the importer handles itself rather than through the converter map.
_BUILTIN_OPS = {"If", "Constant", "Scan", "Loop"}  # Scan/Loop: onnx_ops.control_flow
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Contrib ops whose converters implement that domain's own definition. An op is matched by
# (domain, op type), never by op type alone: a `com.example::MatMul` converted as ONNX's MatMul
# would be a different model that compiles and runs without a word.
_CONTRIB_OPS = {"com.microsoft": frozenset({"BiasGelu", "EmbedLayerNormalization", "FastGelu",
                                            "Gelu", "MatMulInteger16",
                                            "SkipLayerNormalization"})}


def newest_known_opset() -> int:
    """The newest ai.onnx opset the importer knows: the installed onnx's (its node cases are the
    conformance suite the converters are checked with)."""
    import onnx.defs

    return onnx.defs.onnx_opset_version()


def opset_verdict(model) -> str | None:
    """Why the model's ai.onnx opset is refused (newer than the importer knows), else None."""
    opset, newest = model_opset(model), newest_known_opset()
    if opset > newest:
        return (f"the model declares ai.onnx opset {opset}, newer than the newest this importer "
                f"knows ({newest}): ops may mean something else there; pass "
                f"--allow-newer-opset to compile it as opset {newest} (recorded in the manifest)")
    return None


def model_opset(model) -> int:
    for op in model.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return op.version
    return 1


def _iter_nodes(graph):
    """All nodes, including those inside subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.HasField("g"):
                yield from _iter_nodes(attr.g)
            for g in attr.graphs:
                yield from _iter_nodes(g)


def unsupported_ops(model) -> dict[str, list[str]]:
    """Op types the importer cannot convert, each with the names of the nodes using it.

    Keys are 'op_type' for the default domain and 'domain::op_type' otherwise.
    """
    from .onnx_ops import converter_map

    import onnx.defs

    known = set(converter_map()) | _BUILTIN_OPS
    local_functions = {(f.domain, f.name) for f in model.functions}
    missing: dict[str, list[str]] = {}
    for node in _iter_nodes(model.graph):
        if (node.domain, node.op_type) in local_functions:
            continue  # expanded by inlining before import
        if node.domain in _DEFAULT_DOMAINS:
            ok = node.op_type in known and (node.op_type in _BUILTIN_OPS or
                                            onnx.defs.has(node.op_type, ""))
        else:
            ok = node.op_type in known and node.op_type in _CONTRIB_OPS.get(node.domain, ())
        if not ok:
            key = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"
            missing.setdefault(key, []).append(node.name or f"<unnamed {node.op_type}>")
    return missing


def _unsupported_message(model, missing: dict[str, list[str]]) -> str:
    opset = model_opset(model)
    parts = []
    for op, nodes in sorted(missing.items()):
        shown = ", ".join(nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")
        parts.append(f"{op} (nodes: {shown})")
    return f"unsupported ONNX op types at opset {opset}: " + "; ".join(parts)


class _ReadAttrs(dict):
    """A converter's attribute dict that records which attributes the converter looked at.

    Listing, copying or iterating counts as reading all of them (the converter may pass them
    on wholesale), so the check errs towards accepting, never towards a false refusal.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set = set()
        self.all_read = False

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self.read.add(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        self.read.add(key)
        return super().setdefault(key, default)

    def _everything(self):
        self.all_read = True

    def __iter__(self):
        self._everything()
        return super().__iter__()

    def keys(self):
        self._everything()
        return super().keys()

    def items(self):
        self._everything()
        return super().items()

    def values(self):
        self._everything()
        return super().values()

    def copy(self):
        self._everything()
        return dict(super().items())


def _read_inputs_class():
    from tvm.relax.frontend.onnx.onnx_frontend import onnx_input

    class ReadInputs(onnx_input):
        """The node's inputs, recording which positions the converter took."""

        def __init__(self, items):
            super().__init__(items)
            self.read: set = set()
            self.all_read = False

        def __getitem__(self, item):
            if isinstance(item, int):
                self.read.add(item if item >= 0 else len(self) + item)
                return list.__getitem__(self, item) if item < len(self) else None
            return super().__getitem__(item)

        def __iter__(self):
            self.all_read = True
            return super().__iter__()

    return ReadInputs


def _schema(op_type: str, opset: int, domain: str = ""):
    import onnx.defs

    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:  # no schema: a contrib op, or none at this opset
        return None


def _is_default(schema, attr_proto) -> bool:
    """Whether an attribute as set on the node equals the spec's default for it."""
    from onnx import helper

    if schema is None or attr_proto.name not in schema.attributes:
        return False
    default = schema.attributes[attr_proto.name].default_value
    if default is None or not default.name and default.type == 0:
        return False  # no default in the spec: setting it always means something
    try:
        return helper.get_attribute_value(attr_proto) == helper.get_attribute_value(default)
    except ValueError:  # onnx cannot read it (a reference attribute, an unknown type): not the default
        return False


def _show(attr_proto) -> str:
    from onnx import helper

    try:
        value = helper.get_attribute_value(attr_proto)
    except ValueError:  # onnx cannot read it (a reference attribute, an unknown type)
        return "?"
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    text = repr(value) if isinstance(value, (str, int, float, list, tuple)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def ignored_by_converter(node, attrs: "_ReadAttrs", inputs, opset: int) -> str | None:
    """What of `node` its converter did not read (attributes set to a non-default value, given
    optional inputs), as a refusal message; None when the converter read everything.

    A converter that never looks at an attribute computes the op as if it had its default:
    a different model that compiles and runs without a word.
    """
    schema = _schema(node.op_type, opset, node.domain if node.domain != "ai.onnx" else "")
    ignored = []
    if not attrs.all_read:
        for a in node.attribute:
            if a.name not in attrs.read and not _is_default(schema, a):
                ignored.append(f"attribute {a.name}={_show(a)}")
    if not getattr(inputs, "all_read", True):
        for k, name in enumerate(node.input):
            if name and k not in inputs.read:
                label = (schema.inputs[k].name if schema is not None and k < len(schema.inputs)
                         else f"#{k}")
                ignored.append(f"input {k} ('{label}' = {name})")
    if not ignored:
        return None
    who = node.name or f"<unnamed {node.op_type}>"
    return (f"node '{who}' ({node.op_type}, opset {opset}): the converter does not implement "
            f"{'; '.join(ignored)}; refusing rather than ignoring it")


def _check_empty_inputs(node, opset: int) -> None:
    """An empty input name stands for an omitted optional input; anywhere else (a variadic
    input, a required one) it is refused here, before TVM's converters crash on the gap.

    Raises:
        ImportFailure: naming the node, op and input position.
    """
    if all(node.input):
        return
    schema = _schema(node.op_type, opset, node.domain if node.domain != "ai.onnx" else "")
    if schema is None:
        return
    from onnx.defs import OpSchema

    for k, name in enumerate(node.input):
        if name:
            continue
        formal = schema.inputs[min(k, len(schema.inputs) - 1)] if schema.inputs else None
        if formal is None or formal.option != OpSchema.FormalParameterOption.Optional:
            who = node.name or f"<unnamed {node.op_type}>"
            raise ImportFailure(f"node '{who}' ({node.op_type}): input {k} is empty, but "
                                f"'{formal.name if formal else k}' is not optional")


# Attribute values the spec's types allow but its text does not, which TVM's converters would
# take anyway (a keepdims of 2 read as true, a negative epsilon turning sqrt(var + eps) into NaN
# where onnxruntime refuses or clamps): refused by name rather than reinterpreted.
_BOOLEAN_ATTRS = {"keepdims", "select_last_index", "noop_with_empty_axes", "transA", "transB",
                  "count_include_pad", "ceil_mode", "exclusive", "reverse", "largest", "sorted",
                  "center_point_box", "detect_negative", "detect_positive", "upper", "periodic",
                  "onesided", "inverse", "layout"}
_NON_NEGATIVE_ATTRS = {"epsilon"}


def _check_attribute_values(node) -> None:
    """Raises ImportFailure naming the node, op and attribute whose value the op cannot mean."""
    from onnx import AttributeProto

    for a in node.attribute:
        who = node.name or f"<unnamed {node.op_type}>"
        if a.type == AttributeProto.INT and a.name in _BOOLEAN_ATTRS and a.i not in (0, 1):
            raise ImportFailure(f"node '{who}' ({node.op_type}): attribute {a.name}={a.i} must be "
                                "0 or 1")
        if a.type == AttributeProto.FLOAT and a.name in _NON_NEGATIVE_ATTRS and not a.f >= 0:
            raise ImportFailure(f"node '{who}' ({node.op_type}): attribute {a.name}={a.f} must be "
                                ">= 0")


def _check_if_branches(node) -> None:
    """An If whose branches return an Optional is refused by name: TVM imports If itself (not
    through a converter) and fails inside on the empty-Optional value with an internal message.

    Raises:
        UnsupportedOpError: naming the node, the branch and its output.
    """
    if node.op_type != "If":
        return
    for a in node.attribute:
        if a.name not in ("then_branch", "else_branch"):
            continue
        for out in a.g.output:
            if out.type.WhichOneof("value") == "optional_type":
                who = node.name or f"<unnamed {node.op_type}>"
                raise UnsupportedOpError(f"node '{who}' (If): {a.name} output '{out.name}' is "
                                         "an Optional, which the importer does not support")


def _who(node, opset: int) -> str:
    return f"node '{node.name or f'<unnamed {node.op_type}>'}' ({node.op_type}, opset {opset})"


def _unknown_rank_reason(node, inputs: list, err: BaseException) -> str:
    """Why a converter failed, in words when an input's rank or dims are unknown at compile time
    (a shape that follows from run-time values, e.g. Squeeze without axes of a tensor whose dims
    are computed): TVM's own message then is an internal check about a missing shape."""
    from tvm import relax

    reason = error_line(err)
    for k, v in enumerate(inputs):
        ty = getattr(v, "ty", None) if isinstance(v, relax.Expr) else None
        unknown = (isinstance(ty, (relax.TensorType, relax.ShapeType)) and ty.ndim < 0 or
                   isinstance(ty, relax.TensorType) and ty.shape is None)
        if unknown:
            name = f" '{node.input[k]}'" if node is not None and k < len(node.input) else ""
            what = "a length" if isinstance(ty, relax.ShapeType) else \
                "a rank" if ty.ndim < 0 else "dims"
            return (f"input {k}{name} has {what} unknown at compile time (it follows from "
                    f"values computed at run time), which this op needs ({reason})")
    return reason


def _check_no_strings(model) -> None:
    """Refuse a graph with a string tensor (an input, initializer or Constant) by name, before
    TVM fails on numpy's `object` dtype with a message naming neither the tensor nor the node.

    Raises:
        UnsupportedOpError: naming the tensor and the first node that reads it.
    """
    from onnx import TensorProto

    strings = [vi.name for vi in model.graph.input
               if vi.type.tensor_type.elem_type == TensorProto.STRING]
    strings += [t.name for t in model.graph.initializer if t.data_type == TensorProto.STRING]
    strings += [n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output
                and any(a.t.data_type == TensorProto.STRING or a.strings for a in n.attribute)]
    if not strings:
        return
    first = strings[0]
    reader = next((n for n in _iter_nodes(model.graph) if first in n.input), None)
    where = f" read by node '{reader.name or f'<unnamed {reader.op_type}>'}' ({reader.op_type})" \
        if reader is not None else ""
    more = f" (and {len(strings) - 1} more)" if len(strings) > 1 else ""
    raise UnsupportedOpError(f"tensor '{first}'{more}{where} holds strings: string tensors are "
                             "not supported")


class _OneNode:
    """A graph holding one node, for feeding TVM's importer node by node."""

    def __init__(self, node):
        self.node = [node]


# Binary ops TVM's converter folds in numpy when both operands are known scalars.
_FOLDED_ARITHMETIC = ("Add", "Sub", "Mul", "Div")
# Multidirectional-broadcasting ops: operands whose equal dims are spelled differently are
# asserted to one spelling first (shape_values.agree_broadcast_dims).
_BROADCASTING = ("Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Mean", "Sum",
                 "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
                 "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Mod", "PRelu")


def _make_importer_class():
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    from .onnx_ops import converter_map

    class Importer(ONNXGraphImporter):
        """TVM's importer, using tvmopt's converter map and naming the node that failed."""

        def _check_for_unsupported_ops(self, graph):
            pass  # done before import by unsupported_ops(), with node names

        def _construct_nodes(self, graph):
            # TVM refuses a node whose input is a shape value (Shape(x) kept as a ShapeExpr, a
            # dim as a scalar) unless the op is on its short list, which fails expanded function
            # bodies (LayerNormalization_expanded: Shape -> ConstantOfShape -> ...). Feed such
            # inputs as int64 tensors instead, one node at a time.
            from .onnx_ops import control_flow, shape_values

            for node in graph.node:
                _check_empty_inputs(node, self.opset)
                _check_attribute_values(node)
                _check_if_branches(node)
                try:
                    node = shape_values.materialize_inputs(self.bb, self._nodes, node)
                    if node.op_type in control_flow.UNROLLED:  # they need the importer
                        control_flow.unroll(self, node)
                        continue
                    if node.op_type == "If" and control_flow.fold_constant_if(self, node):
                        continue
                    self._current_node = node
                    super()._construct_nodes(_OneNode(node))
                except TvmoptError:
                    raise
                except Exception as err:
                    # Anything else escaping here (TVM's own If import, an internal check while
                    # normalizing) is still this node's failure: say which node.
                    raise ImportFailure(f"{_who(node, self.opset)}: {error_line(err)}") from err
            # A graph output that is a shape value (e.g. Shape(x) itself) leaves as a tensor.
            for out in graph.output:
                value = self._nodes.get(out.name)
                if value is not None and (shape_values.prim_of(value) is not None or
                                          shape_values._is_shape_value(value)):
                    self._nodes[out.name] = shape_values.as_shape_tensor(self.bb, value)

        def _convert_subgraph(self, bb, graph):
            # A branch or loop body goes through the same per-node path as the main graph (its
            # checks, shape-value inputs, nested constant Ifs), not TVM's bare converter loop.
            outer = dict(self._nodes)
            try:
                for init in graph.initializer:
                    self._nodes[init.name] = relax.const(self._parse_array(init))
                self._construct_nodes(graph)
                outs = [self._nodes[o.name] for o in graph.output]
                return outs[0] if len(outs) == 1 else relax.Tuple(outs)
            finally:
                self._nodes = outer

        def _convert_operator(self, op_name, inputs, attrs, opset):
            cmap = converter_map()
            if op_name not in cmap:
                raise UnsupportedOpError(f"unsupported ONNX op type {op_name} at opset {opset}")
            node_name = attrs.get("tvm_custom", {}).get("name") or f"<unnamed {op_name}>"
            node = getattr(self, "_current_node", None)
            if node is not None and node.op_type == op_name:
                attrs = _ReadAttrs(attrs)
                attrs.read.add("tvm_custom")
                inputs = _read_inputs_class()(list.__iter__(inputs))
            from .onnx_ops import shape_values

            if op_name in _BROADCASTING:
                agreed = shape_values.agree_broadcast_dims(self.bb, list(list.__iter__(inputs)))
                for k, v in enumerate(agreed):
                    list.__setitem__(inputs, k, v)
            keep_rank = None
            if op_name in _FOLDED_ARITHMETIC:
                # a scalar dim beside a constant array: the result keeps the array's rank
                operands, keep_rank = shape_values.scalar_fold_operands(
                    self.bb, list(list.__iter__(inputs)))
                for k, v in enumerate(operands):
                    list.__setitem__(inputs, k, v)
            from . import run_time_checks

            try:
                with run_time_checks.at_node(node_name, op_name, list(node.input)
                                             if node is not None and node.op_type == op_name
                                             else []):
                    sym = cmap[op_name].get_converter(opset)(self.bb, inputs, attrs,
                                                              [self._nodes, self._params])
                if isinstance(attrs, _ReadAttrs):
                    ignored = ignored_by_converter(node, attrs, inputs, opset)
                    if ignored:
                        raise UnsupportedOpError(ignored)
                if keep_rank is not None:
                    sym = keep_rank(sym)
                if isinstance(sym, relax.Expr):
                    sym = self._normalize(op_name, inputs, sym)
            except TvmoptError:
                raise
            except Exception as err:
                reason = _unknown_rank_reason(node if node is not None and node.op_type == op_name
                                              else None, list(list.__iter__(inputs)), err)
                raise ImportFailure(f"node '{node_name}' ({op_name}, opset {opset}): {reason}") from err
            return sym

        def _normalize(self, op_name, inputs, sym):
            from .onnx_ops import shape_values

            if op_name in _FOLDED_ARITHMETIC:
                sym = shape_values.keep_scalar_dtype(sym, inputs)
            sym = self.bb.normalize(sym)
            known = self.__dict__.setdefault("_known_dims", {})
            for v in list(inputs) + [sym]:
                for d in shape_values.dims_of(v):
                    known.setdefault(str(d), d)
            return shape_values.tighten_shape(self.bb, sym, list(known.values()))

    return Importer


@dataclass
class ImportedModel:
    """A Relax module together with the model's input/output descriptions."""

    mod: object  # tvm.IRModule
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int


def _prepare(model):
    """Normalise what exporters emit into something the importer takes."""
    if model.functions:
        # torch.onnx (dynamo) and onnxscript emit model-local functions; inline them.
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    from .onnx_ops import preprocess

    return preprocess.run(model)


def import_onnx(model, shape_overrides: dict[str, tuple[int, ...]] | None = None,
                allow_newer_opset: bool = False) -> ImportedModel:
    """Import an ONNX ModelProto into a Relax IRModule with weights bound as constants.

    Args:
        model: a loaded, checked onnx.ModelProto (see onnx_model.load_onnx).
        shape_overrides: static shapes for inputs ('--shape'); named dynamic dims otherwise stay
            symbolic.
        allow_newer_opset: import a model whose ai.onnx opset is newer than the importer knows
            as the newest it knows (otherwise refused).

    Raises:
        UnsupportedOpError: op types with no converter, or of a domain whose op the importer
            does not implement (all listed, with node names); an opset newer than it knows.
        ShapeError: an input dim is unknown and not given, or symbolic dims cannot be kept.
        ImportFailure: a node failed to convert (named).
    """
    from tvm import relax

    overrides = dict(shape_overrides or {})
    inputs = resolve_input_shapes(model, overrides)
    declared = graph_outputs(model)
    model = _prepare(model)
    # 8/4/2-bit tensors travel as int8/uint8 carriers inside tvmopt (onnx_ops/narrow.py)
    from .narrow_types import carrier_name
    from .onnx_ops.narrow import carry_in_bytes

    model, narrow_outputs = carry_in_bytes(model)
    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOpError(_unsupported_message(model, missing))
    too_new = opset_verdict(model)
    if too_new and not allow_newer_opset:
        raise UnsupportedOpError(too_new)
    _check_no_strings(model)

    opset = min(model_opset(model), newest_known_opset())
    shape_dict = {i.name: list(i.shape) for i in inputs if i.name in overrides}
    dtype_dict = {i.name: carrier_name(i.dtype) for i in inputs}
    importer = _make_importer_class()(shape_dict, dtype_dict, keep_params_in_input=False,
                                      sanitize=True)
    symbolic = [f"{i.name}[{k}]={d}" for i in inputs for k, d in enumerate(i.shape)
                if isinstance(d, str)]
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
                _dims_fixed_in_graph(model, inputs, overrides):
            warnings.simplefilter("ignore")
            mod = importer.from_onnx(model.graph, opset)
    except (UnsupportedOpError, ShapeError) as err:
        raise err from None
    except ImportFailure as err:
        if symbolic:
            raise ShapeError(f"{err}; with symbolic dimensions {', '.join(symbolic)}: pass --shape "
                             "to make them static") from None
        raise ImportFailure(str(err)) from None
    except Exception as err:
        reason = error_line(err)
        if symbolic:
            raise ShapeError(f"import failed with symbolic dimensions {', '.join(symbolic)}: "
                             f"{reason}; pass --shape to make them static") from None
        raise ImportFailure(f"import failed: {reason}") from None
    computed = _output_infos(mod, model, inputs)
    _check_declared_outputs(declared, computed)
    outputs = [TensorInfo(o.name, o.shape, narrow_outputs.get(o.name, o.dtype)) for o in computed]
    return ImportedModel(mod=mod, inputs=inputs, outputs=outputs, opset=opset)


@contextlib.contextmanager
def _dims_fixed_in_graph(model, inputs: list[TensorInfo], overrides: dict):
    """The graph inputs not overridden but with a named dim an override fixed
    (`onnx_model.fixed_named_dims`) declare that dim as the number while TVM reads them;
    the model is as it was afterwards."""
    by_name = {i.name: i for i in inputs if i.name not in overrides and i.shape is not None}
    changed = []
    for vi in model.graph.input:
        info = by_name.get(vi.name)
        if info is None or not vi.type.HasField("tensor_type"):
            continue
        for d, value in zip(vi.type.tensor_type.shape.dim, info.shape):
            if d.HasField("dim_param") and isinstance(value, int):
                changed.append((d, d.dim_param))
                d.dim_value = value
    try:
        yield
    finally:
        for d, param in changed:
            d.dim_param = param


def _check_declared_outputs(declared: list[TensorInfo], computed: list[TensorInfo]) -> None:
    """Refuse a model whose graph outputs declare another dtype than the graph computes
    (onnxruntime refuses these too): one of the two is not what was meant. Declared dims are
    not compared: exporters write the example's size of a data-dependent output (NMS).

    Raises:
        ImportFailure: naming the output, what it declares and what the graph computes.
    """
    from .narrow_types import by_name, carrier_name

    for want, got in zip(declared, computed):
        # 8/4/2-bit outputs leave the graph as their int8/uint8 carriers
        if want.dtype != "unknown" and carrier_name(want.dtype) != got.dtype:
            computes = got.dtype if by_name(want.dtype) is None else f"{got.dtype} (not the " \
                f"{carrier_name(want.dtype)} carrier of {want.dtype})"
            raise ImportFailure(f"output '{want.name}' is declared {want.dtype}, but the graph "
                                f"computes {computes}")


def _struct_to_info(name: str, sinfo, input_dims: set[str]) -> TensorInfo:
    from tvm import relax

    if not isinstance(sinfo, relax.TensorType):
        raise ImportFailure(f"output '{name}' is not a tensor ({sinfo}); only tensor outputs are supported")
    if sinfo.shape is None or not hasattr(sinfo.shape, "values"):
        # rank known, sizes decided at run time (NonZero, Unique, a shape read from an input)
        shape = None if sinfo.ndim < 0 else (None,) * sinfo.ndim
    else:
        shape = tuple(_output_dim(v, input_dims) for v in sinfo.shape.values)
    return TensorInfo(name, shape, str(sinfo.dtype))


def _output_dim(expr, input_dims: set[str]):
    """An int, a symbolic expression of the inputs' named dims, or None (data-dependent)."""
    from tvm import tirx

    if hasattr(expr, "value"):
        return int(expr.value)
    names = {v.name for v in tirx.analysis.undefined_vars(expr)}
    if not names <= input_dims:
        return None
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(expr))


def _output_infos(mod, model, inputs) -> list[TensorInfo]:
    from tvm import relax

    ret = mod["main"].ret_ty
    names = [o.name for o in model.graph.output]
    fields = ret.fields if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(names):
        raise ImportFailure(f"imported graph returns {len(fields)} values, the model declares "
                            f"{len(names)} outputs")
    input_dims = {d for i in inputs for d in (i.shape or ()) if isinstance(d, str)}
    return [_struct_to_info(n, s, input_dims) for n, s in zip(names, fields)]
