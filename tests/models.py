"""Every ONNX model the tests build (nothing is downloaded): graph helpers, the model
families tvmopt must handle, tiny tuning workloads, quantized variants and one-node graphs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ------------------------------------------------------------------------ graph helpers
OPSET = 17


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tvmopt-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def rand(*shape, seed=0, scale=0.1):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


# ------------------------------------------------------------------------ one-node graphs
def node_model(node, feeds: dict, consts: dict, outputs: list[str], opset: int = 21,
               out_type: int = TensorProto.UNDEFINED):
    """A one-node model: `feeds` are graph inputs, `consts` initializers (IR version 10)."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    outs = [helper.make_tensor_value_info(o, out_type, None) for o in outputs]
    graph = helper.make_graph([node], "g", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def single_output_model(node, feeds: dict, consts: dict, out_dtype=TensorProto.FLOAT, opset=19,
                        input_shapes=None):
    """A one-node model with its first output typed `out_dtype`; `input_shapes` may name dims."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            (input_shapes or {}).get(k, v.shape))
              for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    out = helper.make_tensor_value_info(node.output[0], out_dtype, None)
    graph = helper.make_graph([node], "g", inputs, [out], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def graph_model(nodes, feeds: dict, outputs, consts=None, opset=19):
    """A model of `nodes` (one or a list) with untyped outputs."""
    nodes = nodes if isinstance(nodes, list) else [nodes]
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()]
    outs = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# ------------------------------------------------------------------------ model families
def mlp(batch="batch"):
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["h3"]),
        helper.make_node("Sigmoid", ["h3"], ["y"]),
    ]
    inits = [const("w1", rand(64, 32, seed=1)), const("b1", rand(64, seed=2)),
             const("w2", rand(64, 10, seed=3)), const("b2", rand(10, seed=4))]
    return make_model(nodes, [vi("x", [batch, 32])], [vi("y", [batch, 10])], inits)


def _bn(prefix, c, seed):
    rng = np.random.default_rng(seed)
    return [const(f"{prefix}_s", rng.uniform(0.5, 1.5, c).astype(np.float32)),
            const(f"{prefix}_b", rng.uniform(-0.2, 0.2, c).astype(np.float32)),
            const(f"{prefix}_m", rng.uniform(-0.2, 0.2, c).astype(np.float32)),
            const(f"{prefix}_v", rng.uniform(0.5, 1.5, c).astype(np.float32))]


def _bn_node(prefix, x, y):
    return helper.make_node("BatchNormalization",
                            [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y])


def cnn(batch=1, size=32):
    """Conv -> BatchNorm -> Relu -> MaxPool, twice, then GlobalAveragePool -> Flatten -> Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "c1w"], ["c1"], pads=[1, 1, 1, 1], strides=[1, 1]),
        _bn_node("bn1", "c1", "n1"), helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        _bn_node("bn2", "c2", "n2"), helper.make_node("Relu", ["n2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [const("c1w", rand(8, 3, 3, 3, seed=1, scale=0.3)), *_bn("bn1", 8, 2),
             const("c2w", rand(16, 8, 3, 3, seed=3, scale=0.2)), const("c2b", rand(16, seed=4)),
             *_bn("bn2", 16, 5), const("fw", rand(10, 16, seed=6)), const("fb", rand(10, seed=7))]
    return make_model(nodes, [vi("x", [batch, 3, size, size])], [vi("y", [batch, 10])], inits)


def depthwise_cnn(batch="N", size=32):
    """MobileNet-style: conv stem, depthwise 3x3 (group=C) + pointwise 1x1, Clip (ReLU6), pool."""
    nodes = [
        helper.make_node("Conv", ["x", "sw"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["s", "lo", "hi"], ["s6"]),
        helper.make_node("Conv", ["s6", "dw"], ["d"], pads=[1, 1, 1, 1], group=16),
        _bn_node("bnd", "d", "dn"), helper.make_node("Clip", ["dn", "lo", "hi"], ["d6"]),
        helper.make_node("Conv", ["d6", "pw", "pb"], ["p"]),
        helper.make_node("Clip", ["p", "lo", "hi"], ["p6"]),
        helper.make_node("Conv", ["p6", "dw2"], ["d2"], pads=[1, 1, 1, 1], group=32, strides=[2, 2]),
        helper.make_node("Relu", ["d2"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["m", "fw"], ["y"]),
    ]
    inits = [const("sw", rand(16, 3, 3, 3, seed=1, scale=0.3)), const("lo", np.float32(0)),
             const("hi", np.float32(6)), const("dw", rand(16, 1, 3, 3, seed=2, scale=0.5)),
             *_bn("bnd", 16, 3), const("pw", rand(32, 16, 1, 1, seed=4, scale=0.3)),
             const("pb", rand(32, seed=5)), const("dw2", rand(32, 1, 3, 3, seed=6, scale=0.5)),
             const("fw", rand(32, 10, seed=7))]
    return make_model(nodes, [vi("x", [batch, 3, size, size])], [vi("y", [batch, 10])], inits)


def encoder_block(seq=16, d=32, heads=4):
    """One transformer encoder block: multi-head attention (Q/K/V, scaled softmax), residual,
    LayerNormalization, feed-forward with exact GELU (Erf form), residual, LayerNormalization."""
    hd = d // heads
    n = []
    for p in ("q", "k", "v"):
        n.append(helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]))
        n.append(helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]))
        n.append(helper.make_node("Reshape", [f"{p}1", "heads_shape"], [f"{p}2"]))
        perm = [0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]
        n.append(helper.make_node("Transpose", [f"{p}2"], [f"{p}h"], perm=perm))
    n += [
        helper.make_node("MatMul", ["qh", "kh"], ["s0"]),
        helper.make_node("Div", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["s1", "mask"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["pr"], axis=-1),
        helper.make_node("MatMul", ["pr", "vh"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctxt", "model_shape"], ["att"]),
        helper.make_node("MatMul", ["att", "wo"], ["o0"]),
        helper.make_node("Add", ["o0", "x"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "g1", "be1"], ["ln1"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln1", "wf1"], ["f0"]),
        helper.make_node("Add", ["f0", "bf1"], ["f1"]),
        # exact GELU: 0.5 * x * (1 + erf(x / sqrt(2)))
        helper.make_node("Div", ["f1", "sqrt2"], ["g0"]),
        helper.make_node("Erf", ["g0"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["g2"]),
        helper.make_node("Mul", ["f1", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "wf2"], ["f2"]),
        helper.make_node("Add", ["f2", "ln1"], ["res2"]),
        helper.make_node("LayerNormalization", ["res2", "g2w", "be2"], ["y"], axis=-1, epsilon=1e-5),
    ]
    mask = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
    inits = [const("wq", rand(d, d, seed=1)), const("bq", rand(d, seed=2)),
             const("wk", rand(d, d, seed=3)), const("bk", rand(d, seed=4)),
             const("wv", rand(d, d, seed=5)), const("bv", rand(d, seed=6)),
             const("heads_shape", np.array([1, seq, heads, hd], np.int64)),
             const("model_shape", np.array([1, seq, d], np.int64)),
             const("scale", np.float32(np.sqrt(hd))), const("mask", mask),
             const("wo", rand(d, d, seed=7)), const("g1", np.ones(d, np.float32)),
             const("be1", np.zeros(d, np.float32)), const("wf1", rand(d, 4 * d, seed=8)),
             const("bf1", rand(4 * d, seed=9)), const("sqrt2", np.float32(np.sqrt(2))),
             const("one", np.float32(1)), const("half", np.float32(0.5)),
             const("wf2", rand(4 * d, d, seed=10)), const("g2w", rand(d, seed=11, scale=1.0)),
             const("be2", rand(d, seed=12))]
    return make_model(n, [vi("x", [1, seq, d])], [vi("y", [1, seq, d])], inits)


def shape_ops(batch=2):
    """Gather / Reshape / Concat / Slice / Transpose / Unsqueeze on an embedding lookup."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),          # [B, 8, 16]
        helper.make_node("Transpose", ["emb"], ["t"], perm=[0, 2, 1]),         # [B, 16, 8]
        helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["s"]),  # [B, 16, 4]
        helper.make_node("Reshape", ["s", "shape"], ["r"]),                     # [B, 64]
        helper.make_node("Gather", ["r", "cols"], ["gc"], axis=1),              # [B, 3]
        helper.make_node("Concat", ["r", "gc"], ["c"], axis=1),                 # [B, 67]
        helper.make_node("Unsqueeze", ["c", "ax0"], ["y"]),                     # [1, B, 67]
    ]
    inits = [const("table", rand(50, 16, seed=1, scale=1.0)),
             const("starts", np.array([1], np.int64)), const("ends", np.array([8], np.int64)),
             const("axes", np.array([2], np.int64)), const("steps", np.array([2], np.int64)),
             const("shape", np.array([0, -1], np.int64)), const("cols", np.array([0, 5, 63], np.int64)),
             const("ax0", np.array([0], np.int64))]
    return make_model(nodes, [vi("ids", [batch, 8], TensorProto.INT64)],
                      [vi("y", [1, batch, 67])], inits)


FAMILIES = {"mlp": mlp, "cnn": cnn, "depthwise_cnn": depthwise_cnn,
            "encoder_block": encoder_block, "shape_ops": shape_ops}


# ------------------------------------------------------------------------ tuning workloads (files)
def tiny_mlp(path, batch="batch", features=32, hidden=32, classes=8, seed=0) -> str:
    """x[batch, features] -> MatMul/Add/Relu -> MatMul/Add; two tuning tasks after fusion."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.1, n)
             for n, s in [("w1", (features, hidden)), ("b1", (hidden,)),
                          ("w2", (hidden, classes)), ("b2", (classes,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def tiny_conv(path, channels=32, size=28, seed=0) -> str:
    """x[1, 16, size, size] -> Conv3x3+Relu -> Conv1x1: two conv tasks with real weights."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.1, n)
             for n, s in [("w1", (channels, 16, 3, 3)), ("b1", (channels,)),
                          ("w2", (channels, channels, 1, 1))]]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h0"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def tiny_lstm(path, steps=6, size=8, hidden=16, seed=0) -> str:
    """x[steps, 1, size] -> LSTM -> Reshape -> MatMul: the LSTM's loop kernel (written
    already scheduled) beside a matmul task."""
    rng = np.random.default_rng(seed)
    inits = [const("W", rng.standard_normal((1, 4 * hidden, size)).astype("float32")
                   * size ** -0.5),
             const("R", rng.standard_normal((1, 4 * hidden, hidden)).astype("float32")
                   * hidden ** -0.5),
             const("B", np.zeros((1, 8 * hidden), "float32")),
             const("shape", np.array([steps, hidden], np.int64)),
             const("M", rng.standard_normal((hidden, 4)).astype("float32"))]
    nodes = [helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=hidden),
             helper.make_node("Reshape", ["Y", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "M"], ["out"])]
    model = make_model(nodes, [vi("X", [steps, 1, size])], [vi("out", [steps, 4])], inits,
                       name="tiny_lstm")
    onnx.save(model, str(path))
    return str(path)


def data_sized_range(path, seed=0) -> str:
    """x[4, 8] -> MatMul, beside Range(0, int(sum|x|)) * 2: a kernel whose size is known only
    at run time though every input is static (as a detector's anchor grid the import leaves
    symbolic)."""
    rng = np.random.default_rng(seed)
    inits = [const("M", rng.standard_normal((8, 4)).astype("float32")),
             const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
             const("two", np.array(2.0, np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "M"], ["out"]),
             helper.make_node("Abs", ["x"], ["ax"]),
             helper.make_node("ReduceSum", ["ax"], ["total"], keepdims=0),
             helper.make_node("Cast", ["total"], ["limit"], to=TensorProto.INT64),
             helper.make_node("Range", ["zero", "limit", "one"], ["steps"]),
             helper.make_node("Cast", ["steps"], ["stepsf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["stepsf", "two"], ["grid"])]
    model = make_model(nodes, [vi("x", [4, 8])], [vi("out", [4, 4]), vi("grid", ["n"])], inits,
                       name="data_sized_range")
    onnx.save(model, str(path))
    return str(path)


def cancelling_matmuls(path, features=64, seed=0) -> str:
    """x[1, F] @ W - x @ (W + tiny): two matmuls whose difference is about 1e-3 of either, so
    computing them in bf16 (about 3 significant digits) leaves little of it: a bf16 build fails
    the accuracy gate at its default limit."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((features, features)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"]),
             helper.make_node("MatMul", ["x", "W2"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["out"])]
    inits = [const("W1", w),
             const("W2", w + 1e-3 * rng.standard_normal(w.shape).astype("float32"))]
    model = make_model(nodes, [vi("x", [1, features])], [vi("out", [1, features])], inits,
                       name="cancelling_matmuls")
    onnx.save(model, str(path))
    return str(path)


def masked_scores(path, batch=2, heads=4, seq=16) -> str:
    """Attention scores q @ k plus an additive mask built with Where from a boolean mask
    broadcast over the heads: fused, MetaSchedule's multi-level tiling fails on it
    (reverse_compute_at) while making its design space."""
    shape = [batch, heads, seq, seq]
    inits = [const("keep", np.array(0.0, np.float32)), const("drop", np.array(-1e4, np.float32))]
    nodes = [helper.make_node("MatMul", ["q", "k"], ["scores"]),
             helper.make_node("Where", ["mask", "keep", "drop"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["out"])]
    model = make_model(nodes, [vi("q", shape), vi("k", shape),
                               vi("mask", [batch, 1, seq, seq], TensorProto.BOOL)],
                       [vi("out", shape)], inits, name="masked_scores")
    onnx.save(model, str(path))
    return str(path)


# ------------------------------------------------------------------------ MLP files, quantized
def mlp_file(path, din=64, hid=128, dout=16, batch="batch", seed=0) -> str:
    """x[batch, din] -> MatMul -> Add -> Relu -> MatMul -> Add."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((din, hid)) * 0.1).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.standard_normal(hid) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((hid, dout)) * 0.1).astype(np.float32), "W2"),
             numpy_helper.from_array((rng.standard_normal(dout) * 0.1).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, din])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dout])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def quantized_mlp(tmp_path) -> str:
    """onnxruntime.quantization.quantize_dynamic of `mlp` (DynamicQuantizeLinear + MatMulInteger)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = mlp_file(tmp_path / "mlp.onnx")
    out = str(tmp_path / "mlp_int8.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(src, out, weight_type=QuantType.QInt8)
    return out


def qdq_mlp(tmp_path) -> str:
    """onnxruntime.quantization.quantize_static of `mlp` in QDQ format (int8, seeded calibration)."""
    import logging

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.it = iter([{"x": rng.standard_normal((4, 64)).astype(np.float32)}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    src = mlp_file(tmp_path / "mlp4.onnx", batch=4)
    out = str(tmp_path / "mlp_qdq.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return out


def quantized_depthwise_cnn(tmp_path, size=16) -> str:
    """onnxruntime.quantization.quantize_dynamic of `depthwise_cnn` at batch 1 (BatchNorm folded
    first, as exporters do): DynamicQuantizeLinear + ConvInteger, dense, depthwise and strided,
    with ReLU6 between them, and a MatMulInteger head."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = str(tmp_path / "dw_cnn.onnx")
    onnx.save(_fold_batchnorm(depthwise_cnn(batch=1, size=size)), src)
    out = str(tmp_path / "dw_cnn_int8.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(src, out, weight_type=QuantType.QInt8)
    return out


def _fold_batchnorm(model):
    """Every Conv -> BatchNormalization pair of `model` as one Conv with a bias."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes, producer = [], {}
    for n in model.graph.node:
        conv = producer.get(n.input[0]) if n.op_type == "BatchNormalization" else None
        if conv is None:
            nodes.append(n)
            for o in n.output:
                producer[o] = n if n.op_type == "Conv" else None
            continue
        g, b, mean, var = (inits[i] for i in n.input[1:5])
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        k = g / np.sqrt(var + eps)
        w = inits[conv.input[1]]
        bias = inits[conv.input[2]] if len(conv.input) > 2 else np.zeros(w.shape[0], np.float32)
        inits[conv.input[1]] = (w * k.reshape(-1, 1, 1, 1)).astype(np.float32)
        inits[conv.output[0] + "_b"] = ((bias - mean) * k + b).astype(np.float32)
        del conv.input[2:]
        conv.input.append(conv.output[0] + "_b")
        conv.output[0] = n.output[0]
    g = helper.make_graph(nodes, model.graph.name, model.graph.input, model.graph.output,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return make_model(list(g.node), list(g.input), list(g.output), list(g.initializer))


def qdq_depthwise_cnn(tmp_path, size=16) -> str:
    """onnxruntime.quantization.quantize_static of `depthwise_cnn` at batch 1 (BatchNorm
    folded) in QDQ format, as the benchmark quantizes MobileNetV2: per-channel int8 weights, u8
    activations, seeded calibration. Consecutive convolutions, dense and depthwise, with only a
    quantize -> dequantize pair between them."""
    import logging

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.it = iter([{"x": rng.standard_normal((1, 3, size, size)).astype(np.float32)}
                            for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    src = str(tmp_path / "dw_cnn_f32.onnx")
    onnx.save(_fold_batchnorm(depthwise_cnn(batch=1, size=size)), src)
    out = str(tmp_path / "dw_cnn_qdq.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def conv_length_nodes():
    """A stride-5 Conv1d of x[batch, 1, samples] into y, beside the graph computing y's length
    again as `len` = (samples - 10) / 5 + 1 with ONNX's truncating integer Div (wav2vec2's
    feature encoder as the dynamo exporter writes it): (nodes, initializers) to build on."""
    c = helper.make_tensor
    i64 = TensorProto.INT64
    w = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((4, 1, 10)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[10], strides=[5]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["n"], axis=0),
        helper.make_node("Sub", ["n", "ten"], ["n10"]),
        helper.make_node("Div", ["n10", "five"], ["q"]),  # integer Div: truncating
        helper.make_node("Add", ["q", "one"], ["len"]),
    ]
    inits = [w, c("two", i64, [], [2]), c("ten", i64, [], [10]), c("five", i64, [], [5]),
             c("one", i64, [], [1])]
    return nodes, inits
