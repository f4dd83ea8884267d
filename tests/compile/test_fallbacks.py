"""Every kind of fallback a compile takes reaches the manifest's `fallbacks` and the summary.

Each fallback is forced by making the step it guards raise, on one tiny MatMul + Add + Relu
model (a [4, 64] weight: large enough that the matmul rule packs it, so the post-schedule
folding pass runs).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import tvmopt
from tests.models import const, make_model, rand, vi


def _mlp(save):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["y"])]
    model = make_model(nodes, [vi("x", [4, 16])], [vi("y", [4, 64])],
                       [const("w", rand(16, 64)), const("b", rand(64, seed=1))])
    return str(save(model, "mlp"))


def _raise(message):
    def fail(*args, **kwargs):
        raise RuntimeError(f"traceback line\n{message}")
    return fail


def _compile(path, tmp_path, **kw):
    logged = []
    opts = tvmopt.CompileOptions(model=path, output=str(tmp_path / "m.tvmopt"), **kw)
    return tvmopt.compile_model(opts, log=logged.append), logged


def test_a_clean_compile_records_no_fallback(save, tmp_path):
    result, _ = _compile(_mlp(save), tmp_path, dispatch="codegen")
    m = result.artifact.manifest
    assert m["fallbacks"] == [] and m["schedule_fallbacks"] == []


def test_every_kind_of_fallback_is_in_the_manifest_and_the_summary(save, tmp_path, monkeypatch,
                                                                    capsys):
    import tvm
    from tvm.s_tir.dlight import cpu as dl_cpu

    from tvmopt.codegen import cpu

    from tvmopt.library import onednn
    from tvmopt.precision import rewrites, schemes
    from tvmopt.report import print_compile_result

    # A rule inside codegen/cpu.py that raises (it catches the error itself) ...
    monkeypatch.setattr(cpu.MatmulRule, "accepts", _raise("matmul rule broke"))
    # ... and a dlight rule that raises out of the rule (the pipeline's guard catches it).
    monkeypatch.setattr(dl_cpu.GEMV, "apply", _raise("gemv rule broke"))
    monkeypatch.setattr(tvm.relax.transform, "ToMixedPrecision", _raise("no mixed precision"))
    monkeypatch.setattr(tvm.relax.transform, "SplitLayoutRewritePreproc",
                        _raise("split refused"))
    # (Its reason is the error's first line, as in the note: the rest is the loader's hint.)
    monkeypatch.setattr(onednn, "load_extension",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("libdnnl.so: cannot open")))
    # The plan keeps fp32 on x86; an fp16 rewrite is what the precision fallback guards.
    monkeypatch.setattr(schemes, "passes_for", lambda plan, hw: [rewrites.fp16_pass()])
    # The packing fold runs only where a rule packed a weight: with MatmulRule failing, let
    # Conv2dRule (the same tiling and packing) take the matmul.
    monkeypatch.setattr(cpu.Conv2dRule, "accepts", lambda self, c: len(c.reads) >= 2)

    result, logged = _compile(_mlp(save), tmp_path, dispatch="auto")
    m = result.artifact.manifest
    got = {(f["kind"], f.get("rule", "")): f for f in m["fallbacks"]}
    assert set(got) == {("schedule_rule", "MatmulRule"), ("schedule_rule", "GEMV"),
                        ("precision_rewrite", ""), ("post_schedule_pass", ""),
                        ("library_unavailable", "")}, m["fallbacks"]
    for f in m["fallbacks"]:
        assert set(f) >= {"kind", "where", "reason", "instead"} and f["where"] and f["instead"]
    assert got["schedule_rule", "MatmulRule"]["reason"] == "matmul rule broke"
    assert "matmul" in got["schedule_rule", "MatmulRule"]["where"]
    assert got["schedule_rule", "GEMV"]["reason"] == "gemv rule broke"
    assert got["precision_rewrite", ""] == {
        "kind": "precision_rewrite", "where": "relax.transform.ToMixedPrecision",
        "reason": "no mixed precision",
        "instead": "fp16 for matmul and conv2d only; every other op stays fp32"}
    assert got["post_schedule_pass", ""]["where"] == "tvmopt.FoldWeightPacking"
    assert got["post_schedule_pass", ""]["reason"] == "split refused"
    assert got["library_unavailable", ""]["where"] == "oneDNN"
    assert got["library_unavailable", ""]["reason"] == "libdnnl.so: cannot open"
    # The older list keeps its form: the schedule-rule fallbacks only.
    assert sorted(f["rule"] for f in m["schedule_fallbacks"]) == ["GEMV", "MatmulRule"]
    assert all(set(f) == {"rule", "kernel", "error"} for f in m["schedule_fallbacks"])
    assert sum(line.startswith("fallback: ") for line in logged) == 4  # the library's is a note

    print_compile_result(result)
    out = capsys.readouterr().out
    assert "fallbacks: 5 (1 precision rewrite, 1 library unavailable, 2 schedule rule, " \
           "1 post schedule pass)" in " ".join(out.split()), out


def test_outputs_stay_right_on_the_fallbacks(save, tmp_path, monkeypatch):
    from tvmopt.codegen import cpu
    from tvmopt.runtime.loader import load

    monkeypatch.setattr(cpu.MatmulRule, "accepts", _raise("matmul rule broke"))
    path = _mlp(save)
    result, _ = _compile(path, tmp_path, dispatch="codegen")
    assert [f["kind"] for f in result.artifact.manifest["fallbacks"]] == ["schedule_rule"]
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    y = load(result.artifact.path).run({"x": x})["y"]
    w, b = rand(16, 64), rand(64, seed=1)
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("records, text", [
    ([], "none"),
    ([{"kind": "schedule_rule"}, {"kind": "schedule_rule"}],
     "2 (2 schedule rule); the manifest's 'fallbacks' names each"),
])
def test_summary_counts(records, text):
    from tvmopt.report import fallback_summary

    assert fallback_summary(records) == text


def _conv(save):
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])],
                       [const("w", rand(4, 3, 3, 3))])
    return str(save(model, "conv"))


@pytest.mark.parametrize("how", ["raises", "ill-formed"])
def test_a_refused_layout_rewrite_is_recorded(save, tmp_path, monkeypatch, how):
    import tvm

    from tvmopt.codegen import layout

    if how == "raises":
        @tvm.transform.module_pass(opt_level=0, name="Refuse")
        def refuse(mod, _ctx):
            raise RuntimeError("traceback line\nexactly one of the layouts is unknown")

        monkeypatch.setattr(tvm.relax.transform, "ConvertLayout", lambda desired: refuse)
        reason = "exactly one of the layouts is unknown"
    else:
        monkeypatch.setattr(layout, "_well_formed", lambda mod: False)
        reason = "relax.transform.ConvertLayout made an ill-formed module"

    result, logged = _compile(_conv(save), tmp_path, dispatch="codegen")
    got = [f for f in result.artifact.manifest["fallbacks"] if f["kind"] == "layout_rewrite"]
    assert got == [{"kind": "layout_rewrite", "where": "tvmopt.ChannelsLast", "reason": reason,
                    "instead": "the module keeps its imported layout (NCHW convolutions)"}]
    assert result.artifact.manifest["kernels"]["layout"] == "as imported"
    assert any(line.startswith("fallback: layout rewrite tvmopt.ChannelsLast failed")
               for line in logged), logged
