"""The default schedule of each task, measured first and committed as a tuning record.

tvmopt's default pipeline schedules every kernel with its CPU rules (codegen/cpu.py); those
schedules are traced, so each one is a MetaSchedule trace that replays on the task's PrimFunc.
Committed to the database before the search, it is

- a record: the task's best record is never slower than what the untuned build runs;
- part of the search's initial population: EvolutionarySearch starts from the database's best
  records of the workload (and from samples of the design space);
- the baseline of the tune report: default vs best per task.

Each default is measured with the tuning builder and runner, so it is timed as the candidates are.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Seed:
    """A task's default schedule, as measured.

    Attributes:
        how: "default rules" (a tvmopt/dlight rule scheduled it) or "LLVM loop nest" (no rule
            takes the kernel: the untuned build runs it unscheduled).
        secs: mean run time; None when it could not be built or run (see error).
        committed: whether it went into the database as a record.
    """

    task: str
    how: str
    secs: float | None
    committed: bool
    error: str | None = None

    def to_json(self) -> dict:
        return {"task": self.task, "how": self.how, "secs": self.secs,
                "committed": self.committed, "error": self.error}


def default_schedule(task, hw, target):
    """(Schedule, how) of the task's PrimFunc under the default CPU rules, as the schedule
    phase applies them (first rule that takes it); an untouched Schedule when none does.

    Raises:
        ValueError: the rule's trace does not replay to the same function (it could not be
            stored as a record).
    """
    import tvm_ffi
    from tvm import s_tir

    from .. import fallbacks
    from ..codegen import cpu
    from ..passes.schedule_guard import guarded

    func = task.mod["main"]
    params = cpu.CPUParams.from_hardware(hw) if hw is not None else cpu.CPUParams.from_target(target)
    # As the schedule phase runs them: a rule that raises passes the kernel on. Its fallback is
    # the compile's to record, not this measurement's.
    with target, fallbacks.paused():
        for rule in (guarded(r) for r in cpu.default_rules(params)):
            sch = rule.apply(func, target, False)
            if sch is None:
                continue
            if isinstance(sch, list):
                sch = sch[0]
            replayed = s_tir.Schedule(task.mod)
            sch.trace.apply_to_schedule(replayed, remove_postproc=False)
            if not tvm_ffi.structural_equal(replayed.mod["main"], sch.mod["main"]):
                raise ValueError(f"{type(rule).__name__}'s trace does not replay")
            return sch, "default rules"
    sch = s_tir.Schedule(task.mod)
    # MetaSchedule's database finds no record whose trace is empty; one look-up of the root
    # block, which changes nothing, keeps the unscheduled kernel's record findable.
    try:
        sch.get_sblock("root")
    except s_tir.ScheduleError:  # "Cannot find a block with the name: root": stays unfindable
        pass
    return sch, "LLVM loop nest"


def seed_defaults(tasks, db, hw, target, builder, runner) -> list[Seed]:
    """Measure each task's default schedule and commit it to `db` as a record.

    Returns:
        One Seed per task, in order (names may repeat across modules: matched by position).
    """
    from tvm.s_tir import meta_schedule as ms

    from ..errors import error_line

    seeds: dict[int, Seed] = {}
    todo = []  # (index, task, schedule, how)
    for i, task in enumerate(tasks):
        try:
            sch, how = default_schedule(task, hw, target)
        except Exception as err:  # pylint: disable=broad-except - a rule's replay raises any type
            # Not swallowed: the reason is the Seed's error, which the tuning report prints.
            seeds[i] = Seed(task.name, "default rules", None, False,
                            f"not reproducible as a record: {error_line(err)}")
            continue
        todo.append((i, task, sch, how))
    if todo:
        built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, _, sch, _ in todo])
        inputs, ran = [], []
        for (i, task, sch, how), b in zip(todo, built):
            if b.error_msg:
                seeds[i] = Seed(task.name, how, None, False,
                                        f"build failed: {_first_line(b.error_msg)}")
                continue
            # As MetaSchedule measures a candidate: a packed weight is an argument in its
            # packed layout (the packing folds into the constant at compile time).
            args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            device = "cpu" if target.kind.name == "llvm" else str(target.kind.name)
            inputs.append(ms.runner.RunnerInput(b.artifact_path, device, args))
            ran.append((i, task, sch, how, args))
        results = [f.result() for f in runner.run(inputs)] if inputs else []
        for (i, task, sch, how, args), r in zip(ran, results):
            if r.error_msg or not r.run_secs:
                seeds[i] = Seed(task.name, how, None, False,
                                        f"run failed: {_first_line(r.error_msg or 'no time')}")
                continue
            workload = db.commit_workload(task.mod)
            db.commit_tuning_record(ms.database.TuningRecord(
                sch.trace, workload, r.run_secs, target, args))
            secs = [float(s) for s in r.run_secs]
            seeds[i] = Seed(task.name, how, sum(secs) / len(secs), True)
    return [seeds.get(i) or Seed(t.name, "default rules", None, False, "not measured")
            for i, t in enumerate(tasks)]


def _first_line(text: str) -> str:
    from ..errors import error_line

    return error_line(str(text), default="?")[:200]
