"""Dataflow patterns of the fp32 chains oneDNN takes: convolution, matmul and batch matmul
with their bias, residual and activation, and attention (scores, mask, softmax, values)."""

from __future__ import annotations


from tvm.relax.dpl import is_const, is_op, wildcard

from .extension import _PREFIX


def _swish(x):
    """x * sigmoid(x) (SiLU), either operand order: what exporters write for torch's SiLU."""
    s = is_op("relax.sigmoid")(x)
    return is_op("relax.multiply")(x, s) | is_op("relax.multiply")(s, x)


def _act_patterns(x):
    return {
        "relu": is_op("relax.nn.relu")(x),
        "clip": is_op("relax.clip")(x, wildcard(), wildcard())
        | is_op("relax.minimum")(is_op("relax.maximum")(x, is_const()), is_const()),
        "swish": _swish(x),
    }


def _conv_patterns():
    """conv2d [+bias] [+relu|clip|swish] [+residual [+relu]], largest first."""
    pats = []
    for res in (2, 1, 0):  # 2: residual then relu, 1: residual, 0: none
        for act in ("relu", "clip", "swish", None):
            for bias in (True, False):
                conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
                ann = {"conv": conv}
                x = conv
                name = "conv2d"
                if bias:
                    x = is_op("relax.add")(x, is_const())
                    ann["bias"] = x
                    name += "_bias"
                if act:
                    x = _act_patterns(x)[act]
                    ann["act"] = x
                    name += "_" + act
                if res:
                    x = is_op("relax.add")(x, wildcard())
                    ann["res"] = x
                    name += "_res"
                    if res == 2:
                        x = is_op("relax.nn.relu")(x)
                        ann["post"] = x
                        name += "_relu"
                pats.append((_PREFIX + name, x, ann))
    return pats


def _matmul_patterns():
    """matmul [+bias] [+relu|gelu|swish] or matmul [+bias] + residual (a transformer's
    projection back into its residual stream), largest first."""
    pats = []
    for res in (True, False):
        for act in ((None,) if res else ("relu", "gelu", "gelu_tanh", "swish", None)):
            for bias in (True, False):
                mm = is_op("relax.matmul")(wildcard(), is_const())
                ann = {"matmul": mm}
                x = mm
                name = "matmul"
                if bias:
                    x = is_op("relax.add")(x, is_const())
                    ann["bias"] = x
                    name += "_bias"
                if act == "swish":
                    x = _swish(x)
                elif act:
                    x = is_op({"relu": "relax.nn.relu", "gelu": "relax.nn.gelu",
                               "gelu_tanh": "relax.nn.gelu_tanh"}[act])(x)
                    ann["act"] = x
                    name += "_" + act
                if res:
                    x = is_op("relax.add")(x, wildcard())
                    ann["res"] = x
                    name += "_res"
                pats.append((_PREFIX + name, x, ann))
    return pats


def _scores(trans: bool, scale: str | None, name: str):
    """matmul(a, b) [b a transpose of its last two axes] [scaled by a constant]: the start of
    the bmm and attention patterns; (pattern, annotations, composite name)."""
    b = is_op("relax.permute_dims")(wildcard()) if trans else wildcard()
    mm = is_op("relax.matmul")(wildcard(), b)
    ann = {"matmul": mm}
    if trans:
        ann["transpose"] = b
        name += "_tb" if name == "bmm" else "_tk"
    x = mm
    if scale:
        x = is_op(scale)(mm, is_const())
        ann["scale"] = x
        name += "_scale"
    return x, ann, name


def _bmm_patterns():
    """A matmul of two activations (attention's scores q.k^T and weighted sum p.v), its b
    optionally a transpose of the last two axes (read through strides) and its output optionally
    scaled by a constant."""
    # Longest first: the first pattern that matches takes the matmul, so a scale-less one
    # listed before would leave the scale as a kernel of its own.
    return [(_PREFIX + name, x, ann)
            for trans in (True, False) for scale in ("relax.divide", "relax.multiply", None)
            for x, ann, name in [_scores(trans, scale, "bmm")]]


def _attention_patterns():
    """softmax(q.k^T [scaled] [masked]).v over the last axis: attention's steps as one call
    that keeps each block of scores in cache (k's transpose read through strides, as in bmm)
    and forks its threads once, over heads and blocks; at any length it timed no slower than
    the two batch matmuls and the softmax between them. The mask is a where() filling the
    scores with a constant (a causal or padding mask) or an added bias."""
    pats = []
    for trans in (True, False):
        for scale in ("relax.divide", "relax.multiply", None):
            for mask in ("fill_true", "fill_false", "add", None):
                x, ann, name = _scores(trans, scale, "attention")
                if mask == "fill_true":  # where(mask, fill, scores)
                    x = is_op("relax.where")(wildcard(), is_const(), x)
                elif mask == "fill_false":  # where(mask, scores, fill)
                    x = is_op("relax.where")(wildcard(), x, is_const())
                elif mask == "add":
                    x = is_op("relax.add")(x, wildcard())
                if mask:
                    ann["mask"] = x
                    name += "_mask_" + mask
                sm = is_op("relax.nn.softmax")(x)
                out = is_op("relax.matmul")(sm, wildcard())
                ann.update(softmax=sm, weighted=out)
                pats.append((_PREFIX + name, out, ann))
    return pats
