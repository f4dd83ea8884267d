"""End to end: `tvmopt bench` compiles a bundled model and benches the artifact briefly."""

import json

import pytest
from click.testing import CliRunner

from tvmopt.cli.main import main
from tvmopt.models import bundled


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", str(bundled()["mobile_cnn"]), "-o", str(out / "art"), "--batch", "1,2", "--runs", "4", "--warmup", "1",
            "--baselines", "ort", "--profile-top", "3", "--load", "poisson", "--rate", "20",
            "--duration", "1", "--max-batch", "4", "--soak", "1", "--json", str(out / "b.json"),
            "--csv", str(out / "b.csv"), "--plot", str(out / "b.png"), "-q"]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    return res, out


def test_bench_prints_every_section(bench_run):
    res, _ = bench_run
    assert res.exit_code == 0, res.output
    for text in ("closed-loop latency", "samples/s/ort", "per-kernel profile", "load test",
                 "end-to-end", "batch-size histogram", "soak:", "memory: RSS", "cold start"):
        assert text in res.output, text


def test_bench_json_holds_the_documented_sections(bench_run):
    _, out = bench_run
    doc = json.loads((out / "b.json").read_text())
    assert doc["schema"] == "tvmopt.bench/1"
    rows = {(r["runner"], r["batch"]): r for r in doc["closed_loop"]}
    assert set(rows) == {("tvmopt", 1), ("onnxruntime", 1), ("tvmopt", 2), ("onnxruntime", 2)}
    assert rows[("tvmopt", 2)]["steady"]["n"] == 4
    assert rows[("onnxruntime", 1)]["ratio_to_ort"]["p50_ms"] == pytest.approx(1.0)
    assert doc["profile"]["kernels"] and 0 < doc["profile"]["kernels"][0]["share"] <= 1
    s = doc["load"]["summary"]
    assert s["requests"] == s["completed"] + s["dropped"] + s["timed_out"] > 0
    assert doc["memory"]["rss_peak_bytes"] >= doc["memory"]["rss_start_bytes"] > 0
    assert doc["cold_start"]["first_run_s"] > 0
    assert doc["soak"]["calls"] > 0 and len(doc["soak"]["windows"]) >= 1
    assert (out / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "b.csv").read_text().startswith("section,runner,batch,metric,value")


def test_bench_errors_are_one_line(tmp_path):
    res = CliRunner().invoke(main, ["bench", str(tmp_path / "missing.tvmopt")])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and res.output.startswith("tvmopt: error:")
    res = CliRunner().invoke(main, ["bench", str(tmp_path / "m.onnx"), "--baselines", "tf"])
    assert res.exit_code == 1 and "choose from ort, openvino, openvino-f32, torch, torch.compile" in res.output


def _has_onnx2torch() -> bool:
    try:
        from tvmopt.bench.runner import _import_onnx2torch

        _import_onnx2torch()
        return True
    except Exception:
        return False


def test_bench_an_artifact_finds_its_bundled_model_for_baselines(bench_run):
    _, out = bench_run
    art = out / "art" / "mobile_cnn.tvmopt"
    res = CliRunner().invoke(main, ["bench", str(art), "--runs", "2", "--warmup", "1",
                                    "--baselines", "ort,torch", "--profile-top", "0",
                                    "--no-coldstart", "--json", str(out / "a.json"), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "a.json").read_text())
    assert doc["model"].endswith("mobile_cnn.onnx")  # matched by the manifest's sha256
    assert doc["baselines"]["ort"] == "ok"
    if _has_onnx2torch():
        assert doc["baselines"]["torch"] == "ok"
        assert {r["runner"] for r in doc["closed_loop"]} == {"tvmopt", "onnxruntime", "torch"}
    else:  # not a dependency (it drags in a torchvision that breaks torch): say how to add it
        assert "pip install --no-deps onnx2torch" in doc["baselines"]["torch"]
        assert {r["runner"] for r in doc["closed_loop"]} == {"tvmopt", "onnxruntime"}


def test_bench_a_torch_program_against_its_own_module(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    ep = torch.export.export(model, (torch.randn(2, 16),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(tmp_path / "mlp.pt2"))
    res = CliRunner().invoke(main, ["bench", str(tmp_path / "mlp.pt2"), "-o", str(tmp_path / "o"),
                                    "--batch", "1,4", "--runs", "3", "--warmup", "1",
                                    "--baselines", "torch,ort", "--profile-top", "0",
                                    "--no-coldstart", "--json", str(tmp_path / "p.json"), "-q"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["baselines"]["torch"] == "ok"
    assert "onnxruntime runs ONNX models" in doc["baselines"]["ort"]
    assert {(r["runner"], r["batch"]) for r in doc["closed_loop"]} == {
        ("tvmopt", 1), ("torch", 1), ("tvmopt", 4), ("torch", 4)}  # one artifact, any batch
    assert list(doc["artifacts"]) == ["any"]


@pytest.mark.parametrize("spec", ["x=4,32", "x=4x32"])
def test_bench_reads_shape_as_compile_does(cli, save, tmp_path, monkeypatch, spec):
    from tests.models import mlp
    from tvmopt.bench import suite
    from tvmopt.errors import TvmoptError

    seen = []

    def stop(model, opts, out, shapes, log):  # stands in for the slow compile
        seen.append(shapes)
        raise TvmoptError("stopped before compiling")

    monkeypatch.setattr(suite, "_compile", stop)
    res = cli("bench", save(mlp(), "mlp"), "--shape", spec, "--batch", "2", "-q",
              "-o", tmp_path / "o")
    assert res.exit_code == 1 and "stopped before compiling" in res.output, res.output
    assert seen == [{"x": (2, 32)}]  # --batch replaces the leading dim of the given shape


@pytest.mark.parametrize("spec,needle", [("x=4xa", "integers"), ("x", "expected NAME=")])
def test_a_bad_bench_shape_is_one_line(cli, tmp_path, spec, needle):
    res = cli("bench", tmp_path / "m.onnx", "--shape", spec)
    assert res.exit_code == 1 and needle in res.output, res.output
    assert res.output.startswith("tvmopt: error:") and res.output.count("\n") == 1


@pytest.fixture(scope="module")
def seq_artifact(tmp_path_factory):
    """A (batch, seq, 8) -> (batch, seq, 4) model compiled with seq bounded to 2..32."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    out = tmp_path_factory.mktemp("bench_dims")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype("float32"), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
                          initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(out / "m.onnx"))
    res = CliRunner().invoke(main, ["compile", str(out / "m.onnx"), "-o", str(out / "m.tvmopt"),
                                    "--dim", "seq=2..32", "--dispatch", "codegen"])
    assert res.exit_code == 0, res.output
    return out


def _bench_dims(folder, *extra):
    args = ["bench", str(folder / "m.tvmopt"), "--model", str(folder / "m.onnx"), "--runs", "2",
            "--warmup", "0", "--profile-top", "0", "--no-coldstart", "--baselines", "ort",
            "--json", str(folder / "d.json"), "-q", *extra]
    return CliRunner().invoke(main, args)


def test_bench_says_which_value_each_symbolic_dim_got(seq_artifact):
    res = _bench_dims(seq_artifact, "--dim", "seq=16")
    assert res.exit_code == 0, res.output
    assert "symbolic dims: batch = the batch size; seq = 16 (--dim)" in res.output
    doc = json.loads((seq_artifact / "d.json").read_text())
    assert doc["dims"] == {"batch": {"value": "--batch", "from": "--batch"},
                           "seq": {"value": 16, "from": "--dim"}}
    assert {r["runner"] for r in doc["closed_loop"]} == {"tvmopt", "onnxruntime"}

    # Not given: the lower bound it was compiled for (1 would be refused), and it says so.
    res = _bench_dims(seq_artifact)
    assert res.exit_code == 0, res.output
    assert "seq = 2 (the compiled lower bound)" in res.output
    assert json.loads((seq_artifact / "d.json").read_text())["dims"]["seq"] == {"value": 2,
                                                                               "from": "bound"}


@pytest.mark.parametrize("dim,needle", [("seq=64", "outside 2..32"), ("batch=2", "set it with --batch"),
                                        ("len=3", "not a symbolic dim"), ("seq=x", "integer")])
def test_a_bad_bench_dim_is_one_line(seq_artifact, dim, needle):
    res = _bench_dims(seq_artifact, "--dim", dim)
    assert res.exit_code != 0 and needle in res.output, res.output
    assert "Traceback" not in res.output


def test_an_error_after_the_baselines_started_is_still_one_line(tmp_path):
    """The baselines' worker processes see the harness go when it stops on an error: they end
    quietly, not with a traceback of their own on the user's terminal."""
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    res = CliRunner().invoke(main, ["compile", str(tmp_path / "m.onnx"), "--target", "x86",
                                    "-o", str(tmp_path / "art")])
    assert res.exit_code == 0, res.output
    res = subprocess.run([sys.executable, "-m", "tvmopt.cli", "bench", str(tmp_path / "art"),
                          "--model", str(tmp_path / "m.onnx"), "--batch", "3", "--runs", "2",
                          "--baselines", "ort", "--profile-top", "0", "--no-coldstart", "-q"],
                         capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "static batch of 2; cannot run batch 3" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0, res.stderr
