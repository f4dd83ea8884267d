"""Every kind of bad input gets one clear line on stderr and a non-zero exit, never a traceback."""

import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.models import make_model, mlp, vi


def _one_line_error(res, *needles):
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("tvmopt: error: ")
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def mlp_path(save):
    return save(mlp(), "mlp")


@pytest.fixture
def artifact(mlp_path, tmp_path, cli):
    art = tmp_path / "mlp.tvmopt"
    assert cli("compile", mlp_path, "-o", art).exit_code == 0
    return art


def test_missing_file(cli, tmp_path):
    _one_line_error(cli("compile", tmp_path / "nope.onnx"), "nope.onnx", "no such file")
    _one_line_error(cli("inspect", tmp_path / "nope.onnx"), "no such file")


def test_not_an_onnx_file(cli, tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is a text file, not a model\n")
    _one_line_error(cli("compile", p), "notes.onnx", "not a valid ONNX")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _one_line_error(cli("inspect", empty), "empty")


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.97])
def test_truncated_protobuf(cli, mlp_path, tmp_path, fraction):
    data = mlp_path.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * fraction)])
    _one_line_error(cli("compile", p), "cut.onnx", "truncated")


def test_unsupported_ops_are_listed_with_nodes(cli, save):
    nodes = [helper.make_node("FancyNorm", ["x"], ["h"], name="fancy_1", domain="com.example"),
             helper.make_node("FancyNorm", ["h"], ["h2"], name="fancy_2", domain="com.example"),
             helper.make_node("Relu", ["h2"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", [1, 4])], [vi("y", [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    line = _one_line_error(cli("compile", save(m, "custom")), "unsupported ONNX op types",
                           "com.example::FancyNorm", "fancy_1", "fancy_2", "opset 17")
    assert "Relu" not in line
    # inspect lists them before compiling, and does not fail
    res = cli("inspect", save(m, "custom"), "--json")
    assert res.exit_code == 0
    assert json.loads(res.output)["unsupported"] == {"com.example::FancyNorm": ["fancy_1", "fancy_2"]}


def test_unsupported_standard_op(cli, save):
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tfidf", mode="TF",
                            min_gram_length=1, max_gram_length=1, max_skip_count=0,
                            ngram_counts=[0], ngram_indexes=[0], pool_int64s=[2])
    m = make_model([node], [vi("x", [1, 6], TensorProto.INT64)], [vi("y", [1, 1])])
    _one_line_error(cli("compile", save(m, "tfidf")), "TfIdfVectorizer", "tfidf")


def test_unnamed_dynamic_dim_needs_shape(cli, save):
    m = mlp()
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()  # neither a value nor a name
    p = save(m, "anon")
    _one_line_error(cli("compile", p), "input 'x' dimension 0", "--shape x=Nx32")
    res = cli("compile", p, "--shape", "x=2x32", "-o", p.parent / "ok.tvmopt")
    assert res.exit_code == 0, res.output


def test_bad_shape_arguments(cli, mlp_path):
    _one_line_error(cli("compile", mlp_path, "--shape", "y=1x32"), "'y'", "not a model input", "x")
    _one_line_error(cli("compile", mlp_path, "--shape", "x=1x3x32"), "rank 3", "rank 2")
    _one_line_error(cli("compile", mlp_path, "--shape", "x=1x31"), "dimension 1 is fixed to 32")
    _one_line_error(cli("compile", mlp_path, "--shape", "x=axb"), "integers")


def test_unknown_target_lists_valid_ones(cli, mlp_path):
    line = _one_line_error(cli("compile", mlp_path, "--target", "tpu9000"), "unknown target 'tpu9000'")
    assert "x86" in line and "host" in line


def test_wrong_input_shape_or_dtype_at_run(cli, artifact, tmp_path):
    cases = {
        "rank": ({"x": np.zeros((2, 32, 1), np.float32)}, "rank 3, expected rank 2"),
        "dim": ({"x": np.zeros((2, 31), np.float32)}, "dimension 1 is 31, expected 32"),
        "dtype": ({"x": np.zeros((2, 32), np.float64)}, "dtype float64, expected float32"),
        "name": ({"input": np.zeros((2, 32), np.float32)}, "missing input(s) x"),
    }
    for name, (feeds, needle) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **feeds)
        _one_line_error(cli("run", artifact, "--inputs", tmp_path / f"{name}.npz"), needle)
    (tmp_path / "junk.npz").write_text("junk")
    _one_line_error(cli("run", artifact, "--inputs", tmp_path / "junk.npz"), "not a readable .npz")


def test_tampered_artifact_is_refused(cli, artifact):
    lib = artifact / "model.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    _one_line_error(cli("run", artifact), "model.so", "does not match its sha256")


def test_missing_artifact_file_and_manifest(cli, artifact, tmp_path):
    _one_line_error(cli("run", tmp_path / "none.tvmopt"), "no such artifact")
    (artifact / "model.so").unlink()
    _one_line_error(cli("run", artifact), "'model.so'", "missing")
    (artifact / "manifest.json").write_text("{not json")
    _one_line_error(cli("run", artifact), "unreadable manifest")


def test_artifact_for_another_arch_is_refused(cli, artifact):
    m = json.loads((artifact / "manifest.json").read_text())
    m["target"]["arch"] = "aarch64"
    (artifact / "manifest.json").write_text(json.dumps(m))
    _one_line_error(cli("run", artifact), "built for aarch64")


def test_real_process_exit_code_and_stderr(tmp_path):
    """The installed entry point: exit status 1, one line on stderr, nothing on stdout."""
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07garbage")
    proc = subprocess.run([sys.executable, "-m", "tvmopt.cli", "compile", str(p)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("tvmopt: error: ") and "bad.onnx" in err[0]
