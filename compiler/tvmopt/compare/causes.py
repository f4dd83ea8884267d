"""The named causes of a latency difference, and which cause each kernel's time belongs to.

A kernel is an onnxruntime node (its op type and the shapes its profiler records) or a tvmopt
callee: a fused TIR kernel (the ops fused into it, from the plan, and the plan's FLOPs and
bytes), a oneDNN library call (its primitive, precision and shapes, from its arguments) or a VM
builtin. All are reduced to one `Kernel` with a cause, chosen from what the kernel computes,
never from how it is named; `attribution` only adds times per cause.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

# (id, label, what it means); order is the report's order
CAUSES = (
    ("quantize", "quantize/dequantize/cast work",
     "DynamicQuantizeLinear, QuantizeLinear, DequantizeLinear, Cast and the min/max/scale "
     "arithmetic of dynamic quantization"),
    ("int8_compute", "integer convolutions/matmuls and their rescale",
     "ConvInteger, MatMulInteger, DynamicQuantizeMatMul, QLinear*; in tvmopt the fused kernels "
     "and oneDNN int8 calls computing them (a dynamic int8 call also quantizes its input)"),
    ("lost_fusion", "extra kernels from lost fusion (count, dispatch overhead)",
     "standalone elementwise kernels (an activation fusion left on its own), the VM builtins "
     "that allocate and check tensors between kernels, and time outside kernels, which grows "
     "with the number of kernels run"),
    ("memory_bound", "memory-bound kernels",
     "matmuls (TIR or oneDNN), normalizations, reductions, pooling, gathers under the "
     "target's roofline ridge"),
    ("layout", "layout transforms",
     "Transpose, ReorderInput/ReorderOutput (NCHWc), layout_transform, reshapes and copies"),
    ("low_intensity_conv", "low-intensity convolutions (depthwise)",
     "depthwise/grouped convolutions, and convolutions under the roofline ridge"),
    ("compute", "dense compute",
     "compute-bound convolutions and matmuls (TIR or oneDNN, fp32 or bf16); negative when "
     "the variant does less of it"),
)
CAUSE_IDS = tuple(c[0] for c in CAUSES)
OTHER = "other"  # kernels no rule names: reported as unexplained
LABELS = {c[0]: c[1] for c in CAUSES} | {OTHER: "unexplained"}


@dataclass
class Kernel:
    """One kernel of a profile, per inference (calls and times are per run)."""

    name: str
    op: str  # onnxruntime op type, or the fused ops joined by '+'
    cause: str
    calls: float
    ms: float
    flops: float | None = None
    bytes: float | None = None
    intensity: float | None = None
    ops: list[str] = field(default_factory=list)
    # where the kernel's description came from: "plan", "library" (its arguments), "builtin",
    # "prepack" (TVM's weight re-layout of a planned kernel), "name" (a TIR kernel the plan
    # does not list: its ops read from its name), or "" for onnxruntime nodes
    source: str = ""

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ onnxruntime
ORT_QUANTIZE = {"DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "Cast"}
ORT_INT8 = {"ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
            "QLinearConv", "QLinearMatMul", "QGemm", "QAttention", "QLinearAdd", "QLinearMul",
            "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat",
            "DynamicQuantizeLSTM", "MatMulInteger16", "MatMulNBits"}
ORT_CONV = {"Conv", "FusedConv", "NhwcFusedConv", "ConvTranspose", "NhwcConv"}
ORT_MATMUL = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Einsum", "Attention",
              "MultiHeadAttention", "GroupQueryAttention"}
ORT_LAYOUT = {"Transpose", "ReorderInput", "ReorderOutput", "Reshape", "Flatten", "Squeeze",
              "Unsqueeze", "Concat", "Split", "Slice", "Identity", "Expand", "Tile", "Pad",
              "DepthToSpace", "SpaceToDepth", "Shape", "Size", "ConstantOfShape", "Range",
              "MemcpyFromHost", "MemcpyToHost"}
ORT_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Relu", "Clip", "Sigmoid", "Tanh", "Erf", "Gelu",
                   "FastGelu", "BiasGelu", "QuickGelu", "Pow", "Sqrt", "Exp", "Log",
                   "LeakyRelu", "HardSigmoid", "HardSwish", "Neg", "Abs", "Where", "Min", "Max",
                   "Equal", "Less", "Greater", "Not", "And", "Or", "Reciprocal", "Floor",
                   "Ceil", "Round", "Sum", "Mean", "PRelu", "Elu", "Selu", "Softplus",
                   "BiasAdd", "Mish", "Sin", "Cos", "IsNaN", "Sign"}
_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float16": 2, "bfloat16": 2,
                "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
                "int64": 8, "uint64": 8, "bool": 1}


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _shapes(entries) -> list[tuple[str, list[int]]]:
    out = []
    for e in entries or []:
        for dtype, shape in e.items():
            out.append((dtype, list(shape)))
    return out


def ort_cost(op: str, inputs, outputs, parameter_bytes: float = 0.0) -> tuple[float, float]:
    """(FLOPs, bytes) of one onnxruntime node from its profiled shapes.

    Bytes are every listed input and output once plus the node's constant parameters; FLOPs
    count a multiply-add as 2 for convolutions and matmuls, one per output element otherwise.
    """
    ins, outs = _shapes(inputs), _shapes(outputs)
    nbytes = sum(_prod(s) * _DTYPE_BYTES.get(d, 4) for d, s in ins + outs) + parameter_bytes
    out_elems = sum(_prod(s) for _, s in outs)
    if op in ORT_CONV or op in ("ConvInteger", "QLinearConv"):
        w = next((s for i, (_, s) in enumerate(ins) if i == (3 if op == "QLinearConv" else 1)),
                 None)
        per_out = _prod(w[1:]) if w and len(w) >= 3 else 1
        return 2.0 * out_elems * per_out, nbytes
    if op in ORT_MATMUL or op in ORT_INT8:
        k = ins[0][1][-1] if ins and ins[0][1] else 1
        return 2.0 * out_elems * k, nbytes
    return float(out_elems), nbytes


def is_depthwise(op: str, inputs) -> bool:
    """A convolution whose weight has one input channel per group (OIHW, I == 1, O > 1)."""
    if op not in ORT_CONV and op not in ("ConvInteger",):
        return False
    ins = _shapes(inputs)
    if len(ins) < 2:
        return False
    w = ins[1][1]
    return len(w) >= 3 and w[1] == 1 and w[0] > 1


def classify_ort(op: str, inputs=None, outputs=None, parameter_bytes: float = 0.0,
                 ridge: float | None = None) -> tuple[str, float, float]:
    """(cause, FLOPs, bytes) of an onnxruntime node.

    Args:
        op: the node's op type as onnxruntime's profiler names it (after its graph fusions).
        inputs, outputs: the profiler's `input_type_shape` / `output_type_shape`.
        parameter_bytes: the profiler's `parameter_size` (constant weights).
        ridge: the target's roofline ridge point (FLOP/byte) at fp32.
    """
    flops, nbytes = ort_cost(op, inputs, outputs, parameter_bytes)
    ai = flops / nbytes if nbytes else float("inf")
    if op in ORT_QUANTIZE:
        return "quantize", flops, nbytes
    if op in ORT_INT8 or op.startswith("QLinear"):
        return "int8_compute", flops, nbytes
    if op in ORT_CONV:
        if is_depthwise(op, inputs) or (ridge is not None and ai < ridge):
            return "low_intensity_conv", flops, nbytes
        return "compute", flops, nbytes
    if op in ORT_MATMUL:
        return ("memory_bound" if ridge is not None and ai < ridge else "compute"), flops, nbytes
    if op in ORT_LAYOUT:
        return "layout", flops, nbytes
    if op in ORT_ELEMENTWISE:
        return "lost_fusion", flops, nbytes
    if op in _ORT_MEMORY:
        return "memory_bound", flops, nbytes
    return OTHER, flops, nbytes


_ORT_MEMORY = {"Softmax", "LogSoftmax", "LayerNormalization", "SkipLayerNormalization",
               "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
               "BatchNormalization", "InstanceNormalization", "GroupNorm", "RMSNormalization",
               "GlobalAveragePool", "GlobalMaxPool", "MaxPool", "AveragePool", "ReduceMean",
               "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ArgMax",
               "ArgMin", "Gather", "GatherElements", "GatherND", "ScatterND", "TopK",
               "EmbedLayerNormalization", "CumSum", "Resize", "Upsample", "LpNormalization",
               "BiasSoftmax", "NhwcMaxPool"}


# ------------------------------------------------------------------------------ tvmopt
# A tvmopt build runs three kinds of callee, each classified by what it computes:
#  * fused TIR kernels (the default schedule or a tuned record: the same PrimFunc, scheduled
#    differently): the legalized ops fused into them (the plan's fusion record), the plan's
#    FLOPs and bytes, and the dtypes of the buffers the profiler saw;
#  * library calls (`tvmopt.onednn.*`): the primitive, its precision and its shapes, read from
#    the call's own arguments;
#  * Relax VM builtins: allocation and shape bookkeeping between kernels, or data movement.

# Legalized op names (each a PrimFunc FuseOps groups; FuseOps adds numeric suffixes), by family.
CONTRACTION = frozenset({
    "conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose",
    "matmul", "dense", "batch_matmul", "einsum", "attention"})
QUANTIZE_OPS = frozenset({"quantize", "dequantize"})
CAST_OPS = frozenset({"cast", "astype"})
REDUCE_OPS = frozenset({
    "softmax", "fast_softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm",
    "batch_norm", "instance_norm", "mean", "sum", "prod", "max", "min", "variance", "std",
    "argmax", "argmin", "cumsum", "cumprod", "take", "gather", "gather_elements", "gather_nd",
    "scatter_nd", "scatter_elements", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d",
    "max_pool2d", "max_pool3d", "topk", "sort", "argsort", "image_resize2d", "resize2d",
    "nonzero", "unique"})
MOVE_OPS = frozenset({
    "layout_transform", "transpose", "permute_dims", "concatenate", "concat", "split",
    "split_tuple", "strided_slice", "dynamic_strided_slice", "pad", "tile", "repeat",
    "broadcast_to", "copy", "flip", "collapse_sum_like", "collapse_sum_to", "one_hot"})
VIEW_OPS = frozenset({"reshape", "squeeze", "expand_dims", "flatten"})  # no data moved
ELEMENTWISE_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "power", "sqrt", "rsqrt", "exp", "log", "erf",
    "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "clip", "round", "floor", "ceil",
    "negative", "abs", "where", "less", "less_equal", "greater", "greater_equal", "equal",
    "not_equal", "logical_not", "logical_and", "logical_or", "bitwise_and", "maximum",
    "minimum", "fast_exp", "fast_erf", "fast_tanh", "tir_exp", "tir_clip", "tir_round", "sin",
    "cos", "tan", "floor_divide", "floor_mod", "mod", "sign", "hardswish", "leakyrelu",
    "leaky_relu", "prelu", "softplus", "zeros", "ones", "full", "zeros_like", "ones_like",
    "full_like", "arange", "isnan", "isinf", "isfinite", "reciprocal", "square", "trunc",
    "atan", "asin", "acos", "sinh", "cosh", "log1p", "expm1", "tril", "triu", "elu", "selu"})
# a kernel of movement ops with at most this much arithmetic per byte (a transpose with a clip
# fused in) is a layout transform; more (GELU behind a reshape) is elementwise work
_MOVE_FLOPS_PER_BYTE = 1.0
# the arithmetic of dynamic quantization (min/max -> scale -> round/clip/cast) in a quantized
# model: these ops together, with a cast, a rounding or a min/max among them
_DYNAMIC_QUANT_OPS = QUANTIZE_OPS | CAST_OPS | {
    "tir_round", "round", "tir_clip", "clip", "divide", "subtract", "multiply", "add",
    "transpose", "max", "min", "maximum", "minimum"}
_DYNAMIC_QUANT_MARKS = CAST_OPS | {"tir_round", "round", "max", "min", "maximum", "minimum"}
_INT8 = frozenset({"int8", "uint8"})
_FAMILIES = (CONTRACTION, QUANTIZE_OPS, CAST_OPS, REDUCE_OPS, MOVE_OPS, VIEW_OPS,
             ELEMENTWISE_OPS)

# Relax VM builtins, by what they do. Bookkeeping runs once per kernel (its outputs' storage and
# tensors, the tuples and shapes between kernels), so it belongs to the count of kernels.
VM_BOOKKEEPING = frozenset({
    "alloc_storage", "alloc_tensor", "alloc_shape_heap", "null_value", "make_shape",
    "make_tuple", "make_prim_value", "make_closure", "match_shape", "match_prim_value",
    "check_tensor_info", "check_shape_info", "check_tuple_info", "check_func_info",
    "check_prim_value_info", "check_string_info", "shape_of", "tensor_to_shape",
    "tuple_getitem", "tuple_reset_item", "ensure_zero_offset", "read_if_cond",
    "memory_manager.clear"})
VM_MOVES = frozenset({"copy", "reshape", "to_device"})
# builtins that run other code (a closure, a kernel of run-time sizes): the profiler does not
# see what, so their time stays unexplained and the report names them
VM_OPAQUE = frozenset({"invoke_closure", "call_tir_dyn"})
# builtins tvmopt's ONNX pipeline never emits (LLM serving state, sampling, Python callbacks,
# debugging, parameter caches): listed so that a builtin new to TVM fails the kinds test
VM_NOT_EMITTED_PREFIXES = ("attention_kv_cache_", "kv_state_", "kv_cache_", "paged_attention_",
                           "rnn_state_", "sample_", "multinomial_", "apply_", "param_",
                           "tensor_cache.")
VM_NOT_EMITTED = frozenset({"call_py_func", "get_py_func", "register_py_func",
                            "clear_py_func_registry", "debug_print", "invoke_debug_func"})
_VM_PREFIX = "vm.builtin."


def builtin_cause(name: str) -> str | None:
    """The cause of a Relax VM builtin's time; OTHER for one that runs unseen code; None for a
    name this table does not know (a builtin new to TVM)."""
    short = name[len(_VM_PREFIX):] if name.startswith(_VM_PREFIX) else None
    if short is None:
        return None
    if short in VM_BOOKKEEPING:
        return "lost_fusion"
    if short in VM_MOVES:
        return "layout"
    if short in VM_OPAQUE:
        return OTHER
    if short in VM_NOT_EMITTED or short.startswith(VM_NOT_EMITTED_PREFIXES):
        return OTHER
    return None


# -------------------------------------------------------------------- library calls (oneDNN)
# Positions in the int64 attrs each call takes (enums of library/onednn/onednn_ext.cc, which
# library/onednn/ writes; tests/compare check them against the C++ source).
ONEDNN_ATTRS = {
    "conv2d": {"groups": 8, "nhwc": 16, "compute": 17},
    "matmul": {"compute": 3},
    "batch_matmul": {"compute": 2},
    "attention": {"compute": 2},
    "rnn": {},
    "qconv2d": {"groups": 8, "nhwc": 13},
    "qmatmul": {"dynamic": 6},
}
ONEDNN_COMPUTE = {0: "fp32", 1: "bf16"}  # library/onednn/ COMPUTE, inverted
# every library function a build can call: name -> the primitive it computes
LIBRARY_FUNCS = {
    "tvmopt.onednn.conv2d": "conv2d",
    "tvmopt.onednn.matmul": "matmul",
    "tvmopt.onednn.qconv2d": "conv2d",
    "tvmopt.onednn.qmatmul": "matmul",
    "tvmopt.onednn.batch_matmul": "matmul",  # two activations (attention)
    "tvmopt.onednn.attention": "attention",  # softmax(q.k^T).v in blocks of rows
    "tvmopt.onednn.rnn": "rnn",  # a whole LSTM / GRU / RNN node
}
# functions the extension registers that are not kernels (configuration, called from Python)
LIBRARY_CONTROL = frozenset({"tvmopt.onednn.share_pool", "tvmopt.onednn.uses_shared_pool",
                             "tvmopt.onednn.set_num_threads"})
# (primitive, precision) -> cause rule: every kind of library call a build can make
LIBRARY_KINDS = {
    ("conv2d", "fp32"): "conv", ("conv2d", "bf16"): "conv",
    ("matmul", "fp32"): "matmul", ("matmul", "bf16"): "matmul",
    # two matmuls around a softmax, the scores kept in cache
    ("attention", "fp32"): "matmul", ("attention", "bf16"): "matmul",
    ("conv2d", "int8"): "int8",
    ("matmul", "int8"): "int8", ("matmul", "int8-dynamic"): "int8",
    # a recurrence is its gate GEMMs, step after step
    ("rnn", "fp32"): "matmul",
}


@dataclass
class LibraryCall:
    """One library call's workload, read from its arguments."""

    func: str
    primitive: str
    precision: str
    flops: float
    bytes: float
    depthwise: bool
    shapes: str  # "1x128x256 @ 256x768 -> 1x128x768"

    @property
    def op(self) -> str:
        return f"oneDNN {self.primitive} {self.precision}" + (" depthwise" if self.depthwise
                                                               else "")


def tensor_bytes(t) -> float:
    """Bytes of a profiled tensor argument ([shape, dtype])."""
    return float(_prod(t[0]) * _DTYPE_BYTES.get(t[1], 4))


def library_call(func: str, args: list) -> LibraryCall | None:
    """The workload of a `tvmopt.onednn.*` call from the profiler's view of its arguments
    (`bench.profile` facts: [shape, dtype] per tensor, {"shape": [...]} for the attrs; the DPS
    output last). None when `func` is no library kernel or the arguments do not fit it."""
    primitive = LIBRARY_FUNCS.get(func)
    if primitive is None:
        return None
    tensors = [a for a in args if isinstance(a, list)]
    attrs = next((a["shape"] for a in args if isinstance(a, dict)), [])
    if len(tensors) < 3:
        return None
    src, weight, out = tensors[0], tensors[1], tensors[-1]
    kind = func.rsplit(".", 1)[1]
    pos = ONEDNN_ATTRS[kind]

    def attr(key, default=0):
        i = pos.get(key)
        return int(attrs[i]) if i is not None and i < len(attrs) else default

    quantized = kind.startswith("q")
    if quantized:
        precision = "int8-dynamic" if attr("dynamic") else "int8"
        if primitive == "conv2d":
            precision = "int8"
    else:
        precision = ONEDNN_COMPUTE.get(attr("compute"), f"compute {attr('compute')}")
    out_elems = _prod(out[0])
    depthwise = False
    if primitive == "rnn":
        # x [T, B, I]; w_layer [1, D, I, G, H] and w_iter [1, D, H, G, H]: per step and batch
        # row, both GEMMs of every direction.
        steps, batch = (src[0] + [1, 1])[:2]
        flops = 2.0 * steps * batch * (_prod(weight[0]) + _prod(tensors[2][0]))
        return LibraryCall(func, primitive, "fp32", flops,
                           sum(tensor_bytes(t) for t in tensors), False,
                           f"{'x'.join(map(str, src[0]))} rnn {'x'.join(map(str, weight[0]))}")
    if primitive == "conv2d":
        nhwc = attr("nhwc") != 0
        cout = out[0][-1] if nhwc else out[0][1]
        cin = src[0][-1] if nhwc else src[0][1]
        groups = attr("groups", 1)
        flops = 2.0 * out_elems * _prod(weight[0]) / max(cout, 1)
        depthwise = groups > 1 and groups == cin
        shapes = f"{'x'.join(map(str, src[0]))} * {'x'.join(map(str, weight[0]))}"
    elif primitive == "attention":
        # q [..., M, D], k, v [..., N, Dv]: q.k^T and p.v, 2 * M * N * (D + Dv) per batch entry
        keys = tensors[2][0][-2] if len(tensors) > 3 and tensors[2][0] else 1
        flops = 2.0 * _prod(src[0][:-1]) * keys * (src[0][-1] + out[0][-1])
        shapes = f"softmax({'x'.join(map(str, src[0]))} @ {'x'.join(map(str, weight[0]))}^T)"
    else:
        flops = 2.0 * out_elems * (src[0][-1] if src[0] else 1)
        shapes = f"{'x'.join(map(str, src[0]))} @ {'x'.join(map(str, weight[0]))}"
    return LibraryCall(func, primitive, precision, flops, sum(tensor_bytes(t) for t in tensors),
                       depthwise, f"{shapes} -> {'x'.join(map(str, out[0]))}")


def library_cause(call: LibraryCall, ridge: float | None) -> str:
    """The cause of a library call's time (OTHER for a primitive x precision with no rule)."""
    rule = LIBRARY_KINDS.get((call.primitive, call.precision))
    low = ridge is not None and call.bytes > 0 and call.flops / call.bytes < ridge
    if rule == "int8":
        return "int8_compute"
    if rule == "conv":
        return "low_intensity_conv" if call.depthwise or low else "compute"
    if rule == "matmul":
        return "memory_bound" if low else "compute"
    return OTHER


# ------------------------------------------------------------------------------ TIR kernels
_TVM_OPS = sorted(set().union(*_FAMILIES) | {"split_tuple", "tir_clip", "tir_round", "tir_exp"},
                  key=len, reverse=True)
_KERNEL_SUFFIXES = ("_prepacked",)
# TVM's SplitLayoutRewritePreproc moves the re-layout of a kernel's layout-free buffers into a
# kernel of its own, named after it: data movement only
WEIGHT_PREPACK_SUFFIX = "_weight_prepack"


def base_op(op: str) -> str:
    """A fused op's Relax name without the numeric suffix FuseOps adds ('conv2d3' -> 'conv2d')."""
    return re.sub(r"\d+$", "", op) if not op.endswith(("1d", "2d", "3d")) else op


def kernel_ops(name: str) -> list[str]:
    """The ops of a tvmopt kernel read from its name ('fused_conv2d_add_relu' -> 3 ops): only for
    a kernel the plan does not list."""
    n = plan_name(name)
    if n.startswith("fused_"):
        n = n[len("fused_"):]
    ops, rest = [], n
    while rest:
        for cand in _TVM_OPS:
            m = re.match(rf"{cand}\d*(?=_|$)", rest)
            if m:
                ops.append(cand)
                rest = rest[m.end():].lstrip("_")
                break
        else:
            head, _, rest = rest.partition("_")
            ops.append(base_op(head))
    return ops


def plan_name(name: str) -> str:
    """The plan's name of a profiled kernel (the build may add suffixes after planning)."""
    for s in _KERNEL_SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def op_family_known(op: str) -> bool:
    """Whether a legalized op name belongs to a family the rules below place."""
    return any(base_op(op) in f for f in _FAMILIES)


def classify_tvm(name: str, ops: list[str] | None = None, flops: float | None = None,
                 nbytes: float | None = None, ridge: float | None = None,
                 quantized_model: bool = False, dtypes: list[str] | None = None) -> str:
    """The cause of a tvmopt kernel's time, from what it computes.

    Args:
        name: the callee the VM called (PrimFunc, library function or VM builtin).
        ops: its fused ops (from the plan; read from the name only when None).
        flops, nbytes: the plan's FLOPs and compulsory bytes (or a library call's).
        ridge: the target's roofline ridge point at fp32.
        quantized_model: the model holds dynamic/static quantization ops, so scalar
            reductions and casts next to its matmuls are its quantization arithmetic.
        dtypes: the dtypes of the buffers the kernel was called with, where profiled.
    """
    if name.startswith("vm."):
        return builtin_cause(name) or OTHER
    if name in LIBRARY_FUNCS:  # without its arguments: the primitive's usual cause
        return "int8_compute" if name.rsplit(".", 1)[1].startswith("q") else "compute"
    if name.endswith(WEIGHT_PREPACK_SUFFIX):
        return "layout"
    ops = [base_op(o) for o in (ops if ops is not None else kernel_ops(name))]
    opset = set(ops)
    ai = (flops / nbytes) if flops is not None and nbytes else None
    low = ridge is not None and ai is not None and ai < ridge
    dts = set(dtypes or ())
    int8_io = bool(dts & _INT8)
    float_io = any(d.startswith(("float", "bfloat")) for d in dts)
    if opset & CONTRACTION:
        if int8_io or (quantized_model and opset & (CAST_OPS | QUANTIZE_OPS)):
            return "int8_compute"
        if any(o.startswith("conv") for o in opset):
            return "low_intensity_conv" if low else "compute"
        return "memory_bound" if low else "compute"
    if (opset & QUANTIZE_OPS or (int8_io and float_io)
            or (quantized_model and opset <= _DYNAMIC_QUANT_OPS and opset & _DYNAMIC_QUANT_MARKS)):
        return "quantize"
    if opset & REDUCE_OPS:
        return "memory_bound"
    moved = opset - VIEW_OPS
    if opset and (not moved or moved <= MOVE_OPS):
        return "layout"  # a reshape alone is a copy the fusion did not remove
    if moved and moved <= MOVE_OPS | ELEMENTWISE_OPS | CAST_OPS:
        light = ai is None or (flops or 0.0) <= _MOVE_FLOPS_PER_BYTE * (nbytes or 0.0)
        if moved & MOVE_OPS and light:
            return "layout"  # a copy with a little arithmetic fused into it
        return "lost_fusion"  # elementwise work in a kernel of its own
    if ai is not None and ridge is not None:
        # ops of no family: the roofline says what bounds the kernel
        return "memory_bound" if low else "compute"
    return OTHER
