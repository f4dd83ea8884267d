"""Values from a request that address memory: no signal, no silent output, in-range values exact.

Each operator that reads indices or sizes from its inputs is compiled once (static and symbolic
shapes) and fed values drawn by hypothesis, far out of range and negative included, through the
artifact path (`compile_model` -> artifact -> `load` -> `run`). onnxruntime is the reference for
what is valid: where it refuses, the artifact must raise InputValueError naming the node, the
input and the value; where it answers, the artifact must give the same answer. A segfault or an
out-of-bounds write would take the test process with it, so reaching the end is the first check.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from tvmopt.errors import InputValueError, RunError, ShapeError
from tvmopt.interface.compile import CompileOptions, compile_model
from tvmopt.runtime.loader import load

LIMIT = 100_000  # --max-elements the size models are compiled with
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
# wide enough to hit every case: in range, negative in range, far out either side, int64 ends
HOSTILE = st.one_of(st.integers(-60, 60), st.integers(-2**62, 2**62),
                    st.sampled_from([-2**63, 2**63 - 1, 1_000_000, -1_000_000]))


def _save(path, nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def _table(name="tab", rows=50, cols=4):
    values = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) / 7
    return helper.make_tensor(name, TP.FLOAT, [rows, cols], values.ravel())


def _vi(name, shape, dtype=TP.INT64):
    return helper.make_tensor_value_info(name, dtype, shape)


def _out(rank, dtype=TP.FLOAT, name="y"):
    return helper.make_tensor_value_info(name, dtype, [f"o{i}" for i in range(rank)])


def _index_models():
    upd = helper.make_tensor("upd", TP.FLOAT, [3, 4], np.ones(12, np.float32))
    return {
        "gather": ([helper.make_node("Gather", ["tab", "ids"], ["y"], name="emb")],
                   [_vi("ids", ["b", "s"])], [_out(3)], [_table()], (2, 3)),
        "gather_static": ([helper.make_node("Gather", ["tab", "ids"], ["y"], name="emb", axis=1)],
                          [_vi("ids", [5])], [_out(2)], [_table()], (5,)),
        "gather_elements": ([helper.make_node("GatherElements", ["tab", "ids"], ["y"], name="ge")],
                            [_vi("ids", [3, 4])], [_out(2)], [_table()], (3, 4)),
        "gather_nd": ([helper.make_node("GatherND", ["tab", "ids"], ["y"], name="gnd")],
                      [_vi("ids", ["n", 2])], [_out(1)], [_table()], (3, 2)),
        "scatter_nd": ([helper.make_node("ScatterND", ["tab", "ids", "upd"], ["y"], name="snd")],
                       [_vi("ids", [3, 1])], [_out(2)], [_table(), upd], (3, 1)),
        "scatter_elements": ([helper.make_node("ScatterElements", ["tab", "ids", "upd"], ["y"],
                                               name="se", axis=0)],
                             [_vi("ids", [3, 4])], [_out(2)], [_table(), upd], (3, 4)),
    }


def _compile_each(root, models: dict, **options) -> dict:
    """name -> (loaded artifact, onnxruntime session, the model's feed shapes, node name)."""
    import onnxruntime as ort

    out = {}
    for name, (nodes, ins, outs, inits, shapes) in models.items():
        path = _save(root / f"{name}.onnx", nodes, ins, outs, inits)
        compile_model(CompileOptions(model=path, target="host", dispatch="codegen",
                                     output=str(root / f"{name}.tvmopt"), **options),
                      log=lambda *a: None)
        out[name] = (load(root / f"{name}.tvmopt"), ort.InferenceSession(path), shapes,
                     nodes[0].name)
    return out


@pytest.fixture(scope="module")
def index_artifacts(tmp_path_factory):
    return _compile_each(tmp_path_factory.mktemp("index_ops"), _index_models())


def _compare(model, sess, feeds: dict, node: str, value_range=None):
    """The artifact answers as onnxruntime does, or refuses where it refuses; then still works."""
    try:
        ref = sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's refusal is the expectation
        ref = None
    if ref is None:
        with pytest.raises((InputValueError, ShapeError)) as err:
            model.run(feeds)
        if isinstance(err.value, InputValueError):
            text = str(err.value)
            assert f"node '{node}'" in text and "\n" not in text, text
        return False
    got = model.run(feeds)
    for want, (name, have) in zip(ref, got.items()):
        np.testing.assert_array_equal(have, want, err_msg=name)
    return True


@pytest.mark.parametrize("name", sorted(_index_models()))
def test_index_operators_refuse_out_of_range_and_stay_exact(index_artifacts, name):
    model, sess, shape, node = index_artifacts[name]
    rows = {"gather_static": 4}.get(name, 50)

    @SETTINGS
    @given(st.lists(HOSTILE, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    def check(values):
        ids = np.array(values, np.int64).reshape(shape)
        ok = _compare(model, sess, {"ids": ids}, node)
        if not ok:
            bad = [v for v in values if not -rows <= v < rows]
            assert bad, "refused though every index is in range"
        # the artifact answers the next request
        _compare(model, sess, {"ids": np.zeros(shape, np.int64)}, node)

    check()


def test_the_error_names_node_input_value_and_range(index_artifacts):
    model, _, _, _ = index_artifacts["gather"]
    with pytest.raises(InputValueError) as err:
        model.run({"ids": np.array([[1, 2, 1_000_000]], np.int64)})
    assert str(err.value) == ("node 'emb' (Gather): input 'indices' ('ids'): index 1000000 is "
                              "out of range: valid indices are [-50, 49]")
    got = model.run({"ids": np.array([[-1, -50, 49]], np.int64)})["y"]
    np.testing.assert_array_equal(got[0], (np.arange(200, dtype=np.float32).reshape(50, 4) / 7)
                                  [[49, 0, 49]])


def test_a_constant_index_into_a_dim_known_only_at_run_time(tmp_path):
    """Gather(x[:, 5]) of a symbolic sequence: in range only where the sequence is long enough."""
    idx = helper.make_tensor("five", TP.INT64, [], [5])
    path = _save(tmp_path / "pick.onnx", [helper.make_node("Gather", ["x", "five"], ["y"],
                                                           name="pick", axis=1)],
                 [helper.make_tensor_value_info("x", TP.FLOAT, ["b", "s"])], [_out(1)], [idx])
    res = compile_model(CompileOptions(model=path, target="host", dispatch="codegen",
                                       output=str(tmp_path / "pick.tvmopt")), log=lambda *a: None)
    model = load(res.artifact.path)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(model.run({"x": x})["y"], x[:, 5])
    with pytest.raises(InputValueError, match=r"node 'pick' \(Gather\): input 'indices' "
                                              r"\('five'\): index 5 is out of range: valid "
                                              r"indices are \[-3, 2\]"):
        model.run({"x": x[:, :3].copy()})


def test_a_position_table_sliced_to_the_sequence_refuses_a_longer_one(tmp_path):
    """BERT's exports slice a buffer of position ids to the sequence length (`position_ids[:,
    :seq]`); past the buffer that read past it. onnxruntime refuses; so must the artifact."""
    import onnxruntime as ort

    inits = [helper.make_tensor("buf", TP.INT64, [1, 32], np.arange(32)),
             helper.make_tensor("pos", TP.FLOAT, [32, 4], np.arange(128, dtype=np.float32)),
             helper.make_tensor("one", TP.INT64, [], [1]),
             helper.make_tensor("zero", TP.INT64, [1], [0]),
             helper.make_tensor("ax", TP.INT64, [1], [1])]
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["seq", "zero"], ["end"]),
             helper.make_node("Slice", ["buf", "zero", "end", "ax"], ["positions"],
                              name="position_ids"),
             helper.make_node("Gather", ["pos", "positions"], ["y"], name="position_embeddings")]
    path = _save(tmp_path / "pos.onnx", nodes, [_vi("ids", ["b", "s"])], [_out(3)], inits,
                 opset=17)
    res = compile_model(CompileOptions(model=path, target="host", dispatch="codegen",
                                       output=str(tmp_path / "pos.tvmopt")), log=lambda *a: None)
    model, sess = load(res.artifact.path), ort.InferenceSession(path)
    for seq in (1, 32):
        feeds = {"ids": np.zeros((1, seq), np.int64)}
        np.testing.assert_array_equal(model.run(feeds)["y"], sess.run(None, feeds)[0])
    with pytest.raises(InputValueError, match=r"node 'position_ids' \(Slice\): .*value 32 at "
                                              r"position 1 must be 40"):
        model.run({"ids": np.zeros((1, 40), np.int64)})


def _size_models():
    x = helper.make_tensor("x", TP.FLOAT, [2, 3], np.arange(6, dtype=np.float32))
    v = helper.make_tensor("v", TP.FLOAT, [2], [0.0, 1.0])
    return {
        "reshape": ([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
                    [_vi("s", [2])], [_out(2)], [x], {"s": (2,)}),
        "expand": ([helper.make_node("Expand", ["x", "s"], ["y"], name="ex")],
                   [_vi("s", [2])], [_out(2)], [x], {"s": (2,)}),
        "tile": ([helper.make_node("Tile", ["x", "s"], ["y"], name="ti")],
                 [_vi("s", [2])], [_out(2)], [x], {"s": (2,)}),
        "constant_of_shape": ([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")],
                              [_vi("s", [2])], [_out(2)], [], {"s": (2,)}),
        "range": ([helper.make_node("Range", ["a", "b", "c"], ["y"], name="rg")],
                  [_vi("a", []), _vi("b", []), _vi("c", [])], [_out(1, TP.INT64)], [],
                  {"a": (), "b": (), "c": ()}),
        "one_hot": ([helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="oh")],
                    [_vi("i", [3]), _vi("d", [])], [_out(2)], [v], {"i": (3,), "d": ()}),
        "top_k": ([helper.make_node("TopK", ["x", "k"], ["y", "yi"], name="tk")],
                  [_vi("k", [1])], [_out(2), _out(2, TP.INT64, "yi")], [x], {"k": (1,)}),
    }


@pytest.fixture(scope="module")
def size_artifacts(tmp_path_factory):
    return _compile_each(tmp_path_factory.mktemp("size_ops"), _size_models(), max_elements=LIMIT)


def _elements(name, feeds) -> float:
    """What the request asks to allocate (at most; |values| for negative ones), to keep
    onnxruntime's allocations small."""
    if name == "range":
        a, b, c = (float(feeds[k]) for k in "abc")
        return max((b - a) / c, 0.0) if c else float("inf")
    if name == "one_hot":
        return 3.0 * abs(float(feeds["d"]))
    if name == "top_k":
        return 6.0
    vals = [max(abs(float(v)), 1.0) for v in feeds["s"].reshape(-1)]
    return float(np.prod(vals)) * (6 if name == "tile" else 1)


@pytest.mark.parametrize("name", sorted(_size_models()))
def test_sizes_from_inputs_are_refused_before_allocating(size_artifacts, name):
    model, sess, shapes, node = size_artifacts[name]
    small = st.integers(-4, 8)

    @SETTINGS
    @given(st.data())
    def check(data):
        feeds = {k: np.array(data.draw(st.lists(st.one_of(small, HOSTILE), min_size=int(
            np.prod(s)), max_size=int(np.prod(s)))), np.int64).reshape(s) for k, s in shapes.items()}
        size = _elements(name, feeds)
        if name == "range" and max(abs(int(v)) for v in feeds.values()) > 2**53:
            size = LIMIT + 1  # float64 counts past 2^53 may round: an answer or a refusal
        if size <= LIMIT:
            _compare(model, sess, feeds, node)
        elif size > 8 * LIMIT:  # too large to allocate here: refused, unallocated
            with pytest.raises((InputValueError, ShapeError)):
                model.run(feeds)
        else:  # near the limit, where the bound above is loose: no crash, and an answer or
            try:  # a clear refusal
                model.run(feeds)
            except (InputValueError, ShapeError):
                pass

    check()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A BERT-style embedding: word and position tables, positions from Range over the
    sequence, a projection; symbolic batch and sequence."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("encoder")
    inits = [helper.make_tensor("word", TP.FLOAT, [1000, 16], rng.standard_normal(16000)),
             helper.make_tensor("pos", TP.FLOAT, [32, 16], rng.standard_normal(512)),
             helper.make_tensor("w", TP.FLOAT, [16, 8], rng.standard_normal(128)),
             helper.make_tensor("zero", TP.INT64, [], [0]),
             helper.make_tensor("one", TP.INT64, [], [1]),
             helper.make_tensor("axis1", TP.INT64, [1], [1])]
    nodes = [helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["positions"]),
             helper.make_node("Gather", ["word", "input_ids"], ["we"], name="word_embeddings"),
             helper.make_node("Gather", ["pos", "positions"], ["pe"], name="position_embeddings"),
             helper.make_node("Add", ["we", "pe"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["hidden"])]
    path = _save(root / "enc.onnx", nodes, [_vi("input_ids", ["batch", "seq"])],
                 [helper.make_tensor_value_info("hidden", TP.FLOAT, ["batch", "seq", 8])], inits,
                 opset=17)
    res = compile_model(CompileOptions(model=path, target="host", output=str(root / "enc.tvmopt")),
                        log=lambda *a: None)
    return load(res.artifact.path), ort.InferenceSession(path), path, res.artifact.path


@SETTINGS
@given(batch=st.integers(1, 3), seq=st.integers(1, 40), ids=st.lists(HOSTILE, min_size=1,
                                                                      max_size=4))
def test_an_encoders_token_ids_and_sequence_length_at_any_size(encoder, batch, seq, ids):
    model, sess, _, _ = encoder
    feeds = {"input_ids": np.resize(np.array(ids, np.int64), (batch, seq))}
    try:
        ref = sess.run(None, feeds)[0]
    except Exception:  # noqa: BLE001
        ref = None
    if ref is None:  # a token id out of the vocabulary, or a sequence past the position table
        with pytest.raises(InputValueError, match=r"node '(word|position)_embeddings' \(Gather\)"):
            model.run(feeds)
    else:
        np.testing.assert_allclose(model.run(feeds)["hidden"], ref, rtol=1e-5, atol=1e-5)


def test_the_manifest_lists_the_checks_that_remain(encoder):
    _, _, _, art = encoder
    manifest = json.loads((art / "manifest.json").read_text())
    checks = manifest["run_time_checks"]
    assert checks["max_elements"] == 2**31
    # both embeddings read run-time indices (the positions follow the symbolic sequence)
    assert "node 'word_embeddings' (Gather): input 'indices' ('input_ids')" in checks["checks"]
    assert any("position_embeddings" in c for c in checks["checks"])


def test_tvmopt_run_exits_1_with_one_line(encoder, tmp_path):
    _, _, _, art = encoder
    np.savez(tmp_path / "bad.npz", input_ids=np.full((1, 4), -1_000_000, np.int64))
    proc = subprocess.run([sys.executable, "-m", "tvmopt.cli", "run", str(art), "--inputs",
                           str(tmp_path / "bad.npz")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["tvmopt: error: node 'word_embeddings' (Gather): input 'indices' "
                     "('input_ids'): index -1000000 is out of range: valid indices are "
                     "[-1000, 999]"], proc.stderr


def test_a_torch_programs_embedding_checks_its_ids(tmp_path):
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(40, 8)

        def forward(self, ids):
            return self.emb(ids).sum(-1)

    m = Model().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(m, (torch.zeros(2, 3, dtype=torch.int64),),
                             dynamic_shapes={"ids": {0: batch}})
    torch.export.save(ep, str(tmp_path / "emb.pt2"))
    res = compile_model(CompileOptions(model=str(tmp_path / "emb.pt2"), target="host",
                                       dispatch="codegen", output=str(tmp_path / "emb.tvmopt")),
                        log=lambda *a: None)
    model = load(res.artifact.path)
    name = model.inputs[0].name
    for bad in (40, -1, 2**40):  # 2^40: before TVM's importer casts the ids to int32
        with pytest.raises(InputValueError, match=rf"'{name}' \(a model input\): index {bad} is "
                                                  r"out of range: valid indices are \[0, 39\]"):
            model.run({name: np.array([[1, bad, 2]], np.int64)})
    ids = np.array([[1, 39, 0], [5, 6, 7]], np.int64)
    want = m(torch.from_numpy(ids)).detach().numpy()
    np.testing.assert_allclose(model.run({name: ids})[list(model.run({name: ids}))[0]], want,
                               rtol=1e-5, atol=1e-5)


def test_a_load_test_counts_refused_requests_and_goes_on():
    from tvmopt.bench.clock import SimClock
    from tvmopt.bench.load import Request
    from tvmopt.bench.server import BatchPolicy, serve

    class Runner:
        def __init__(self, clock):
            self.clock, self.calls = clock, 0

        def prepare(self, batch, size=None):
            pass

        def run(self, batch, size=None):
            self.calls += 1
            self.clock.sleep(1e-3)
            if self.calls % 3 == 0:
                raise RunError("node 'emb' (Gather): input 'indices' ('ids'): index 7 is out "
                               "of range: valid indices are [-5, 4]")

    clock = SimClock()
    runner = Runner(clock)
    reqs = [Request(i, 0.01 * i, "1", 1) for i in range(30)]
    res = serve(runner, clock, reqs, BatchPolicy(max_batch=1, max_wait_s=0.0, timeout_s=None,
                                                 max_queue=100))
    summary = res.summary()
    assert summary["failed"] == 10 and summary["completed"] == 20
    assert list(summary["errors"].values()) == [10]


def test_a_cuda_build_says_its_values_are_not_checked(tmp_path):
    """The check kernels run on the host; a CUDA build's tensors are on the device."""
    nodes, ins, outs, inits, _ = _index_models()["gather"]
    path = _save(tmp_path / "g.onnx", nodes, ins, outs, inits)
    res = compile_model(CompileOptions(model=path, target="a100", output=str(tmp_path / "g")),
                        log=lambda *a: None)
    checks = res.artifact.manifest["run_time_checks"]
    assert checks["checks"] == [] and checks["not_checked"].startswith("cuda: ")
