"""A whole ONNX LSTM / GRU / RNN node (the importer's recurrent body) on oneDNN's RNN
primitives: `recurrent_sites` finds the nodes the primitive can run, `lower_recurrent` replaces
them by the packed call."""

from __future__ import annotations


import numpy as np
import tvm
from tvm import relax

from ...passes.values import const_array


RNN_FUNC = "tvmopt.onednn.rnn"
# Cell codes and vanilla-RNN activation codes understood by onednn_ext.cc (tvmopt.onednn.rnn).
RNN_CELLS = {"LSTM": 0, "GRU": 1, "GRU_LBR": 2, "RNN": 3}
RNN_ACTS = {"Tanh": 0, "Relu": 1, "Sigmoid": 2}
# ONNX gate order -> oneDNN's, as indices into the ONNX gates: LSTM i o f c -> i f c o; GRU's
# z r h is oneDNN's u r o; LSTM peepholes i o f -> i f o.
_LSTM_GATES = (0, 2, 3, 1)
_PEEPHOLE_ORDER = (0, 2, 1)
_RNN_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _recurrent_acts(op: str, attrs: dict, dirs: int) -> list[str]:
    names = [str(a) for a in attrs.get("activations") or []]
    if not names:
        return _RNN_DEFAULT_ACTS.get(op, ["Tanh"]) * dirs
    per_dir = len(_RNN_DEFAULT_ACTS.get(op, ["Tanh"]))
    return names * 2 if dirs == 2 and len(names) == per_dir else names


def recurrent_unsupported(spec: dict, args) -> str | None:
    """Why oneDNN's RNN primitives cannot run this node (a passes.recurrent spec with its call
    arguments); None when they can."""
    from ...passes.recurrent import RECURRENT_ATTR  # noqa: F401 - the spec's producer

    op, attrs, names = spec["op"], spec["attrs"], spec["inputs"]
    by_name = dict(zip(names, args))
    if str(by_name["X"].ty.dtype) != "float32":
        return f"{by_name['X'].ty.dtype} input"
    for w in ("W", "R", "B", "P"):
        if w in by_name and const_array(by_name[w]) is None:
            return f"{w} is not a constant"
    if attrs.get("clip") is not None:
        return "clip"
    if attrs.get("input_forget"):
        return "input_forget"
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    acts = _recurrent_acts(op, attrs, dirs)
    if op == "RNN":
        if len(set(acts)) != 1 or acts[0] not in RNN_ACTS:
            return f"activations {acts}"
    elif acts != _RNN_DEFAULT_ACTS[op] * dirs:
        return f"activations {acts}"
    return None


def _recurrent_weights(spec: dict, by_name: dict):
    """The ONNX constants in oneDNN's logical layouts: w_layer [1, D, I, G, H], w_iter
    [1, D, H, G, H] (ldigo), bias [1, D, Gb, H], peephole [1, D, 3, H] or None."""
    op, attrs = spec["op"], spec["attrs"]
    w, r = const_array(by_name["W"]), const_array(by_name["R"])
    dirs, gh, inp = w.shape
    hidden = r.shape[-1]
    gates = gh // hidden
    order = list(_LSTM_GATES) if op == "LSTM" else list(range(gates))
    b = (const_array(by_name["B"]) if "B" in by_name
         else np.zeros((dirs, 2 * gh), np.float32))

    def ldigo(m, k):  # [D, G*H, K] -> [1, D, K, G, H], gates in oneDNN's order
        m = m.reshape(dirs, gates, hidden, k)[:, order]
        return np.ascontiguousarray(m.transpose(0, 3, 1, 2)[None], dtype=np.float32)

    wb = b[:, :gh].reshape(dirs, gates, hidden)[:, order]
    rb = b[:, gh:].reshape(dirs, gates, hidden)[:, order]
    lbr = op == "GRU" and attrs.get("linear_before_reset", 0)
    if lbr:  # the candidate's recurrent bias stays inside the reset product: a fourth row
        bias = np.concatenate([wb[:, :2] + rb[:, :2], wb[:, 2:], rb[:, 2:]], axis=1)
    else:
        bias = wb + rb
    peep = None
    if "P" in by_name:
        p = const_array(by_name["P"]).reshape(dirs, 3, hidden)[:, list(_PEEPHOLE_ORDER)]
        peep = np.ascontiguousarray(p[None], dtype=np.float32)
    return (ldigo(w, inp), ldigo(r, hidden),
            np.ascontiguousarray(bias[None], dtype=np.float32), peep)


def _recurrent_call(bb, spec: dict, args):
    """Emit the library call for one node; returns the tuple (Y, Y_h[, Y_c]) in the node's
    layout."""
    op, attrs = spec["op"], spec["attrs"]
    by_name = dict(zip(spec["inputs"], args))
    w_layer, w_iter, bias, peep = _recurrent_weights(spec, by_name)
    dirs, hidden = w_iter.shape[1], w_iter.shape[2]
    layout = attrs.get("layout", 0)
    x = by_name["X"]
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
    steps, batch = x.ty.shape.values[0], x.ty.shape.values[1]
    call_args = [x, relax.const(w_layer), relax.const(w_iter), relax.const(bias)]
    if peep is not None:
        call_args.append(relax.const(peep))
    states = []
    for name in ("initial_h", "initial_c"):
        s = by_name.get(name)
        if s is not None and layout:
            s = bb.emit(relax.op.permute_dims(s, [1, 0, 2]))
        states.append(s)
    call_args += [s for s in states if s is not None]
    lens = by_name.get("sequence_lens")
    if lens is not None:
        call_args.append(lens)
    cell = "GRU_LBR" if op == "GRU" and attrs.get("linear_before_reset", 0) else op
    acts = _recurrent_acts(op, attrs, dirs)
    attr_vals = [RNN_CELLS[cell], dirs, int(attrs.get("direction") == "reverse"),
                 RNN_ACTS.get(acts[0], 0) if op == "RNN" else 0, int(peep is not None),
                 int(states[0] is not None), int(states[1] is not None), int(lens is not None)]
    call_args.append(relax.ShapeExpr(attr_vals))
    dtype = "float32"
    out = [relax.TensorType([steps, dirs, batch, hidden], dtype),
           relax.TensorType([dirs, batch, hidden], dtype)]
    if op == "LSTM":
        out.append(relax.TensorType([dirs, batch, hidden], dtype))
    res = bb.emit(relax.call_dps_packed(RNN_FUNC, call_args, out))
    fields = [bb.emit(relax.TupleGetItem(res, i)) for i in range(len(out))]
    if layout:
        fields[0] = bb.emit(relax.op.permute_dims(fields[0], [2, 0, 1, 3]))
        fields[1:] = [bb.emit(relax.op.permute_dims(f, [1, 0, 2])) for f in fields[1:]]
    return relax.Tuple(fields)


@relax.expr_functor.mutator
class _LowerRecurrent(relax.PyExprMutator):
    def __init__(self, mod, chosen: dict):
        super().__init__(mod)
        self.chosen = chosen  # GlobalVar -> spec

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, relax.GlobalVar) and call.op in self.chosen:
            return _recurrent_call(self.builder_, self.chosen[call.op], list(call.args))
        return call


def recurrent_sites(mod: tvm.IRModule) -> dict:
    """GlobalVar -> (spec, call args) of every recurrent body oneDNN can run (each body is
    called once: the importer makes one per node); the reasons for the others as a second
    dict GlobalVar -> text."""
    from ...passes.recurrent import recurrent_functions, spec_of

    bodies = recurrent_functions(mod)
    args_of: dict = {}

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar) and e.op in bodies:
            args_of[e.op] = list(e.args)

    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and gv not in bodies:
            relax.analysis.post_order_visit(f, visit)
    ok, why = {}, {}
    for gv, args in args_of.items():
        spec = spec_of(bodies[gv])
        reason = recurrent_unsupported(spec, args)
        if reason is None:
            ok[gv] = (spec, args)
        else:
            why[gv] = reason
    return ok, why


def recurrent_workload_key(spec: dict, args) -> str:
    """What a recurrent node computes, independent of its weights."""
    shapes = [str(a.ty) for a in args]
    attrs = ",".join(f"{k}={v}" for k, v in sorted(spec["attrs"].items()))
    return "|".join(["rnn", spec["op"], *spec["inputs"], *shapes, attrs])


def lower_recurrent(mod: tvm.IRModule, keep=None) -> tvm.IRModule:
    """Replace the calls of the recurrent bodies in `keep` (GlobalVars; None: every one oneDNN
    can run) with ``tvmopt.onednn.rnn`` calls; the other bodies stay for InlineRecurrent."""
    ok, _ = recurrent_sites(mod)
    chosen = {gv: spec for gv, (spec, _) in ok.items() if keep is None or gv in keep}
    if not chosen:
        return mod
    mod = mod.clone()
    lowering = _LowerRecurrent(mod, chosen)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and gv not in chosen:
            mod[gv] = lowering.visit_expr(func)
    for gv in chosen:
        del mod[gv]
    return mod
