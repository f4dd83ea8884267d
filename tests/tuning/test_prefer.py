"""A tuned record is replayed only where it measures faster than the default schedule.

The decisions are tested with scripted timings; tests that compare real timings of two builds
are slow-tier, since on a shared CPU the slower build can measure faster now and then.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.models import tiny_mlp
from tests.onednn_required import require_onednn

from tvmopt.cli.main import main
from tvmopt import timing
from tvmopt.timing import Measurement, TimingCache
from tvmopt.targets.registry import get_target
from tvmopt.tuning import prefer, replay, tune
from tvmopt.tuning.tasks import extract_tasks

SHAPES = {"x": (64, 256)}


def _naive_records(fused, target):
    """A database whose record for every task is the unscheduled loop nest (one core, no
    tiling): what a search that found nothing better would leave, far slower than the rules."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    db = ms.database.MemoryDatabase()
    for task in extract_tasks(fused, target):
        sch = Schedule(task.mod)
        sch.get_loops(sch.get_sblock("matmul"))  # a trace that transforms nothing
        wl = db.commit_workload(task.mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, wl, [1e-3], target, ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))
    return db


def _scripted(monkeypatch, module, pairs):
    """Make `module.measure_paired` return `pairs` in order, each (tuned ms, default ms,
    ratio), as trusted measurements; returns the list of calls made."""
    calls = []

    def fake(f_a, f_b, inputs, rounds=timing.PAIR_ROUNDS):
        calls.append((f_a, f_b))
        a, b, ratio = pairs[len(calls) - 1]
        return timing.Paired(a, b, ratio, 0.0, rounds)

    monkeypatch.setattr(module, "measure_paired", fake)
    return calls


def test_a_record_is_kept_only_where_it_times_faster(tmp_path, monkeypatch):
    import tvm_ffi

    hw = get_target("host")
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=64, features=256, hidden=256, classes=256)
    fused, _, _ = tune.fused_module(model, SHAPES, hw)
    tasks = extract_tasks(fused, hw.to_tvm())
    assert len(tasks) == 2
    rep = replay.Replay(_naive_records(fused, hw.to_tvm()), tmp_path, "x", [], [], None, None)
    cache = TimingCache(tmp_path / "timings.json")
    # The verdict is the rounds' ratio, not the two medians: the first task's medians favour
    # the default, but within the rounds the record was faster; the second task is within
    # KEEP_BELOW of a tie, which the default wins.
    assert 0.9 < prefer.KEEP_BELOW <= 0.98
    calls = _scripted(monkeypatch, timing, [(2.1, 2.0, 0.9), (2.9, 3.0, 0.98)])

    got = prefer.prefer_default_where_faster(rep, hw, fused, cache=cache)
    assert len(calls) == 2
    assert [(c.task, c.tuned_ms, c.default_ms, c.ratio, c.kept, c.cached) for c in got] == [
        (tasks[0].name, 2.1, 2.0, 0.9, True, False), (tasks[1].name, 2.9, 3.0, 0.98, False, False)]
    left = rep.db.get_all_tuning_records()
    assert len(left) == 1 and tvm_ffi.structural_equal(left[0].workload.mod, tasks[0].mod)

    # A second compile on this host reads the verdicts instead of timing again.
    calls = _scripted(monkeypatch, timing, [])
    rep2 = replay.Replay(_naive_records(fused, hw.to_tvm()), tmp_path, "x", [], [], None, None)
    again = prefer.prefer_default_where_faster(rep2, hw, fused, cache=TimingCache(cache.path))
    assert not calls
    assert [(c.kept, c.cached) for c in again] == [(True, True), (False, True)]


def test_a_loaded_machine_verdict_is_used_but_not_cached(tmp_path, monkeypatch):
    hw = get_target("host")
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=64, features=256, hidden=256, classes=256)
    fused, _, _ = tune.fused_module(model, SHAPES, hw)
    rep = replay.Replay(_naive_records(fused, hw.to_tvm()), tmp_path, "x", [], [], None, None)
    monkeypatch.setattr(timing, "measure_paired",
                        lambda f_a, f_b, inputs: timing.Paired(1.0, 2.0, 0.5, 1.5, 7))
    got = prefer.prefer_default_where_faster(rep, hw, fused,
                                             cache=TimingCache(tmp_path / "t.json"))
    assert [c.kept for c in got] == [True, True]
    assert TimingCache(tmp_path / "t.json").data == {}


def test_paired_rounds_compare_within_a_round(monkeypatch):
    # The host runs slow for a spell over the first two rounds, the record at 2.0 in it and the
    # default at 1.0 once it is over: timed one after the other, the record would lose; three
    # rounds out of the spell decide.
    spell = iter([2.0, 3.0, 1.6, 2.0, 0.8, 1.0, 1.0, 0.8, 0.8, 1.0])
    order = []

    def sample(f, inputs, batches=5):
        order.append(f)
        return next(spell), 0.0, 0.0

    monkeypatch.setattr(timing, "_sample", sample)
    got = timing.measure_paired("tuned", "default", [], rounds=5)
    assert order == ["tuned", "default", "default", "tuned"] * 2 + ["tuned", "default"]
    assert got.ratio == pytest.approx(0.8) and got.rounds == 5 and got.trusted
    assert (got.a_ms, got.b_ms) == (0.8, 1.0)


@pytest.mark.slow
def test_a_record_slower_than_the_default_schedule_is_dropped(tmp_path, monkeypatch):
    # The second call reading the verdicts is under test, not how quiet the machine is.
    monkeypatch.setattr(timing, "FOREIGN_LOAD_LIMIT", float("inf"))
    monkeypatch.setattr(timing, "SPREAD", float("inf"))
    hw = get_target("host")
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=64, features=256, hidden=256, classes=256)
    fused, _, _ = tune.fused_module(model, SHAPES, hw)
    db = _naive_records(fused, hw.to_tvm())
    rep = replay.Replay(db, tmp_path, "x", [], [], None, None)
    cache = TimingCache(tmp_path / "timings.json")

    got = prefer.prefer_default_where_faster(rep, hw, fused, cache=cache)
    assert {c.task for c in got} == {t.name for t in extract_tasks(fused, hw.to_tvm())}
    assert len(got) == 2
    for c in got:
        assert not c.kept and not c.cached and c.tuned_ms > c.default_ms > 0, c
    assert rep.db.get_all_tuning_records() == []  # nothing left to replay

    # A second compile on this host reads the verdicts instead of timing again.
    rep2 = replay.Replay(_naive_records(fused, hw.to_tvm()), tmp_path, "x", [], [], None, None)
    again = prefer.prefer_default_where_faster(rep2, hw, fused, cache=TimingCache(cache.path))
    assert all(c.cached and not c.kept for c in again)


@pytest.mark.slow  # a database replay and a compile with timing: the longest test here
def test_compile_with_a_database_records_each_comparison(tmp_path):
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=1, features=32, hidden=32, classes=8)
    db = tmp_path / "db"
    tune.tune(tune.TuneOptions(model=model, trials=4, db=str(db), shapes={"x": (1, 32)},
                               target="host", trials_per_round=2, population=16,
                               dispatch="codegen"))
    out = tmp_path / "a.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--target", "host", "--shape", "x=1x32",
                                    "--db", str(db), "--verify", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "tuned records measure faster than the default schedule" in " ".join(res.output.split())
    # --retime times every kernel again, the records against their defaults included.
    again = CliRunner().invoke(main, ["compile", model, "--target", "host", "--shape", "x=1x32",
                                      "--db", str(db), "--retime", "-o", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output
    compared = json.loads((tmp_path / "b" / "manifest.json").read_text())["tuning"][
        "records_vs_default"]
    assert compared and not any(c["cached"] for c in compared), compared
    tun = json.loads((out / "manifest.json").read_text())["tuning"]
    rows = tun["records_vs_default"]
    assert len(rows) == 2
    assert all(r["tuned_ms"] > 0 and r["default_ms"] > 0 for r in rows)
    for r in rows:  # the verdict is the paired rounds' ratio (the medians may disagree)
        assert r["kept"] == (r["ratio"] < prefer.KEEP_BELOW), r


def _dispatch_choices(tmp_path, monkeypatch, times=None):
    """Dispatch choices for the tiny MLP with a naive tuned record, and the kernel timings in
    the order taken (per kernel: oneDNN, default schedule, tuned record): `times` scripted, or
    measured when None."""
    from tvmopt import pipeline
    from tvmopt.frontend.model_file import import_model
    from tvmopt.precision import choice

    require_onednn()
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    # One round of timings per kernel: which side ships is under test, not how quiet the
    # machine is (a loaded one would time every side again).
    monkeypatch.setattr(timing, "FOREIGN_LOAD_LIMIT", float("inf"))
    monkeypatch.setattr(timing, "SPREAD", float("inf"))
    monkeypatch.setattr(timing, "CEILING_FLOORS", float("inf"))
    hw = get_target("host")
    target = hw.to_tvm()
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=64, features=256, hidden=256, classes=256)
    fused, _, _ = tune.fused_module(model, SHAPES, hw)
    timings = []
    real = choice.measure_call

    def timed(*args):
        m = real(*args) if times is None else Measurement(*(2 * [times[len(timings)]]), 0.0)
        timings.append(m.ms)
        return m

    monkeypatch.setattr(choice, "measure_call", timed)
    cfg = pipeline.PipelineConfig(dispatch="auto", channels_last=False,
                                  database=_naive_records(fused, target))
    records = pipeline.optimize(import_model(model, SHAPES).mod, target, cfg, until="dispatch").records
    return records.choices, timings


def test_dispatch_timing_takes_the_codegen_side_that_will_ship(tmp_path, monkeypatch):
    """With a database, oneDNN is timed against the faster of the tuned record and the default
    schedule, since compile drops a record the default schedule beats: a slow record must not
    hand a kernel to the library."""
    from tvmopt.precision.choice import MARGIN

    # kernel 0: the record is slow, oneDNN beats the default; kernel 1: the record is fastest
    times = [1.0, 2.0, 5.0, 3.0, 4.0, 1.5]
    choices, timings = _dispatch_choices(tmp_path, monkeypatch, times)
    assert timings == times
    assert 1.0 < MARGIN * 2.0 and 3.0 > MARGIN * 1.5
    assert [(c.codegen_by, c.codegen_ms, c.library_ms, c.choice) for c in choices] == [
        ("default", 2.0, 1.0, "library"), ("tuned", 1.5, 3.0, "codegen")]


@pytest.mark.slow
def test_a_slow_record_measures_slower_than_the_default_schedule(tmp_path, monkeypatch):
    from tvmopt.precision import choice

    choices, timings = _dispatch_choices(tmp_path, monkeypatch)
    assert len(choices) == 2 and len(timings) == 3 * len(choices)  # oneDNN, default, tuned
    for i, c in enumerate(choices):
        lib_ms, default_ms, tuned_ms = timings[3 * i: 3 * i + 3]
        # The naive record is slow on a quiet machine, but which side measured faster is the
        # machine's to say: the verdict must follow the real timings, whichever they are.
        faster, codegen_ms = (("default", default_ms) if default_ms <= tuned_ms
                              else ("tuned", tuned_ms))
        assert c.codegen_by == faster and c.codegen_ms == round(codegen_ms, 4)
        assert c.library_ms == round(lib_ms, 4)
        assert c.choice == ("library" if lib_ms < choice.MARGIN * codegen_ms else "codegen")


def test_a_kernel_with_two_outputs_is_wrapped_for_timing():
    """A fused kernel with several outputs (GPT-2's split of the fused q/k/v projection) is
    called with a tuple type: the timing wrapper must hand call_tir the list of its outputs
    (compile --db of a tuned GPT-2 raised a TypeError there)."""
    import numpy as np
    import tvm
    from tvm import relax, te

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit_te(lambda t: [te.compute((4, 3), lambda i, j: t[i, j]),
                                          te.compute((4, 3), lambda i, j: t[i, j + 3] * 2)], x)
            out = bb.emit_output(relax.TupleGetItem(parts, 1))
        bb.emit_func_output(out)
    mod = bb.get()
    (gv, call), = [v for k, v in prefer._call_sites(mod).items()]
    assert isinstance(call.ty_args[0], relax.TupleType)
    wrapped = prefer._wrapper(gv, call)
    assert wrapped is not None
    timed = tvm.IRModule({"main": wrapped, gv: mod[gv]})
    ex = tvm.compile(timed, "llvm")
    data = np.arange(24, dtype="float32").reshape(4, 6)
    a, b = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data))
    np.testing.assert_array_equal(b.numpy(), data[:, 3:] * 2)
