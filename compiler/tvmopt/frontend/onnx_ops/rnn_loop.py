"""RNN / GRU / LSTM as one loop kernel: the recurrence's time loop inside a kernel.

The input projection of all steps and directions stays one Relax matmul (x @ W^T + Wb over
[T, B, I], as in the unrolled form); the loop over time is a TIR kernel whose step does the
recurrent matmul (h @ R^T + Rb), the gates and the state update, with the ONNX node's
activations, clip, peepholes, input_forget, linear_before_reset and sequence_lens masking
(held state past a sequence's end, zero Y rows, zero final states for a sequence of no steps).
On CPUs it is what runs every node no library takes (passes.recurrent.LoopRecurrent): one
kernel call for the whole node instead of the unrolled body's few per step, and the only form
a symbolic sequence length has.

The kernel is written scheduled, for CPUs:
- batch rows and directions are independent recurrences, so blocks of rows of each direction
  run on the threads, each block through every step (no synchronisation per step); where R is
  too large for a core's cache, the hidden units are split across the threads at every step
  instead (splits_units);
- the recurrent matmul is a register-blocked micro-kernel: for each reduction index, a few
  vectors of R^T's row (R is passed transposed, [D, H, G*H], so a row of gate columns is
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
# The units of one vector, which a packed R groups (rnn.py packs it where splits_units).
UNITS_PER_VECTOR = _LANES
# Elements of R (per direction) from which the hidden units are split across the threads at
# every step rather than batch rows across them for all steps: a matrix past a core's L2
# would be streamed from memory at every step, while a slice per core stays in its cache, and
# a batch of one is one block of rows (one thread) in the other form.
_SPLIT_MIN = 1 << 16

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


def splits_units(gates: int, hidden: int) -> bool:
    """Whether the kernel of a node with this many gates splits the hidden units across the
    threads at every step (see _SPLIT_MIN); R is then passed packed per vector of units
    (loop_kernel)."""
    return hidden % _LANES == 0 and hidden * gates * hidden >= _SPLIT_MIN


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


def loop_kernel(op: str, hidden: int, dtype: str, directions, *, clip=None,
                linear_before_reset: bool = False, input_forget: bool = False,
                peepholes: bool = False, lens: bool = False):
    """The TIR kernel of a node: every direction's recurrence in one kernel, so that the
    directions of a bidirectional node run on threads of their own at once (a batch of one row
    is one block per direction).

    Args:
        op: "RNN", "GRU" or "LSTM".
        hidden: the hidden size H.
        dtype: the float type.
        directions: (acts, reverse) for each direction D in ONNX order: its activations,
            (name, alpha, beta) each, and whether it runs from the last step to the first.

    Returns:
        A PrimFunc taking xw [T, B, D*G*H] (input projection with Wb, the directions side by
        side), rt [D, H, G*H] (R transposed; where splits_units, packed per vector of L units
        as [D, H/L, H, G, L], so that a thread's slice is one contiguous run), rb [D, G*H],
        h0 [D, B, H], (c0 [D, B, H],) (p [D, 3H],) (lens [B] int64,) and writing
        y [T, D, B, H], y_h [D, B, H], (y_c [D, B, H],) and a scratch [D, B, G*H + 3H].
    """
    import tvm
    from tvm.script import tirx

    for acts, _ in directions:
        for name, _, _ in acts:
            if name not in _TIR_ACTS:
                raise ValueError(f"activation {name} is not supported")
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    lstm = op == "LSTM"
    H, GH, D = hidden, gates * hidden, len(directions)  # noqa: N806 - the ONNX names
    i64 = "T.int64({})".format
    split = splits_units(gates, hidden)
    zero = _const(0.0, dtype)
    one = _const(1.0, dtype)
    params = ["xw", "rt", "rb", "h0"] + (["c0"] if lstm else []) + (["p"] if peepholes else []) \
        + (["lens"] if lens else []) + ["y", "yh"] + (["yc"] if lstm else []) + ["g"]
    shapes = {"xw": (["steps", "batch", i64(D * GH)], dtype),
              "rt": ([i64(D), i64(H // _LANES), i64(H), i64(gates), i64(_LANES)] if split
                     else [i64(D), i64(H), i64(GH)], dtype), "rb": ([i64(D), i64(GH)], dtype),
              "h0": ([i64(D), "batch", i64(H)], dtype), "c0": ([i64(D), "batch", i64(H)], dtype),
              "p": ([i64(D), i64(3 * H)], dtype), "lens": (["batch"], "int64"),
              "y": (["steps", i64(D), "batch", i64(H)], dtype),
              "yh": ([i64(D), "batch", i64(H)], dtype), "yc": ([i64(D), "batch", i64(H)], dtype),
              "g": ([i64(D), "batch", i64(GH + 3 * H)], dtype)}
    body = _Body(dtype, directions[0][0], clip)
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
    blocks = f"((batch + {rows} - T.int64(1)) // {rows})"
    # The previous step's h of a row (b) and unit (j or k). Split over units, a step reads
    # every unit of it while other threads write theirs: the state alternates between two
    # halves of the scratch by step parity (HS: where they start in a row of the scratch).
    HS = GH + H  # noqa: N806
    h_prev = (f"g[dd, {{b}}, {{k}} + {i64(HS)} + cur * {i64(H)}]" if split
              else "yh[dd, {b}, {k}]")
    h_next = f"g[dd, b, j + {i64(HS)} + nxt * {i64(H)}]" if split else "yh[dd, b, j]"
    h_own = h_prev.format(b="b", k="j")

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
            body.line(d + 3, f"acc[r, ji] = rb[dd, {col} + ji]")
            body.line(d + 1, f"for k in range({i64(H)}):")
            body.line(d + 2, f"for c in T.unroll({i64(_CHUNKS)}):")
            body.line(d + 3, f"for r in T.unroll({i64(nr)}):")
            body.line(d + 4, f"for ji in T.vectorized({i64(_LANES)}):")
            lane = f"c * {i64(_LANES)} + ji"
            body.line(d + 5, f"acc[r, {lane}] = acc[r, {lane}] + "
                             f"{state.format(b=f'{base} + r', k='k')} * rt[dd, k, {col} + {lane}]")
            body.line(d + 1, f"for r in T.unroll({i64(nr)}):")
            body.line(d + 2, f"for ji in T.vectorized({i64(width)}):")
            body.line(d + 3, f"g[dd, {base} + r, {col} + ji] = acc[r, ji]")
        if cols_from + full * width < cols_to:
            body.line(d, f"for r, j in T.grid({i64(nr)}, "
                         f"{i64(cols_to - cols_from - full * width)}):")
            col = f"j + {i64(cols_from + full * width)}"
            body.line(d + 1, f"g[dd, {base} + r, {col}] = rb[dd, {col}]")
            body.line(d + 1, f"for k in range({i64(H)}):")
            body.line(d + 2, f"g[dd, {base} + r, {col}] = g[dd, {base} + r, {col}] + "
                             f"{state.format(b=f'{base} + r', k='k')} * rt[dd, k, {col}]")

    def matmul_units(d: int, base: str, nr: int, first: int, count: int, state: str):
        """The same for the one vector of units from u0 of `count` gates from gate `first`:
        the gate columns the update of those units reads, in registers together."""
        col = f"(T.int64({first}) + s) * {i64(H)} + u0 + ji"
        body.line(d, f"for r, s in T.grid({i64(nr)}, {i64(count)}):")
        body.line(d + 1, f"for ji in T.vectorized({i64(_LANES)}):")
        body.line(d + 2, f"acc[r, s * {i64(_LANES)} + ji] = rb[dd, {col}]")
        body.line(d, f"for k in range({i64(H)}):")
        body.line(d + 1, f"for s in T.unroll({i64(count)}):")
        body.line(d + 2, f"for r in T.unroll({i64(nr)}):")
        body.line(d + 3, f"for ji in T.vectorized({i64(_LANES)}):")
        lane = f"s * {i64(_LANES)} + ji"
        body.line(d + 4, f"acc[r, {lane}] = acc[r, {lane}] + "
                         f"{state.format(b=f'{base} + r', k='k')} * "
                         f"rt[dd, w, k, T.int64({first}) + s, ji]")
        body.line(d, f"for r, s in T.grid({i64(nr)}, {i64(count)}):")
        body.line(d + 1, f"for ji in T.vectorized({i64(_LANES)}):")
        body.line(d + 2, f"g[dd, {base} + r, {col}] = acc[r, s * {i64(_LANES)} + ji]")

    def per_unit(d: int, emit) -> None:
        """emit(depth) once over the hidden units j of row b: whole vectors, then the rest (in
        the split form, over the one vector of units from u0)."""
        if split:
            body.line(d, f"for ji in T.vectorized({i64(_LANES)}):")
            start = len(body.lines)
            emit(d + 1)
            body.bind(start, "j", "u0 + ji")
            return
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
        return f"xw[tt, b, xo + j + {i64(gate * H)}] + g[dd, b, j + {i64(gate * H)}]"

    def gate_update(d: int) -> None:
        if op == "RNN":
            h_new = body.act(d, 0, pre(0))
            c_new = None
        elif op == "GRU":
            z = body.act(d, 0, pre(0))
            r_gate = body.act(d, 0, pre(1))
            cand = (f"xw[tt, b, xo + j + {i64(2 * H)}] + {r_gate} * g[dd, b, j + {i64(2 * H)}]"
                    if linear_before_reset else pre(2))
            h_tilde = body.act(d, 1, cand)
            h_new = body.let(d, f"({one} - {z}) * {h_tilde} + {z} * {h_own}")
            c_new = None
        else:  # LSTM, gates i, o, f, c
            peep = ((lambda k, c: f" + p[dd, j + {i64(k * H)}] * {c}") if peepholes
                    else (lambda k, c: ""))
            i_gate = body.act(d, 0, pre(0) + peep(0, "yc[dd, b, j]"))
            f_gate = (body.let(d, f"{one} - {i_gate}") if input_forget
                      else body.act(d, 0, pre(2) + peep(2, "yc[dd, b, j]")))
            c_gate = body.act(d, 1, pre(3))
            c_new = body.let(d, f"{f_gate} * yc[dd, b, j] + {i_gate} * {c_gate}")
            o_gate = body.act(d, 0, pre(1) + peep(1, c_new))
            h_new = body.let(d, f"{o_gate} * " + body.act(d, 2, c_new, clipped=False))
        if lens:
            valid = "tt < lens[b]"
            body.line(d, f"y[tt, dd, b, j] = T.if_then_else({valid}, {h_new}, {zero})")
            body.line(d, f"{h_next} = T.if_then_else({valid}, {h_new}, {h_own})")
            if lstm:
                body.line(d, f"yc[dd, b, j] = T.if_then_else({valid}, {c_new}, yc[dd, b, j])")
        else:
            body.line(d, f"y[tt, dd, b, j] = {h_new}")
            body.line(d, f"{h_next} = {h_new}")
            if lstm:
                body.line(d, f"yc[dd, b, j] = {c_new}")

    def phases(d: int, base: str, nr: int, mm) -> list:
        """The step of the nr rows from `base` in the parts that need every unit of the part
        before (a GRU's candidate multiplies r * h of all units), each a function of a depth;
        mm(depth, first_gate, gate_count, state) emits the matmul of those gates."""
        def per_row(dd_, emit) -> None:  # emit over the units of each of the nr rows (as b)
            body.line(dd_, f"for r in range({i64(nr)}):")
            start = len(body.lines)
            per_unit(dd_ + 1, emit)
            body.bind(start, "b", f"{base} + r")

        if op == "GRU" and not linear_before_reset:
            def reset(dp):
                r_gate = body.act(dp, 0, pre(1))
                body.line(dp, f"g[dd, b, j + {i64(GH)}] = {r_gate} * {h_own}")

            def zr(dp):
                mm(dp, 0, 2, h_prev)
                per_row(dp, reset)

            def candidate(dp):
                mm(dp, 2, 1, "g[dd, {b}, {k} + " + i64(GH) + "]")
                per_row(dp, gate_update)
            return [zr, candidate]

        def whole(dp):
            mm(dp, 0, gates, h_prev)
            per_row(dp, gate_update)
        return [whole]

    def each_direction(d: int, extent: str, emit) -> None:
        """emit(depth, k) for each direction k, u in [k * extent, (k + 1) * extent) picking
        direction k and binding its names (the unit index in it is `w`)."""
        for k, (acts, reverse) in enumerate(directions):
            if D > 1:
                body.line(d, f"if u < {extent}:" if k == 0 else "else:")
            start = len(body.lines)
            body.acts = acts
            emit(d + 1 if D > 1 else d, reverse)
            body.bind(start, "w", f"u - {i64(k)} * {extent}" if k else "u")
            body.bind(start, "xo", i64(k * GH))
            body.bind(start, "dd", i64(k))

    # The matmul's accumulators, one block of columns for each row. Global scope under TVM's
    # stack limit is what becomes a stack array (a "local" one is a heap workspace): LLVM then
    # knows no buffer aliases it and keeps it in registers through the reduction.
    acc = f'acc = T.alloc_buffer(({rows}, {i64(_LANES * max(_CHUNKS, gates))}), "{dtype}")'
    if split:
        # Every step on all threads, each a vector of hidden units of a direction (TVM hands
        # each thread the same contiguous units at every step, so its slice of R stays in its
        # core's cache), all rows of the batch in blocks.
        body.line(1, f"for e, b, j in T.grid({i64(D)}, batch, {i64(H)}):")
        body.line(2, f"g[e, b, j + {i64(HS)}] = h0[e, b, j]")
        if lstm:
            body.line(2, "yc[e, b, j] = c0[e, b, j]")
        body.line(1, "for t in range(steps):")
        step_start = len(body.lines)
        for n in range(len(phases(0, "", 1, None))):
            body.line(2, f"for u in T.parallel({i64(D * (H // _LANES))}):")
            body.line(3, acc)

            def unit_block(d, reverse, n=n):
                body.line(d, f"u0 = T.meta_var(w * {i64(_LANES)})")
                body.line(d, f"for bo in range(batch // {rows}):")
                start = len(body.lines)
                phases(d + 1, "bo * " + rows, _ROWS, lambda dp, f, c, st: matmul_units(
                    dp, "bo * " + rows, _ROWS, f, c, st))[n](d + 1)
                body.line(d, f"for bi in range(batch % {rows}):")
                base = f"batch // {rows} * {rows} + bi"
                phases(d + 1, base, 1, lambda dp, f, c, st: matmul_units(
                    dp, base, 1, f, c, st))[n](d + 1)
                body.bind(start, "tt", "steps - T.int64(1) - t" if reverse else "t")

            each_direction(3, i64(H // _LANES), unit_block)
        body.bind(step_start, "cur", "t % T.int64(2)")
        body.bind(step_start, "nxt", "(t + T.int64(1)) % T.int64(2)")
        body.line(1, f"for e, b, j in T.grid({i64(D)}, batch, {i64(H)}):")
        last = f"g[e, b, j + {i64(HS)} + steps % T.int64(2) * {i64(H)}]"
        if lens:
            # A sequence of no steps ends with zero states (onnxruntime), not its initial ones.
            body.line(2, f"yh[e, b, j] = T.if_then_else(lens[b] > T.int64(0), {last}, {zero})")
            if lstm:
                body.line(2, "yc[e, b, j] = T.if_then_else(lens[b] > T.int64(0), yc[e, b, j], "
                             f"{zero})")
        else:
            body.line(2, f"yh[e, b, j] = {last}")
    else:
        # Each block of rows of each direction runs the whole recurrence on a thread of its
        # own (no synchronisation per step).
        body.line(1, f"for u in T.parallel({i64(D)} * {blocks}):")
        body.line(2, acc)

        def recurrence(d: int, base: str, nr: int, reverse: bool) -> None:
            """Every step for the nr rows from `base`."""
            body.line(d, "for t in range(steps):")
            start = len(body.lines)
            for part in phases(d + 1, base, nr, lambda dp, f, c, st: matmul(
                    dp, base, nr, f * H, (f + c) * H, st)):
                part(d + 1)
            body.bind(start, "tt", "steps - T.int64(1) - t" if reverse else "t")

        def block(d: int, reverse: bool) -> None:
            """One block of rows (from b0, nrows of them) of direction dd, through every step."""
            start = len(body.lines)
            body.line(d, f"for bi, j in T.grid(nrows, {i64(H)}):")
            body.line(d + 1, "yh[dd, b0 + bi, j] = h0[dd, b0 + bi, j]")
            if lstm:
                body.line(d + 1, "yc[dd, b0 + bi, j] = c0[dd, b0 + bi, j]")
            # A full block keeps all its rows' accumulators in registers; the last, partial
            # block (and a batch of one) runs its rows one at a time.
            body.line(d, f"if nrows == {rows}:")
            recurrence(d + 1, "b0", _ROWS, reverse)
            body.line(d, "else:")
            body.line(d + 1, "for bi in range(nrows):")
            recurrence(d + 2, "b0 + bi", 1, reverse)
            if lens:
                # A sequence of no steps ends with zero states (onnxruntime), not its initial
                # ones.
                body.line(d, f"for bi, j in T.grid(nrows, {i64(H)}):")
                zstart = len(body.lines)
                for state in ("yh", "yc") if lstm else ("yh",):
                    body.line(d + 1, f"{state}[dd, b, j] = T.if_then_else(lens[b] > "
                                     f"T.int64(0), {state}[dd, b, j], {zero})")
                body.bind(zstart, "b", "b0 + bi")
            body.bind(start, "nrows", f"T.min(batch - b0, {rows})")
            body.bind(start, "b0", f"w * {rows}")

        each_direction(2, blocks, block)
    return tvm.script.from_source("\n".join(body.lines),
                                  extra_vars={"T": tirx, **_math(dtype)})
