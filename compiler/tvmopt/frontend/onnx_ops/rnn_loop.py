"""RNN / GRU / LSTM as one loop kernel per direction: the recurrence's time loop inside a kernel.

The input projection of all steps stays one Relax matmul (x @ W^T + Wb over [T, B, I], as in
the unrolled form); the loop over time is a TIR kernel whose step does the recurrent matmul
(h @ R^T + Rb), the gates and the state update, with the ONNX node's activations, clip,
peepholes, input_forget, linear_before_reset and sequence_lens masking (held state past a
sequence's end, zero Y rows, zero final states for a sequence of no steps). On CPUs it is what
runs every node no library takes (passes.recurrent.LoopRecurrent): one kernel call for the
whole node instead of the unrolled body's few per step, and the only form a symbolic sequence
length has.

The kernel is written scheduled, for CPUs:
- batch rows are independent recurrences, so blocks of rows run on the threads, each block
  through every step (no synchronisation per step);
- the recurrent matmul is a register-blocked micro-kernel: for each reduction index, a few
  vectors of R^T's row (R is passed transposed, [H, G*H], so a row of gate columns is
  contiguous) are loaded once and multiplied into the accumulators of every row of the block;
- the gates and the state update are vectorized over the hidden units, with the vectorizable
  forms of exp, tanh and sigmoid that the rest of the pipeline uses (TOPI's fast_exp /
  fast_tanh, here as TIR expressions, since this kernel is TVMScript and not TE).
"""

from __future__ import annotations

import re

# Float32 lanes of one vector of the micro-kernel (AVX-512's width; narrower ISAs split it),
# vectors of gate columns per reduction step, and batch rows per block. Rows x vectors
# accumulators stay few: LLVM keeps the fast-math constants of the gate loop in registers
# across the whole step, and with 2 x 4 accumulators the reduction spilled to the stack.
_LANES = 16
_CHUNKS = 2
_ROWS = 2

# A pre-activation as TIR text -> its activation, with the ONNX alpha / beta (names resolved
# by rnn._activation_specs). The argument is always a meta-variable name, so it may repeat.
# tanh_ / sigmoid_ / exp_ are the vectorizable forms for float32 and TIR's own otherwise.
_TIR_ACTS = {
    "Tanh": "tanh_({x})",
    "Sigmoid": "sigmoid_({x})",
    "Relu": "T.max({x}, {zero})",
    "Affine": "{x} * {a} + {b}",
    "LeakyRelu": "T.if_then_else({x} >= {zero}, {x}, {x} * {a})",
    "ThresholdedRelu": "T.if_then_else({x} > {a}, {x}, {zero})",
    "ScaledTanh": "{a} * tanh_({x} * {b})",
    "HardSigmoid": "T.max(T.min({x} * {a} + {b}, {one}), {zero})",
    "Elu": "T.if_then_else({x} > {zero}, {x}, {a} * (exp_({x}) - {one}))",
    "Softsign": "{x} / ({one} + T.fabs({x}))",
    "Softplus": "T.log({one} + exp_({x}))",
}


def _fast_exp(x):
    """TOPI's fast_exp_float32 on a float32 PrimExpr: exp(x) = 2^n * exp(f) with a degree-7
    polynomial for exp(f), 2^n built in the exponent bits."""
    from tvm import tirx

    def c(v):
        return tirx.const(v, "float32")

    xc = tirx.max(tirx.min(x, c(88.3762626647950)), c(-88.3762626647949))
    n = tirx.floor(xc * c(1.44269504088896341) + c(0.5))
    f = xc - n * c(0.6931471805599453)
    y = c(1.9875691500e-4)
    for coef in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                 5.0000001201e-1):
        y = y * f + c(coef)
    y = y * f * f + f + c(1.0)
    scale = tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n + c(127.0)), 23))
    return tirx.max(scale * y, x)


def _fast_tanh(x):
    """TOPI's fast_tanh_float: a rational approximation on x clamped to [-9, 9]."""
    from tvm import tirx

    def c(v):
        return tirx.const(v, "float32")

    xc = tirx.max(c(-9.0), tirx.min(c(9.0), x))
    x2 = xc * xc
    p = c(-2.76076847742355e-16)
    for coef in (2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
                 1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03):
        p = x2 * p + c(coef)
    q = c(1.19825839466702e-06)
    for coef in (1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03):
        q = x2 * q + c(coef)
    return xc * p / q


def _fast_sigmoid(x):
    from tvm import tirx

    one = tirx.const(1.0, "float32")
    return one / (one + _fast_exp(-x))


def _math(dtype: str) -> dict:
    """The names _TIR_ACTS calls, for a kernel of this float type."""
    from tvm import tirx

    if dtype == "float32":
        return {"tanh_": _fast_tanh, "sigmoid_": _fast_sigmoid, "exp_": _fast_exp}
    return {"tanh_": tirx.tanh, "sigmoid_": tirx.sigmoid, "exp_": tirx.exp}


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

    def bind(self, start: int, name: str, expr: str) -> None:
        """`name` in the lines from `start` on replaced by `(expr)`. Index names are written
        out rather than let-bound: TVM keeps a let of a loop-varying value in a stack slot
        that it reloads after every store (the stores might alias it), and a vectorized loop
        keeps a let of its lane index scalar."""
        self.lines[start:] = [re.sub(rf"\b{name}\b", f"({expr})", ln)
                              for ln in self.lines[start:]]

    def let(self, depth: int, expr: str) -> str:
        self.n += 1
        name = f"v{self.n}"
        self.line(depth, f"{name} = T.meta_var({expr})")
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
        A PrimFunc taking xw [T, B, G*H] (input projection with Wb), rt [H, G*H] (R
        transposed), rb [G*H], h0 [B, H], (c0 [B, H],) (p [3H],) (lens [B] int64,) and writing
        y [T, B, H], y_h [B, H], (y_c [B, H],) and a scratch [B, G*H + H].
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
    one = _const(1.0, dtype)
    params = ["xw", "rt", "rb", "h0"] + (["c0"] if lstm else []) + (["p"] if peepholes else []) \
        + (["lens"] if lens else []) + ["y", "yh"] + (["yc"] if lstm else []) + ["g"]
    shapes = {"xw": (["steps", "batch", i64(GH)], dtype), "rt": ([i64(H), i64(GH)], dtype),
              "rb": ([i64(GH)], dtype), "h0": (["batch", i64(H)], dtype),
              "c0": (["batch", i64(H)], dtype), "p": ([i64(3 * H)], dtype),
              "lens": (["batch"], "int64"), "y": (["steps", "batch", i64(H)], dtype),
              "yh": (["batch", i64(H)], dtype), "yc": (["batch", i64(H)], dtype),
              "g": (["batch", i64(GH + H)], dtype)}
    body = _Body(dtype, acts, clip)
    body.line(0, "@T.prim_func(private=True)")
    body.line(0, f"def {op.lower()}_loop(" + ", ".join(f"var_{p}: T.handle" for p in params)
              + "):")
    body.line(1, 'T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})')
    body.line(1, "steps = T.int64()")
    body.line(1, "batch = T.int64()")
    for p in params:
        dims, dt = shapes[p]
        body.line(1, f'{p} = T.match_buffer(var_{p}, ({", ".join(dims)},), "{dt}")')
    rows = i64(_ROWS)
    # Each block of rows runs the whole recurrence on a thread of its own.
    body.line(1, f"for blk in T.parallel((batch + {rows} - T.int64(1)) // {rows}):")
    block_start = len(body.lines)
    # The matmul's accumulators, one block of columns for each row. Global scope under TVM's
    # stack limit is what becomes a stack array (a "local" one is a heap workspace): LLVM then
    # knows no buffer aliases it and keeps it in registers through the reduction.
    body.line(2, f'acc = T.alloc_buffer(({rows}, {i64(_LANES * _CHUNKS)}), "{dtype}")')
    body.line(2, "for bi, j in T.grid(nrows, " + i64(H) + "):")
    body.line(3, "yh[b0 + bi, j] = h0[b0 + bi, j]")
    if lstm:
        body.line(3, "yc[b0 + bi, j] = c0[b0 + bi, j]")

    def matmul(d: int, base: str, nr: int, cols_from: int, cols_to: int, state: str):
        """g[base + r, j] = rb[j] + sum_k state(r, k) * rt[k, j], j in [cols_from, cols_to),
        for the nr rows from `base`: whole chunks of columns in registers, the rest one column
        at a time. `state` formats with {b} (the row) and {k}."""
        width = _LANES * _CHUNKS
        full = (cols_to - cols_from) // width
        if full:
            body.line(d, f"for jo in range({i64(full)}):")
            col = f"{i64(cols_from)} + jo * {i64(width)}"
            body.line(d + 1, f"for r in T.unroll({i64(nr)}):")
            body.line(d + 2, f"for ji in T.vectorized({i64(width)}):")
            body.line(d + 3, f"acc[r, ji] = rb[{col} + ji]")
            body.line(d + 1, f"for k in range({i64(H)}):")
            body.line(d + 2, f"for c in T.unroll({i64(_CHUNKS)}):")
            body.line(d + 3, f"for r in T.unroll({i64(nr)}):")
            body.line(d + 4, f"for ji in T.vectorized({i64(_LANES)}):")
            lane = f"c * {i64(_LANES)} + ji"
            body.line(d + 5, f"acc[r, {lane}] = acc[r, {lane}] + "
                             f"{state.format(b=f'{base} + r', k='k')} * rt[k, {col} + {lane}]")
            body.line(d + 1, f"for r in T.unroll({i64(nr)}):")
            body.line(d + 2, f"for ji in T.vectorized({i64(width)}):")
            body.line(d + 3, f"g[{base} + r, {col} + ji] = acc[r, ji]")
        if cols_from + full * width < cols_to:
            body.line(d, f"for r, j in T.grid({i64(nr)}, "
                         f"{i64(cols_to - cols_from - full * width)}):")
            col = f"j + {i64(cols_from + full * width)}"
            body.line(d + 1, f"g[{base} + r, {col}] = rb[{col}]")
            body.line(d + 1, f"for k in range({i64(H)}):")
            body.line(d + 2, f"g[{base} + r, {col}] = g[{base} + r, {col}] + "
                             f"{state.format(b=f'{base} + r', k='k')} * rt[k, {col}]")

    def per_unit(d: int, emit) -> None:
        """emit(depth) once over the hidden units j of row b: whole vectors, then the rest."""
        full = H // _LANES
        if full:
            body.line(d, f"for jo in range({i64(full)}):")
            body.line(d + 1, f"for ji in T.vectorized({i64(_LANES)}):")
            start = len(body.lines)
            emit(d + 2)
            body.bind(start, "j", f"jo * {i64(_LANES)} + ji")
        if full * _LANES < H:
            body.line(d, f"for j in range({i64(full * _LANES)}, {i64(H)}):")
            emit(d + 1)

    def pre(gate: int) -> str:  # gate's input projection plus its recurrent part
        return f"xw[tt, b, j + {i64(gate * H)}] + g[b, j + {i64(gate * H)}]"

    def gate_update(d: int) -> None:
        if op == "RNN":
            h_new = body.act(d, 0, pre(0))
            c_new = None
        elif op == "GRU":
            z = body.act(d, 0, pre(0))
            r_gate = body.act(d, 0, pre(1))
            cand = (f"xw[tt, b, j + {i64(2 * H)}] + {r_gate} * g[b, j + {i64(2 * H)}]"
                    if linear_before_reset else pre(2))
            h_tilde = body.act(d, 1, cand)
            h_new = body.let(d, f"({one} - {z}) * {h_tilde} + {z} * yh[b, j]")
            c_new = None
        else:  # LSTM, gates i, o, f, c
            peep = ((lambda k, c: f" + p[j + {i64(k * H)}] * {c}") if peepholes
                    else (lambda k, c: ""))
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
        else:
            body.line(d, f"y[tt, b, j] = {h_new}")
            body.line(d, f"yh[b, j] = {h_new}")
            if lstm:
                body.line(d, f"yc[b, j] = {c_new}")

    def recurrence(d: int, base: str, nr: int) -> None:
        """Every step for the nr rows from `base`."""
        body.line(d, "for t in range(steps):")
        d += 1
        step_start = len(body.lines)
        def per_row(emit) -> None:  # emit over the units of each of the nr rows (as b)
            body.line(d, f"for r in range({i64(nr)}):")
            start = len(body.lines)
            per_unit(d + 1, emit)
            body.bind(start, "b", f"{base} + r")

        if op == "GRU" and not linear_before_reset:
            # z and r first; the candidate's recurrence multiplies r * h before its matmul.
            matmul(d, base, nr, 0, 2 * H, "yh[{b}, {k}]")

            def reset(dd):
                r_gate = body.act(dd, 0, pre(1))
                body.line(dd, f"g[b, j + {i64(GH)}] = {r_gate} * yh[b, j]")

            per_row(reset)
            matmul(d, base, nr, 2 * H, 3 * H, "g[{b}, {k} + " + i64(GH) + "]")
        else:
            matmul(d, base, nr, 0, GH, "yh[{b}, {k}]")
        per_row(gate_update)
        body.bind(step_start, "tt", "steps - T.int64(1) - t" if reverse else "t")

    # A full block keeps all its rows' accumulators in registers; the last, partial block
    # (and a batch of one) runs its rows one at a time.
    body.line(2, f"if nrows == {rows}:")
    recurrence(3, "b0", _ROWS)
    body.line(2, "else:")
    body.line(3, "for bi in range(nrows):")
    recurrence(4, "b0 + bi", 1)
    if lens:
        # A sequence of no steps ends with zero states (onnxruntime), not its initial ones.
        body.line(2, f"for bi, j in T.grid(nrows, {i64(H)}):")
        start = len(body.lines)
        body.line(3, f"yh[b, j] = T.if_then_else(lens[b] > T.int64(0), yh[b, j], {zero})")
        if lstm:
            body.line(3, f"yc[b, j] = T.if_then_else(lens[b] > T.int64(0), yc[b, j], {zero})")
        body.bind(start, "b", "b0 + bi")
    body.bind(block_start, "nrows", f"T.min(batch - b0, {rows})")
    body.bind(block_start, "b0", f"blk * {rows}")
    return tvm.script.from_source("\n".join(body.lines),
                                  extra_vars={"T": tirx, **_math(dtype)})
