"""RNN / GRU / LSTM over a run-time sequence length: one loop kernel per direction.

With a symbolic sequence length the recurrence cannot be unrolled. The input projection of all
steps stays one Relax matmul (x @ W^T + Wb over [T, B, I], as in the unrolled form); the loop
over time is a TIR kernel whose step does the recurrent matmul (h @ R^T + Rb), the gates and the
state update, with the ONNX node's activations, clip, peepholes, input_forget,
linear_before_reset and sequence_lens masking (held state past a sequence's end, zero Y rows,
zero final states for a sequence of no steps). The kernel is written scheduled (a serial loop
nest): on x86 the dispatch phase gives such nodes to oneDNN's RNN primitives, which take the
time dim at execution; the kernel is what runs where the library does not.
"""

from __future__ import annotations

# A pre-activation as TIR text -> its activation, with the ONNX alpha / beta (names resolved
# by rnn._activation_specs). The argument is always a let-bound variable, so it may repeat.
_TIR_ACTS = {
    "Tanh": "T.tanh({x})",
    "Sigmoid": "T.sigmoid({x})",
    "Relu": "T.max({x}, {zero})",
    "Affine": "{x} * {a} + {b}",
    "LeakyRelu": "T.if_then_else({x} >= {zero}, {x}, {x} * {a})",
    "ThresholdedRelu": "T.if_then_else({x} > {a}, {x}, {zero})",
    "ScaledTanh": "{a} * T.tanh({x} * {b})",
    "HardSigmoid": "T.max(T.min({x} * {a} + {b}, {one}), {zero})",
    "Elu": "T.if_then_else({x} > {zero}, {x}, {a} * (T.exp({x}) - {one}))",
    "Softsign": "{x} / ({one} + T.fabs({x}))",
    "Softplus": "T.log({one} + T.exp({x}))",
}


def _const(v, dtype: str) -> str:
    return f"T.{dtype}({float(v)!r})"


class _Body:
    """Lines of TVMScript with indentation and fresh let-variable names."""

    def __init__(self, dtype: str, acts, clip):
        self.lines: list[str] = []
        self.dtype, self.acts, self.clip = dtype, acts, clip
        self.n = 0

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def let(self, depth: int, expr: str) -> str:
        self.n += 1
        name = f"v{self.n}"
        self.line(depth, f"{name} = {expr}")
        return name

    def act(self, depth: int, i: int, x: str, clipped: bool = True) -> str:
        """Activation i of this direction on pre-activation x (clipped first, as ONNX does for
        the gate activations)."""
        name, alpha, beta = self.acts[i]
        if clipped and self.clip is not None:
            c = _const(self.clip, self.dtype)
            x = f"T.max(T.min({x}, {c}), {_const(-float(self.clip), self.dtype)})"
        x = self.let(depth, x)
        return self.let(depth, _TIR_ACTS[name].format(
            x=x, a=_const(alpha or 0.0, self.dtype), b=_const(beta or 0.0, self.dtype),
            zero=_const(0.0, self.dtype), one=_const(1.0, self.dtype)))


def loop_kernel(op: str, hidden: int, dtype: str, acts, *, reverse: bool, clip=None,
                linear_before_reset: bool = False, input_forget: bool = False,
                peepholes: bool = False, lens: bool = False):
    """The TIR kernel of one direction.

    Args:
        op: "RNN", "GRU" or "LSTM".
        hidden: the hidden size H.
        dtype: the float type.
        acts: this direction's activations, (name, alpha, beta) each, in ONNX order.
        reverse: run from the last step to the first.

    Returns:
        A PrimFunc taking xw [T, B, G*H] (input projection with Wb), r [G*H, H], rb [G*H],
        h0 [B, H], (c0 [B, H],) (p [3H],) (lens [B] int64,) and writing y [T, B, H], y_h
        [B, H], (y_c [B, H],) and a scratch [B, G*H + H].
    """
    import tvm
    from tvm.script import tirx

    for name, _, _ in acts:
        if name not in _TIR_ACTS:
            raise ValueError(f"activation {name} is not supported")
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    lstm = op == "LSTM"
    H, GH = hidden, gates * hidden  # noqa: N806 - the ONNX names
    i64 = "T.int64({})".format
    zero = _const(0.0, dtype)
    params = ["xw", "r", "rb", "h0"] + (["c0"] if lstm else []) + (["p"] if peepholes else []) \
        + (["lens"] if lens else []) + ["y", "yh"] + (["yc"] if lstm else []) + ["g"]
    shapes = {"xw": (["steps", "batch", i64(GH)], dtype), "r": ([i64(GH), i64(H)], dtype),
              "rb": ([i64(GH)], dtype), "h0": (["batch", i64(H)], dtype),
              "c0": (["batch", i64(H)], dtype), "p": ([i64(3 * H)], dtype),
              "lens": (["batch"], "int64"), "y": (["steps", "batch", i64(H)], dtype),
              "yh": (["batch", i64(H)], dtype), "yc": (["batch", i64(H)], dtype),
              "g": (["batch", i64(GH + H)], dtype)}
    body = _Body(dtype, acts, clip)
    body.line(0, "@T.prim_func(private=True)")
    body.line(0, f"def {op.lower()}_loop(" + ", ".join(f"var_{p}: T.handle" for p in params)
              + "):")
    body.line(1, 'T.func_attr({"tir.noalias": True, "tir.is_scheduled": True})')
    body.line(1, "steps = T.int64()")
    body.line(1, "batch = T.int64()")
    for p in params:
        dims, dt = shapes[p]
        body.line(1, f'{p} = T.match_buffer(var_{p}, ({", ".join(dims)},), "{dt}")')
    body.line(1, f"for b, j in T.grid(batch, {i64(H)}):")
    body.line(2, "yh[b, j] = h0[b, j]")
    if lstm:
        body.line(2, "yc[b, j] = c0[b, j]")
    body.line(1, "for t in range(steps):")
    body.line(2, "tt = steps - T.int64(1) - t" if reverse else "tt = t")

    def matmul(rows_from: int, rows_to: int, state: str):
        """g[b, j] = rb[j] + sum_k state[b, k] * r[j, k] for j in [rows_from, rows_to)."""
        body.line(2, f"for b, j in T.grid(batch, {i64(rows_to - rows_from)}):")
        body.line(3, f"g[b, j + {i64(rows_from)}] = rb[j + {i64(rows_from)}]")
        body.line(3, f"for k in range({i64(H)}):")
        body.line(4, f"g[b, j + {i64(rows_from)}] = g[b, j + {i64(rows_from)}] + "
                     f"{state} * r[j + {i64(rows_from)}, k]")

    def pre(gate: int) -> str:  # gate's input projection plus its recurrent part
        return f"xw[tt, b, j + {i64(gate * H)}] + g[b, j + {i64(gate * H)}]"

    one = _const(1.0, dtype)
    if op == "GRU" and not linear_before_reset:
        # z and r first; the candidate's recurrence multiplies r * h before its matmul.
        matmul(0, 2 * H, "yh[b, k]")
        body.line(2, f"for b, j in T.grid(batch, {i64(H)}):")
        r_gate = body.act(3, 0, pre(1))
        body.line(3, f"g[b, j + {i64(GH)}] = {r_gate} * yh[b, j]")
        matmul(2 * H, 3 * H, f"g[b, k + {i64(GH)}]")
    else:
        matmul(0, GH, "yh[b, k]")
    body.line(2, f"for b, j in T.grid(batch, {i64(H)}):")
    d = 3
    if op == "RNN":
        h_new = body.act(d, 0, pre(0))
    elif op == "GRU":
        z = body.act(d, 0, pre(0))
        r_gate = body.act(d, 0, pre(1))
        cand = (f"xw[tt, b, j + {i64(2 * H)}] + {r_gate} * g[b, j + {i64(2 * H)}]"
                if linear_before_reset else pre(2))
        h_tilde = body.act(d, 1, cand)
        h_new = body.let(d, f"({one} - {z}) * {h_tilde} + {z} * yh[b, j]")
    else:  # LSTM, gates i, o, f, c
        peep = (lambda k, c: f" + p[j + {i64(k * H)}] * {c}") if peepholes else (lambda k, c: "")
        i_gate = body.act(d, 0, pre(0) + peep(0, "yc[b, j]"))
        f_gate = (body.let(d, f"{one} - {i_gate}") if input_forget
                  else body.act(d, 0, pre(2) + peep(2, "yc[b, j]")))
        c_gate = body.act(d, 1, pre(3))
        c_new = body.let(d, f"{f_gate} * yc[b, j] + {i_gate} * {c_gate}")
        o_gate = body.act(d, 0, pre(1) + peep(1, c_new))
        h_new = body.let(d, f"{o_gate} * " + body.act(d, 2, c_new, clipped=False))
    if lens:
        valid = "tt < lens[b]"
        body.line(d, f"y[tt, b, j] = T.if_then_else({valid}, {h_new}, {zero})")
        body.line(d, f"yh[b, j] = T.if_then_else({valid}, {h_new}, yh[b, j])")
        if lstm:
            body.line(d, f"yc[b, j] = T.if_then_else({valid}, {c_new}, yc[b, j])")
        # A sequence of no steps ends with zero states (onnxruntime), not its initial ones.
        body.line(1, f"for b, j in T.grid(batch, {i64(H)}):")
        body.line(2, f"yh[b, j] = T.if_then_else(lens[b] > T.int64(0), yh[b, j], {zero})")
        if lstm:
            body.line(2, f"yc[b, j] = T.if_then_else(lens[b] > T.int64(0), yc[b, j], {zero})")
    else:
        body.line(d, f"y[tt, b, j] = {h_new}")
        body.line(d, f"yh[b, j] = {h_new}")
        if lstm:
            body.line(d, f"yc[b, j] = {c_new}")
    return tvm.script.from_source("\n".join(body.lines), extra_vars={"T": tirx})
