"""tuning.retime: a task's best record and default schedule are timed again in alternating
rounds, and the report's speed-ups and estimate take those times, not the search's luckiest
sample."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from tests.models import tiny_mlp

from tvmopt.targets.registry import get_target
from tvmopt.tuning import retime, seed, tune
from tvmopt.tuning.tasks import extract_tasks


class _Builder:
    def build(self, inputs):
        return [SimpleNamespace(error_msg=None, artifact_path=f"lib{i}.so")
                for i, _ in enumerate(inputs)]


class _Runner:
    """Scripted run times per library (artifact path); records the order of each round."""

    def __init__(self, secs: dict):
        self.secs, self.rounds = secs, []

    def run(self, inputs):
        self.rounds.append([x.artifact_path for x in inputs])
        out = []
        for x in inputs:
            f = Future()
            f.set_result(SimpleNamespace(error_msg=None, run_secs=[self.secs[x.artifact_path].pop(0)]))
            out.append(f)
        return out


@pytest.fixture(scope="module")
def mlp_tasks(tmp_path_factory):
    hw = get_target("x86-avx2")
    model = tiny_mlp(tmp_path_factory.mktemp("retime") / "m.onnx")
    mod, _, _ = tune.fused_module(model, {"x": (1, 32)}, hw, dispatch="codegen")
    return hw, extract_tasks(mod, hw.to_tvm())


def _db_with_defaults(tasks, hw, target):
    """A MemoryDatabase whose best record of each task is its default schedule."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.MemoryDatabase()
    for t in tasks:
        sch, _ = seed.default_schedule(t, hw, target)
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(t.mod), [1e-5], target, args))
    return db


def test_a_lead_that_does_not_hold_side_by_side_is_not_promised(mlp_tasks):
    hw, tasks = mlp_tasks
    target = hw.to_tvm()
    db = _db_with_defaults(tasks, hw, target)
    # The search saw task 0's record at half its default; task 1's record was no better.
    results = [tune.TaskResult(tasks[0].name, 1, 0.0, 5, best_s=1e-5, default_s=2e-5),
               tune.TaskResult(tasks[1].name, 2, 0.0, 5, best_s=3e-5, default_s=3e-5)]
    # Side by side, the record (lib0) takes 2.1, 1.9, 2.0 us and the default (lib1) 2.0 us.
    runner = _Runner({"lib0.so": [2.1e-6, 1.9e-6, 2.2e-6], "lib1.so": [2.0e-6] * 3})
    timed = retime.retime(tasks, results, db, hw, target, _Builder(), runner)
    assert list(timed) == [0]  # only the task whose record led was timed again
    assert timed[0] == retime.SideBySide(best_s=2.1e-6, default_s=2.0e-6)  # medians
    # Alternating order: the record first, then the default first, then the record first.
    assert runner.rounds == [["lib0.so", "lib1.so"], ["lib1.so", "lib0.so"],
                             ["lib0.so", "lib1.so"]]
    results[0].side_by_side = timed[0]
    res = tune.TuneResult(db_dir=None, tasks=results)
    assert results[0].speedup == pytest.approx(2.0 / 2.1)  # the record lost
    assert results[0].tuned_s == results[0].untuned_s == 2.0e-6  # compile keeps the default
    # Whole model: task 0 at its side-by-side default, task 1 x2 at the search's figure.
    assert res.estimate_s == res.default_estimate_s == pytest.approx(2.0e-6 + 2 * 3e-5)
    assert res.retimed == 1


def test_a_lead_that_holds_keeps_its_side_by_side_speed_up(mlp_tasks):
    hw, tasks = mlp_tasks
    target = hw.to_tvm()
    db = _db_with_defaults(tasks[:1], hw, target)
    results = [tune.TaskResult(tasks[0].name, 3, 0.0, 5, best_s=1e-6, default_s=4e-6)]
    runner = _Runner({"lib0.so": [2e-6] * 3, "lib1.so": [3e-6] * 3})
    timed = retime.retime(tasks[:1], results, db, hw, target, _Builder(), runner)
    results[0].side_by_side = timed[0]
    res = tune.TuneResult(db_dir=None, tasks=results)
    assert results[0].speedup == pytest.approx(1.5)  # not the search's 4x
    assert (res.default_estimate_s, res.estimate_s) == (pytest.approx(9e-6), pytest.approx(6e-6))
