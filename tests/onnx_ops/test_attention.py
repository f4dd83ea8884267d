"""Attention: float16/bfloat16 rounding, masks, windows, external KV cache, torch SDPA export.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from tests.harness import check_against_reference, run_tvmopt
from tests.models import graph_model



# ---- Attention: float16/bfloat16 rounding, masks, windows, external KV cache -------------

def _attention(feeds, attrs, opset, n_out=1, names=("Q", "K", "V")):
    outs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", list(names), outs, **attrs)
    return graph_model(node, feeds, outs, opset=opset)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_low_precision_causal_matches_reference_exactly(dtype):
    # The reference accumulates matmuls in float32 and rounds softmax steps to the input type;
    # TVM's float16 accumulators drifted 1-8 ulps, which the cases' rtol=1e-3 rejects.
    rng = np.random.default_rng(0)
    feeds = {k: rng.random(shape).astype(dtype)
             for k, shape in (("Q", (2, 3, 4, 8)), ("K", (2, 3, 6, 8)), ("V", (2, 3, 6, 8)))}
    model = _attention(feeds, {"is_causal": 1}, 23)
    want = ReferenceEvaluator(model).run(None, feeds)[0].astype("float32")
    got = run_tvmopt(model, feeds)[0].astype("float32")
    # bfloat16: same up to rounding of fused intermediates; float16: within 1 ulp
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)) <= ulp + 1e-6


def test_attention_fully_masked_row_is_zero_and_mode2_keeps_minus_inf():
    rng = np.random.default_rng(1)
    feeds = {"Q": rng.random((1, 2, 3, 4), dtype=np.float32),
             "K": rng.random((1, 2, 5, 4), dtype=np.float32),
             "V": rng.random((1, 2, 5, 4), dtype=np.float32),
             "mask": np.array([[True] * 5, [False] * 5, [True, False, True, False, True]])}
    model = _attention(feeds, {"qk_matmul_output_mode": 2}, 23, n_out=4,
                       names=("Q", "K", "V", "mask"))
    y, _, _, qk = check_against_reference(model, feeds)
    assert np.all(y[:, :, 1] == 0) and np.all(np.isneginf(qk[:, :, 1]))


@pytest.mark.parametrize("left,right,causal", [(2, -1, 1), (1, 1, 0), (-1, 0, 0)])
def test_attention_sliding_window(left, right, causal):
    rng = np.random.default_rng(2)
    feeds = {k: rng.random((1, 2, 6, 4), dtype=np.float32) for k in ("Q", "K", "V")}
    check_against_reference(_attention(feeds, {"left_window_size": left, "right_window_size": right,
                              "is_causal": causal}, 25), feeds)


def test_attention_nonpad_kv_seqlen_decode_with_gqa_and_window():
    # A static KV buffer of 8 with 5 and 3 valid keys; one decode query per batch.
    rng = np.random.default_rng(3)
    feeds = {"Q": rng.random((2, 4, 1, 8), dtype=np.float32),
             "K": rng.random((2, 2, 8, 8), dtype=np.float32),
             "V": rng.random((2, 2, 8, 8), dtype=np.float32),
             "nonpad": np.array([5, 3], dtype=np.int64)}
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad"], ["Y"],
                            is_causal=1, left_window_size=2)
    check_against_reference(graph_model(node, feeds, ["Y"], opset=25), feeds)


def test_torch_sdpa_fp16_causal_export_matches_reference():
    # What exporters write for F.scaled_dot_product_attention: MatMul -> Softmax -> MatMul in
    # float16, which tvmopt now rounds like the reference (float32 accumulation).
    torch = pytest.importorskip("torch")
    import io

    class SDPA(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal((1, 2, 8, 16)).astype("float16") for _ in range(3)]
    buf = io.BytesIO()
    torch.onnx.export(SDPA(), tuple(torch.from_numpy(a) for a in qkv), buf, dynamo=False,
                      opset_version=17, input_names=["q", "k", "v"])
    model = onnx.load_from_string(buf.getvalue())
    assert {"MatMul", "Softmax"} <= {n.op_type for n in model.graph.node}
    feeds = dict(zip(["q", "k", "v"], qkv))
    want = ReferenceEvaluator(model).run(None, feeds)[0].astype("float32")
    got = run_tvmopt(model, feeds)[0].astype("float32")
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    exact = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a.astype("float32")) for a in qkv), is_causal=True).numpy()
    np.testing.assert_allclose(got, exact, rtol=1e-2, atol=5e-3)
