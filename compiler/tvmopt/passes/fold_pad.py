"""A Relax pass that folds a zero pad into the convolution that reads it.

Models exported from frameworks with TensorFlow's "same" padding (EfficientNet, many TF and
timm ports) pad explicitly and convolve with no padding. As its own kernel the pad is a full
copy of the activation, and a pad between layout changes gets a transpose pair of its own. A
convolution pads its input for free (the default schedules and oneDNN both read the border
in place), so `conv2d(pad(x, 0))` becomes `conv2d(x)` with the pad added to its padding; a pad
of all-zero widths is dropped.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .mutate import rewrite_functions


def _pad_widths(call):
    """(before, after) per axis of a constant-zero nn.pad, else None."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
            and call.op.name == "relax.nn.pad"):
        return None
    a = call.attrs
    if str(a.pad_mode) != "constant" or float(a.pad_value) != 0.0:
        return None
    w = [int(v) for v in a.pad_width]
    return list(zip(w[0::2], w[1::2]))


@mutator
class _Fold(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        widths = _pad_widths(call)
        if widths is not None and all(b == 0 and e == 0 for b, e in widths):
            return call.args[0]
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
            return self._fold_into_conv(call)
        return call

    def _fold_into_conv(self, conv):
        data = conv.args[0]
        pad = self.lookup_binding(data) if isinstance(data, relax.Var) else data
        widths = _pad_widths(pad)
        a = conv.attrs
        layout = str(a.data_layout)
        if widths is None or len(layout) != 4 or len(widths) != 4 or \
                not set("HW") <= set(layout):
            return conv
        h, w = layout.index("H"), layout.index("W")
        if any(widths[i] != (0, 0) for i in range(4) if i not in (h, w)):
            return conv
        top, left, bottom, right = [int(v) for v in a.padding]
        padding = [top + widths[h][0], left + widths[w][0],
                   bottom + widths[h][1], right + widths[w][1]]
        return relax.op.nn.conv2d(
            pad.args[0], conv.args[1], strides=a.strides, padding=padding,
            dilation=a.dilation, groups=a.groups, data_layout=layout,
            kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.FoldPadIntoConv")
def FoldPadIntoConv(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """Fold constant-zero pads over H/W into the conv2d that consumes them."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(_Fold(mod), mod))
