"""Every kind of kernel a tvmopt build can run has a cause in `compare.causes`.

The kinds are enumerated from their sources, not listed here again: the library functions
`library/onednn/onednn_ext.cc` registers and `library/onednn/` emits, each primitive in each
precision the extension computes, and the Relax VM builtins TVM registers. A new one without
a cause fails here, before a comparison files its time as unexplained.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.onednn_required import require_onednn
from tvmopt.compare.causes import (CAUSE_IDS, LIBRARY_CONTROL, LIBRARY_FUNCS, LIBRARY_KINDS,
                                   ONEDNN_ATTRS, ONEDNN_COMPUTE, OTHER, VM_NOT_EMITTED,
                                   VM_NOT_EMITTED_PREFIXES, VM_OPAQUE, builtin_cause,
                                   classify_tvm, library_call, library_cause)
from tvmopt.compare.profiles import tvm_kernels

KERNELS = Path(__file__).resolve().parents[2] / "compiler" / "tvmopt" / "library" / "onednn"
RIDGE = 6.5


def _registered_library_funcs() -> set[str]:
    src = (KERNELS / "onednn_ext.cc").read_text()
    return set(re.findall(r'\.def(?:_packed)?\(\s*"(tvmopt\.onednn\.[\w.]+)"', src))


def _emitted_library_funcs() -> set[str]:
    src = "".join(p.read_text() for p in sorted(KERNELS.glob("*.py")))
    return set(re.findall(r'^\w+_FUNC = "(tvmopt\.onednn\.[\w.]+)"', src, re.M))


def _enum(name: str) -> dict[str, int]:
    """Positions of a C++ enum's entries (`X = Y` aliases an earlier entry)."""
    src = (KERNELS / "onednn_ext.cc").read_text()
    body = re.search(rf"enum {name}\b[^{{]*\{{(.*?)\}};", src, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    out, i = {}, 0
    for entry in (e.strip() for e in body.split(",")):
        if not entry:
            continue
        key, _, alias = (p.strip() for p in entry.partition("="))
        i = out[alias] if alias else i
        out[key] = i
        i += 1
    return out


def test_every_library_function_is_a_kernel_kind_or_a_control_function():
    registered, emitted = _registered_library_funcs(), _emitted_library_funcs()
    assert emitted and registered >= emitted
    assert registered - LIBRARY_CONTROL == set(LIBRARY_FUNCS), (
        "a tvmopt.onednn.* function without a kind in compare.causes.LIBRARY_FUNCS")
    assert LIBRARY_CONTROL <= registered


def test_attr_positions_match_the_extension():
    enums = {"conv2d": _enum("ConvAttr"), "matmul": _enum("MatmulAttr"),
             "batch_matmul": _enum("BmmAttr"), "attention": _enum("AttnAttr"),
             "qconv2d": _enum("QConvAttr"), "qmatmul": _enum("QMatmulAttr")}
    names = {("conv2d", "groups"): "kGroups", ("conv2d", "nhwc"): "kConvNHWC",
             ("conv2d", "compute"): "kConvCompute", ("matmul", "compute"): "kMMCompute",
             ("batch_matmul", "compute"): "kBCompute", ("attention", "compute"): "kACompute",
             ("qconv2d", "groups"): "kQGroups", ("qconv2d", "nhwc"): "kQWeightLayout",
             ("qmatmul", "dynamic"): "kQMDynamic"}
    assert {(f, k) for f, attrs in ONEDNN_ATTRS.items() for k in attrs} == set(names)
    for (func, key), enum_name in names.items():
        assert ONEDNN_ATTRS[func][key] == enums[func][enum_name], (func, key)


def test_compute_precisions_match_the_lowering():
    from tvmopt.library import onednn as od

    assert ONEDNN_COMPUTE == {v: k for k, v in od.COMPUTE.items()}
    src = (KERNELS / "onednn_ext.cc").read_text()
    compute = re.search(r"enum Compute[^{]*\{(.*?)\};", src, re.S).group(1)
    assert len(re.findall(r"=\s*\d+", compute)) == len(ONEDNN_COMPUTE)


def _attrs(func: str, **values) -> list[int]:
    pos = ONEDNN_ATTRS[func.rsplit(".", 1)[1]]
    out = [0] * (max(pos.values()) + 1)
    for k, v in values.items():
        out[pos[k]] = v
    return out


def _calls():
    """A call of every library function in every precision it computes."""
    conv = [[1, 16, 16, 8], "float32"], [[3, 3, 8, 32], "float32"], [[1, 16, 16, 32], "float32"]
    dw = [[1, 16, 16, 8], "float32"], [[3, 3, 1, 8], "float32"], [[1, 16, 16, 8], "float32"]
    mm = [[1, 128, 256], "float32"], [[256, 768], "float32"], [[1, 128, 768], "float32"]
    bq, bk, bs = ([[1, 4, 128, 64], "float32"], [[1, 4, 128, 64], "float32"],
                  [[1, 4, 128, 128], "float32"])
    for compute in ONEDNN_COMPUTE:
        yield "tvmopt.onednn.conv2d", [conv[0], conv[1], {"shape": _attrs(
            "tvmopt.onednn.conv2d", groups=1, nhwc=2, compute=compute)}, conv[2]]
        yield "tvmopt.onednn.conv2d", [dw[0], dw[1], {"shape": _attrs(
            "tvmopt.onednn.conv2d", groups=8, nhwc=2, compute=compute)}, dw[2]]
        yield "tvmopt.onednn.matmul", [mm[0], mm[1], {"shape": _attrs(
            "tvmopt.onednn.matmul", compute=compute)}, mm[2]]
        yield "tvmopt.onednn.batch_matmul", [bq, bk, {"shape": _attrs(
            "tvmopt.onednn.batch_matmul", compute=compute)}, bs]
        yield "tvmopt.onednn.attention", [bq, bk, bq, {"shape": _attrs(
            "tvmopt.onednn.attention", compute=compute)}, bq]
    # x [T, B, I], w_layer, w_iter, bias, attrs, y [T, D, B, H], y_h, y_c (a bidirectional LSTM)
    yield "tvmopt.onednn.rnn", [[[64, 1, 32], "float32"], [[1, 2, 32, 4, 16], "float32"],
                                [[1, 2, 16, 4, 16], "float32"], [[1, 2, 4, 16], "float32"],
                                {"shape": [0] * 8}, [[64, 2, 1, 16], "float32"],
                                [[2, 1, 16], "float32"], [[2, 1, 16], "float32"]]
    yield "tvmopt.onednn.qconv2d", [conv[0], [conv[1][0], "int8"], [[32], "float32"],
                                    {"shape": _attrs("tvmopt.onednn.qconv2d", groups=1, nhwc=2)},
                                    conv[2]]
    for dynamic in (0, 1):
        yield "tvmopt.onednn.qmatmul", [mm[0], [mm[1][0], "int8"], [[1], "float32"],
                                        {"shape": _attrs("tvmopt.onednn.qmatmul",
                                                         dynamic=dynamic)}, mm[2]]


def test_every_library_call_kind_has_a_cause():
    seen = set()
    for func, args in _calls():
        call = library_call(func, args)
        assert call is not None, func
        seen.add((call.primitive, call.precision))
        assert library_cause(call, RIDGE) in CAUSE_IDS, (func, call.precision)
    assert seen == set(LIBRARY_KINDS)
    assert seen >= {(p, c) for p in ("conv2d", "matmul") for c in ONEDNN_COMPUTE.values()}


def test_attention_counts_both_matmuls():
    call = library_call("tvmopt.onednn.attention", [[[2, 6, 1500, 64], "float32"],
                                                    [[2, 6, 1500, 64], "float32"],
                                                    [[2, 6, 1500, 32], "float32"],
                                                    {"shape": [1, 0, 0]},
                                                    [[2, 6, 1500, 32], "float32"]])
    assert call.flops == 2.0 * 2 * 6 * 1500 * 1500 * (64 + 32)


def test_library_workloads_are_read_from_the_arguments():
    calls = {(f, c.precision, c.depthwise): c for f, a in _calls()
             if (c := library_call(f, a)) is not None}
    mm = calls[("tvmopt.onednn.matmul", "fp32", False)]
    assert mm.flops == 2 * 128 * 768 * 256
    assert mm.bytes == 4 * (128 * 256 + 256 * 768 + 128 * 768)
    conv = calls[("tvmopt.onednn.conv2d", "bf16", False)]
    assert conv.flops == 2 * (16 * 16 * 32) * (3 * 3 * 8)
    dw = calls[("tvmopt.onednn.conv2d", "fp32", True)]
    assert library_cause(dw, RIDGE) == "low_intensity_conv"
    assert library_cause(calls[("tvmopt.onednn.qmatmul", "int8-dynamic", False)],
                         RIDGE) == "int8_compute"
    # a matmul of one row reads its whole weight for little arithmetic: memory-bound
    gemv = library_call("tvmopt.onednn.matmul", [[[1, 1, 1024], "float32"],
                                                 [[1024, 1024], "float32"],
                                                 {"shape": [0, 0, 0, 0]},
                                                 [[1, 1, 1024], "float32"]])
    assert library_cause(gemv, RIDGE) == "memory_bound"


def test_every_registered_vm_builtin_has_a_cause_or_is_known_not_to_be_emitted():
    tvm_ffi = pytest.importorskip("tvm_ffi")
    pytest.importorskip("tvm")  # registers the runtime's builtins
    names = [n for n in tvm_ffi.registry.list_global_func_names()
             if n.startswith("vm.builtin.")]
    assert names
    missing = [n for n in names if builtin_cause(n) is None]
    assert not missing, f"VM builtins without a cause in compare.causes: {missing}"
    emitted = [n for n in names if n[len("vm.builtin."):] not in VM_NOT_EMITTED | VM_OPAQUE
               and not n[len("vm.builtin."):].startswith(VM_NOT_EMITTED_PREFIXES)]
    assert all(builtin_cause(n) in CAUSE_IDS for n in emitted)
    assert builtin_cause("vm.builtin.alloc_tensor") == "lost_fusion"
    assert builtin_cause("vm.builtin.call_tir_dyn") == OTHER


@pytest.mark.parametrize("name,ops,flops,nbytes,dtypes,cause", [
    # GPT-2's tanh GELU between reshapes: elementwise work, whatever its name starts with
    ("fused_reshape9_power_multiply1_add4_multiply2_fast_tanh_add5_multiply3_reshape10",
     ["reshape9", "power", "multiply1", "add4", "multiply2", "fast_tanh", "add5", "multiply3",
      "reshape10"], 2.0e7, 4.2e6, ["float32"], "lost_fusion"),
    # the same ops with a transpose and little arithmetic: a layout transform
    ("fused_transpose1_maximum_minimum_transpose2", ["transpose1", "maximum", "minimum",
                                                     "transpose2"], 2e5, 8e5, None, "layout"),
    # a name that says nothing: the plan's ops decide
    ("kernel7", ["matmul3", "add3"], 6.7e7, 2.6e6, ["float32"], "compute"),
    ("kernel8", ["conv2d"], 1e8, 1e6, ["uint8", "int8", "int32"], "int8_compute"),
    ("kernel9", ["cast", "multiply"], 1e5, 5e5, ["int32", "float32", "uint8"], "quantize"),
    ("reshape3", ["reshape3"], 0.0, 1e6, ["float32"], "layout"),
    # an op of no family: the roofline places it
    ("fused_wibble", ["wibble"], 1e3, 1e6, ["float32"], "memory_bound"),
])
def test_fused_kernels_are_classified_by_their_ops_not_their_names(name, ops, flops, nbytes,
                                                                    dtypes, cause):
    assert classify_tvm(name, ops, flops, nbytes, RIDGE, False, dtypes) == cause


def test_profile_rows_of_library_calls_are_split_by_workload():
    mm = [[1, 128, 256], "float32"], [[1, 128, 768], "float32"]
    prof = {"kernels": [
        {"name": "tvmopt.onednn.matmul", "calls_per_run": 5.0, "total_ms_per_run": 3.0,
         "signatures": [
             {"args": [mm[0], [[256, 768], "float32"], {"shape": [0, 0, 0, 0]}, mm[1]],
              "calls_per_run": 4.0, "total_ms_per_run": 2.0},
             {"args": [[[1, 1, 256], "float32"], [[256, 768], "float32"],
                       {"shape": [0, 0, 0, 0]}, [[1, 1, 768], "float32"]],
              "calls_per_run": 1.0, "total_ms_per_run": 1.0}]},
        {"name": "vm.builtin.alloc_tensor", "calls_per_run": 9.0, "total_ms_per_run": 0.1,
         "signatures": [{"args": [None, None], "calls_per_run": 9.0,
                         "total_ms_per_run": 0.1}]}]}
    ks = tvm_kernels(prof, {"kernels": []}, RIDGE, False)
    assert [k.cause for k in ks] == ["compute", "memory_bound", "lost_fusion"]
    assert ks[0].flops == 4 * 2 * 128 * 768 * 256 and ks[0].source == "library"
    assert sum(k.ms for k in ks) == pytest.approx(3.1)
    assert "1x128x256 @ 256x768" in ks[0].name


@pytest.mark.slow  # builds four small models through oneDNN and profiles each
def test_every_callee_of_real_builds_has_a_named_cause(tmp_path):
    """fp32 conv/matmul, QDQ int8 and dynamic int8 builds: no callee the VM runs is
    unexplained."""
    import onnx
    import onnxruntime as ort

    from tests.library.test_onednn_int8 import qdq_cnn
    from tests.models import cnn, encoder_block, qdq_mlp, quantized_mlp
    from tvmopt.bench.runner import InputFactory
    from tvmopt.compare.profiles import profile_tvm
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.runtime.loader import load
    from tvmopt.targets.registry import host_cpu_features

    od = require_onednn()
    models = {}
    for name, model in (("cnn", cnn()), ("encoder", encoder_block())):
        models[name] = str(tmp_path / f"{name}.onnx")
        onnx.save(model, models[name])
    if od.int8_unavailable(host_cpu_features()) is None:
        models["dynamic"] = quantized_mlp(tmp_path)
        models["qdq_mlp"] = qdq_mlp(tmp_path)
        qcnn, feeds = qdq_cnn()[:2]
        y = ort.InferenceSession(qcnn.SerializeToString()).run(None, feeds)[0]
        out = qcnn.graph.output[0].type.tensor_type
        out.shape.dim.extend([onnx.TensorShapeProto.Dimension(dim_value=d) for d in y.shape])
        models["qdq_cnn"] = str(tmp_path / "qdq_cnn.onnx")
        onnx.save(qcnn, models["qdq_cnn"])
    kinds = set()
    for name, path in models.items():
        res = compile_model(CompileOptions(model=path, output=str(tmp_path / name),
                                           dispatch="library",
                                           shapes=["x=4x64"] if name == "dynamic" else []),
                            log=lambda s: None)
        lm = load(res.artifact.path)
        feeds = InputFactory(lm.inputs, seed=0)
        args = lm.to_device(feeds.feeds(feeds.static_batch or 1))
        ks = profile_tvm(lm, args, 2, RIDGE, name in ("dynamic",))
        assert ks and all(k.cause in CAUSE_IDS for k in ks), (
            name, [(k.name, k.cause) for k in ks if k.cause not in CAUSE_IDS])
        kinds |= {k.op for k in ks if k.source == "library"}
    assert {"oneDNN conv2d fp32", "oneDNN matmul fp32"} <= kinds, kinds
    if "dynamic" in models:
        assert {"oneDNN matmul int8-dynamic", "oneDNN matmul int8",
                "oneDNN conv2d int8"} <= kinds, kinds


def test_kernels_as_built_and_weight_prepacks_are_matched_without_reading_names():
    prof = {"kernels": [
        {"name": "fused_q7", "calls_per_run": 1.0, "total_ms_per_run": 1.0},
        {"name": "mean_weight_prepack", "calls_per_run": 1.0, "total_ms_per_run": 0.1}]}
    plan = {"kernels": [{"name": "fused_q3", "ops": ["divide"], "flops": 1.0, "bytes": 1.0}],
            "compiled": [{"name": "fused_q7", "ops": ["divide1", "tir_round", "cast", "quantize4"],
                          "flops": 1e4, "bytes": 1e5}]}
    ks = tvm_kernels(prof, plan, RIDGE, True)
    assert [(k.cause, k.source) for k in ks] == [("quantize", "plan"), ("layout", "prepack")]
