"""Tuning: a tiny MLP tuned once per module, then replay, corrupt lines, locks, target checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.models import (cancelling_matmuls, data_sized_range, masked_scores, tiny_conv,
                          tiny_lstm, tiny_mlp)
from tests.onednn_required import require_onednn
from tests.precision.test_bf16 import bf16_always_faster, needs_bf16_host  # noqa: F401

from tvmopt import errors, front, timing
from tvmopt.tuning import database, measure, replay, tasks, tune
from tvmopt.cli.main import main
from tvmopt.errors import TargetError
from tvmopt.targets.registry import get_target

SHAPE = {"x": (1, 32)}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(model path, db folder, TuneResult): 8 trials over the MLP's two fused tasks."""
    root = tmp_path_factory.mktemp("tuned")
    model = tiny_mlp(root / "mlp.onnx")
    db = root / "db"
    # A small population keeps the search cheap on 2 busy cores; 8 trials still find schedules.
    result = tune.tune(tune.TuneOptions(model=model, trials=8, db=str(db), shapes=SHAPE,
                                            trials_per_round=4, population=32, dispatch="codegen"))
    return model, db, result


def _copy_db(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock", "logs"))
    return dst


def test_tune_finds_schedules_without_build_failures(tuned):
    _, db, result = tuned
    assert result.trials_run == 8
    assert result.build_failures == 0 and result.run_failures == 0
    assert {t.name for t in result.tasks} == {"fused_matmul_add_relu", "fused_matmul1_add1"}
    assert all(t.best_s is not None and t.trials > 0 for t in result.tasks)
    assert result.estimate_s == pytest.approx(sum(t.weight * t.tuned_s for t in result.tasks))
    manifest = json.loads((db / database.MANIFEST_FILE).read_text())
    assert manifest["target"]["name"] == "x86-avx2"
    # 8 trials of the search + the 2 default schedules measured first, + the 2 measured again
    # where other processes kept the cores busy the first time (whether they did is the
    # machine's business, not the test's: the count must add up either way)
    assert result.extra_default_records in (0, len(result.seeds))
    assert manifest["trials"] == 10 + result.extra_default_records
    assert manifest["shapes"] == {"x": [1, 32]}
    assert manifest["target"]["tvm"]["kind"] == "llvm"
    assert len(manifest["model"]["sha256"]) == 64


def test_default_schedules_are_measured_first_and_bound_the_best(tuned):
    _, db, result = tuned
    assert len(result.seeds) == 2 and all(sd.committed and sd.secs > 0 for sd in result.seeds)
    for t in result.tasks:  # the default is a record: the best is never slower
        assert t.default_s is not None and t.best_s <= t.default_s
        # Timed again side by side where the record led, the record may lose: the estimate
        # then takes the default schedule, as compile --db does.
        assert t.tuned_s <= t.untuned_s
        assert t.side_by_side is not None or t.best_s == t.default_s or t.speedup >= 1.0
    assert result.default_estimate_s >= result.estimate_s
    manifest = json.loads((db / database.MANIFEST_FILE).read_text())
    assert manifest["pipeline"] == {"layout": "NHWC", "dispatch": "codegen", "precision": "auto",
                                    "weight_prepack": False,
                                    "fingerprint": front.pipeline_fingerprint()}
    assert sorted(d["task"] for d in manifest["defaults"].values()) == sorted(
        t.name for t in result.tasks)
    assert result.stopped_by == "trials" and result.spent == 1.0


def test_compile_says_when_the_database_was_tuned_under_other_options(tuned, tmp_path):
    model, db, _ = tuned
    other = _copy_db(db, tmp_path / "other-options")
    m = json.loads((other / database.MANIFEST_FILE).read_text())
    m["pipeline"].update(dispatch="library", fingerprint="0" * 64)
    (other / database.MANIFEST_FILE).write_text(json.dumps(m))
    out = tmp_path / "o.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(other),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "was tuned under other pipeline options (dispatch library (this compile: codegen); " \
           "pipeline code changed since): records of unchanged kernels still apply (2 of 2 " \
           "tasks)" in flat
    tun = json.loads((out / "manifest.json").read_text())["tuning"]
    assert tun["hit_rate"] == 1.0 and len(tun["option_changes"]) == 2


def test_changed_pipeline_code_is_news_only_where_a_task_lost_its_record(tuned, tmp_path):
    """The fingerprint stands in for the task-by-task check compile makes anyway: with every
    task still served there is nothing to tell; with one gone, compile says why and how to
    tune it."""
    model, db, _ = tuned
    other = _copy_db(db, tmp_path / "other-code")
    m = json.loads((other / database.MANIFEST_FILE).read_text())
    m["pipeline"]["fingerprint"] = "0" * 64
    (other / database.MANIFEST_FILE).write_text(json.dumps(m))

    def compile_with(folder, name):
        out = tmp_path / name
        res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db",
                                        str(folder), "-o", str(out)])
        assert res.exit_code == 0, res.output
        return " ".join(res.output.split()), json.loads((out / "manifest.json").read_text())

    flat, man = compile_with(other, "all.tvmopt")
    assert "tuned under other pipeline options" not in flat
    assert man["tuning"]["hit_rate"] == 1.0
    assert man["tuning"]["option_changes"] == [front.CODE_CHANGED]  # still on record

    # Drop every record of the first workload: its task now misses.
    rec = other / database.RECORD_FILE
    lines = rec.read_text().splitlines()
    rec.write_text("".join(ln + "\n" for ln in lines if json.loads(ln)[0] != 0))
    flat, man = compile_with(other, "one.tvmopt")
    assert man["tuning"]["hits"] == 1 and len(man["tuning"]["misses"]) == 1
    assert ("(pipeline code changed since): records of unchanged kernels still apply (1 of 2 "
            "tasks); `tvmopt tune MODEL --db") in flat
    assert "--missing-only` tunes the other 1" in flat


def _defaults_then_compile(model: str, tmp_path: Path, *compile_args: str):
    """`tune --trials 0 --dispatch codegen` (the default schedules alone), then `compile
    --require-db --verify` from that database: (tune's and compile's output flattened, the
    artifact's manifest)."""
    db = tmp_path / "db"
    res = CliRunner().invoke(main, ["tune", model, "--db", str(db), "--trials", "0",
                                    "--dispatch", "codegen"])
    assert res.exit_code == 0, res.output
    tuned = " ".join(res.output.split())
    out = tmp_path / "c.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--db", str(db), *compile_args,
                                    "--require-db", "--verify", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return tuned, " ".join(res.output.split()), json.loads((out / "manifest.json").read_text())


def test_default_schedules_alone_serve_every_task_of_the_nhwc_module(tmp_path):
    """--trials 0: only the default schedules are measured; they are records of exactly the
    module compile builds (NHWC convolutions, nothing switched off), so --require-db holds."""
    model = tiny_conv(tmp_path / "conv.onnx", channels=16, size=8)
    tuned, compiled, manifest = _defaults_then_compile(model, tmp_path)
    # two convolutions and the NCHW <-> NHWC transposes at the graph's edges
    assert "0 before + 0 this run (+ 4 default schedules measured)" in tuned
    assert "tuned under other pipeline options" not in compiled
    assert manifest["tuning"]["hit_rate"] == 1.0 and manifest["tuning"]["hits"] == 4
    assert "layout NHWC" in compiled


def test_minutes_budget_ends_the_search_and_says_so(tuned, tmp_path):
    model, db, _ = tuned
    copy = _copy_db(db, tmp_path / "timed")
    res = CliRunner().invoke(main, ["tune", model, "--shape", "x=1x32", "--db", str(copy),
                                    "--minutes", "0.01", "--population", "16",
                                    "--trials-per-round", "2"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "of 0.0 min (time budget reached)" in flat


def test_the_library_share_bounds_what_tuning_can_buy():
    """Kernels oneDNN runs are not tuned: their timed share is what no tuning can go below."""
    from tvmopt.precision.choice import Choice

    choices = [Choice("conv", 3, "library", 1.0, 2.0),
               Choice("conv_bf16", 2, "library", 1.0, 2.0, precision="bf16", library_bf16_ms=0.5),
               Choice("mm", 4, "codegen", 1.0, 0.5)]
    lib = tune.library_time(choices)
    assert (lib.calls, lib.ms, lib.untimed) == (5, 3 * 1.0 + 2 * 0.5, 0)
    # 4 ms on the library, 1 ms in the tuned kernels' default schedules
    share, floor = tune.ceiling(lib, 1e-3)
    assert share == pytest.approx(0.2) and floor == pytest.approx(0.8)
    result = tune.TuneResult(Path("db"), [tune.TaskResult("k", 2, 0.0, 1, 0.25e-3, 0.5e-3)],
                             library=lib)
    assert result.untuned_total_s == pytest.approx(5e-3)
    assert result.tuned_total_s == pytest.approx(4.5e-3)
    # An untimed library call (a forced --dispatch) leaves no whole-model figure.
    forced = tune.library_time([*choices, Choice("rnn", 1, "library", None, None)])
    assert forced.untimed == 1 and tune.ceiling(forced, 1e-3) is None
    assert tune.TuneResult(Path("db"), result.tasks, library=forced).untuned_total_s is None
    # Some of the model's tasks left out of the run: no whole-model figure either.
    partial = tune.TuneResult(Path("db"), result.tasks, library=lib, every_task=False)
    assert partial.untuned_total_s is None and partial.tuned_total_s is None
    assert tune.library_time([choices[2]]) is None


def test_a_build_almost_all_on_the_library_is_told_it_has_little_to_tune():
    from rich.console import Console
    from tvmopt.precision.choice import Choice

    task = tasks.Task("k", 2, None, 0.0)
    key = tune._task_key
    for lib_ms, hint in ((0.5, False), (99.0, True)):
        console = Console(record=True, width=200)
        lib = tune.library_time([Choice("conv", 1, "library", lib_ms, 2 * lib_ms)])
        tune._say_ceiling(console, lib, [task], {key(task): {"secs": 0.25e-3}})
        text = console.export_text()
        assert f"even were they free, the build would take {lib_ms / (lib_ms + 0.5):.2f}x" in text
        assert ("tuning has little to work on" in text) == hint, text


def test_tune_says_what_share_of_the_model_it_can_change(tmp_path, monkeypatch):
    """With the convolutions on oneDNN, tune says before the search what share of the kernel
    time its tasks hold, and after it the whole model's kernel time untuned and tuned."""
    from tvmopt.precision import choice

    # oneDNN takes every convolution whatever the timings say: the test is of the report.
    monkeypatch.setattr(choice, "MARGIN", float("inf"))
    # ... and so is the rate line, which tune leaves out where the probe's timing was not
    # trusted: on a machine other processes keep busy, it always is not. Timings are trusted
    # here whatever the load (the trust rules have tests of their own in
    # tests/timing/test_timing.py), and go to a cache of the test's own, not the user's.
    require_onednn()  # loaded before the cache moves: it is not built again into tmp_path
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(timing, "FOREIGN_LOAD_LIMIT", float("inf"))
    monkeypatch.setattr(timing, "SPREAD", float("inf"))
    monkeypatch.setattr(timing, "CEILING_FLOORS", float("inf"))
    model = tiny_conv(tmp_path / "conv.onnx", channels=16, size=8)
    res = CliRunner().invoke(main, ["tune", model, "--db", str(tmp_path / "db"), "--trials",
                                    "0", "--dispatch", "auto", "--precision", "fp32"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "2 kernels run on oneDNN (--dispatch auto, 2 workloads;" in flat
    assert "ms per inference as the dispatch timed them): not tuned" in flat
    assert "the tuned kernels hold " in flat and "of the untuned latency" in flat
    assert "oneDNN: 2 kernel calls, " in flat and "kernel time per inference: untuned " in flat
    # and how near those calls run to oneDNN's best on this host, before and after the search
    assert "of oneDNN's rate on a large matmul on this host (fp32 " in flat
    assert "GFLOP/s: " in flat and "of its large-matmul rate on this host), not tuned" in flat
    assert "(1.00x; the tuned kernels held" in flat  # no trials: the records are the defaults


def test_a_task_whose_search_ends_early_says_why(tmp_path):
    t = tasks.Task("k", 1, None, 0.0)
    why = tune._why_ended
    assert why(t, tmp_path, 4, 4, 0, "RuntimeError: boom", 100) == \
        "every candidate failed to build: RuntimeError: boom"
    assert why(t, tmp_path, 3, 1, 2, "x", 100).startswith("every candidate failed to run")
    assert why(t, tmp_path, 3, 0, 0, "", 100).startswith("design space exhausted after 3 trial(s)")
    assert why(t, tmp_path, 0, 0, 0, "", 100) == "the search produced no candidate"
    assert why(t, tmp_path, 100, 0, 0, "", 100) == "reached --max-trials-per-task 100"


def test_replay_hits_every_task_and_matches_onnxruntime(tuned, tmp_path):
    model, db, _ = tuned
    out = tmp_path / "a.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(db),
                                    "--require-db", "--verify", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "2/2 tasks served from the database, 0 fell back" in " ".join(res.output.split())
    tun = json.loads((out / "manifest.json").read_text())["tuning"]
    assert tun["hit_rate"] == 1.0 and tun["misses"] == [] and tun["hits"] == 2
    assert tun["sha256"] == database.database_sha256(db)


def test_replay_schedules_are_applied_before_dlight(tuned):
    """The database phase marks the tuned fused functions scheduled (apache/tvm#19385)."""
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_model import load_onnx
    from tvmopt.targets.registry import get_target

    model, db, _ = tuned
    hw = get_target("x86")
    imported = import_onnx(load_onnx(model), SHAPE)
    fused = pipeline.optimize(imported.mod, hw.to_tvm(), until=pipeline.FRONT_HALF).mod
    rep = replay.replay_database(db, hw, fused, require=True)
    mod = pipeline.optimize(fused, hw.to_tvm(), pipeline.PipelineConfig(database=rep.db),
                            until="database", start_after=pipeline.FRONT_HALF).mod
    scheduled = sorted(gv.name_hint for gv, f in mod.functions.items()
                       if f.attrs is not None and f.attrs.get("tirx.is_scheduled", False))
    assert scheduled == sorted(rep.hits)


def test_other_shape_misses_and_require_db_names_them(tuned, tmp_path):
    model, db, _ = tuned
    args = ["compile", model, "--shape", "x=4x32", "--db", str(db), "-o", str(tmp_path / "b")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "0/2 tasks served" in " ".join(res.output.split())
    res = CliRunner().invoke(main, args + ["--require-db"])
    assert res.exit_code == 1
    assert "--require-db" in res.output and "fused_matmul_add_relu" in res.output


def test_corrupt_and_truncated_lines_are_skipped_with_a_count(tuned, tmp_path):
    model, db, _ = tuned
    bad = _copy_db(db, tmp_path / "bad")
    rec = bad / database.RECORD_FILE
    lines = rec.read_text().splitlines()
    rec.write_text("\n".join(["not json", lines[0], "[99, []]"] + lines[1:]) + "\n"
                   + lines[-1][: len(lines[-1]) // 2])  # a line cut by a kill
    out = tmp_path / "c.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(bad),
                                    "--require-db", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "skipped 3 corrupt or truncated database lines" in " ".join(res.output.split())
    assert json.loads((out / "manifest.json").read_text())["tuning"]["skipped_lines"] == 3
    rep = database.sanitize_files(bad, tmp_path / "clean")
    assert (rep.records, rep.bad_record_lines) == (len(lines), 3)


def test_database_for_another_target_is_refused(tuned, tmp_path):
    model, db, _ = tuned
    other = _copy_db(db, tmp_path / "other")
    m = json.loads((other / database.MANIFEST_FILE).read_text())
    m["target"]["name"] = "arm64-neon"
    m["target"]["tvm_dict"] = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    (other / database.MANIFEST_FILE).write_text(json.dumps(m))
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(other),
                                    "-o", str(tmp_path / "d")])
    assert res.exit_code == 1
    assert "tuned for target 'arm64-neon'" in res.output and "Traceback" not in res.output
    with pytest.raises(TargetError):
        tune.tune(tune.TuneOptions(model=model, trials=8, db=str(other), shapes=SHAPE))


def test_locked_database_is_refused(tuned, tmp_path):
    model, db, _ = tuned
    copy = _copy_db(db, tmp_path / "locked")
    with database.locked(copy):
        with pytest.raises(errors.TuningError, match="being tuned by another process"):
            tune.tune(tune.TuneOptions(model=model, trials=16, db=str(copy), shapes=SHAPE))


@pytest.mark.slow  # the budget arithmetic; test_minutes_budget_ends_the_search_and_says_so
# keeps a budget test in the default tier
def test_spent_budget_runs_nothing_and_reports(tuned, tmp_path):
    model, db, result = tuned
    copy = _copy_db(db, tmp_path / "spent")
    res = CliRunner().invoke(main, ["tune", model, "--shape", "x=1x32", "--db", str(copy),
                                    "--trials", "8"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    # the records in the database: 8 searched, the 2 defaults, and the defaults measured again
    # where the fixture's tune ran on a busy machine
    before = 10 + result.extra_default_records
    assert f"trials: {before} before + 0 this run" in flat and "whole-model estimate" in flat
    assert "budget: spent 0 of 0 trials (trial budget reached)" in flat


@pytest.mark.slow  # a second search over the fixture's database
def test_missing_only_tunes_just_the_tasks_without_a_record(tuned, tmp_path):
    model, db, _ = tuned
    copy = _copy_db(db, tmp_path / "partial")
    # Drop every record of workload 1: that task is "missing", the other keeps its records.
    rec = copy / database.RECORD_FILE
    lines = [ln for ln in rec.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln)[0] != 1]
    assert 0 < len(kept) < len(lines)
    rec.write_text("\n".join(kept) + "\n")
    result = tune.tune(tune.TuneOptions(model=model, trials=len(kept) + 4, db=str(copy),
                                            shapes=SHAPE, trials_per_round=4, population=32,
                                            missing_only=True))
    assert len(result.tasks) == 1 and result.tasks[0].best_s is not None
    assert result.trials_run == 4 and result.build_failures == 0
    # Now nothing is missing: a second run tunes nothing, whatever the budget.
    again = tune.tune(tune.TuneOptions(model=model, trials=100, db=str(copy), shapes=SHAPE,
                                           missing_only=True))
    assert again.trials_run == 0 and again.tasks == []


def test_prune_keeps_best_record_per_task(tuned, tmp_path):
    model, db, result = tuned
    copy = _copy_db(db, tmp_path / "pruned")
    before, after = database.prune(copy, top_k=1)
    # 8 trials, 2 default schedules, and their second measurement if the first was busy
    assert (before, after) == (10 + result.extra_default_records, 2)
    hw = get_target("x86")
    fused, _, _ = tune.fused_module(model, SHAPE, hw)
    rep = replay.open_for_replay(copy, hw, fused)
    assert rep.hit_rate == 1.0
    pruned = tune.summarize(rep.db, tasks.extract_tasks(fused, hw.to_tvm()))
    assert {t.name: t.best_s for t in pruned} == pytest.approx(
        {t.name: t.best_s for t in result.tasks})
    assert json.loads((copy / database.MANIFEST_FILE).read_text())["pruned_top_k"] == 1


def test_host_port_and_options_are_validated():
    assert measure.parse_host_port("127.0.0.1:9190") == ("127.0.0.1", 9190)
    for bad in ("9190", "host:", "host:abc"):
        with pytest.raises(errors.TuningError, match="HOST:PORT"):
            measure.parse_host_port(bad)
    with pytest.raises(errors.TuningError, match="--trials"):
        tune.TuneOptions(model="m.onnx", trials=-1)
    with pytest.raises(errors.TuningError, match="--minutes must be > 0"):
        tune.TuneOptions(model="m.onnx", minutes=0)
    assert tune.TuneOptions(model="m.onnx").trials == 64
    assert tune.TuneOptions(model="m.onnx", minutes=5).trials is None
    with pytest.raises(errors.TuningError, match="--rpc-key"):
        tune.TuneOptions(model="m.onnx", rpc_tracker="127.0.0.1:9190")
    with pytest.raises(errors.TuningError, match="HOST:PORT"):
        tune.TuneOptions(model="m.onnx", rpc_tracker="localhost", rpc_key="k")
    opts = tune.TuneOptions(model="dir/my_model.onnx", target="x86")
    assert Path(opts.db) == Path("schedules/my_model/x86-avx2")


def test_intrinsics_loaded_per_target_family():
    import tvm

    assert measure._target_intrinsic_modules(tvm.target.Target({"kind": "llvm"})) == ["x86"]
    arm = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    assert measure._target_intrinsic_modules(arm) == ["arm_cpu"]
    assert measure._target_intrinsic_modules(tvm.target.Target({"kind": "cuda"})) == ["cuda"]



def test_weight_prepack_setting_must_match_the_database(tuned, tmp_path):
    model, db, _ = tuned
    copy = _copy_db(db, tmp_path / "layout")
    with pytest.raises(errors.TuningError, match="weight_prepack=False"):
        tune.tune(tune.TuneOptions(model=model, trials=16, db=str(copy), shapes=SHAPE,
                                       weight_prepack=True))


def test_tuning_inputs_keep_indices_in_range():
    """Integer buffers (gather/take indices) are zero, floats random: random indices made every
    `take` task of tiny_bert fail its measurement and miss the database."""
    import numpy as np
    import tvm

    from tvmopt.tuning.measure import alloc_arguments_in_range

    (args,) = alloc_arguments_in_range(tvm.cpu(), [["TENSOR", "int64", [64]],
                                                   ["TENSOR", "float32", [64]]], 1)
    assert not np.any(args[0].numpy())
    assert np.any(args[1].numpy())


def test_tuning_a_symbolic_shape_asks_for_a_static_one(tmp_path, monkeypatch):
    import tvmopt.front

    def front_half(*a, **k):  # its kernel timing takes a while: the shapes are checked first
        raise AssertionError("the front half ran before the shape check")

    monkeypatch.setattr(tvmopt.front, "fuse_and_plan", front_half)
    model = tiny_mlp(tmp_path / "mlp.onnx")
    with pytest.raises(errors.TuningError, match=r"input 'x' dimension 0 is symbolic \(batch\)"
                                                 r".*--shape x=Nx32"):
        tune.tune(tune.TuneOptions(model=model, trials=4, db=str(tmp_path / "db")))
    assert not (tmp_path / "db").exists()


def test_database_of_another_tvm_release_is_refused(tuned, tmp_path):
    model, db, _ = tuned
    old = _copy_db(db, tmp_path / "old")
    m = json.loads((old / database.MANIFEST_FILE).read_text())
    m["tvm_version"] = "0.19.0"
    (old / database.MANIFEST_FILE).write_text(json.dumps(m))
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(old),
                                    "-o", str(tmp_path / "d")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    errors_ = [ln for ln in res.output.splitlines() if ln.startswith("tvmopt: error: ")]
    assert len(errors_) == 1 and "tuned with TVM 0.19.0" in errors_[0]
    with pytest.raises(errors.TuningError, match="tuned with TVM 0.19.0"):
        tune.tune(tune.TuneOptions(model=model, trials=16, db=str(old), shapes=SHAPE))


def test_records_of_another_target_are_refused_whatever_the_manifest_says(tuned, tmp_path):
    model, db, _ = tuned
    other = _copy_db(db, tmp_path / "records")
    (other / database.MANIFEST_FILE).unlink()  # no manifest to say so: the records must
    rec = other / database.RECORD_FILE
    lines = []
    for line in rec.read_text().splitlines():
        idx, body = json.loads(line)
        body[2]["mtriple"], body[2]["mcpu"] = "aarch64-linux-gnu", "cortex-a72"
        lines.append(json.dumps([idx, body]))
    rec.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(main, ["compile", model, "--shape", "x=1x32", "--db", str(other),
                                    "-o", str(tmp_path / "d")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"holds {len(lines)} of {len(lines)} records measured for llvm" in res.output
    assert "cortex-a72" in res.output
    with pytest.raises(TargetError, match="records measured for llvm"):
        tune.tune(tune.TuneOptions(model=model, trials=16, db=str(other), shapes=SHAPE))


def test_runner_workers_time_on_as_many_threads_as_an_artifact_runs(monkeypatch):
    """TVM's pool in a runner worker took its default, half the logical CPUs (one thread on a
    2-vCPU machine), while schedules are made for every core and artifacts run on every core:
    a default schedule measured at half its speed. The worker sets the count before its pool
    starts."""
    import os

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    runner = measure.make_runner()
    try:
        got = runner.pool.submit(os.getenv, "TVM_NUM_THREADS").result()
    finally:
        runner.pool.shutdown()
    assert got == str(os.cpu_count())
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # an explicit count is the user's, and kept
    runner = measure.make_runner()
    try:
        assert runner.pool.submit(os.getenv, "TVM_NUM_THREADS").result() == "1"
    finally:
        runner.pool.shutdown()


def test_the_fingerprint_leaves_out_only_how_kernels_are_timed(monkeypatch, tmp_path):
    """How a kernel is timed shapes no task, so a change there must not tell every database's
    user that its records may be stale: timing.py lies outside every fingerprinted path, and
    every fingerprinted path exists (or the fingerprint has gone stale after a rename)."""
    pkg = Path(front.__file__).resolve().parent
    assert all((pkg / p).exists() for p in front._FINGERPRINTED)
    assert (pkg / "timing.py").is_file()
    assert not any(p == "timing.py" or (pkg / p).is_dir() and (pkg / p / "timing.py").exists()
                   for p in front._FINGERPRINTED)
    # ... and a fingerprinted source does change it
    before = front.pipeline_fingerprint()
    fake = tmp_path / "tvmopt"
    fake.mkdir()
    for p in front._FINGERPRINTED:
        (fake / p).symlink_to(pkg / p)
    (fake / "front.py").unlink()
    (fake / "front.py").write_text((pkg / "front.py").read_text() + "# edited\n")
    monkeypatch.setattr(front, "__file__", str(fake / "front.py"))
    assert front.pipeline_fingerprint() != before


@pytest.mark.slow  # the same left-out path as a kernel sized at run time, on an LSTM
def test_a_recurrent_loop_kernel_is_left_out_of_tuning_and_said_so(tmp_path):
    """The loop kernel of a recurrent layer is generic in its steps and batch and written
    already scheduled: MetaSchedule can measure no candidate of it (measuring its default
    schedule crashed the tune), and no record could apply to it, so compile --require-db
    must not count it as a task the database lacks."""
    model = tiny_lstm(tmp_path / "lstm.onnx")
    tuned, _, manifest = _defaults_then_compile(model, tmp_path, "--dispatch", "codegen")
    assert "tvmopt_lstm_loop: written already scheduled" in tuned
    assert manifest["tuning"]["hit_rate"] == 1.0 and manifest["tuning"]["hits"] >= 1


def test_a_kernel_sized_at_run_time_is_left_out_of_tuning_and_said_so(tmp_path):
    """Every input static, yet one kernel's size comes from the data: MetaSchedule times
    arguments of fixed sizes (measuring its default schedule crashed the tune), so it is no
    task, here or in compile --require-db."""
    model = data_sized_range(tmp_path / "range.onnx")
    tuned, _, manifest = _defaults_then_compile(model, tmp_path, "--dispatch", "codegen")
    assert "sized at run time" in tuned and "not tuned" in tuned
    assert manifest["tuning"]["hit_rate"] == 1.0 and manifest["tuning"]["hits"] >= 1


def _defaults_on_host(model: str, db: Path) -> str:
    """`tune --trials 0 --target host --dispatch auto` (library calls timed, bf16 where the
    host has it, the default schedules measured): its output flattened."""
    res = CliRunner().invoke(main, ["tune", model, "--db", str(db), "--trials", "0",
                                    "--target", "host", "--dispatch", "auto"])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_tasks_come_from_the_module_the_accuracy_gate_keeps(tmp_path, bf16_always_faster):
    """Where compile's accuracy gate gives bf16 back, the casts around those library calls
    leave the fused kernels beside them, so the module compile keeps has other tasks than the
    bf16 build: tune runs the gate first and tunes the kept module, and compile --db takes the
    database's library choices, so --require-db finds every task."""
    needs_bf16_host()
    model = cancelling_matmuls(tmp_path / "mm.onnx")
    db = tmp_path / "db"
    tuned = _defaults_on_host(model, db)
    assert "running compile's accuracy gate" in tuned and "over the limit" in tuned
    m = json.loads((db / database.MANIFEST_FILE).read_text())
    assert len(m["pipeline"]["accuracy_gate"]["fp32_only"]) == 1  # both matmuls: one workload
    assert m["library_precisions"] and set(m["library_precisions"].values()) == {"fp32"}
    out = tmp_path / "c.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--db", str(db), "--target", "host",
                                    "--require-db", "--verify", "-o", str(out)])
    assert res.exit_code == 0, res.output
    built = json.loads((out / "manifest.json").read_text())
    assert built["tuning"]["hit_rate"] == 1.0
    assert all(c["precision"] == "fp32" for c in built["kernels"]["choices"])


@pytest.mark.slow  # two tunes and a gated compile; the settings' comparison is unit-tested
# below and the gate's module in test_tasks_come_from_the_module_the_accuracy_gate_keeps
def test_tune_gates_with_the_settings_compile_is_given(tmp_path, bf16_always_faster):
    """tune --max-error runs compile's gate at that limit and records it; a compile --db whose
    gate runs at another limit says so, since where it gives calls back their tasks miss."""
    needs_bf16_host()
    model = cancelling_matmuls(tmp_path / "mm.onnx")
    db = tmp_path / "db"
    res = CliRunner().invoke(main, ["tune", model, "--db", str(db), "--trials", "0",
                                    "--target", "host", "--dispatch", "auto",
                                    "--max-error", "100"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "limit 100 (--max-error): passed" in flat  # the default limit fails this model
    m = json.loads((db / database.MANIFEST_FILE).read_text())
    assert m["pipeline"]["accuracy_gate"] == {"fp32_only": [], "all_fp32": False,
                                              "max_error": 100.0, "calibration_sha256": None}
    assert set(m["library_precisions"].values()) == {"bf16"}
    res = CliRunner().invoke(main, ["compile", model, "--db", str(db), "--target", "host",
                                    "-o", str(tmp_path / "c.tvmopt")])
    assert res.exit_code == 0, res.output
    assert ("tuned behind the accuracy gate with other settings (--max-error 100 (this run: "
            "default))") in " ".join(res.output.split())
    # resumed without it: the recorded choices stay, and tune says they were gated otherwise
    res = CliRunner().invoke(main, ["tune", model, "--db", str(db), "--trials", "0",
                                    "--target", "host", "--dispatch", "auto"])
    assert res.exit_code == 0, res.output
    assert ("library calls were gated with other settings (--max-error 100 (this run: "
            "default)); this run keeps them as recorded") in " ".join(res.output.split())


def test_gate_settings_are_compared_only_where_a_database_records_them():
    now = tune.gate_settings(None, None)
    assert tune.gate_settings_differ({"fp32_only": [], "all_fp32": False}, now) == []
    assert tune.gate_settings_differ(None, now) == []
    assert tune.gate_settings_differ({**now}, now) == []
    assert tune.gate_settings_differ({"max_error": 0.01, "calibration_sha256": "ab" * 32},
                                     now) == [
        "--max-error 0.01 (this run: default)",
        "--calibration file sha256 abababababab (this run: seeded random inputs)"]
    with pytest.raises(errors.TuningError, match="--max-error must be > 0"):
        tune.TuneOptions(model="m.onnx", max_error=0.0)
    with pytest.raises(errors.TuningError, match="--calibration nowhere.npz: no such file"):
        tune.TuneOptions(model="m.onnx", calibration="nowhere.npz")


def test_compile_db_takes_the_library_choices_the_database_was_tuned_with(tmp_path, monkeypatch,
                                                                          bf16_always_faster):
    """Timed again at compile, a library call's precision (or side) can come out otherwise,
    and the module then has other tasks than the database: compile --db (and a resumed tune)
    takes tune's choices as recorded, and compile --retime decides them again."""
    needs_bf16_host()
    from tests.library.test_onednn import _small_cnn
    from tvmopt.precision import choice
    from tvmopt import timing

    model = _small_cnn(tmp_path / "cnn.onnx")
    db = tmp_path / "db"
    _defaults_on_host(model, db)
    tuned = json.loads((db / database.MANIFEST_FILE).read_text())["library_precisions"]
    assert tuned and set(tuned.values()) == {"bf16"}
    # this host now times oneDNN fp32 ahead of bf16, and both ahead of codegen
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache2"))
    ms = {"library_ms": 1.0, "library_bf16_ms": 2.0}
    monkeypatch.setattr(choice, "_time_sides", lambda sides, name: {
        s: timing.Measurement(*(2 * [ms.get(s, 4.0)]), 0.0) for s in sides})

    def choices(*extra):
        out = tmp_path / f"c{len(extra)}.tvmopt"
        res = CliRunner().invoke(main, ["compile", model, "--db", str(db), "--target", "host",
                                        *extra, "-o", str(out)])
        assert res.exit_code == 0, res.output
        return json.loads((out / "manifest.json").read_text())["kernels"]["choices"]

    as_tuned = choices()
    assert {c["kernel"]: c["precision"] for c in as_tuned} == tuned
    assert all(c["reason"] == "as the database was tuned" for c in as_tuned)
    retimed = choices("--retime")
    assert all(c["choice"] == "library" and c["precision"] == "fp32" for c in retimed)
    # a resumed tune keeps them too: its tasks stay those of the module the records came from
    resumed = _defaults_on_host(model, db)
    assert "library calls as the database recorded them" in resumed
    # and reports oneDNN's time as the first run measured it, not "untimed"
    assert "ms per inference as the dispatch timed them): not tuned" in resumed
    assert json.loads((db / database.MANIFEST_FILE).read_text())["library_precisions"] == tuned


@pytest.mark.slow  # a search of its own, on a regression's model
def test_a_task_whose_design_space_fails_keeps_its_default_and_the_search_goes_on(tmp_path):
    """MetaSchedule's multi-level tiling raises on attention scores fused with a broadcast
    Where mask (reverse_compute_at); that error ended the whole tune (a DistilBERT). The task
    is left out of the search with the reason, keeps its default-schedule record, and compile
    --require-db finds it."""
    model = masked_scores(tmp_path / "scores.onnx")
    db = tmp_path / "db"
    res = CliRunner().invoke(main, ["tune", model, "--db", str(db), "--trials", "8",
                                    "--dispatch", "codegen"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "not searched: MetaSchedule's schedule rules fail on it (ScheduleError" in flat
    out = tmp_path / "c.tvmopt"
    res = CliRunner().invoke(main, ["compile", model, "--db", str(db), "--dispatch", "codegen",
                                    "--require-db", "--verify", "-o", str(out)])
    assert res.exit_code == 0, res.output


def test_default_schedules_measured_on_a_busy_machine_are_measured_again(monkeypatch):
    """Load only adds time, and the defaults are the baseline of every speed-up: measured
    while other processes were busy, they are measured again and each keeps its faster
    figure (a failed one loses); the second measurement's records are no trials."""
    from rich.console import Console

    from tvmopt import timing
    from tvmopt.tuning import seed

    loads, rounds = iter([1.5, 0.0]), iter([[0.5, None, 0.25], [0.1, 0.2, 0.75]])

    class Load:
        def __enter__(self):
            self.cores = next(loads)
            return self

        def __exit__(self, *exc):
            return False

        @property
        def busy(self):
            return self.cores >= timing.FOREIGN_LOAD_LIMIT

    def measured(tasks, *args):
        return [seed.Seed(t, "default rules", s, s is not None)
                for t, s in zip(tasks, next(rounds))]

    monkeypatch.setattr(timing, "ForeignLoad", Load)
    monkeypatch.setattr(seed, "seed_defaults", measured)
    monkeypatch.setattr(tune, "make_builder", lambda **kw: None)
    console = Console(record=True, width=400)
    result = tune.TuneResult(Path("db"), [])
    tune._measure_defaults(["a", "b", "c"], None, None, None, None, result, console)
    assert ("other processes used 1.50 cores while the default schedules were measured: "
            "measuring them again") in console.export_text()
    assert [s.secs for s in result.seeds] == [0.1, 0.2, 0.25]
    assert result.foreign_load == {"defaults": 0.0} and result.extra_default_records == 3
    # quiet the first time: measured once
    loads, rounds = iter([0.0]), iter([[0.5, None, 0.25]])
    result = tune.TuneResult(Path("db"), [])
    tune._measure_defaults(["a", "b", "c"], None, None, None, None, result, console)
    assert [s.secs for s in result.seeds] == [0.5, None, 0.25]
    assert result.extra_default_records == 0


def test_tune_warns_when_other_processes_kept_the_cores_busy(tuned, monkeypatch):
    """Measured while another process ran, a 2-core machine's parallel kernels read up to 100x
    their time (a ShuffleNet's default schedules summed to 46 ms instead of 0.33): tune
    measures the load in both phases, and says so past the limit."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from tvmopt.tuning import report

    _, _, result = tuned
    assert set(result.foreign_load) == {"defaults", "search"}
    out = io.StringIO()
    monkeypatch.setattr(report, "_console", Console(file=out, width=400))
    report._print_load(SimpleNamespace(foreign_load={"defaults": 1.2, "search": 0.01}))
    text = out.getvalue()
    assert "other processes used 1.20 cores while the default schedules were measured" in text
    assert "the search" not in text
    quiet = io.StringIO()
    monkeypatch.setattr(report, "_console", Console(file=quiet, width=400))
    report._print_load(SimpleNamespace(foreign_load={"defaults": 0.01, "search": 0.0}))
    assert not quiet.getvalue()
