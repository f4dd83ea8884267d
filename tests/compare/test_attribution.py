"""Attribution arithmetic, kernel classification and recommendations (pure, no runtime)."""

import numpy as np
import pytest

from tvmopt.compare.attribution import Profile, attribute, delta_noise
from tvmopt.compare.causes import (CAUSE_IDS, OTHER, Kernel, classify_ort, classify_tvm,
                                   kernel_ops)
from tvmopt.compare.profiles import OUTSIDE, ort_kernels, tvm_kernels
from tvmopt.compare.recommend import ModelFacts, recommend, verdict

RIDGE = 6.5


def _k(name, cause, ms, calls=1.0, flops=None, nbytes=None):
    return Kernel(name=name, op=name, cause=cause, calls=calls, ms=ms, flops=flops, bytes=nbytes)


def _sum(att):
    return sum(r["delta_ms"] for r in att["attribution"]) + att["unexplained_ms"]


def test_deltas_add_up_to_the_measured_difference():
    a = Profile(2.0, [_k("conv", "compute", 1.5, flops=4e9), _k("add", "lost_fusion", 0.5)])
    b = Profile(8.0, [_k("convint", "int8_compute", 3.0, flops=1e9), _k("dql", "quantize", 1.0),
                      _k("mystery", OTHER, 0.5), _k("conv", "compute", 0.5, flops=1e9)])
    att = attribute(a, b)
    assert att["delta_ms"] == pytest.approx(6.0)
    assert _sum(att) == pytest.approx(6.0)
    rows = {r["cause"]: r for r in att["attribution"]}
    # B's profile (5 ms) is scaled to its 8 ms median: every row by 1.6
    assert rows["int8_compute"]["delta_ms"] == pytest.approx(4.8)
    assert rows["quantize"]["delta_ms"] == pytest.approx(1.6)
    assert rows["compute"]["delta_ms"] == pytest.approx(0.8 - 1.5)
    assert rows["compute"]["label"] == "compute saved by the variant"
    assert att["unexplained_ms"] == pytest.approx(0.8)
    assert att["explained_share"] == pytest.approx(1 - 0.8 / 6.0)
    assert att["ratio"] == pytest.approx(4.0)
    assert att["profile_scale"] == {"a": pytest.approx(1.0), "b": pytest.approx(1.6)}


@pytest.mark.parametrize("seed", range(40))
def test_attribution_always_sums_to_b_minus_a(seed):
    rng = np.random.default_rng(seed)
    causes = CAUSE_IDS + (OTHER,)

    def profile(side):
        n = int(rng.integers(1, 12))
        return Profile(float(rng.uniform(0.01, 100)),
                       [_k(f"{side}{i}", causes[int(rng.integers(len(causes)))],
                           float(rng.uniform(0.001, 50))) for i in range(n)])

    a, b = profile("a"), profile("b")
    att = attribute(a, b)
    assert _sum(att) == pytest.approx(b.measured_ms - a.measured_ms, rel=1e-9, abs=1e-9)


def test_noise_is_reported_from_the_samples():
    assert delta_noise([1.0, 1.1], [2.0, 2.0]) is None
    narrow = delta_noise([1.0, 1.01, 0.99, 1.0, 1.0], [2.0, 2.01, 1.99, 2.0, 2.0])
    wide = delta_noise([1.0, 3.0, 0.5, 2.0, 1.0], [2.0, 6.0, 1.0, 2.5, 4.0])
    assert 0 <= narrow < wide


@pytest.mark.parametrize("op,ins,outs,params,cause", [
    ("DynamicQuantizeLinear", [{"float": [1, 8, 4, 4]}], [{"uint8": [1, 8, 4, 4]}], 0, "quantize"),
    ("ConvInteger", [{"uint8": [1, 8, 4, 4]}], [{"int32": [1, 8, 4, 4]}], 0, "int8_compute"),
    ("DynamicQuantizeMatMul", [{"float": [1, 64, 128]}], [{"float": [1, 64, 128]}], 16384,
     "int8_compute"),
    ("Conv", [{"float": [1, 32, 32, 32]}, {"float": [32, 1, 3, 3]}], [{"float": [1, 32, 32, 32]}],
     1152, "low_intensity_conv"),
    ("Conv", [{"float": [1, 64, 32, 32]}, {"float": [64, 64, 3, 3]}], [{"float": [1, 64, 32, 32]}],
     147456, "compute"),
    ("MatMul", [{"float": [1, 1, 512]}, {"float": [512, 512]}], [{"float": [1, 1, 512]}], 0,
     "memory_bound"),
    ("Transpose", [{"float": [1, 4, 64, 32]}], [{"float": [1, 64, 4, 32]}], 0, "layout"),
    ("ReorderOutput", [{"float": [1, 8, 1, 1]}], [{"float": [1, 8, 1, 1]}], 0, "layout"),
    ("Add", [{"float": [1, 8]}, {"float": [1, 8]}], [{"float": [1, 8]}], 0, "lost_fusion"),
    ("Softmax", [{"float": [1, 4, 64, 64]}], [{"float": [1, 4, 64, 64]}], 0, "memory_bound"),
    ("SomeCustomOp", [{"float": [1, 8]}], [{"float": [1, 8]}], 0, OTHER),
])
def test_onnxruntime_nodes_get_their_cause(op, ins, outs, params, cause):
    assert classify_ort(op, ins, outs, params, RIDGE)[0] == cause


def test_conv_flops_and_bytes_from_profiled_shapes():
    _, flops, nbytes = classify_ort("Conv", [{"float": [1, 3, 8, 8]}, {"float": [4, 3, 3, 3]}],
                                    [{"float": [1, 4, 8, 8]}], 0, RIDGE)
    assert flops == 2 * 4 * 8 * 8 * 3 * 3 * 3
    assert nbytes == 4 * (3 * 64 + 4 * 27 + 4 * 64)


def test_fused_kernel_names_are_read_as_ops():
    assert kernel_ops("fused_conv2d2_cast5_multiply4_multiply5_add1_relu1_prepacked") == [
        "conv2d", "cast", "multiply", "multiply", "add", "relu"]
    assert kernel_ops("fused_divide1_subtract1_tir_clip_tir_round_cast_quantize_cast1") == [
        "divide", "subtract", "tir_clip", "tir_round", "cast", "quantize", "cast"]
    assert kernel_ops("layout_transform3") == ["layout_transform"]


@pytest.mark.parametrize("name,quantized,flops,nbytes,cause", [
    ("fused_conv2d_add_relu", False, 1e8, 1e6, "compute"),
    ("fused_conv2d3_add2_relu2", False, 1e6, 1e6, "low_intensity_conv"),
    ("fused_conv2d_cast3_multiply_multiply1_add_relu", True, 1e8, 1e6, "int8_compute"),
    ("fused_divide1_subtract1_tir_clip_tir_round_cast_quantize_cast1", True, None, None,
     "quantize"),
    ("max1", True, 1e4, 4e4, "quantize"),
    ("max1", False, 1e4, 4e4, "memory_bound"),
    ("fused_matmul_add", False, 1e5, 1e6, "memory_bound"),
    ("transpose", False, None, None, "layout"),
    ("fused_add_relu", False, None, None, "lost_fusion"),
    ("vm.builtin.alloc_tensor", False, None, None, "lost_fusion"),
    ("fused_layer_norm_add", False, None, None, "memory_bound"),
    ("fused_wibble_wobble", False, None, None, OTHER),
])
def test_tvmopt_kernels_get_their_cause(name, quantized, flops, nbytes, cause):
    assert classify_tvm(name, None, flops, nbytes, RIDGE, quantized) == cause


def _ev(name, ts, dur, op="Conv", ins=None, outs=None):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
            "args": {"op_name": op, "input_type_shape": ins or [{"float": [1, 8]}],
                     "output_type_shape": outs or [{"float": [1, 8]}], "parameter_size": "0"}}


def test_onnxruntime_profile_drops_warmup_and_keeps_time_outside_nodes():
    events = []
    for r, (start, node_us) in enumerate([(0, 900), (1000, 100), (2000, 120), (3000, 110)]):
        events.append({"cat": "Session", "name": "model_run", "ts": start, "dur": 200})
        events.append(_ev("conv", start + 10, node_us))
        events.append(_ev("add", start + 150, 20, op="Add"))
    ks = {k.name: k for k in ort_kernels(events, warmup=1, ridge=RIDGE)}
    assert ks["conv"].ms == pytest.approx(0.110)  # median of the three kept runs
    assert ks["add"].cause == "lost_fusion" and ks["add"].calls == 1
    assert ks[OUTSIDE].ms == pytest.approx((200 - 110 - 20) / 1e3)


def test_tvmopt_profile_rows_are_matched_to_the_plan():
    prof = {"kernels": [{"name": "fused_conv2d_add_prepacked", "calls_per_run": 2.0,
                         "total_ms_per_run": 1.0},
                        {"name": "vm.builtin.alloc_tensor", "calls_per_run": 5.0,
                         "total_ms_per_run": 0.1}]}
    plan = {"kernels": [{"name": "fused_conv2d_add", "ops": ["conv2d", "add"], "flops": 1e6,
                         "bytes": 1e6}]}
    ks = tvm_kernels(prof, plan, RIDGE, False)
    assert ks[0].cause == "low_intensity_conv" and ks[0].flops == 2e6
    assert ks[1].cause == "lost_fusion"


def _att(a_ms, b_ms, b_quant=0.0, b_int=0.0, b_flops=0.0):
    a = Profile(a_ms, [_k("conv", "compute", a_ms, flops=1e9)])
    b = Profile(b_ms, [_k("convint", "int8_compute", b_int, flops=b_flops),
                       _k("dql", "quantize", b_quant)])
    return attribute(a, b)


def test_folding_is_recommended_and_ranked_by_its_measurement():
    att = _att(1.0, 10.0, b_quant=2.0, b_int=8.0, b_flops=1e9)
    a = ModelFacts("a.onnx", "a.onnx", "fp32", 1e9, False)
    b = ModelFacts("b.onnx", "b.onnx", "int8 (dynamic)", 1e9, True, "b.fp32w.onnx")
    recs = recommend(att, a, b, "onnxruntime", "x86-avx2", {"b.fp32w.onnx": 0.9}, 1000.0, 25.6)
    assert recs[0].id == "fold_quantization"
    assert recs[0].measured_ms == 0.9
    # a precision variant (same FLOPs): folding predicts the fp32 model's kernels back
    assert recs[0].predicted_ms == pytest.approx(1.0)
    smaller = ModelFacts("b.onnx", "b.onnx", "int8 (dynamic)", 2.5e8, True, "b.fp32w.onnx")
    other = recommend(att, a, smaller, "onnxruntime", "x86-avx2", {}, 1000.0, 25.6)
    fold = next(r for r in other if r.id == "fold_quantization")
    assert fold.predicted_ms == pytest.approx(10.0 - 2.0 - 8.0 + 1e9 / 1e9)
    assert {r.id for r in recs} >= {"fold_quantization", "ship_a"}
    line = verdict(recs, att, a, b, "onnxruntime", "x86-avx2")
    assert "b.fp32w.onnx" in line and "\n" not in line


def test_a_rewrite_within_noise_of_the_plain_model_does_not_win():
    att = _att(1.0, 10.0, b_quant=2.0, b_int=8.0, b_flops=1e9)
    a = ModelFacts("a.onnx", "a.onnx", "fp32", 1e9, False)
    b = ModelFacts("b.onnx", "b.onnx", "int8 (dynamic)", 1e9, True, "b.fp32w.onnx")
    recs = recommend(att, a, b, "tvmopt", "x86-avx2", {"b.fp32w.onnx": 0.98}, 1000.0, 25.6)
    assert [r.id for r in recs[:2]] == ["ship_a", "fold_quantization"]
    assert "within the noise" in recs[0].why


def test_the_standard_model_is_recommended_when_the_variant_is_slower():
    att = _att(1.0, 3.0, b_int=3.0)
    a = ModelFacts("std.onnx", "std.onnx", "fp32", 4e9, False)
    b = ModelFacts("dw.onnx", "dw.onnx", "fp32", 1e9, False)
    recs = recommend(att, a, b, "tvmopt", "x86-avx2", {}, None, 25.6)
    assert recs[0].id == "ship_a" and recs[0].measured_ms == 1.0
    assert "saves 75% of FLOPs" in recs[0].why


def test_the_variant_is_recommended_when_it_is_faster():
    att = _att(3.0, 1.0, b_int=1.0)
    a = ModelFacts("std.onnx", "std.onnx", "fp32", 4e9, False)
    b = ModelFacts("dw.onnx", "dw.onnx", "fp32", 1e9, False)
    recs = recommend(att, a, b, "tvmopt", "x86-avx2", {}, None, 25.6)
    assert recs[0].id == "ship_b"
    assert "ship dw.onnx" in verdict(recs, att, a, b, "tvmopt", "x86-avx2")


def test_a_difference_inside_the_noise_is_said_so():
    att = _att(1.0, 1.1, b_int=1.1)
    att["noise_ms"] = 0.5
    a = ModelFacts("std.onnx", "std.onnx", "fp32", 4e9, False)
    b = ModelFacts("dw.onnx", "dw.onnx", "fp32", 1e9, False)
    recs = recommend(att, a, b, "tvmopt", "x86-avx2", {}, None, 25.6)
    assert "within the measurement noise" in verdict(recs, att, a, b, "tvmopt", "x86-avx2")


def test_layout_transforms_around_unconverted_ops_are_named():
    a = Profile(1.0, [_k("fused_conv2d_add", "compute", 1.0, flops=4e9)])
    tr = Kernel(name="fused_transpose1_maximum_minimum_transpose2", op="transpose+maximum+"
                "minimum", cause="layout", calls=1.0, ms=1.0)
    b = Profile(2.0, [tr, _k("dw", "low_intensity_conv", 0.5)])
    att = attribute(a, b)
    a_f = ModelFacts("std.onnx", "std.onnx", "fp32", 4e9, False)
    b_f = ModelFacts("dw.onnx", "dw.onnx", "fp32", 1e9, False)
    recs = recommend(att, a_f, b_f, "tvmopt", "x86-avx2", {}, None, 25.6)
    lay = next(r for r in recs if r.id == "keep_one_layout")
    assert "maximum, minimum" in lay.action and lay.measured_ms is None
    assert recs[0].id == "ship_a"


def test_profile_and_timing_disagreeing_is_warned():
    from tvmopt.compare.report import scale_warning

    assert scale_warning({"profile_scale": {"a": 0.9, "b": 1.3}}) is None
    assert "A x7.40" in scale_warning({"profile_scale": {"a": 7.4, "b": 1.0}})


def test_an_incomplete_explanation_is_said_plainly_with_its_kernels():
    from tvmopt.compare.report import explanation_line

    a = Profile(10.0, [_k("conv", "compute", 4.0), _k("lib", OTHER, 6.0)])
    b = Profile(6.0, [_k("conv", "compute", 4.0), _k("lib", OTHER, 2.0)])
    att = attribute(a, b)
    assert att["explained_share"] == pytest.approx(0.0) and not att["explained_ok"]
    line = explanation_line(att)
    assert "NOT explained" in line and "-4.00 ms" in line and "A lib 6.00 ms" in line
    good = attribute(Profile(1.0, [_k("conv", "compute", 1.0)]),
                     Profile(2.0, [_k("conv", "compute", 2.0)]))
    assert good["explained_ok"] and "NOT" not in explanation_line(good)
    good["noise_ms"] = 1.5
    assert "within the noise" in explanation_line(good)
