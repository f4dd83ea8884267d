"""Mutated ONNX models (tools/fuzz_models.py): refused in one line or compiled to onnxruntime's
results; never a traceback, a hang, a crash, or a silently different model."""

from __future__ import annotations

import onnx
import pytest
from hypothesis import HealthCheck, given, settings

from tools import fuzz_models as fz


@pytest.fixture(scope="module")
def worker():
    w = fz.Worker(timeout_s=300)
    yield w
    w.close()


def _assert_no_bug(res, case):
    assert not res["outcome"].startswith("bug:"), (case[:3], res)


def test_every_seed_model_compiles_and_matches_onnxruntime(worker):
    for name, model in fz.seed_models().items():
        assert worker.check(model.SerializeToString())["outcome"] == "ok:match", name


@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=fz.mutated_models())
def test_mutated_models_are_refused_or_match(worker, case):
    _assert_no_bug(worker.check(case[3]), case)


def _declared_double_output() -> bytes:
    m = fz.seed_models()["mlp"]
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    return m.SerializeToString()


def test_the_cli_answers_mutated_files_in_one_line():
    data = fz.seed_models()["conv"].SerializeToString()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    for command, blob, rc in (("compile", data[: len(data) * 2 // 3], 1),
                              ("compile", _declared_double_output(), 1),
                              ("inspect", bytes(flipped), None)):
        verdict = fz.cli_verdict(blob, command)
        assert verdict["one_line"], (command, verdict)
        assert verdict["rc"] in ((0, 1) if rc is None else (rc,)), (command, verdict)


def test_declared_output_type_that_the_graph_does_not_compute_is_refused(worker):
    res = worker.check(_declared_double_output())
    assert res["outcome"] == "refused:import"
    assert "output 'y' is declared float64, but the graph computes float32" in res["reason"]


@pytest.mark.slow
def test_longer_fuzz_run_finds_nothing():
    results = fz.fuzz(200, seed=7, timeout_s=300)
    summary = fz.summarize(results)
    assert summary["examples"] == 200
    assert not summary["bugs"], summary["bugs"][:3]
