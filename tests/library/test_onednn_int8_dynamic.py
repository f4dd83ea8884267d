"""oneDNN int8 kernels for dynamically quantized models (onnxruntime `quantize_dynamic`:
DynamicQuantizeLinear + MatMulInteger / ConvInteger + Mul by the scales + Add of the bias):
each integer matmul or convolution (dense, grouped, depthwise; with its activation and a
residual join) becomes one int8 packed call that quantizes its input at run time, as
DynamicQuantizeLinear does, and matches onnxruntime on the same model; the precision
decision reports int8 chosen for those library workloads.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import quantized_mlp

# The QDQ tests' module fixture: skip, naming what is missing, on a host without VNNI /
# AMX-INT8 or without the oneDNN extension.
from .test_onednn_int8 import int8_host, od  # noqa: F401


@pytest.fixture(scope="module")
def qmodel(tmp_path_factory):
    return quantized_mlp(tmp_path_factory.mktemp("dyn"))


def _gpt_block(path) -> str:
    """A GPT-style block (LayerNorm, Q/K/V projections reading one input, attention, output
    projection + residual, GELU MLP), quantized by quantize_dynamic: one DynamicQuantizeLinear
    feeds three MatMulIntegers."""
    import logging

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.ln = torch.nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
            self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            h = self.ln(x)
            q, k, v = self.q(h), self.k(h), self.v(h)
            a = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v
            x = x + self.o(a)
            return x + self.proj(torch.nn.functional.gelu(self.fc(x)))

    src = str(path / "block.onnx")
    torch.onnx.export(Block().eval(), (torch.randn(1, 16, 64),), src, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    out = str(path / "block_int8.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(src, out, weight_type=QuantType.QInt8)
    return out


def _compile(path, dispatch, shapes=None):
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch=dispatch)
    optimized = pipeline.optimize(import_onnx(onnx.load(path), shapes).mod, target, cfg,
                                  until="dispatch")
    mod = optimized.mod
    return mod, pipeline.build(mod, target, cfg=cfg, start_after="dispatch"), optimized.records


def _check_against_onnxruntime(path, ex, x):
    import tvm
    from tvm import relax

    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):  # the second run hits the cached primitive and reordered weights
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        # Same int8 products and scales as onnxruntime; only fp32 summation order differs
        # (and a rounding tie may move one input one quantization step).
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-2 * np.abs(ref).max())
    return got, ref


def test_mlp_integer_matmuls_are_int8_calls_and_match_onnxruntime(qmodel):
    mod, ex, records = _compile(qmodel, "library", {"x": (4, 64)})
    text = mod.script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.QMATMUL_FUNC}"') == 2
    assert 'R.matmul(' not in text and "R.quantize(" not in text  # min/max chain gone too
    assert all(c.dynamic and c.quantized and c.precision == "int8"
               for c in records.choices)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    got, ref = _check_against_onnxruntime(qmodel, ex, x)
    assert np.abs(got - ref).max() < 1e-4  # an MLP's ties are rare: the same numbers


def test_gpt_block_shares_one_quantized_input_between_three_int8_calls(tmp_path):
    pytest.importorskip("torch")
    path = _gpt_block(tmp_path)
    n_int = sum(n.op_type == "MatMulInteger" for n in onnx.load(path).graph.node)
    mod, ex, _ = _compile(path, "library")
    text = mod.script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.QMATMUL_FUNC}"') == n_int == 6
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
    _check_against_onnxruntime(path, ex, x)


def test_decision_reports_int8_chosen_for_the_dynamic_library_workloads(qmodel, tmp_path):
    from tvmopt.interface.compile import CompileOptions, compile_model

    logs = []
    res = compile_model(CompileOptions(model=qmodel, target="host", output=str(tmp_path / "a"),
                                       dispatch="library", shapes={"x": (4, 64)},
                                       verify=True), log=logs.append)
    prec = res.artifact.manifest["precision"]
    (d,) = [d for d in prec["decisions"] if d["precision"] == "int8"]
    assert d["action"] == "chosen"
    assert "int8 compute chosen for 2 of 2 integer matmul library workload(s)" in d["reason"]
    # Every integer matmul went to the library: nothing is left for the fp32 rewrite.
    assert "tvmopt.IntegerMatmulToFP32" not in res.artifact.manifest["passes"]["precision"]
    assert res.verification and all(e.mismatched == 0 for e in res.verification)


def test_scheme_text_counts_library_and_codegen_workloads():
    from tvmopt.precision.choice import Choice
    from tvmopt.precision.schemes import SCHEMES, Context
    from tvmopt.targets.registry import get_target

    hw = get_target("x86-sapphirerapids")
    lib = [Choice("qmatmul_dynamic_bias|a", 3, "library", 0.1, 0.3, precision="int8",
                  quantized=True, dynamic=True),
           Choice("qmatmul_dynamic_bias|b", 1, "codegen", 0.3, 0.2, quantized=True,
                  dynamic=True)]
    ctx = Context(hw, [], "auto", library=lib)
    SCHEMES["int8-integer"].consider(ctx)
    (d,) = ctx.decisions
    assert d.action == "chosen" and d.precision == "int8" and ctx.model_precision == "int8"
    assert "chosen for 1 of 2 integer matmul" in d.reason and "3 call site(s)" in d.reason
    ctx = Context(hw, [], "auto", library=lib)
    SCHEMES["int8-qdq"].consider(ctx)  # not a QDQ model: the QDQ scheme stays silent
    assert not ctx.decisions


def test_without_vnni_integer_matmuls_stay_off_the_int8_kernels(qmodel, monkeypatch):
    from tvmopt.targets import registry

    monkeypatch.setattr(registry, "host_cpu_features", lambda: {"avx2", "fma"})
    mod, _, records = _compile(qmodel, "library", {"x": (4, 64)})
    assert od.QMATMUL_FUNC not in mod.script(show_meta=False)
    assert any("dynamically quantized model" in n and "int8 dot-product" in n
               for n in records.notes)


def test_fp32_rewrite_leaves_the_int8_library_matmuls_integer(qmodel):
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.precision.rewrites import integer_matmul_to_fp32_pass
    from tvmopt.runtime.in_memory import host_target

    def int32_matmuls(keep):
        cfg = pipeline.PipelineConfig(dispatch="library",
                                      precision_passes=[integer_matmul_to_fp32_pass(keep)])
        mod = pipeline.optimize(import_onnx(onnx.load(qmodel), {"x": (4, 64)}).mod,
                                host_target().to_tvm(), cfg, until="precision").mod
        return mod.script(show_meta=False).count('out_dtype="int32"')

    assert int32_matmuls(False) == 0 and int32_matmuls(True) == 2


# ------------------------------------------------------------------ ConvInteger (quantize_dynamic of CNNs)
def _residual_cnn(path, hw=(12, 12)) -> str:
    """Conv -> Relu -> grouped Conv (2 groups) + input -> Relu, then a strided Conv with bias:
    quantize_dynamic's ConvIntegers with a residual join and a non-depthwise grouped conv."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tests.models import const, make_model, rand, vi

    nodes = [onnx.helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Relu", ["c1"], ["r1"]),
             onnx.helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             onnx.helper.make_node("Add", ["c2", "x"], ["s"]),
             onnx.helper.make_node("Relu", ["s"], ["r2"]),
             onnx.helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], strides=[2, 2])]
    inits = [const("w1", rand(8, 8, 3, 3, seed=1, scale=0.3)), const("b1", rand(8, seed=2)),
             const("w2", rand(8, 4, 3, 3, seed=3, scale=0.3)),
             const("w3", rand(16, 8, 1, 1, seed=4, scale=0.3)), const("b3", rand(16, seed=5))]
    src = str(path / "res.onnx")
    out_hw = [(d + 1) // 2 for d in hw]
    onnx.save(make_model(nodes, [vi("x", [1, 8, *hw])], [vi("y", [1, 16, *out_hw])], inits), src)
    out = str(path / "res_int8.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(src, out, weight_type=QuantType.QInt8)
    return out


def test_cnn_conv_integers_are_int8_calls_and_match_onnxruntime(tmp_path):
    from tests.models import quantized_depthwise_cnn

    path = quantized_depthwise_cnn(tmp_path)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    mod, ex, records = _compile(path, "library")
    text = mod.script(show_meta=False)
    # Dense, depthwise and strided convolutions, and the head's MatMulInteger.
    assert text.count(f'R.call_dps_packed("{od.QCONV_FUNC}"') == ops.count("ConvInteger") == 4
    assert text.count(f'R.call_dps_packed("{od.QMATMUL_FUNC}"') == 1
    # No convolution left, no quantize: the min/max -> scale chains went with them, and the
    # transposes ConvertLayout put around each quantize cancel inside the calls.
    assert "R.nn.conv2d(" not in text and "R.quantize(" not in text
    assert "R.permute_dims(" not in text and "R.max(" not in text
    assert all(c.dynamic and c.quantized and c.precision == "int8"
               for c in records.choices)
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    _check_against_onnxruntime(path, ex, x)


def test_residual_and_grouped_conv_integers_join_in_the_int8_call(tmp_path):
    path = _residual_cnn(tmp_path)
    mod, ex, _ = _compile(path, "library")
    text = mod["main"].script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.QCONV_FUNC}"') == 3
    assert "R.add(" not in text and "R.nn.relu(" not in text  # the join is a sum post-op
    x = np.random.default_rng(3).standard_normal((1, 8, 12, 12)).astype(np.float32)
    _check_against_onnxruntime(path, ex, x)


def test_large_activations_quantize_with_their_whole_range(tmp_path):
    """An activation large enough that its min/max is taken by several threads in chunks, and
    whose length is no multiple of the vector width: an outlier in the last element, or in
    the middle of one chunk, sets the scale exactly as onnxruntime's does (a missed element
    would clip it, far beyond the tolerance); an all-positive input keeps 0 in its range."""
    path = _residual_cnn(tmp_path, hw=(93, 97))  # 8 * 93 * 97 floats: several chunks, a tail
    _, ex, _ = _compile(path, "library")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 93, 97)).astype(np.float32)
    last = x.copy()
    last.reshape(-1)[-1] = 40.0
    middle = x.copy()
    middle.reshape(-1)[x.size // 2 + 3] = -40.0
    for case in (last, middle, np.abs(x) + 0.5):
        _check_against_onnxruntime(path, ex, case)


def test_compile_summary_and_decision_name_the_int8_convolutions(tmp_path):
    from click.testing import CliRunner

    from tvmopt.cli.main import main
    from tests.models import quantized_depthwise_cnn

    path = quantized_depthwise_cnn(tmp_path)
    out = CliRunner().invoke(main, ["compile", path, "--target", "host", "--dispatch",
                                    "library", "-o", str(tmp_path / "art")])
    assert out.exit_code == 0, out.output
    assert "5 kernels on oneDNN (5 int8)" in out.output
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    (d,) = [d for d in manifest["precision"]["decisions"] if d["precision"] == "int8"]
    assert d["action"] == "chosen"
    assert "5 of 5 integer matmul/convolution library workload(s)" in d["reason"]
    # Built as the model quantizes itself: no rewritten graph for an fp32 build to measure,
    # so none is built; the record says what checks the artifact instead.
    acc = manifest["precision"]["accuracy"]
    assert acc["reference"] is None and acc["outputs"] == [] and "--verify" in acc["note"]
    assert "accuracy int8: no precision rewrite" in out.output
