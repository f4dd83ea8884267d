"""The named causes of a latency difference, and which cause each kernel's time belongs to.

A kernel is an onnxruntime node (its op type and the shapes its profiler records) or a tvmopt
fused kernel (the ops fused into it, from the plan, and the plan's FLOPs and bytes). Both are
reduced to one `Kernel` with a cause; `attribution` only adds times per cause.
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
     "computing them"),
    ("lost_fusion", "extra kernels from lost fusion (count, dispatch overhead)",
     "standalone elementwise kernels, runtime builtins, and time outside kernels, which grows "
     "with the number of kernels run"),
    ("memory_bound", "memory-bound kernels",
     "matmuls, normalizations, reductions, pooling, gathers under the target's roofline ridge"),
    ("layout", "layout transforms",
     "Transpose, ReorderInput/ReorderOutput (NCHWc), layout_transform, reshapes and copies"),
    ("low_intensity_conv", "low-intensity convolutions (depthwise)",
     "depthwise/grouped convolutions, and convolutions under the roofline ridge"),
    ("compute", "dense compute",
     "compute-bound convolutions and matmuls; negative when the variant does less of it"),
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
    if op in ORT_INT8:
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
# Relax op names as they appear in fused kernel names; multi-word names first.
_TVM_OPS = sorted([
    "layout_transform", "batch_matmul", "conv2d_transpose", "conv1d_transpose", "strided_slice",
    "expand_dims", "broadcast_to", "adaptive_avg_pool2d", "adaptive_avg_pool1d", "avg_pool2d",
    "max_pool2d", "layer_norm", "group_norm", "rms_norm", "batch_norm", "instance_norm",
    "tir_clip", "tir_round", "tir_exp", "fast_exp", "fast_erf", "fast_tanh", "fast_softmax",
    "log_softmax", "split_tuple", "collapse_sum_like", "scatter_nd", "one_hot",
    "conv1d", "conv2d", "conv3d", "matmul", "dense", "transpose", "reshape", "concatenate",
    "concat", "split", "squeeze", "flatten", "take", "gather", "quantize", "dequantize", "cast",
    "softmax", "mean", "sum", "max", "min", "maximum", "minimum", "variance", "argmax", "argmin",
    "add", "subtract", "multiply", "divide", "power", "sqrt", "rsqrt", "exp", "log", "erf",
    "tanh", "sigmoid", "relu", "gelu", "silu", "clip", "round", "floor", "ceil", "negative",
    "abs", "where", "less", "greater", "equal", "not_equal", "logical_not", "logical_and",
    "astype", "copy", "zeros", "ones", "full", "arange", "tile", "repeat", "pad", "cumsum",
    "image_resize2d", "resize2d", "sin", "cos", "floor_divide", "floor_mod", "sign",
    "hardswish", "leakyrelu", "leaky_relu", "prelu", "softplus", "topk", "sort",
], key=len, reverse=True)
_TVM_MATRIX = ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "matmul",
               "dense", "batch_matmul")
_TVM_QUANT = {"quantize", "dequantize", "tir_round", "round", "cast", "astype", "tir_clip",
              "clip"}
_TVM_LAYOUT = {"layout_transform", "transpose", "reshape", "concatenate", "concat", "split",
               "split_tuple", "squeeze", "flatten", "expand_dims", "strided_slice", "copy",
               "broadcast_to", "tile", "repeat", "pad"}
_TVM_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "power", "sqrt", "rsqrt", "exp",
                    "log", "erf", "tanh", "sigmoid", "relu", "gelu", "silu", "clip", "round",
                    "floor", "ceil", "negative", "abs", "where", "less", "greater", "equal",
                    "not_equal", "logical_not", "logical_and", "maximum", "minimum", "fast_exp",
                    "fast_erf", "fast_tanh", "tir_exp", "tir_clip", "tir_round", "sin", "cos",
                    "floor_divide", "floor_mod", "sign", "hardswish", "leakyrelu",
                    "leaky_relu", "prelu", "softplus", "cast", "astype", "zeros", "ones",
                    "full"}
_KERNEL_SUFFIXES = ("_prepacked",)


def base_op(op: str) -> str:
    """A fused op's Relax name without the numeric suffix FuseOps adds ('conv2d3' -> 'conv2d')."""
    return re.sub(r"\d+$", "", op) if not op.endswith(("1d", "2d", "3d")) else op


def kernel_ops(name: str) -> list[str]:
    """The ops of a tvmopt kernel, read from its name ('fused_conv2d_add_relu' -> 3 ops)."""
    n = name
    for s in _KERNEL_SUFFIXES:
        if n.endswith(s):
            n = n[: -len(s)]
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


def classify_tvm(name: str, ops: list[str] | None = None, flops: float | None = None,
                 nbytes: float | None = None, ridge: float | None = None,
                 quantized_model: bool = False) -> str:
    """The cause of a tvmopt kernel's time.

    Args:
        name: the kernel (PrimFunc or VM builtin) the VM called.
        ops: its fused ops (from the plan; read from the name when None).
        flops, nbytes: the plan's FLOPs and compulsory bytes, when the plan has the kernel.
        ridge: the target's roofline ridge point at fp32.
        quantized_model: the model holds dynamic/static quantization ops, so scalar
            reductions and casts next to its matmuls are its quantization arithmetic.
    """
    if name.startswith("vm.builtin.") or name.startswith("vm."):
        return "lost_fusion"
    ops = [base_op(o) for o in (ops if ops is not None else kernel_ops(name))]
    opset = set(ops)
    ai = (flops / nbytes) if flops is not None and nbytes else None
    low = ridge is not None and ai is not None and ai < ridge
    if opset & set(_TVM_MATRIX):
        if quantized_model and opset & {"cast", "astype", "quantize", "dequantize"}:
            return "int8_compute"
        is_conv = any(o.startswith("conv") for o in opset)
        if is_conv:
            return "low_intensity_conv" if low else "compute"
        return "memory_bound" if low else "compute"
    if opset & {"quantize", "dequantize"} or (quantized_model and opset <= _TVM_QUANT | {
            "divide", "subtract", "multiply", "add", "transpose", "max", "min", "maximum",
            "minimum"} and (opset & {"cast", "tir_round", "round", "max", "min", "maximum",
                                    "minimum"})):
        return "quantize"
    if opset and opset <= _TVM_LAYOUT:
        return "layout"
    if opset and opset <= _TVM_ELEMENTWISE:
        return "lost_fusion"
    if opset & {"softmax", "fast_softmax", "log_softmax", "layer_norm", "group_norm",
                "rms_norm", "batch_norm", "instance_norm", "mean", "sum", "max", "min",
                "variance", "argmax", "argmin", "take", "gather", "adaptive_avg_pool2d",
                "adaptive_avg_pool1d", "avg_pool2d", "max_pool2d", "cumsum", "topk", "sort",
                "scatter_nd", "image_resize2d", "resize2d"}:
        return "memory_bound"
    if opset and opset <= _TVM_LAYOUT | _TVM_ELEMENTWISE:
        return "layout"  # a copy with elementwise work fused into it: moved bytes dominate
    return OTHER
