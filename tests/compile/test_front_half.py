"""One compile runs the pipeline's front half (every phase up to and including fuse) once."""

from __future__ import annotations

import tvmopt
from tvmopt import pipeline
from tvmopt.models import default_model_path


def test_compiling_the_bundled_model_runs_each_phase_once(tmp_path):
    opts = tvmopt.CompileOptions(model=str(default_model_path()), output=str(tmp_path / "m.tvmopt"))
    with pipeline.record_phases() as runs:
        result = tvmopt.compile_model(opts, log=lambda msg: None)
    front = pipeline.front_half("cpu")
    assert front[-1] == "fuse" and "simplify" in front
    assert {p: runs.count(p) for p in front} == {p: 1 for p in front}, runs
    assert runs == pipeline.phase_names("cpu")  # and the back half once too, in order
    plan = result.artifact.manifest["plan"]
    assert plan["kernels_before_fusion"] > plan["kernels_after_fusion"] > 0


def test_the_phase_record_counts_every_run():
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_model import load_onnx
    from tvmopt.targets.registry import get_target

    mod = import_onnx(load_onnx(default_model_path())).mod
    target = get_target("x86").to_tvm()
    with pipeline.record_phases() as runs:
        fused = pipeline.optimize(mod, target, until=pipeline.FRONT_HALF).mod
        pipeline.optimize(mod, target, until="simplify")
    assert runs == pipeline.front_half("cpu") + ["simplify"]
    with pipeline.record_phases() as rest:
        pipeline.optimize(fused, target, start_after=pipeline.FRONT_HALF)
    assert rest == ["database", "schedule"]
