"""Hostile inputs to `run`, `bench` and artifact loading: one line each, with the right exit."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from tests.models import make_model, vi

from tvmopt.cli.main import main
from tvmopt.errors import ArtifactError


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _lines(text):
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def _one_error(res, *needles, code=1):
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    lines = _lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("tvmopt: error: "), res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def sqrt_artifact(tmp_path_factory):
    """y = Sqrt(x) on a symbolic batch: negative or NaN inputs give NaN outputs."""
    root = tmp_path_factory.mktemp("sqrt")
    model = make_model([helper.make_node("Sqrt", ["x"], ["y"], name="root")],
                       [vi("x", ["batch", 4])], [vi("y", ["batch", 4])])
    onnx.save(model, str(root / "sqrt.onnx"))
    res = _invoke("compile", root / "sqrt.onnx", "-o", root / "sqrt.tvmopt")
    assert res.exit_code == 0, res.output
    return root / "sqrt.tvmopt"


@pytest.fixture
def artifact(sqrt_artifact, tmp_path):
    """A private copy, free to tamper with."""
    import shutil

    return shutil.copytree(sqrt_artifact, tmp_path / "a.tvmopt")


def test_nan_and_inf_inputs_are_warned_about_and_flagged_in_outputs(sqrt_artifact, tmp_path):
    x = np.ones((2, 4), np.float32)
    x[0, 0], x[1, 1], x[1, 2] = np.nan, np.inf, np.nan
    np.savez(tmp_path / "in.npz", x=x)
    res = _invoke("run", sqrt_artifact, "--inputs", tmp_path / "in.npz",
                  "--outputs", tmp_path / "out.npz")
    assert res.exit_code == 0, res.output
    warnings = _lines(res.stderr)
    assert warnings == [
        "tvmopt: warning: input 'x': 2 NaN, 1 Inf of 8 values; running anyway "
        "(--require-finite refuses them)",
        "tvmopt: warning: output 'y': 2 NaN, 1 Inf of 8 values (from non-finite inputs)"]
    assert np.isnan(np.load(tmp_path / "out.npz")["y"]).sum() == 2


def test_require_finite_refuses_nan_inputs_and_fails_on_nan_outputs(sqrt_artifact, tmp_path):
    x = np.full((1, 4), np.nan, np.float32)
    np.savez(tmp_path / "nan.npz", x=x)
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "nan.npz", "--require-finite"),
               "input 'x': 4 NaN of 4 values", "--require-finite")
    np.savez(tmp_path / "neg.npz", x=-np.ones((1, 4), np.float32))  # finite in, NaN out
    res = _invoke("run", sqrt_artifact, "--inputs", tmp_path / "neg.npz")
    assert res.exit_code == 0
    assert _lines(res.stderr) == ["tvmopt: warning: output 'y': 4 NaN of 4 values (with finite "
                                  "inputs: the model or its build produces them)"]
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "neg.npz", "--require-finite"),
               "non-finite outputs", "output 'y': 4 NaN")


def test_empty_and_malformed_npz(sqrt_artifact, tmp_path):
    np.savez(tmp_path / "empty.npz")
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "empty.npz"),
               "empty.npz", "holds no arrays (expected: x)")
    (tmp_path / "zero.npz").write_bytes(b"")
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "zero.npz"),
               "not a readable .npz")
    np.save(tmp_path / "plain.npy", np.ones((1, 4), np.float32))
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "plain.npy"),
               "holds one unnamed array")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))  # needs pickle
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "obj.npz"),
               "not a readable .npz")
    np.savez(tmp_path / "int.npz", x=np.ones((1, 4), np.int64))
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "int.npz"),
               "input 'x': dtype int64, expected float32")
    np.savez(tmp_path / "shape.npz", x=np.ones((1, 5), np.float32))
    _one_error(_invoke("run", sqrt_artifact, "--inputs", tmp_path / "shape.npz"),
               "input 'x': dimension 1 is 5, expected 4")


def test_hashes_are_checked_before_any_library_is_loaded(artifact, monkeypatch):
    import tvm

    from tvmopt.library import onednn
    from tvmopt.runtime import loader

    loaded = []
    monkeypatch.setattr(tvm.runtime, "load_module", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(onednn, "load_extension", lambda *a, **k: loaded.append("onednn"))
    m = json.loads((artifact / "manifest.json").read_text())
    m["kernels"] = {"requires": ["onednn"]}  # would load the oneDNN extension first
    (artifact / "manifest.json").write_text(json.dumps(m))
    lib = artifact / "model.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 3] ^= 0x01  # one bit of native code
    lib.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="'model.so' does not match its sha256"):
        loader.load(artifact)
    assert loaded == []
    _one_error(_invoke("run", artifact), "does not match its sha256")
    _one_error(_invoke("bench", artifact, "--runs", "1", "--no-coldstart"),
               "does not match its sha256")


@pytest.mark.parametrize("library", ["../evil.so", "/tmp/evil.so", "other.so"])
def test_manifest_cannot_point_the_loader_at_an_unhashed_library(artifact, library):
    m = json.loads((artifact / "manifest.json").read_text())
    m["library"] = library
    (artifact / "manifest.json").write_text(json.dumps(m))
    _one_error(_invoke("run", artifact), repr(library))


def test_manifest_edited_to_name_a_target_this_host_lacks(artifact, monkeypatch):
    from tvmopt.targets import registry

    # The manifest is not hashed: an edit consistent with the files' hashes passes that check,
    # so the host check must stand on its own.
    avx512 = registry.get_target("x86-avx512")
    m = json.loads((artifact / "manifest.json").read_text())
    m["target"].update(name=avx512.name, features=list(avx512.features))
    (artifact / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setattr(registry, "host_cpu_features",
                        lambda: {"sse4_2", "avx", "avx2", "fma"})  # a host without AVX-512
    _one_error(_invoke("run", artifact), "needs CPU features", "avx512f", "this host lacks")
    m["target"].update(name="a100", device="cuda", arch="sm_80", features=[])
    (artifact / "manifest.json").write_text(json.dumps(m))
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this host has a CUDA device")
    _one_error(_invoke("run", artifact), "targets a cuda device, and this host has none")


def test_load_beyond_what_the_host_serves_is_reported_and_every_request_counted(sqrt_artifact,
                                                                                 tmp_path):
    out = tmp_path / "bench.json"
    res = _invoke("bench", sqrt_artifact, "--runs", "1", "--warmup", "0", "--profile-top", "0",
                  "--no-coldstart", "-q", "--load", "poisson", "--rate", "100000",
                  "--duration", "0.2", "--max-batch", "1", "--json", out)
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["load"]["summary"]
    assert s["overloaded"]
    assert s["completed"] + s["dropped"] + s["timed_out"] == s["requests"] > 0
    assert "pending" not in json.loads(out.read_text())["load"]["timeline"]["status"]
    assert "over capacity" in res.output


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    from onnx import TensorProto, numpy_helper

    (tmp_path / "m").mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(16, np.float32).tobytes())
    for location, needle in (("../secret.bin", "points outside the directory"),
                             ("../../../../../../etc/passwd", "points outside the directory"),
                             (str(tmp_path / "secret.bin"), "absolute path")):
        w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        entry = w.external_data.add()
        entry.key, entry.value = "location", location
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [vi("x", [2, 4])], [vi("y", [2, 4])], [w])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path = tmp_path / "m" / "model.onnx"
        onnx.save(model, str(path))
        for cmd in ("inspect", "compile"):
            _one_error(_invoke(cmd, path, "-o", tmp_path / "out") if cmd == "compile"
                       else _invoke(cmd, path), "cannot load external tensor data", needle)


def test_external_data_in_a_constant_attribute_is_loaded_too(tmp_path):
    from onnx import TensorProto, numpy_helper

    value = numpy_helper.from_array(np.full((2, 4), 3, np.float32), "c")
    (tmp_path / "c.bin").write_bytes(value.raw_data)
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    entry = value.external_data.add()
    entry.key, entry.value = "location", "c.bin"
    nodes = [helper.make_node("Constant", [], ["c"], value=value),
             helper.make_node("Add", ["x", "c"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", [2, 4])], [vi("y", [2, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    from tvmopt.frontend.onnx_model import load_onnx

    loaded = load_onnx(tmp_path / "m.onnx")
    got = numpy_helper.to_array(loaded.graph.node[0].attribute[0].t)
    assert np.array_equal(got, np.full((2, 4), 3, np.float32))


def test_rpc_server_listens_on_loopback_unless_told(monkeypatch):
    from tvmopt.tuning import rpc

    calls = []
    monkeypatch.setattr(rpc, "run_server", lambda *a: calls.append(a))
    res = _invoke("rpc", "server", "--tracker", "127.0.0.1:9190", "--key", "k")
    assert res.exit_code == 0 and calls[-1][2] == "127.0.0.1" and res.stderr == ""
    res = _invoke("rpc", "server", "--tracker", "127.0.0.1:9190", "--key", "k", "--host", "0.0.0.0")
    assert res.exit_code == 0 and calls[-1][2] == "0.0.0.0"
    assert "runs any code sent to it" in res.stderr and "0.0.0.0" in res.stderr
    assert rpc.is_loopback("127.0.0.1") and rpc.is_loopback("::1") and rpc.is_loopback("localhost")
    assert not rpc.is_loopback("0.0.0.0") and not rpc.is_loopback("10.0.0.2")


def _weighted_model(w):
    from onnx import numpy_helper

    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [vi("x", [2, 4])],
                          [vi("y", [2, 4])], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_tensor_whose_bytes_do_not_fit_its_type_and_dims_is_refused(tmp_path):
    m = _weighted_model(np.ones((2, 4), np.float32))
    m.graph.initializer[0].data_type = onnx.TensorProto.UINT4  # 32 bytes, 4 would do
    onnx.save(m, str(tmp_path / "m.onnx"))
    for cmd in ("inspect", "compile"):
        _one_error(_invoke(cmd, tmp_path / "m.onnx"), "tensor 'w' (uint4, dims [2, 4]) holds 32 "
                   "bytes of data, its type and dims need 4")


def test_nan_weights_are_warned_about_at_compile_and_inspect(tmp_path):
    w = np.ones((2, 4), np.float32)
    w[0, 1] = np.nan
    onnx.save(_weighted_model(w), str(tmp_path / "m.onnx"))
    res = _invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "a.tvmopt")
    assert res.exit_code == 0, res.output
    assert "warning: initializer 'w': 1 NaN of 8 values" in res.output
    m = json.loads((tmp_path / "a.tvmopt" / "manifest.json").read_text())
    assert m["model"]["nonfinite_weights"] == ["initializer 'w': 1 NaN of 8 values"]
    info = json.loads(_invoke("inspect", tmp_path / "m.onnx", "--json").output)
    assert info["nonfinite_weights"] == ["initializer 'w': 1 NaN of 8 values"]
