"""error_line picks the message out of TVM, Python and onnxruntime error texts."""

from tvmopt.errors import error_line, last_line


class InternalError(RuntimeError):
    """Stands in for tvm.error.InternalError (same name, no TVM import)."""


# What TVM 0.27 raises for a Relax module whose printed form needs metadata (a constant):
# the message, then the module dump, then the printer's closing comment.
METADATA_DUMP = '''Check failed: (StructInfoBaseCheck(arg_sinfo, param_sinfo)) is false: Argument 0 of conv2d \
expects R.Tensor((1, 64, 32, 32), dtype="float32") but got R.Tensor((1, 128, 32, 32))
# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 128, 32, 32), dtype="float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, metadata["relax.expr.Constant"][0])
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
            R.output(lv)
        return lv

# Metadata omitted. Use show_meta=True in script() method to show it.
'''

# TVM 0.27's StructuralEqual failure: a first-line message, then two module dumps.
STRUCTURAL = '''StructuralEqual check failed, caused by lhs at <root>.functions[I.GlobalVar("main")]
Access path: <root>.functions[I.GlobalVar("main")].body.blocks[0].bindings[0].value.op

# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), dtype="float32")) -> R.Tensor((2, 3), dtype="float32"):
        y: R.Tensor((2, 3), dtype="float32") = R.add(x, x)
        return y
'''

# Older TVM: the C++ backtrace comes first and the message is the last line.
BACKTRACE = '''Traceback (most recent call last):
  3: tvm::relax::BlockBuilderImpl::Normalize(tvm::RelaxExpr const&)
  2: tvm::relax::InferStructInfoMatmul(tvm::relax::Call const&, tvm::relax::BlockBuilder const&)
  1: tvm::runtime::detail::LogFatal::Entry::Finalize()
  0: _ZN3tvm7runtime6detail8LogFatal
  File "/workspace/tvm/src/relax/op/tensor/linear_algebra.cc", line 112
InternalError: Check failed: (analyzer->CanProveEqual(k_a, k_b)) is false: Matmul requires \
the reduction length of the operands to be equal
'''


def test_skips_a_trailing_metadata_comment_and_ir_dump():
    line = error_line(InternalError(METADATA_DUMP))
    assert line.startswith("Check failed: (StructInfoBaseCheck")
    assert "Metadata omitted" not in line


def test_message_before_ir_dump_without_a_marker():
    assert error_line(ValueError(STRUCTURAL)).startswith("StructuralEqual check failed")


def test_message_after_a_backtrace():
    assert error_line(InternalError(BACKTRACE)) == (
        "InternalError: Check failed: (analyzer->CanProveEqual(k_a, k_b)) is false: Matmul "
        "requires the reduction length of the operands to be equal")


def test_one_line_messages_come_back_whole():
    # TVM 0.27 run-time check, as the VM raises it
    msg = ("Check failed: input_shape[i] == reg (3 vs. 2) : ErrorContext(fn=main, loc=param[0], "
           "param=x) match_cast error, shape[0] mismatch to specified constant.")
    assert error_line(RuntimeError(msg)) == msg
    assert error_line(ValueError('Target kind "tpu" is not defined.')) == \
        'Target kind "tpu" is not defined.'


def test_onnxruntime_keeps_its_first_line():
    text = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x\n"
            " index: 1 Got: 4 Expected: 3\n Please fix either the inputs/outputs or the model.")
    assert error_line(RuntimeError(text)).endswith("Got invalid dimensions for input: x")


def test_python_traceback_in_process_output():
    stderr = ('Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
              '    import tvm\nModuleNotFoundError: No module named \'tvm\'\n')
    assert error_line(stderr) == "ModuleNotFoundError: No module named 'tvm'"


def test_falls_back_to_the_type_name_or_default():
    assert error_line(KeyError()) == "KeyError"
    assert error_line(ValueError("\n  \n# Metadata omitted. Use show_meta=True\n")) == "ValueError"
    assert error_line(ValueError(""), "invalid model") == "invalid model"
    assert error_line("", "no output") == "no output"


def test_last_line():
    assert last_line("WARNING: a\nERROR: No matching distribution\n\n", "none") == \
        "ERROR: No matching distribution"
    assert last_line("  \n", "pip gave no reason") == "pip gave no reason"
