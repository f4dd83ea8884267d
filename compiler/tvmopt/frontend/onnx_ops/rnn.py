"""RNN / GRU / LSTM: unrolled over a static sequence length, a loop over a symbolic one.

TVM 0.27's Relax frontend has no recurrent ops. With a static sequence length (the ONNX node
cases, many exported models) each step is emitted as plain Relax ops (the input projection for
all steps is one matmul up front). With a symbolic one (a model exported with a dynamic
sequence axis) the projection is the same matmul and the steps are one loop kernel per
direction (rnn_loop), the time dim read at run time.
`sequence_lens` (run-time, per batch entry) is honoured by masking: past a sequence's end its
state is held and its Y rows are zero, as onnxruntime does (a sequence of no steps ends with zero
states); reverse directions then start at each
sequence's own last step, since the held state stays the initial one until that step.

Each node becomes a call of a private function holding that unrolled body and, as an attribute,
the node's description (passes.recurrent): the dispatch phase may replace the call with a
library's whole-layer kernel (oneDNN's RNN primitives); otherwise the body is inlined back.
"""

from __future__ import annotations

from . import register

# The attribute of a recurrent body that describes its node (JSON): the format this module
# writes and passes.recurrent reads.
RECURRENT_ATTR = "tvmopt.recurrent"

# Gates per op, in ONNX weight order; default activations per direction.
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
# Activations taking alpha / beta, with ONNX's defaults.
_ALPHA = {"Affine": 1.0, "LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "ScaledTanh": 1.0,
          "HardSigmoid": 0.2, "Elu": 1.0}
_BETA = {"Affine": 0.0, "ScaledTanh": 1.0, "HardSigmoid": 0.5}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activation_specs(op: str, attr: dict, num_dirs: int) -> list[list[tuple]]:
    """Per direction, the activations as (name, alpha, beta), from the activations /
    activation_alpha / activation_beta attributes (alphas and betas are consumed in order by
    the activations that take them, ONNX's defaults otherwise)."""
    names = [_text(a) for a in attr.get("activations", [])] or _DEFAULT_ACTS[op] * num_dirs
    per_dir = len(_DEFAULT_ACTS[op])
    if len(names) == per_dir and num_dirs == 2:
        names = names * 2
    if len(names) != per_dir * num_dirs:
        raise ValueError(f"{op} expects {per_dir * num_dirs} activations, got {len(names)}")
    alphas = list(attr.get("activation_alpha", []))
    betas = list(attr.get("activation_beta", []))
    specs = []
    for name in names:
        alpha = alphas.pop(0) if name in _ALPHA and alphas else _ALPHA.get(name)
        beta = betas.pop(0) if name in _BETA and betas else _BETA.get(name)
        specs.append((name, alpha, beta))
    return [specs[d * per_dir:(d + 1) * per_dir] for d in range(num_dirs)]


def _relax_act(spec: tuple, dtype: str):
    """The activation (name, alpha, beta) as a callable f(x) on Relax expressions."""
    from tvm import relax

    name, alpha, beta = spec

    def c(v):
        return relax.const(v, dtype)

    table = {
        "Tanh": relax.op.tanh,
        "Sigmoid": relax.op.sigmoid,
        "Relu": relax.op.nn.relu,
        "Affine": lambda x: relax.op.add(relax.op.multiply(x, c(alpha)), c(beta)),
        "LeakyRelu": lambda x: relax.op.nn.leakyrelu(x, alpha),
        "ThresholdedRelu": lambda x: relax.op.where(relax.op.greater(x, c(alpha)), x, c(0.0)),
        "ScaledTanh": lambda x: relax.op.multiply(
            c(alpha), relax.op.tanh(relax.op.multiply(x, c(beta)))),
        "HardSigmoid": lambda x: relax.op.clip(
            relax.op.add(relax.op.multiply(x, c(alpha)), c(beta)), 0.0, 1.0),
        "Elu": lambda x: relax.op.where(relax.op.greater(x, c(0.0)), x, relax.op.multiply(
            c(alpha), relax.op.subtract(relax.op.exp(x), c(1.0)))),
        "Softsign": lambda x: relax.op.divide(x, relax.op.add(c(1.0), relax.op.abs(x))),
        "Softplus": lambda x: relax.op.log(relax.op.add(c(1.0), relax.op.exp(x))),
    }
    if name not in table:
        raise ValueError(f"activation {name} is not supported")
    return table[name]


def _is_static_len(bb, x, axis: int) -> bool:
    from tvm import tirx

    return isinstance(bb.normalize(x).ty.shape.values[axis], tirx.IntImm)


def _static_len(bb, x, axis: int, op: str) -> int:
    from tvm import tirx

    dim = bb.normalize(x).ty.shape.values[axis]
    if not isinstance(dim, tirx.IntImm):
        raise ValueError(f"{op} needs a static sequence length to unroll; X has dim {dim} on axis "
                         f"{axis}")
    return int(dim.value)


def _split(bb, x, n: int, axis: int) -> list:
    """n equal parts of x along axis, as slices: a slice fuses into the elementwise kernel that
    reads it, where a split is a kernel of its own (one per gate block per step)."""
    from tvm import relax

    if n == 1:
        return [x]
    x = bb.normalize(x)
    ndim = len(x.ty.shape.values)
    axis = axis % ndim
    size = int(x.ty.shape.values[axis]) // n
    return [bb.emit(relax.op.strided_slice(x, [axis], [i * size], [(i + 1) * size]))
            for i in range(n)]


def _direction(bb, op, attr, xw, r, rb, p, h0, c0, mask, steps, reverse, acts, dtype):
    """One direction: returns (list of H per step in time order, last H, last C)."""
    from tvm import relax

    def c(v):
        return relax.const(v, dtype)

    clip = attr.get("clip")
    fns = [_relax_act(a, dtype) for a in acts]

    def act(i, x):
        if clip is not None:
            x = relax.op.clip(x, -float(clip), float(clip))
        return fns[i](x)

    r_t = bb.emit(relax.op.permute_dims(r))  # [H, G*H]
    if op == "GRU":  # the h gate's recurrence is applied separately (linear_before_reset)
        r_z, r_r, r_h = _split(bb, r_t, 3, axis=1)
        r_zr = bb.emit(relax.op.concat([r_z, r_r], axis=1))
        rb_z, rb_r, rb_h = _split(bb, rb, 3, axis=0)
        rb_zr = bb.emit(relax.op.concat([rb_z, rb_r], axis=0))
    if op == "LSTM" and p is not None:
        p_i, p_o, p_f = _split(bb, p, 3, axis=0)
    h, cell = h0, c0
    ys = [None] * steps
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for t in order:
        x_t = xw[t]
        if op == "RNN":
            h_new = act(0, relax.op.add(x_t, relax.op.add(relax.op.matmul(h, r_t), rb)))
        elif op == "GRU":
            x_z, x_r, x_h = _split(bb, x_t, 3, axis=-1)
            rec = bb.emit(relax.op.add(relax.op.matmul(h, r_zr), rb_zr))
            rec_z, rec_r = _split(bb, rec, 2, axis=-1)
            z = bb.emit(act(0, relax.op.add(x_z, rec_z)))
            r_gate = bb.emit(act(0, relax.op.add(x_r, rec_r)))
            if attr.get("linear_before_reset", 0):
                rec_h = relax.op.multiply(r_gate, relax.op.add(relax.op.matmul(h, r_h), rb_h))
            else:
                rec_h = relax.op.add(relax.op.matmul(relax.op.multiply(r_gate, h), r_h), rb_h)
            h_tilde = bb.emit(act(1, relax.op.add(x_h, rec_h)))
            h_new = relax.op.add(relax.op.multiply(relax.op.subtract(c(1.0), z), h_tilde),
                                 relax.op.multiply(z, h))
        else:  # LSTM, gates i, o, f, c
            g = bb.emit(relax.op.add(x_t, relax.op.add(relax.op.matmul(h, r_t), rb)))
            g_i, g_o, g_f, g_c = _split(bb, g, 4, axis=-1)
            if p is not None:
                g_i = relax.op.add(g_i, relax.op.multiply(p_i, cell))
                g_f = relax.op.add(g_f, relax.op.multiply(p_f, cell))
            i_gate = bb.emit(act(0, g_i))
            f_gate = bb.emit(relax.op.subtract(c(1.0), i_gate) if attr.get("input_forget", 0)
                             else act(0, g_f))
            c_new = bb.emit(relax.op.add(relax.op.multiply(f_gate, cell),
                                         relax.op.multiply(i_gate, act(1, g_c))))
            if p is not None:
                g_o = relax.op.add(g_o, relax.op.multiply(p_o, c_new))
            h_new = relax.op.multiply(act(0, g_o), fns[2](c_new))
            if mask is not None:
                c_new = relax.op.where(mask[t], c_new, cell)
            cell = bb.emit(c_new)
        h_new = bb.emit(h_new)
        if mask is not None:
            ys[t] = bb.emit(relax.op.where(mask[t], h_new, c(0.0)))
            h = bb.emit(relax.op.where(mask[t], h_new, h))
        else:
            ys[t] = h = h_new
    return ys, h, cell


_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _json_attr(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_json_attr(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return float(value) if hasattr(value, "__float__") else str(value)


def _convert(op: str, bb, inputs, attr):
    """The node as a call of a private function whose body is the unrolled recurrence (or, over
    a symbolic sequence length, the loop kernels) and whose RECURRENT_ATTR describes the node
    (see the module docstring)."""
    import json

    from tvm import relax

    inputs = (list(inputs) + [None] * 8)[:8]
    if op != "LSTM":
        inputs[6:] = [None, None]
    present = [i for i, v in enumerate(inputs) if v is not None]
    args = [bb.normalize(inputs[i]) for i in present]
    static = _is_static_len(bb, args[0], 1 if attr.get("layout", 0) else 0)
    inner = relax.BlockBuilder()
    params = [relax.Var(_INPUTS[i], a.ty) for i, a in zip(present, args)]
    positional = [None] * 8
    for i, v in zip(present, params):
        positional[i] = v
    with inner.function(op.lower(), params, private=True):
        with inner.dataflow():
            out = (_unrolled(op, inner, positional, attr) if static
                   else _looped(op, bb, inner, positional, attr))
            out = inner.emit_output(out)
        inner.emit_func_output(out)
    # tvm_custom (the node's name, added by TVM's importer) is left out: the description is what
    # the node computes, shared by every node that computes the same.
    spec = {"op": op, "inputs": [_INPUTS[i] for i in present],
            "attrs": {k: _json_attr(v) for k, v in attr.items() if k != "tvm_custom"}}
    if not static:
        spec["loop"] = True
    func = inner.get()[op.lower()].with_attr(RECURRENT_ATTR, json.dumps(spec, sort_keys=True))
    gv = bb.add_func(func, f"tvmopt_{op.lower()}")
    return bb.emit(relax.Call(gv, args))


def _operands(op: str, bb, inputs, attr):
    """The node's operands time-major ([T, B, I], states [D, B, H]) and its attributes, as both
    the unrolled and the looped forms read them (attr gains hidden_size when it was implied)."""
    from tvm import relax

    inputs = list(inputs) + [None] * 8
    x, w, r, b, seq_lens, h0, c0, p = inputs[:8]
    if op != "LSTM":
        c0 = p = None
    x = bb.normalize(x)
    dtype = str(x.ty.dtype)
    layout = attr.get("layout", 0)
    direction = _text(attr.get("direction", b"forward"))
    num_dirs = 2 if direction == "bidirectional" else 1
    gates = _GATES[op]
    hidden = attr.get("hidden_size")
    if hidden is None:
        hidden = int(bb.normalize(r).ty.shape.values[-1].value)
        attr = dict(attr, hidden_size=hidden)
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
        h0 = None if h0 is None else bb.emit(relax.op.permute_dims(h0, [1, 0, 2]))
        c0 = None if c0 is None else bb.emit(relax.op.permute_dims(c0, [1, 0, 2]))
    return (x, w, r, b, seq_lens, h0, c0, p, dtype, layout, direction, num_dirs, gates, hidden,
            attr)


def _outputs(op: str, bb, layout, y, y_h, y_c=None):
    """Y [T, D, B, H], Y_h [D, B, H] (and Y_c for LSTM) in the node's layout."""
    from tvm import relax

    outs = [y, y_h] + ([y_c] if op == "LSTM" else [])
    if layout:
        outs[0] = relax.op.permute_dims(outs[0], [2, 0, 1, 3])  # [B, T, D, H]
        outs[1:] = [relax.op.permute_dims(o, [1, 0, 2]) for o in outs[1:]]
    return relax.Tuple([bb.normalize(o) for o in outs])


def _unrolled(op: str, bb, inputs, attr):
    from tvm import relax

    (x, w, r, b, seq_lens, h0, c0, p, dtype, layout, direction, num_dirs, gates, hidden,
     attr) = _operands(op, bb, inputs, attr)
    steps = _static_len(bb, x, 0, op)
    batch = bb.normalize(x).ty.shape.values[1]
    acts = _activation_specs(op, attr, num_dirs)

    mask = None
    if seq_lens is not None:
        # mask[t]: [B, 1] booleans, t < sequence_lens[b]
        lens = bb.emit(relax.op.expand_dims(relax.op.astype(seq_lens, "int64"), -1))
        mask = [bb.emit(relax.op.less(relax.const(t, "int64"), lens)) for t in range(steps)]
        # A sequence of no steps ends with zero states (onnxruntime), not its initial ones.
        ended = mask[0] if steps else None

    zeros = relax.op.zeros(relax.ShapeExpr([batch, hidden]), dtype)
    y_dirs, h_last, c_last = [], [], []
    for d in range(num_dirs):
        w_d = relax.op.squeeze(relax.op.strided_slice(w, [0], [d], [d + 1]), [0])
        r_d = bb.emit(relax.op.squeeze(relax.op.strided_slice(r, [0], [d], [d + 1]), [0]))
        xw = relax.op.matmul(x, relax.op.permute_dims(w_d))  # [T, B, G*H]
        if b is not None:
            b_d = relax.op.squeeze(relax.op.strided_slice(b, [0], [d], [d + 1]), [0])
            wb, rb = _split(bb, bb.emit(b_d), 2, axis=0)
            xw = relax.op.add(xw, wb)
        else:
            rb = relax.op.zeros(relax.ShapeExpr([gates * hidden]), dtype)
        xw = bb.emit(xw)
        xw_steps = [bb.emit(relax.op.squeeze(s, [0])) for s in _split(bb, xw, steps, axis=0)]

        def state(s0):
            if s0 is None:
                return bb.emit(zeros)
            return bb.emit(relax.op.squeeze(relax.op.strided_slice(s0, [0], [d], [d + 1]), [0]))

        p_d = None if p is None else bb.emit(
            relax.op.squeeze(relax.op.strided_slice(p, [0], [d], [d + 1]), [0]))
        reverse = direction == "reverse" or d == 1
        ys, h, cell = _direction(bb, op, attr, xw_steps, r_d, rb, p_d, state(h0),
                                 state(c0) if op == "LSTM" else None, mask, steps, reverse,
                                 acts[d], dtype)
        y_dirs.append(bb.emit(relax.op.stack(ys, axis=0)))  # [T, B, H]
        if mask is not None:
            h = bb.emit(relax.op.where(ended, h, relax.const(0.0, dtype)))
            if cell is not None:
                cell = bb.emit(relax.op.where(ended, cell, relax.const(0.0, dtype)))
        h_last.append(h)
        c_last.append(cell)
    y = bb.emit(relax.op.stack(y_dirs, axis=1))
    y_h = bb.emit(relax.op.stack(h_last, axis=0))
    y_c = bb.emit(relax.op.stack(c_last, axis=0)) if op == "LSTM" else None
    return _outputs(op, bb, layout, y, y_h, y_c)


def _looped(op: str, module_bb, bb, inputs, attr):
    """The node with a run-time sequence length: the input projection of all steps and
    directions as one matmul, then one loop kernel over time for all directions (rnn_loop).
    `module_bb` receives the kernel (the body's own builder `bb` is a private function's)."""
    from tvm import relax

    from .rnn_loop import UNITS_PER_VECTOR, loop_kernel, splits_units

    (x, w, r, b, seq_lens, h0, c0, p, dtype, layout, direction, num_dirs, gates, hidden,
     attr) = _operands(op, bb, inputs, attr)
    steps, batch = bb.normalize(x).ty.shape.values[:2]
    acts = _activation_specs(op, attr, num_dirs)
    lens = None if seq_lens is None else bb.emit(relax.op.astype(seq_lens, "int64"))
    size = bb.normalize(x).ty.shape.values[2]
    # The projection of every direction as one 2-D matmul over all steps and rows (a 3-D one is
    # a batch of small matmuls to the default schedules), reshaped back to [T, B, D*G*H].
    rows = bb.emit(relax.op.reshape(x, relax.ShapeExpr([steps * batch, size])))
    xw = relax.op.matmul(rows, relax.op.permute_dims(
        relax.op.reshape(w, relax.ShapeExpr([num_dirs * gates * hidden, size]))))
    if b is not None:
        wb, rb = _split(bb, b, 2, axis=1)
        xw = relax.op.add(xw, relax.op.reshape(wb, relax.ShapeExpr([num_dirs * gates * hidden])))
        rb = bb.emit(rb)
    else:
        rb = relax.op.zeros(relax.ShapeExpr([num_dirs, gates * hidden]), dtype)
    xw = relax.op.reshape(xw, relax.ShapeExpr([steps, batch, num_dirs * gates * hidden]))
    zeros = relax.op.zeros(relax.ShapeExpr([num_dirs, batch, hidden]), dtype)
    rt = relax.op.permute_dims(r, [0, 2, 1])  # [D, H, G*H]
    if splits_units(gates, hidden):  # packed per vector of units: [D, H/L, H, G, L]
        rt = relax.op.permute_dims(relax.op.reshape(rt, relax.ShapeExpr(
            [num_dirs, hidden, gates, hidden // UNITS_PER_VECTOR, UNITS_PER_VECTOR])),
            [0, 3, 1, 2, 4])
    args = [bb.emit(xw), bb.emit(rt), bb.normalize(rb),
            h0 if h0 is not None else bb.emit(zeros)]
    if op == "LSTM":
        args.append(c0 if c0 is not None else bb.emit(zeros))
        if p is not None:
            args.append(p)
    if lens is not None:
        args.append(lens)
    kernel = loop_kernel(
        op, hidden, dtype,
        [(acts[d], direction == "reverse" or d == 1) for d in range(num_dirs)],
        clip=attr.get("clip"), linear_before_reset=bool(attr.get("linear_before_reset", 0)),
        input_forget=bool(attr.get("input_forget", 0)), peepholes=p is not None,
        lens=lens is not None)
    gv = module_bb.add_func(kernel, f"tvmopt_{op.lower()}_loop")
    state_ty = relax.TensorType([num_dirs, batch, hidden], dtype)
    outs = [relax.TensorType([steps, num_dirs, batch, hidden], dtype), state_ty]
    if op == "LSTM":
        outs.append(state_ty)
    outs.append(relax.TensorType([num_dirs, batch, (gates + 3) * hidden], dtype))  # scratch
    res = bb.emit(relax.call_tir(gv, args, outs))
    return _outputs(op, bb, layout, *[bb.emit(relax.TupleGetItem(res, i))
                                      for i in range(3 if op == "LSTM" else 2)])


def looped_form(mod, gv):
    """`mod` with the recurrent body `gv` (a static-length one, unrolled) rebuilt as its loop
    kernel, the form a symbolic length gets: one kernel call for the node instead of a few
    per step. Its description is unchanged (it still computes the node)."""
    import json

    from tvm import relax

    func = mod[gv]
    spec = json.loads(str(func.attrs[RECURRENT_ATTR]))
    op = spec["op"]
    module_bb = relax.BlockBuilder(mod)
    inner = relax.BlockBuilder()
    params = [relax.Var(p.name, p.ty) for p in func.params]
    positional = [None] * 8
    for name, v in zip(spec["inputs"], params, strict=True):
        positional[_INPUTS.index(name)] = v
    with inner.function(op.lower(), params, private=True):
        with inner.dataflow():
            out = inner.emit_output(_looped(op, module_bb, inner, positional,
                                            dict(spec["attrs"])))
        inner.emit_func_output(out)
    new = module_bb.get()
    new[gv] = inner.get()[op.lower()].with_attr(RECURRENT_ATTR,
                                                str(func.attrs[RECURRENT_ATTR]))
    return new


def _make(op: str):
    @register(op)
    class Recurrent:
        @classmethod
        def get_converter(cls, opset):
            def convert(bb, inputs, attr, params):
                return _convert(op, bb, inputs, attr)

            return convert

    Recurrent.__name__ = op
    return Recurrent


RNN = _make("RNN")
GRU = _make("GRU")
LSTM = _make("LSTM")
