"""ONNX node cases that escaped with internal messages dressed as import errors (issue 26):
each now passes, or is refused in one line naming the node, the op and the reason."""

from __future__ import annotations

import importlib

import pytest


def _run(name: str, op: str, bind_operands: bool = False):
    tool = importlib.import_module("tools.onnx_conformance")
    case = next(c for c in tool.collect({op}, bind_operands) if c.name == name)
    return tool.run_tvmopt(case, "host")


@pytest.mark.parametrize("bind_operands", [False, True], ids=["fed", "constant"])
def test_max_unpool_with_output_shape_matches_the_reference(bind_operands):
    # output_shape larger than the inferred shape: the unpooled values keep the inferred
    # shape's flat positions, at the start of each axis
    stage, reason = _run("test_maxunpool_export_with_output_shape", "MaxUnpool", bind_operands)
    assert stage is None, reason


def test_if_with_an_optional_branch_output_is_refused_by_name():
    stage, reason = _run("test_if_opt", "If")
    assert stage == "import"
    assert reason == ("node '<unnamed If>' (If): else_branch output 'else_opt' is an Optional, "
                      "which the importer does not support")
