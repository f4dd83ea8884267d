"""tuning.seed: every task's default schedule becomes a record compile can find, including a
kernel no default rule schedules (the untuned build runs its plain loop nest)."""

from __future__ import annotations

from types import SimpleNamespace

from tvmopt.targets.registry import get_target
from tvmopt.tuning import seed
from tvmopt.tuning.tasks import Task


def _abs_sum_task() -> Task:
    """|x| summed to a scalar: a kernel none of the default CPU rules takes."""
    import tvm
    from tvm import te

    x = te.placeholder((4, 8), name="x")
    k0, k1 = te.reduce_axis((0, 4), "k0"), te.reduce_axis((0, 8), "k1")
    total = te.compute((), lambda: te.sum(te.abs(x[k0, k1]), axis=[k0, k1]), name="total")
    return Task("abs_sum", 1, tvm.IRModule({"main": te.create_prim_func([x, total])}), 32.0)


def test_an_unscheduled_default_is_a_record_compile_finds():
    """MetaSchedule's database finds no record with an empty trace, and an unscheduled
    kernel's default schedule is one: compile --require-db then missed a task tune had
    measured."""
    from concurrent.futures import Future

    from tvm.s_tir import meta_schedule as ms

    hw = get_target("x86-avx2")
    target = hw.to_tvm()
    task = _abs_sum_task()
    sch, how = seed.default_schedule(task, hw, target)
    assert how == "LLVM loop nest"

    class Builder:
        def build(self, inputs):
            return [SimpleNamespace(error_msg=None, artifact_path="lib.so") for _ in inputs]

    class Runner:
        def run(self, inputs):
            f = Future()
            f.set_result(SimpleNamespace(error_msg=None, run_secs=[2e-8]))
            return [f for _ in inputs]

    db = ms.database.MemoryDatabase()
    (sd,) = seed.seed_defaults([task], db, hw, target, Builder(), Runner())
    assert sd.committed and sd.how == "LLVM loop nest"
    # what replay.match asks of the database at compile time
    rec = db.query_tuning_record(task.mod, target, task.name)
    assert rec is not None
    import tvm_ffi
    from tvm import s_tir

    again = s_tir.Schedule(task.mod)
    rec.trace.apply_to_schedule(again, remove_postproc=False)
    assert tvm_ffi.structural_equal(again.mod, task.mod)  # the record changes nothing
