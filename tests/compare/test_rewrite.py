"""Folding onnxruntime's dynamic quantization back to fp32 convolutions/matmuls."""

import logging

import numpy as np
import onnx
import pytest

from tests.models import cnn, quantized_mlp
from tvmopt.compare.rewrite import fold_dynamic_quantization, has_dynamic_quantization


def _quantize(src, dst):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst


def _run(path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("kind", ["conv", "matmul"])
def test_folded_model_has_no_integer_ops_and_stays_close(kind, tmp_path, save):
    if kind == "conv":
        fp32 = save(cnn(), "cnn")
        feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("f4")}
        q = _quantize(fp32, tmp_path / "cnn_int8.onnx")
    else:
        q = quantized_mlp(tmp_path)
        fp32 = tmp_path / "mlp.onnx"
        feeds = {"x": np.random.default_rng(0).standard_normal((2, 64)).astype("f4")}
    qm = onnx.load(str(q))
    assert has_dynamic_quantization(qm)
    folded, n = fold_dynamic_quantization(qm)
    assert n >= 2
    ops = {node.op_type for node in folded.graph.node}
    assert not ops & {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "Cast"}
    assert not has_dynamic_quantization(folded)
    out = tmp_path / "folded.onnx"
    onnx.save(folded, str(out))
    ref, got, q_out = _run(fp32, feeds), _run(out, feeds), _run(q, feeds)
    # dequantized weights, fp32 activations: no worse than the int8 model, far from zero error
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= max(np.abs(q_out - ref).max(), 1e-6) * 1.5 + 1e-6
    assert np.abs(got - ref).max() < 0.05 * scale


def test_a_float_model_is_left_alone(save):
    m = cnn()
    folded, n = fold_dynamic_quantization(m)
    assert n == 0
    assert [x.op_type for x in folded.graph.node] == [x.op_type for x in m.graph.node]
