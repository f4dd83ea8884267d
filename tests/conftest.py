"""Shared fixtures: tiny ONNX models built in the test (nothing is downloaded)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tvmopt-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def rand(*shape, seed=0, scale=0.1):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.fixture
def save(tmp_path):
    """save(model, 'name') -> path of the written .onnx file."""

    def _save(model, name="model"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        return path

    return _save


@pytest.fixture
def cli():
    """invoke(*args) -> click Result of `tvmopt args...` (in process)."""
    from tvmopt.cli.main import main

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return invoke
