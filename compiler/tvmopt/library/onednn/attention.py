"""Lowering of attention composites: one call over blocks of query rows, reading the fused
q/k/v projection and writing the merged heads itself where the graph does that next."""

from __future__ import annotations


import tvm
from tvm import relax

from ...passes.values import const_array
from .common import _f32_bits, _is, _use_counts
from .extension import ATTN_FUNC, ATTN_SEQ_MAJOR_K, ATTN_SEQ_MAJOR_OUT, ATTN_SEQ_MAJOR_Q, ATTN_SEQ_MAJOR_V


@relax.expr_functor.mutator
class _MergeHeads(relax.PyExprMutator):
    """An attention call read only by the head merge (b, h, s, d) -> (b, s, h, d) writes the
    merged layout itself: the call takes the permute_dims' place and var."""

    def __init__(self, mod, merges):
        super().__init__(mod)
        self.merges = merges  # permute_dims var -> (attention var, its call)
        self.skip = {a for a, _ in merges.values()}

    def visit_var_binding_(self, binding):
        if binding.var in self.skip:
            return  # emitted where its permute_dims was
        if binding.var not in self.merges:
            super().visit_var_binding_(binding)
            return
        call = self.merges[binding.var][1]
        attrs = [int(v) for v in call.args[1].fields[-1].values]
        attrs[5] |= ATTN_SEQ_MAJOR_OUT
        args = [self.visit_expr(a) for a in call.args[1].fields[:-1]]
        merged = self.builder_.normalize(relax.call_dps_packed(
            ATTN_FUNC, [*args, relax.ShapeExpr(attrs)], binding.var.ty))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, merged))


def _merge_heads(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold the head-merge transpose after each attention call into the call (_MergeHeads)."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        attn, perms = {}, {}  # attention var -> call; -> the head-merge vars reading it
        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value
                if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                    continue
                if (v.op.name == "relax.call_dps_packed"
                        and str(v.args[0].global_symbol) == ATTN_FUNC
                        and len(v.args[1].fields[-1].values) >= 6):
                    attn[b.var] = v
                elif (v.op.name == "relax.permute_dims" and v.args[0] in attn
                      and v.attrs.axes is not None
                      and tuple(int(a) for a in v.attrs.axes) == (0, 2, 1, 3)):
                    perms.setdefault(v.args[0], []).append(b.var)
        uses = _use_counts(func)
        body = func.body.body
        merges = {ps[0]: (a, attn[a]) for a, ps in perms.items()
                  if len(ps) == 1 and uses.get(a) == 1
                  and not (isinstance(body, relax.Var) and body.same_as(a))}
        if merges:
            mod[gv] = _MergeHeads(mod, merges).visit_expr(func)
    return mod


class _AttentionLowering:
    """The attention cases of `lower._Lower`."""

    def _attention(self, env, ops, call, compute):
        trans, scale, q, k, v = 0, 1.0, None, None, None
        mask, mode, fill = None, 0, 0.0
        scores = None  # the var holding the scores so far, to tell the mask operand apart
        for var, val in ops:
            name = val.op.name
            if name == "relax.permute_dims":
                trans, k = 1, self._resolve(env, val.args[0])
            elif name == "relax.matmul" and q is None:
                q = self._resolve(env, val.args[0])
                k = k if trans else self._resolve(env, val.args[1])
                scores = var
            elif name == "relax.matmul":
                v = self._resolve(env, val.args[1])
            elif name in ("relax.divide", "relax.multiply"):
                c = float(const_array(self._resolve(env, val.args[1])).reshape(-1)[0])
                scale = 1.0 / c if name == "relax.divide" else c
                scores = var
            elif name == "relax.where":
                cond, a, b = (self._resolve(env, x) for x in val.args)
                fill_true = const_array(a) is not None and not val.args[1].same_as(scores)
                const = a if fill_true else b
                mask, mode = cond, 1 if fill_true else 2
                fill = float(const_array(const).reshape(-1)[0])
            elif name == "relax.add":
                a, b = val.args
                mask, mode = self._resolve(env, b if a.same_as(scores) else a), 3
        # The head split of a transformer, (b, s, h, d) -> (b, h, s, d), is read through the
        # row stride instead of run as a transpose kernel (k's (b, h, d, s) read transposed).
        layout, offsets, heads = 0, [0, 0, 0], 0
        if (x := self._head_split(q, (0, 2, 1, 3))) is not None:
            q, layout = x, layout | ATTN_SEQ_MAJOR_Q
        if (x := self._head_split(k, (0, 2, 1, 3) if trans else (0, 2, 3, 1))) is not None:
            k, trans, layout = x, 1, layout | ATTN_SEQ_MAJOR_K
        if (x := self._head_split(v, (0, 2, 1, 3))) is not None:
            v, layout = x, layout | ATTN_SEQ_MAJOR_V
        if layout & ATTN_SEQ_MAJOR_Q:
            # q, k and v sliced out of one projection by a split: read from the projection
            # itself, (b, s, 3h, d), each from its first head on, without the split's copies
            fused = [self._fused_heads(t) for t in (q, k, v)]
            if all(f is not None for f in fused) and layout == (
                    ATTN_SEQ_MAJOR_Q | ATTN_SEQ_MAJOR_K | ATTN_SEQ_MAJOR_V):
                heads = int(q.ty.shape.values[2])
                (q, offsets[0]), (k, offsets[1]), (v, offsets[2]) = fused
        attrs = relax.ShapeExpr([trans, _f32_bits(scale), compute, mode, _f32_bits(fill),
                                 layout, *offsets, heads])
        args = [self._bf16(q, compute), self._bf16(k, compute), self._bf16(v, compute)]
        if mask is not None:
            args.append(mask)
        return relax.call_dps_packed(ATTN_FUNC, [*args, attrs], call.ty)

    def _fused_heads(self, x):
        """(view, first head) when (b, s, h, d) `x` reshapes a section of a split along the
        last axis of a (b, s, c) projection: the projection viewed (b, s, c / d, d), one view
        per projection; else None."""
        shape = getattr(x.ty, "shape", None)
        bound = self.lookup_binding(x) if isinstance(x, relax.Var) else None
        if not (_is(bound, "relax.reshape") and isinstance(bound.args[0], relax.Var)
                and shape is not None and isinstance(shape.values[3], tvm.tirx.IntImm)):
            return None
        item = self.lookup_binding(bound.args[0])
        if not (isinstance(item, relax.TupleGetItem) and isinstance(item.tuple_value, relax.Var)):
            return None
        split = self.lookup_binding(item.tuple_value)
        if not _is(split, "relax.split"):
            return None
        proj = split.args[0]
        pshape = getattr(proj.ty, "shape", None)
        if pshape is None or len(pshape.values) != 3 or int(split.attrs.axis) not in (-1, 2):
            return None
        c, d = pshape.values[2], int(shape.values[3])
        if not isinstance(c, tvm.tirx.IntImm) or int(c) % d:
            return None
        c = int(c)
        sections = split.attrs.indices_or_sections
        if isinstance(sections, tvm.tirx.IntImm):
            starts = [c // int(sections) * i for i in range(int(sections))]
        else:
            starts = [0] + [int(i) for i in sections]
        start = starts[int(item.index)]
        if start % d:
            return None
        if proj not in self.fused_of:
            b, s = pshape.values[0], pshape.values[1]
            self.fused_of[proj] = self.builder_.emit(
                relax.op.reshape(proj, relax.ShapeExpr([b, s, c // d, d])))
        return self.fused_of[proj], start // d

    def _head_split(self, x, axes):
        """The (b, s, h, d) tensor that rank-4 `x` is a permute_dims by `axes` of, else None."""
        if not isinstance(x, relax.Var):
            return None
        bound = self.lookup_binding(x)
        if not (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                and bound.op.name == "relax.permute_dims"
                and getattr(bound.args[0].ty, "ndim", None) == 4 and bound.attrs.axes is not None
                and tuple(int(a) for a in bound.attrs.axes) == axes):
            return None
        return bound.args[0]
