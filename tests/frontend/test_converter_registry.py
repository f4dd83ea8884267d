"""An ONNX op type has one tvmopt converter; registering a second one fails loudly."""

import pytest

from tvmopt.frontend import onnx_ops


def test_a_second_converter_for_an_op_is_refused(monkeypatch):
    monkeypatch.setattr(onnx_ops, "_REGISTRY", {})

    @onnx_ops.register("MyOp", "MyOtherOp")
    def first(bb, inputs, attr, params, opset):
        return inputs[0]

    with pytest.raises(ValueError, match="MyOp already has a converter: .*first"):
        @onnx_ops.register("MyOp")
        def second(bb, inputs, attr, params, opset):
            return inputs[0]

    with pytest.raises(ValueError, match="MyOtherOp"):
        @onnx_ops.register("YetAnotherOp", "MyOtherOp")
        class Third:
            pass

    assert set(onnx_ops._REGISTRY) == {"MyOp", "MyOtherOp"}  # a refused one adds nothing
    assert onnx_ops._REGISTRY["MyOp"].fn is first


def test_reduce_log_sum_exp_is_the_run_time_axes_wrapper():
    from tvmopt.frontend.onnx_ops import run_time_operands

    entry = onnx_ops.tvmopt_converters()["ReduceLogSumExp"]
    assert entry.__module__ == run_time_operands.__name__
