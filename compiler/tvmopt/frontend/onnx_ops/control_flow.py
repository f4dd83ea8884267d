"""Scan and Loop, unrolled: the body subgraph is imported once per iteration.

TVM 0.27's Relax frontend has neither. A static compiler can unroll them when the iteration count
is known at import time: for Scan, the scanned axis of its inputs (static in the node cases and
in LinearAttention's expansion); for Loop, a constant trip count `M` and a condition that stays
true (the body passes `cond` through or makes it a constant). Anything else is refused by name.

These ops need the importer itself (to import the body with its inputs bound), so they are not
converters: `tvmopt.frontend.importer`'s importer calls `unroll(importer, node)` for `UNROLLED` op types.
"""

from __future__ import annotations

UNROLLED = ("Scan", "Loop")


def unroll(importer, node) -> None:
    """Import a Scan/Loop node by unrolling it; binds its outputs in importer._nodes."""
    inputs = [importer._nodes[i] if i else None for i in node.input]
    attr = importer._parse_attr(node.attribute)
    name = node.name or f"<unnamed {node.op_type}>"
    try:
        if node.op_type == "Scan":
            outs = _scan(importer, inputs, attr, importer.opset)
        else:
            outs = _loop(importer, inputs, attr)
    except ValueError as err:
        from ...errors import ImportFailure

        raise ImportFailure(f"node '{name}' ({node.op_type}, opset {importer.opset}): {err}") from None
    for out_name, value in zip(node.output, outs):
        if out_name:
            importer._nodes[out_name] = value


def fold_constant_if(importer, node) -> bool:
    """Import only the taken branch of an If whose condition is known at import time (a shape
    test such as Size(size) == 4 in AffineGrid's expansion); False when it is not known.

    The untaken branch may not even import (it can assume the other rank), and TVM's If would
    emit both branches' work into the enclosing block.
    """
    cond = importer._nodes.get(node.input[0]) if node.input else None
    value = _const_value(cond)
    if value is None or value.size != 1:
        return False
    attr = {a.name: a.g for a in node.attribute}
    branch = attr["then_branch" if bool(value.reshape(())) else "else_branch"]
    outs = _run_body(importer, branch, [])
    for out_name, value in zip(node.output, outs):
        if out_name:
            importer._nodes[out_name] = value
    return True


def _static_dim(importer, x, axis: int, what: str) -> int:
    from tvm import tirx

    shape = importer.bb.normalize(x).ty.shape.values
    dim = shape[axis]
    if not isinstance(dim, tirx.IntImm):
        raise ValueError(f"{what} has a symbolic length ({dim}): only a static count is unrolled")
    return int(dim.value)


def _take(bb, x, index: int, axis: int):
    from tvm import relax

    return bb.emit(relax.op.squeeze(relax.op.strided_slice(x, [axis], [index], [index + 1]),
                                    [axis]))


def _run_body(importer, body, values: list) -> list:
    """Import `body` with its inputs bound to `values`; returns its outputs, emitted."""
    from tvm import relax
    from tvm.ir import GenericConst

    bb = importer.bb
    saved = {}
    for inp, value in zip(body.input, values):
        saved[inp.name] = importer._nodes.get(inp.name)
        importer._nodes[inp.name] = value
    try:
        result = importer._convert_subgraph(bb, body)
    finally:
        for k, v in saved.items():
            if v is None:
                importer._nodes.pop(k, None)
            else:
                importer._nodes[k] = v
    outs = list(result) if isinstance(result, relax.Tuple) else [result]
    return [o if isinstance(o, GenericConst) else bb.emit(o) for o in outs]


def _scan(importer, inputs, attr, opset):
    from tvm import relax

    bb = importer.bb
    body = attr["body"]
    n_scan = attr["num_scan_inputs"]
    if opset < 9:
        # Scan-8: a leading sequence_lens input and a batch axis 0 on every input and output;
        # the body sees one batch entry. Unroll over the batch, then over the sequence.
        seq_lens, inputs = inputs[0], inputs[1:]
        if seq_lens is not None:
            raise ValueError("Scan-8 sequence_lens is not supported")
        batch = _static_dim(importer, inputs[0], 0, "Scan batch")
        dirs = attr.get("directions", [0] * n_scan)
        per_batch = [_scan_core(importer, body, [_take(bb, x, b, 0) for x in inputs], n_scan,
                                [0] * n_scan, dirs, None, None) for b in range(batch)]
        return [bb.emit(relax.op.stack([pb[k] for pb in per_batch], axis=0))
                for k in range(len(per_batch[0]))]
    return _scan_core(importer, body, inputs, n_scan, attr.get("scan_input_axes"),
                      attr.get("scan_input_directions"), attr.get("scan_output_axes"),
                      attr.get("scan_output_directions"))


def _scan_core(importer, body, inputs, n_scan, in_axes, in_dirs, out_axes, out_dirs):
    from tvm import relax

    bb = importer.bb
    n_state = len(inputs) - n_scan
    states, xs = list(inputs[:n_state]), inputs[n_state:]
    in_axes = list(in_axes or [0] * n_scan)
    in_dirs = list(in_dirs or [0] * n_scan)
    ranks = [len(bb.normalize(x).ty.shape.values) for x in xs]
    in_axes = [a % r for a, r in zip(in_axes, ranks)]
    lengths = {_static_dim(importer, x, a, "Scan input") for x, a in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise ValueError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    steps = lengths.pop()
    if steps == 0:
        raise ValueError("Scan over an empty sequence is not supported")
    collected = None
    for t in range(steps):
        slices = [_take(bb, x, steps - 1 - t if d else t, a) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = _run_body(importer, body, states + slices)
        states, scan_outs = outs[:n_state], outs[n_state:]
        if collected is None:
            collected = [[] for _ in scan_outs]
        for k, value in enumerate(scan_outs):
            collected[k].append(value)
    out_axes = list(out_axes or [0] * len(collected))
    out_dirs = list(out_dirs or [0] * len(collected))
    results = list(states)
    for k, values in enumerate(collected):
        if out_dirs[k]:
            values = values[::-1]  # reverse: iteration i fills position steps-1-i
        rank = len(bb.normalize(values[0]).ty.shape.values) + 1
        results.append(bb.emit(relax.op.stack(values, axis=out_axes[k] % rank)))
    return results


def _const_value(expr):
    from tvm.ir import GenericConst

    if isinstance(expr, GenericConst):
        return expr.value.numpy()
    return None


def _loop(importer, inputs, attr):
    import numpy as np
    from tvm import relax

    bb = importer.bb
    body = attr["body"]
    trip, cond = inputs[0], inputs[1]
    carried = list(inputs[2:])
    if trip is None:
        raise ValueError("Loop without a trip count M (condition only) cannot be unrolled")
    trip_value = _const_value(trip)
    if trip_value is None:
        raise ValueError("Loop trip count M is computed at run time: only a constant M is unrolled")
    steps = int(np.asarray(trip_value).reshape(-1)[0])
    if cond is not None:
        cond_value = _const_value(cond)
        if cond_value is None:
            raise ValueError("Loop condition is computed at run time: only a constant one is "
                             "unrolled")
        if not bool(np.asarray(cond_value).reshape(-1)[0]):
            steps = 0
    if steps <= 0:
        raise ValueError("Loop with zero iterations is not supported")
    true = relax.const(True, "bool")
    collected = None
    for t in range(steps):
        outs = _run_body(importer, body, [relax.const(t, "int64"), true] + carried)
        cond_out, carried, scan_outs = outs[0], outs[1:1 + len(carried)], outs[1 + len(carried):]
        if collected is None:
            collected = [[] for _ in scan_outs]
        for k, value in enumerate(scan_outs):
            collected[k].append(value)
        if cond_out is true or _is_bound_to(bb, cond_out, true):
            continue
        cond_value = _const_value(cond_out)
        if cond_value is None:
            raise ValueError("Loop condition depends on values computed in the body: only a "
                             "loop that runs its full trip count is unrolled")
        if not bool(np.asarray(cond_value).reshape(-1)[0]):
            break
    return carried + [bb.emit(relax.op.concat([relax.op.expand_dims(v, 0) for v in values], 0))
                      for values in collected]


def _is_bound_to(bb, var, value) -> bool:
    """Whether `var` is an emitted binding of exactly `value` (Identity of cond_in)."""
    from tvm import relax

    if not isinstance(var, relax.Var):
        return False
    return bb.lookup_binding(var) is value  # None, raising nothing, for a var with no binding
