"""ONNX rewrites that build the variants `compare` recommends, so they can be measured.

`fold_dynamic_quantization`: the graph `onnxruntime.quantization.quantize_dynamic` writes,

    x -> DynamicQuantizeLinear -> ConvInteger/MatMulInteger(., W_q, ., W_zp) -> Cast -> Mul(s_x*s_w)

becomes `Conv/MatMul(x, (W_q - W_zp) * s_w)`: activations stay fp32, the int8 weights are
dequantized once, offline (the weight-only scheme). Embedding tables quantized as
`Gather(W_q) -> DequantizeLinear` become a Gather of the dequantized table. Whatever no longer
feeds an output is removed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import ModelError, error_line


def _consumers(graph) -> dict[str, list]:
    out = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            out[i].append(n)
    return out


def _producer(graph) -> dict[str, object]:
    return {o: n for n in graph.node for o in n.output}


def _scalar_or_vec(arr: np.ndarray) -> np.ndarray:
    return np.asarray(arr, dtype=np.float32)


def fold_dynamic_quantization(model):
    """Return (a rewritten copy of `model`, number of integer ops folded back to fp32).

    Raises:
        ModelError: the rewritten graph does not pass the ONNX checker.
    """
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    init = {i.name: i for i in g.initializer}
    arr = {name: numpy_helper.to_array(t) for name, t in init.items()}
    prod, cons = _producer(g), _consumers(g)
    graph_outputs = {o.name for o in g.output}
    new_nodes: dict[int, object] = {}  # index of the node replaced -> replacement
    drop: set[int] = set()
    index = {id(n): i for i, n in enumerate(g.node)}
    new_inits = []
    folded = 0

    def only_consumer(name, op):
        users = cons.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op and \
            name not in graph_outputs else None

    for n in g.node:
        if n.op_type not in ("ConvInteger", "MatMulInteger") or len(n.input) < 2:
            continue
        xq, wq = n.input[0], n.input[1]
        wzp = n.input[3] if len(n.input) > 3 and n.input[3] else None
        dql = prod.get(xq)
        if dql is None or dql.op_type != "DynamicQuantizeLinear" or wq not in arr:
            continue
        if wzp is not None and wzp not in arr:
            continue
        cast = only_consumer(n.output[0], "Cast")
        mul = cast and only_consumer(cast.output[0], "Mul")
        if mul is None:
            continue
        scale_in = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
        smul = prod.get(scale_in)
        if smul is None or smul.op_type != "Mul":
            continue
        w_scale = next((i for i in smul.input if i != dql.output[1]), None)
        if dql.output[1] not in smul.input or w_scale not in arr:
            continue
        w = arr[wq].astype(np.float32) - (arr[wzp].astype(np.float32) if wzp else 0.0)
        s = _scalar_or_vec(arr[w_scale])
        if n.op_type == "ConvInteger":
            s = s.reshape((-1,) + (1,) * (w.ndim - 1)) if s.size > 1 else s
            op, attrs = "Conv", {a.name: helper.get_attribute_value(a) for a in n.attribute}
        else:
            op, attrs = "MatMul", {}
        wf_name = f"{wq}_dequantized"
        new_inits.append(numpy_helper.from_array((w * s).astype(np.float32), wf_name))
        new_nodes[index[id(mul)]] = helper.make_node(
            op, [dql.input[0], wf_name], [mul.output[0]], name=f"{n.name or wq}_fp32", **attrs)
        drop.update({index[id(n)], index[id(cast)]})
        folded += 1

    # Gather(W_q, ids) -> DequantizeLinear(., s, zp) with per-tensor s, zp: gather fp32 instead
    for n in g.node:
        if n.op_type != "DequantizeLinear" or len(n.input) < 2:
            continue
        gather = prod.get(n.input[0])
        if gather is None or gather.op_type != "Gather" or gather.input[0] not in arr:
            continue
        if only_consumer(gather.output[0], "DequantizeLinear") is None:
            continue
        s_name = n.input[1]
        zp_name = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if s_name not in arr or (zp_name and zp_name not in arr) or arr[s_name].size != 1:
            continue
        zp = arr[zp_name].astype(np.float32) if zp_name else 0.0
        table = (arr[gather.input[0]].astype(np.float32) - zp) * arr[s_name].astype(np.float32)
        tname = f"{gather.input[0]}_dequantized"
        new_inits.append(numpy_helper.from_array(table.astype(np.float32), tname))
        attrs = {a.name: helper.get_attribute_value(a) for a in gather.attribute}
        new_nodes[index[id(n)]] = helper.make_node("Gather", [tname, gather.input[1]],
                                                   [n.output[0]], name=f"{gather.name}_fp32",
                                                   **attrs)
        drop.add(index[id(gather)])
        folded += 1

    if not folded:
        return m, 0
    nodes = [new_nodes.get(i, node) for i, node in enumerate(g.node) if i not in drop]
    g.initializer.extend(new_inits)
    del g.node[:]
    g.node.extend(_live(nodes, graph_outputs))
    used = {i for node in g.node for i in node.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    try:
        onnx.checker.check_model(m)
    except Exception as err:  # onnx raises ValidationError and friends
        raise ModelError(f"folding dynamic quantization produced an invalid graph: "
                         f"{error_line(err, '')}") from None
    return m, folded


def _live(nodes: list, outputs: set[str]) -> list:
    """Nodes something downstream of a graph output still needs, in their order."""
    needed = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    return keep[::-1]


def has_dynamic_quantization(model) -> bool:
    """The graph computes integer products from run-time quantized activations."""
    ops = {n.op_type for n in model.graph.node}
    return "DynamicQuantizeLinear" in ops and bool(ops & {"ConvInteger", "MatMulInteger"})
