"""Baselines in worker processes of their own: each call timed in the worker, the harness using
that figure; the tools' interleaving alternates the order of the runtimes by round."""

from __future__ import annotations

from importlib.util import find_spec

import numpy as np
import pytest

from tvmopt.bench import isolated
from tvmopt.bench.closed_loop import _timed
from tvmopt.bench.runner import BaselineUnavailable, InputFactory, ProcessRunner
from tvmopt.cli.options import default_model
from tvmopt.frontend.model_file import model_inputs


def _factory(model):
    return InputFactory(model_inputs(model), seed=0)


def test_a_baseline_in_its_own_process_is_timed_there():
    model = default_model()
    r = ProcessRunner("ort", model, _factory(model), threads=1)
    try:
        assert r.name == "onnxruntime"
        r.prepare(2)
        r.run(2)
        assert 0 < r.measured_s < 10
    finally:
        r.close()
    assert not r._proc.is_alive()


def test_a_baseline_that_cannot_load_the_model_is_unavailable(tmp_path):
    bad = tmp_path / "m.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(BaselineUnavailable):
        ProcessRunner("ort", str(bad), _factory(default_model()), threads=1)


def test_the_harness_takes_the_workers_own_time():
    class Clock:
        t = 0.0

        def now(self):
            self.t += 1.0  # the pipe round trip costs a whole "second" here
            return self.t

    class Remote:
        measured_s = None

        def run(self, batch, size):
            self.measured_s = 0.25

    assert _timed(Remote(), Clock(), 1, None) == 0.25


@pytest.mark.skipif(find_spec("openvino") is None, reason="openvino is not installed "
                    "(pip install 'tvmopt[baselines]')")
@pytest.mark.parametrize("baseline, hint", [("openvino", None), ("openvino-f32", "f32")])
def test_openvino_baselines_say_which_precision_ran(baseline, hint):
    model = default_model()
    r = ProcessRunner(baseline, model, _factory(model), threads=1)
    try:
        assert r.name == baseline
        assert r.precision  # read back from OpenVINO, not assumed
        if hint:
            assert r.precision == hint
        r.prepare(1)
        r.run(1)
        assert r.measured_s > 0
    finally:
        r.close()


def test_rounds_alternate_the_order_and_drop_the_first_call_of_each_block(monkeypatch):
    monkeypatch.setattr(isolated.time, "sleep", lambda s: None)
    order = []

    class Fake:
        def __init__(self, name, ms):
            self.name, self.ms = name, ms

        def time(self, calls):
            order.append(self.name)
            return [100.0] + [self.ms] * (calls - 1)  # a slow first call after the gap

    got = isolated.interleaved({"a": Fake("a", 1.0), "b": Fake("b", 2.0)}, runs=6, block=3)
    assert order == ["a", "b", "b", "a"]
    assert got["a"].tolist() == [1.0] * 6 and got["b"].tolist() == [2.0] * 6


def test_a_worker_runs_its_runtime_in_another_process():
    model = default_model()
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], i.dtype)
             for i in model_inputs(model)}
    w = isolated.Worker("onnxruntime", isolated.Spec("onnxruntime", model), 1, feeds)
    try:
        assert len(w.time(3)) == 3
        out = w.outputs()
        assert all(isinstance(v, np.ndarray) for v in out.values())
        assert w._proc.pid != __import__("os").getpid()
    finally:
        w.close()
