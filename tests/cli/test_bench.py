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
    assert res.exit_code == 1 and "choose from ort, torch, torch.compile" in res.output


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
    assert doc["baselines"] == {"ort": "ok", "torch": "ok"}
    assert {r["runner"] for r in doc["closed_loop"]} == {"tvmopt", "onnxruntime", "torch"}


def _seq_model(path):
    """x[batch, seq, 16] @ W -> mean over seq: a model whose second symbolic dim is a length."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((16, 4), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    g = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", "seq", 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["batch", 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def test_bench_sizes_map_to_a_sequence_dim(tmp_path):
    _seq_model(tmp_path / "seq.onnx")
    res = CliRunner().invoke(main, [
        "bench", str(tmp_path / "seq.onnx"), "-o", str(tmp_path / "out"), "--runs", "2",
        "--warmup", "1", "--profile-top", "0", "--no-coldstart", "--load", "poisson",
        "--rate", "100", "--duration", "0.5", "--sizes", "8:0.5,32:0.5", "--max-batch", "4",
        "--timeout-ms", "0",
        "--json", str(tmp_path / "s.json"), "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ld = json.loads((tmp_path / "s.json").read_text())["load"]
    assert ld["size_dim"] == "seq"
    assert set(ld["summary"]["by_size"]) == {"8", "32"}
    assert ld["summary"]["completed"] == ld["summary"]["requests"]
