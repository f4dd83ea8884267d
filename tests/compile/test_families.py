"""Five model families, compiled through the CLI for x86 and checked against onnxruntime."""

import json

import numpy as np
import onnxruntime as ort
import pytest

from tests.models import FAMILIES


def _ort(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_compiles_and_matches_onnxruntime(family, save, cli, tmp_path):
    model_path = save(FAMILIES[family](), family)
    art = tmp_path / f"{family}.tvmopt"
    res = cli("compile", model_path, "--target", "x86", "-o", art, "--verify")
    assert res.exit_code == 0, res.output
    assert "vs onnxruntime" in res.output

    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["target"]["name"] == "x86-avx2"
    assert manifest["target"]["tvm"]["mcpu"] == "haswell"
    assert manifest["verification"]["outputs"][0]["mismatched"] == 0
    assert set(manifest["files"]) == {"model.so"}

    # run through the CLI with our own inputs and compare the saved outputs with onnxruntime
    from tvmopt.runtime.loader import random_inputs
    from tvmopt.tensor_info import TensorInfo

    feeds = random_inputs([TensorInfo.from_json(i) for i in manifest["inputs"]], {"batch": 3, "N": 2},
                          seed=7)
    np.savez(tmp_path / "in.npz", **feeds)
    res = cli("run", art, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert res.exit_code == 0, res.output
    got = np.load(tmp_path / "out.npz")
    ref = _ort(model_path, feeds)
    np.testing.assert_allclose(got[manifest["outputs"][0]["name"]], ref[0], rtol=1e-3, atol=1e-4)


def test_symbolic_batch_runs_any_batch(save, tmp_path):
    """An artifact built with a symbolic batch keeps it: one build runs batch 1, 5 and 16."""
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.runtime.loader import load, random_inputs

    path = save(FAMILIES["depthwise_cnn"](), "dw")
    result = compile_model(CompileOptions(model=str(path), output=str(tmp_path / "a")))
    assert result.artifact.manifest["inputs"][0]["shape"] == ["N", 3, 32, 32]
    lm = load(tmp_path / "a")
    for n in (1, 5, 16):
        feeds = random_inputs(lm.inputs, {"N": n}, seed=n)
        out = lm.run(feeds)["y"]
        assert out.shape == (n, 10)
        np.testing.assert_allclose(out, _ort(path, feeds)[0], rtol=1e-3, atol=1e-4)


def test_shape_override_makes_batch_static(save, tmp_path, cli):
    path = save(FAMILIES["mlp"](), "mlp")
    art = tmp_path / "mlp.tvmopt"
    res = cli("compile", path, "-o", art, "--shape", "x=4x32")
    assert res.exit_code == 0, res.output
    m = json.loads((art / "manifest.json").read_text())
    assert m["inputs"][0]["shape"] == [4, 32]
    assert m["shape_overrides"] == {"x": [4, 32]}
    # the static artifact now refuses another batch, by name and dimension
    np.savez(tmp_path / "in.npz", x=np.zeros((3, 32), np.float32))
    res = cli("run", art, "--inputs", tmp_path / "in.npz")
    assert res.exit_code == 1
    assert "input 'x': dimension 0 is 3, expected 4" in res.output


def test_manifest_records_provenance(save, tmp_path):
    import tvm

    from tvmopt import __version__
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.files import sha256_file

    path = save(FAMILIES["mlp"](), "mlp")
    compile_model(CompileOptions(model=str(path), output=str(tmp_path / "a")))
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["tvmopt_version"] == __version__
    assert m["tvm_version"] == tvm.__version__
    assert m["model"]["sha256"] == sha256_file(path)
    assert m["target"]["tvm"]["kind"] == "llvm"
    assert m["passes"]["fuse"] and "FuseOps" in m["passes"]["fuse"]
    assert m["precision"]["default"] == "fp32"
    assert m["tuning"]["database"] is None
    assert m["inputs"] == [{"name": "x", "shape": ["batch", 32], "dtype": "float32"}]
    assert m["outputs"] == [{"name": "y", "shape": ["batch", 10], "dtype": "float32"}]


def test_host_target_detects_this_machine(save, tmp_path, cli):
    from tvmopt.targets.registry import host_arch

    path = save(FAMILIES["mlp"](), "mlp")
    res = cli("compile", path, "--target", "host", "-o", tmp_path / "h", "--verify")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "h" / "manifest.json").read_text())
    assert m["target"]["name"] == "host" and m["target"]["arch"] == host_arch()
    assert m["target"]["tvm"]["mcpu"]  # LLVM's name for this CPU


def test_constant_of_shape_empty_and_symbolic(save, tmp_path, cli):
    """ConstantOfShape with an empty shape (a scalar, as torch.onnx emits for scalar constants)
    and with a shape computed from a symbolic input."""
    from onnx import TensorProto, helper

    from tests.models import const, make_model, vi

    nodes = [
        helper.make_node("ConstantOfShape", ["empty"], ["c0"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("ConstantOfShape", ["xs"], ["c1"],
                         value=helper.make_tensor("w", TensorProto.FLOAT, [1], [2.0])),
        helper.make_node("Mul", ["x", "c1"], ["m"]),
        helper.make_node("Add", ["m", "c0"], ["y"]),
    ]
    m = make_model(nodes, [vi("x", ["batch", 4])], [vi("y", ["batch", 4])],
                   [const("empty", np.zeros((0,), np.int64))])
    res = cli("compile", save(m, "cos"), "-o", tmp_path / "cos", "--verify", "--dim", "batch=3")
    assert res.exit_code == 0, res.output
