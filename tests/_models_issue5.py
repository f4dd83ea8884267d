"""Tiny ONNX models built in the tests (nothing is downloaded)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def mlp(path, din=64, hid=128, dout=16, batch="batch", seed=0) -> str:
    """x[batch, din] -> MatMul -> Add -> Relu -> MatMul -> Add."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array((rng.standard_normal((din, hid)) * 0.1).astype(np.float32), "W1"),
             nh.from_array((rng.standard_normal(hid) * 0.1).astype(np.float32), "b1"),
             nh.from_array((rng.standard_normal((hid, dout)) * 0.1).astype(np.float32), "W2"),
             nh.from_array((rng.standard_normal(dout) * 0.1).astype(np.float32), "b2")]
    nodes = [h.make_node("MatMul", ["x", "W1"], ["h0"]), h.make_node("Add", ["h0", "b1"], ["h1"]),
             h.make_node("Relu", ["h1"], ["h2"]), h.make_node("MatMul", ["h2", "W2"], ["h3"]),
             h.make_node("Add", ["h3", "b2"], ["y"])]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, [batch, din])],
                     [h.make_tensor_value_info("y", T.FLOAT, [batch, dout])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def quantized_mlp(tmp_path) -> str:
    """onnxruntime.quantization.quantize_dynamic of `mlp` (DynamicQuantizeLinear + MatMulInteger)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = mlp(tmp_path / "mlp.onnx")
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

    src = mlp(tmp_path / "mlp4.onnx", batch=4)
    out = str(tmp_path / "mlp_qdq.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return out
