"""Relax VM execution modes: `PipelineConfig.exec_mode="compiled"` (VM instructions lowered to C)
builds, exports, reloads and gives the same outputs as the default interpreted bytecode."""

import numpy as np
import pytest

from tests.models import tiny_conv
from tvmopt import pipeline
from tvmopt.frontend.importer import import_onnx
from tvmopt.frontend.onnx_model import load_onnx
from tvmopt.targets.registry import get_target


def test_compiled_exec_mode_matches_bytecode(tmp_path):
    import tvm
    from tvm import relax

    hw = get_target("x86")
    imported = import_onnx(load_onnx(tiny_conv(tmp_path / "c.onnx", channels=8, size=8)))
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    outs = {}
    for mode in ("bytecode", "compiled"):
        ex = pipeline.build(imported.mod, hw.to_tvm(),
                            pipeline.PipelineConfig(dispatch="codegen", exec_mode=mode))
        lib_path = tmp_path / f"{mode}.so"
        ex.export_library(str(lib_path))
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib_path)), tvm.cpu())
        outs[mode] = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    assert outs["bytecode"].shape == (1, 8, 8, 8)
    np.testing.assert_allclose(outs["compiled"], outs["bytecode"], rtol=0, atol=0)


def test_unknown_exec_mode_is_refused_with_the_choices():
    from tvmopt.errors import BuildError

    with pytest.raises(BuildError,
                       match=r"unknown Relax VM exec_mode 'jit' \(choose bytecode or compiled\)"):
        pipeline.PipelineConfig(dispatch="codegen", exec_mode="jit")
