"""Recurrent layers travel through the front of the pipeline as one call each.

The ONNX importer emits an LSTM / GRU / RNN node that a library can run whole (oneDNN's RNN
primitives) as a call of a private Relax function: its body is the unrolled recurrence (the
input projection of every step hoisted into one matmul, then the steps), its `RECURRENT_ATTR`
attribute the node's description as JSON. The dispatch phase either replaces the call with the
library's (library.onednn.lower_recurrent) or leaves it; on CPUs `LoopRecurrent` rebuilds each
body that is left as loop kernels (frontend rnn_loop: the time loop inside one kernel for all
directions, where the unrolled body calls a few kernels per step); `InlineRecurrent` then puts
every body back into its caller, so the rest of the pipeline sees plain ops.

A body over a run-time sequence length (a loop kernel, frontend rnn_loop; its spec says
"loop") stays a function of its own: it calls the kernel with output shapes in its parameters'
dims, and TVM's inliner renames those dims without substituting them in a call_tir's output
types (the caller would be left with undefined dims). As a function it matches its dims from
its arguments at run time.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from ..frontend.onnx_ops.rnn import RECURRENT_ATTR


def recurrent_functions(mod: tvm.IRModule) -> dict:
    """GlobalVar -> function, for every recurrent body the importer made."""
    return {gv: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and RECURRENT_ATTR in f.attrs}


def spec_of(func: relax.Function) -> dict:
    """The node description a recurrent body carries."""
    return json.loads(str(func.attrs[RECURRENT_ATTR]))


def inline_recurrent(mod: tvm.IRModule, keep=()) -> tvm.IRModule:
    """Inline the recurrent bodies (all but the GlobalVars in `keep`) into their callers and
    drop them."""
    bodies = {gv: f for gv, f in recurrent_functions(mod).items() if gv not in keep}
    if not bodies:
        return mod
    mod = mod.clone()
    for gv, func in list(bodies.items()):
        if spec_of(func).get("loop"):
            mod[gv] = func.without_attr(RECURRENT_ATTR)
            del bodies[gv]
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and gv not in bodies:
            mod[gv] = func.inline_functions(bodies)
    for gv in bodies:
        del mod[gv]
    return mod


def loop_recurrent(mod: tvm.IRModule) -> tvm.IRModule:
    """Every unrolled recurrent body rebuilt as its loop kernels (CPU targets: the kernels are
    scheduled for CPUs, threads over blocks of batch rows)."""
    from ..frontend.onnx_ops.rnn import looped_form

    for gv, func in recurrent_functions(mod).items():
        if not spec_of(func).get("loop"):
            mod = looped_form(mod, gv)
    return mod


def loop_and_inline(mod: tvm.IRModule) -> tvm.IRModule:
    """loop_recurrent, then inline_recurrent, then the weight slices and transposes the loop
    form takes of its (now inlined, constant) weights folded into constants."""
    looped = any(not spec_of(f).get("loop") for f in recurrent_functions(mod).values())
    mod = inline_recurrent(loop_recurrent(mod))
    return relax.transform.FoldConstant()(mod) if looped else mod


@tvm.transform.module_pass(opt_level=0, name="tvmopt.LoopRecurrent")
def LoopRecurrent(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return loop_and_inline(mod)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.InlineRecurrent")
def InlineRecurrent(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return inline_recurrent(mod)
