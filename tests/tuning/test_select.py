"""`tune --tasks slowest:N`: tasks ranked by their default-schedule time on this host."""

from __future__ import annotations

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
import numpy as np

from tvmopt.cli.main import main
from tvmopt.errors import TuningError
from tvmopt.targets.registry import detect_host, get_target
from tvmopt.tuning import select, tasks
from tvmopt.tuning.tune import fused_module


def _two_sizes(path):
    """A big matmul and a tiny one: the big one must rank first, whatever the order."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8)).astype("float32"), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 512)).astype("float32"), "w2")
    # Big enough that a test running beside it on the other core cannot reverse the ranking.
    w3 = numpy_helper.from_array(rng.standard_normal((512, 2048)).astype("float32"), "w3")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["b"]),
             helper.make_node("Tanh", ["b"], ["t"]),
             helper.make_node("MatMul", ["t", "w3"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 2048])],
                          [w1, w2, w3])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def test_selection_syntax():
    assert select.parse_selection("all") is None and select.parse_selection(None) is None
    assert select.parse_selection("slowest:3") == 3
    for bad in ("slowest:0", "fastest:2", "slowest:", "3"):
        with pytest.raises(TuningError, match="slowest:N"):
            select.parse_selection(bad)


def _ranked(tmp_path):
    hw = detect_host()
    mod, _, _ = fused_module(_two_sizes(tmp_path / "m.onnx"), {}, hw, False)
    found = tasks.extract_tasks(mod, hw.to_tvm())
    assert len(found) >= 2
    kept, costs = select.slowest(found, hw, 1)
    return found, kept, costs


def test_slowest_keeps_the_task_that_times_costliest(tmp_path, monkeypatch):
    from tvmopt import timing

    # Scripted timings (ms = the task's argument elements / 1e6), so what is tested is the
    # ranking, not how quiet this machine is: the smallest task must not be kept.
    def scripted(lib, name, args, dev=None):
        return sum(a.numpy().size for a in args) / 1e6

    monkeypatch.setattr(timing, "time_call", scripted)
    found, kept, costs = _ranked(tmp_path)
    timed = {c.name: c.total_ms for c in costs}
    assert len(kept) == 1 and all(c.default_ms is not None for c in costs)
    assert kept[0].name == max(timed, key=timed.get) != min(timed, key=timed.get)


@pytest.mark.slow
def test_slowest_keeps_the_costliest_task(tmp_path):
    found, kept, costs = _ranked(tmp_path)
    assert len(kept) == 1 and all(c.default_ms is not None for c in costs)
    costliest = max(costs, key=lambda c: c.total_ms)
    assert kept[0].name == costliest.name
    # the 512x2048 matmul is the costliest by far: timing, not list order, picked it
    assert "matmul" in kept[0].name and kept[0].flops == max(t.flops for t in found)


def test_slowest_refuses_a_target_this_host_cannot_run(tmp_path):
    hw = get_target("arm-cortex-a76")
    with pytest.raises(TuningError, match="cannot run"):
        select.slowest([], hw, 1)


def test_cli_rejects_a_bad_selection(tmp_path):
    r = CliRunner().invoke(main, ["tune", _two_sizes(tmp_path / "m.onnx"), "--tasks", "top:2",
                                  "--db", str(tmp_path / "db")])
    assert r.exit_code != 0 and "slowest:N" in r.output and "Traceback" not in r.output
