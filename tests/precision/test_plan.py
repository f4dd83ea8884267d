"""Plan and precision end to end: quantized model on x86 keeps fp32, ARM weight-only int8,
accuracy report and --max-error, and `tvmopt plan` on the bundled model for cuda/x86/arm."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.models import mlp_file, qdq_mlp, quantized_mlp
from tvmopt.cli.main import main
from tvmopt.interface.compile import CompileOptions, compile_model
from tvmopt.errors import VerificationError
from tvmopt.interface.plan_model import plan_model
from tvmopt.targets.registry import get_target


@pytest.fixture(scope="module")
def qmodel(tmp_path_factory):
    return quantized_mlp(tmp_path_factory.mktemp("q"))


def test_int8_model_on_avx2_auto_keeps_fp32_and_says_why(qmodel, tmp_path):
    logs = []
    res = compile_model(CompileOptions(model=qmodel, target="x86", output=str(tmp_path / "a"),
                                       verify=True), log=logs.append)
    prec = res.artifact.manifest["precision"]
    assert prec["requested"] == "auto" and prec["default"] == "fp32"
    refusal = [d for d in prec["decisions"] if d["precision"] == "int8"]
    assert refusal and refusal[0]["action"] == "refused" and "VNNI" in refusal[0]["reason"]
    assert any("int8: refused" in line and "VNNI" in line for line in logs)  # printed too
    assert "tvmopt.IntegerMatmulToFP32" in res.artifact.manifest["passes"]["precision"]
    # fp32 compute of the quantized graph still matches onnxruntime's int8 execution
    assert res.verification and all(e.mismatched == 0 for e in res.verification)
    assert res.artifact.manifest["precision"]["accuracy"]["outputs"][0]["max_abs"] < 1e-4


def test_int8_verify_rechecks_onnx_reference_where_onnxruntime_saturates(qmodel, tmp_path,
                                                                          monkeypatch):
    # On x86 without VNNI onnxruntime's u8 x s8 kernels saturate int16 pair sums, so its
    # MatMulInteger is a quantization step off on some outputs (seen: 9/16, 0.00167).
    from tvmopt.runtime import verify

    exact = verify.run_onnxruntime

    def saturated(path, feeds):
        return {k: v + np.float32(0.002) * (np.arange(v.size).reshape(v.shape) % 2)
                for k, v in exact(path, feeds).items()}

    monkeypatch.setattr(verify, "run_onnxruntime", saturated)
    monkeypatch.setattr(verify, "host_has_vnni", lambda: False)
    res = compile_model(CompileOptions(model=qmodel, target="x86", output=str(tmp_path / "a"),
                                       verify=True), log=lambda s: None)
    record = json.loads((tmp_path / "a" / "manifest.json").read_text())["verification"]
    assert record["reference"] == "onnx.reference" and "VNNI" in record["note"]
    assert record["onnxruntime"][0]["mismatched"] > 0 and record["outputs"][0]["mismatched"] == 0
    # a host with VNNI has no such excuse: the same difference fails verification
    monkeypatch.setattr(verify, "host_has_vnni", lambda: True)
    with pytest.raises(VerificationError, match="differs from onnxruntime"):
        compile_model(CompileOptions(model=qmodel, target="x86", output=str(tmp_path / "b"),
                                     verify=True), log=lambda s: None)


def test_qdq_model_compiles_and_matches_onnxruntime(tmp_path):
    model = qdq_mlp(tmp_path)
    res = compile_model(CompileOptions(model=model, target="x86", output=str(tmp_path / "a"),
                                       verify=True), log=lambda s: None)
    assert all(e.mismatched == 0 for e in res.verification)
    prec = res.artifact.manifest["precision"]
    assert prec["default"] == "fp32"
    # Where the build has int8 library kernels (a host with VNNI / AMX-INT8 whose timing chose
    # them) the QDQ decision says so; otherwise it refuses int8.
    int8 = [c for c in res.artifact.manifest["kernels"]["choices"]
            if c.get("quantized") and c["choice"] == "library"]
    action = "chosen" if int8 else "refused"
    assert any("QDQ" in d["reason"] and d["action"] == action for d in prec["decisions"])


def test_arm_plan_picks_weight_only_int8_for_gemv(tmp_path):
    model = mlp_file(tmp_path / "m.onnx", din=256, hid=512, dout=64)
    p = plan_model(model, get_target("arm"))
    assert p.precision == "int8_weight"
    mm = [k for k in p.kernels if "matmul" in k.ops]
    assert mm and all(k.precision == "int8_weight" and k.bound == "memory" for k in mm)
    assert p.weight_bytes["int8_weight"] < p.weight_bytes["fp32"] / 3
    assert p.kernels_before_fusion > p.kernels_after_fusion
    # x86 (AVX2): not in its auto order -> fp32, refusal recorded
    p = plan_model(model, get_target("x86"))
    assert p.precision == "fp32" and any(d.action == "refused" for d in p.decisions)


def test_explicit_int8_accuracy_report_and_max_error(tmp_path):
    # Default schedules only: weight-only int8 is a codegen scheme, and oneDNN (which takes
    # the dense layers under the default dispatch, symbolic batch included) runs fp32 weights.
    model = mlp_file(tmp_path / "m.onnx")
    res = compile_model(CompileOptions(model=model, target="x86", output=str(tmp_path / "a"),
                                       precision="int8", dispatch="codegen"),
                        log=lambda s: None)
    acc = res.artifact.manifest["precision"]["accuracy"]
    err = acc["outputs"][0]
    assert res.artifact.manifest["precision"]["default"] == "int8_weight"
    assert 0 < err["max_abs"] < 0.05 and err["mean_abs"] <= err["max_abs"]
    with pytest.raises(VerificationError, match="max-error"):
        compile_model(CompileOptions(model=model, target="x86", output=str(tmp_path / "b"),
                                     precision="int8", max_error=1e-6, dispatch="codegen"),
                      log=lambda s: None)


# x86 in the default tier; the other targets' plans of the same model in the slow one.
@pytest.mark.parametrize("target,expect", [
    ("x86", "fp32"), pytest.param("cuda", "fp16", marks=pytest.mark.slow),
    pytest.param("arm", "int8_weight", marks=pytest.mark.slow)])
def test_plan_cli_on_bundled_model(target, expect):
    r = CliRunner().invoke(main, ["plan", "--target", target, "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["precision"] == expect
    assert p["kernels_before_fusion"] > p["kernels_after_fusion"] == len(p["kernels"])
    k = p["kernels"][0]
    assert {"ops", "flops", "bytes", "intensity", "bound", "precision", "why", "time_us"} <= set(k)
    assert p["predicted_ms"] > 0 and p["weight_bytes"]["fp16"] == p["weight_bytes"]["fp32"] / 2
    r = CliRunner().invoke(main, ["plan", "--target", target])
    assert r.exit_code == 0 and "before fusion" in r.output


def test_the_dispatch_table_gives_the_chosen_side_its_rate():
    from tvmopt.report import _chosen_gflops

    row = {"library_ms": 2.0, "library_bf16_ms": 1.0, "codegen_ms": 4.0, "gflop": 0.5}
    assert _chosen_gflops({**row, "choice": "library", "precision": "bf16"}) == "500"
    assert _chosen_gflops({**row, "choice": "library", "precision": "fp32"}) == "250"
    assert _chosen_gflops({**row, "choice": "codegen", "precision": "fp32"}) == "125"
    # FLOPs unknown (a symbolic dim), or the side untimed (a forced --dispatch): no figure
    assert _chosen_gflops({**row, "gflop": None, "choice": "codegen"}) == "-"
    assert _chosen_gflops({**row, "codegen_ms": None, "choice": "codegen"}) == "-"


def test_plan_bad_precision_is_one_line():
    r = CliRunner().invoke(main, ["plan", "--precision", "fp12"])
    assert r.exit_code != 0 and "fp12" in r.output


def test_compile_cli_prints_a_downgrade(tmp_path):
    model = mlp_file(tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["compile", model, "-t", "x86", "-p", "fp16", "-o",
                                  str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "precision fp16: downgraded" in r.output and "no fast fp16" in r.output
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["precision"]["requested"] == "fp16" and m["precision"]["default"] == "fp32"


def test_fp16_rewrite_matches_fp32_within_tolerance(tmp_path):
    """The CUDA fp16 rewrite, built for the host CPU (how compile measures its accuracy)."""
    import onnx

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.precision.rewrites import fp16_pass
    from tvmopt.runtime.in_memory import run_in_memory

    model = mlp_file(tmp_path / "m.onnx", batch=8)
    mod = import_onnx(onnx.load(model)).mod
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    outs = []
    for passes in ([fp16_pass()], []):
        outs.append(run_in_memory(mod, [x], get_target("x86").to_tvm(),
                                  pipeline.PipelineConfig(dispatch="codegen",
                                                          precision_passes=passes))[0])
    err = np.abs(outs[0] - outs[1]).max()
    assert 0 < err < 1e-2 * max(1.0, np.abs(outs[1]).max())  # fp16 rounding, not a no-op
