"""tools/make_variant_pairs.py writes every model and pairs that compare can take."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # exports six torch models and quantizes them
def test_pairs_are_generated_with_matching_signatures(tmp_path):
    import onnx

    from tvmopt.compare.rewrite import has_dynamic_quantization
    from tvmopt.compare.run import check_signatures

    subprocess.run([sys.executable, str(ROOT / "tools" / "make_variant_pairs.py"), str(tmp_path)],
                   check=True, capture_output=True)
    pairs = json.loads((tmp_path / "pairs.json").read_text())
    assert len(pairs) == 9
    for p in pairs:
        a, b = onnx.load(p["a"]), onnx.load(p["b"])
        check_signatures(p["a"], a, p["b"], b)
        if p["b"].endswith("_int8.onnx"):
            assert has_dynamic_quantization(b) and not has_dynamic_quantization(a)
        if p["b"].endswith("_qdq.onnx"):
            ops = {n.op_type for n in b.graph.node}
            assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    # the transformer pairs the default dispatch gives library kernels: a dynamic int8 decoder
    # and a static QDQ encoder
    assert {"gpt2_int8.onnx", "tfm_qdq.onnx"} <= {Path(p["b"]).name for p in pairs}
    dw = onnx.load(str(tmp_path / "cnn_dw.onnx"))
    groups = [a.i for n in dw.graph.node if n.op_type == "Conv" for a in n.attribute
              if a.name == "group"]
    assert max(groups) > 1
