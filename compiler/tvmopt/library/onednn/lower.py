"""Composite functions -> `R.call_dps_packed` calls of the extension (`lower`).

`_Lower` rewrites each call of a `tvmopt_onednn.*` composite into the packed call with its
int64 attrs; its int8 and attention cases live in `int8_lower` and `attention`. bf16 calls whose
every reader converts to bf16 return bf16 themselves.
"""

from __future__ import annotations


import numpy as np
import tvm
from tvm import relax

from ...passes.values import const_array, scalar_value, static_f32_shape
from .attention import _AttentionLowering, _merge_heads
from .checks import _other_operand
from .common import _composite_ops, _f32_bits, _use_counts
from .extension import ACT_CLIP, ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SWISH, ATTN_FUNC, BMM_FUNC, COMPUTE, CONV_FUNC, LAYOUT_AUTO, MATMUL_FUNC, _PREFIX
from .int8_lower import _Int8Lowering
from .partition import composites, is_quantized, partition


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator, _Int8Lowering, _AttentionLowering):
    def __init__(self, mod, layout, compute):
        super().__init__(mod)
        self.mod_ = mod
        self.layout = layout
        self.compute = compute  # GlobalVar -> "fp32" | "bf16"
        self.bf16_of = {}  # an fp32 operand -> its bf16 copy, within the current block
        self.fused_of = {}  # a fused q/k/v projection -> its (b, s, heads, d) view, ditto
        self.uses = {}  # var -> number of uses in the function being lowered

    def visit_binding_block_(self, block):
        self.bf16_of, self.fused_of = {}, {}  # made in one block, not visible in the next
        return super().visit_binding_block_(block)

    def visit_dataflow_block_(self, block):
        self.bf16_of, self.fused_of = {}, {}
        return super().visit_dataflow_block_(block)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, relax.GlobalVar):
            return call
        func = self.mod_[call.op]
        if not isinstance(func, relax.Function) or func.attrs is None:
            return call
        comp = func.attrs.get("Composite")
        if comp is None or not str(comp).startswith(_PREFIX):
            return call
        env = {p: a for p, a in zip(func.params, call.args)}
        ops = _composite_ops(func)
        if str(comp).startswith(_PREFIX + "qmatmul_dynamic"):
            return self._dynamic(env, ops, call)
        if str(comp).startswith(_PREFIX + "qconv2d_dynamic"):
            return self._dynamic_conv(env, ops, call)
        if str(comp).startswith(_PREFIX + "q"):
            return self._quantized(env, ops, call)
        compute = COMPUTE[self.compute.get(call.op, "fp32")]
        if str(comp).startswith(_PREFIX + "conv2d"):
            return self._conv(env, ops, call, compute)
        if str(comp).startswith(_PREFIX + "bmm"):
            return self._bmm(env, ops, call, compute)
        if str(comp).startswith(_PREFIX + "attention"):
            return self._attention(env, ops, call, compute)
        return self._matmul(env, ops, call, compute)

    @staticmethod
    def _resolve(env, e):
        return env.get(e, e)

    def _clip(self, env, name, val, lo, hi):
        """The clip bounds (lo, hi) after one of _CLIPS in a composite's chain."""
        if name == "relax.clip":
            return scalar_value(val.args[1]), scalar_value(val.args[2])
        bound = scalar_value(self._resolve(env, val.args[1]))
        return (bound, hi) if name == "relax.maximum" else (lo, bound)

    def _bf16(self, x, compute):
        """A bf16 call's activation operand, converted by an astype before the call.

        The fusion phase folds the astype into the TIR kernel that produces x (a norm, a
        transpose, a pool), which then writes bf16, half the bytes, instead of the call
        converting x on every run; between two library calls `_bf16_outputs` makes the
        producing call write bf16 directly. An fp32 call, or x already bf16, is unchanged.
        """
        if compute != COMPUTE["bf16"] or str(getattr(x.ty, "dtype", "")) != "float32":
            return x
        if isinstance(x, relax.Var):
            # bf16 -> fp32 -> bf16 is exact: take the bf16 tensor as it was
            bound = self.lookup_binding(x)
            if (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                    and bound.op.name == "relax.astype"
                    and str(getattr(bound.args[0].ty, "dtype", "")) == "bfloat16"):
                return bound.args[0]
        if x not in self.bf16_of:  # one copy for every call that reads x (q, k and v)
            self.bf16_of[x] = self.builder_.emit(relax.op.astype(x, "bfloat16"))
        return self.bf16_of[x]

    def _conv(self, env, ops, call, compute):
        (conv_var, conv), rest = ops[0], ops[1:]
        a = conv.attrs
        args = [self._bf16(self._resolve(env, conv.args[0]), compute),
                self._resolve(env, conv.args[1])]
        bias = residual = None
        act, lo, hi, post = ACT_NONE, -np.inf, np.inf, ACT_NONE
        chain = conv_var
        seen_res = False
        for var, val in rest:
            name = val.op.name
            if name == "relax.add":
                other = self._resolve(env, _other_operand(val, chain))
                arr = const_array(other)
                # A constant that broadcasts over the channels is the bias; a full-shape
                # tensor (constant or not) is the residual.
                if (bias is None and act == ACT_NONE and not seen_res and arr is not None
                        and static_f32_shape(other) != static_f32_shape(call)):
                    bias = relax.const(arr.reshape(-1).astype(np.float32), "float32")
                else:
                    residual, seen_res = other, True
            elif name == "relax.nn.relu":
                if seen_res:
                    post = ACT_RELU
                else:
                    act = ACT_RELU
            elif name == "relax.clip":
                act = ACT_CLIP
                lo, hi = scalar_value(val.args[1]), scalar_value(val.args[2])
            elif name == "relax.maximum":
                act = ACT_CLIP
                lo = scalar_value(self._resolve(env, val.args[1]))
            elif name == "relax.minimum":
                act = ACT_CLIP
                hi = scalar_value(self._resolve(env, val.args[1]))
            elif name in ("relax.sigmoid", "relax.multiply"):  # the two halves of x*sigmoid(x)
                act = ACT_SWISH
                if name == "relax.sigmoid":
                    continue  # the chain goes on from the multiply
            else:
                raise ValueError(f"unexpected op {name} in oneDNN conv composite")
            chain = var
        if bias is not None:
            args.append(bias)
        if residual is not None:
            args.append(self._bf16(residual, compute))
        pad = [int(p) for p in a.padding]
        attrs = [int(a.strides[0]), int(a.strides[1]), pad[0], pad[1], pad[2], pad[3],
                 int(a.dilation[0]), int(a.dilation[1]), int(a.groups),
                 int(bias is not None), int(residual is not None), act, _f32_bits(lo),
                 _f32_bits(hi), post, self.layout,
                 int(a.data_layout == "NHWC") + int(a.kernel_layout == "HWIO"), compute]
        args.append(relax.ShapeExpr(attrs))
        return relax.call_dps_packed(CONV_FUNC, args, call.ty)

    def _matmul(self, env, ops, call, compute):
        (mm_var, mm), rest = ops[0], ops[1:]
        args = [self._bf16(self._resolve(env, mm.args[0]), compute),
                self._resolve(env, mm.args[1])]
        bias = residual = None
        act = ACT_NONE
        chain = mm_var
        for var, val in rest:
            name = val.op.name
            if name == "relax.add":
                other = self._resolve(env, _other_operand(val, chain))
                arr = const_array(other)
                if bias is None and residual is None and arr is not None:
                    bias = relax.const(arr.reshape(-1).astype(np.float32), "float32")
                else:
                    residual = other
            elif name == "relax.sigmoid":
                continue  # x*sigmoid(x): the multiply that follows sets the activation
            else:
                act = {"relax.nn.relu": ACT_RELU, "relax.nn.gelu": ACT_GELU_ERF,
                       "relax.nn.gelu_tanh": ACT_GELU_TANH, "relax.multiply": ACT_SWISH}[name]
            chain = var
        if bias is not None:
            args.append(bias)
        if residual is not None:
            args.append(residual)
        args.append(relax.ShapeExpr([0, int(bias is not None), act, compute,
                                     int(residual is not None)]))
        return relax.call_dps_packed(MATMUL_FUNC, args, call.ty)


    def _bmm(self, env, ops, call, compute):
        trans, scale, a, b = 0, 1.0, None, None
        for _, val in ops:
            name = val.op.name
            if name == "relax.permute_dims":
                trans, b = 1, self._resolve(env, val.args[0])
            elif name == "relax.matmul":
                a = self._resolve(env, val.args[0])
                b = b if trans else self._resolve(env, val.args[1])
            else:
                c = float(const_array(self._resolve(env, val.args[1])).reshape(-1)[0])
                scale = 1.0 / c if name == "relax.divide" else c
        attrs = relax.ShapeExpr([trans, _f32_bits(scale), compute])
        return relax.call_dps_packed(
            BMM_FUNC, [self._bf16(a, compute), self._bf16(b, compute), attrs], call.ty)


_BF16_OUT_FUNCS = (CONV_FUNC, MATMUL_FUNC, BMM_FUNC, ATTN_FUNC)


def _bf16_astype_of(e):
    """The operand of `e` when `e` is an astype to bf16, else None."""
    if (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
            and e.op.name == "relax.astype" and str(e.attrs.dtype) == "bfloat16"):
        return e.args[0]
    return None


@relax.expr_functor.mutator
class _Bf16Outputs(relax.PyExprMutator):
    """A library call whose every use is an astype to bf16 (the next bf16 calls' operands)
    writes bf16 itself, so nothing converts between two bf16 library kernels (oneDNN rounds
    the fp32 accumulator to bf16 as it stores, after bias, activation and residual)."""

    def __init__(self, mod, narrowed):
        super().__init__(mod)
        self.narrowed = narrowed  # vars of the calls to narrow

    def visit_var_binding_(self, binding):
        value = binding.value
        if binding.var in self.narrowed:
            new = self.visit_expr(value)
            ty = new.ty
            call = relax.call_dps_packed(value.args[0], list(new.args[1].fields),
                                         relax.TensorType(ty.shape, "bfloat16"))
            var = self.builder_.emit(call, binding.var.name)
            self.set_var_remap(binding.var, var)
            return
        if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == "relax.astype" and value.args[0] in self.narrowed):
            self.set_var_remap(binding.var, self.visit_expr(value.args[0]))
            return
        super().visit_var_binding_(binding)


def _compute_of(call) -> int | None:
    """The compute precision entry of a library call's attrs: attention's third, a matmul's
    fourth, the last of a conv2d / batch_matmul."""
    attrs = call.args[1].fields[-1]
    if not isinstance(attrs, relax.ShapeExpr) or not attrs.values:
        return None
    where = {ATTN_FUNC: 2, MATMUL_FUNC: 3}.get(str(call.args[0].global_symbol), -1)
    entry = attrs.values[where]
    return int(entry.value) if isinstance(entry, tvm.tirx.IntImm) else None


def _bf16_outputs(mod: tvm.IRModule) -> tvm.IRModule:
    """Narrow to bf16 the output of each bf16 library call that only bf16 astypes read."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        calls, casts, aliased = set(), {}, set()
        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value
                if (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                        and v.op.name == "relax.call_dps_packed"
                        and str(v.args[0].global_symbol) in _BF16_OUT_FUNCS
                        and str(getattr(v.ty, "dtype", "")) == "float32"
                        and _compute_of(v) == COMPUTE["bf16"]):
                    calls.add(b.var)
                elif isinstance(v, relax.Var):  # `z = y` or a match_cast: a plain use
                    aliased.add(v)
                elif _bf16_astype_of(v) is not None:
                    casts[v.args[0]] = casts.get(v.args[0], 0) + 1
        uses = _use_counts(func)
        body = func.body.body
        narrowed = {v for v in calls
                    if casts.get(v, 0) and uses.get(v) == casts[v] and v not in aliased
                    and not (isinstance(body, relax.Var) and body.same_as(v))}
        if narrowed:
            mod[gv] = _Bf16Outputs(mod, narrowed).visit_expr(func)
    return mod


def lower(mod: tvm.IRModule, keep=None, conv_layout: int = LAYOUT_AUTO,
          compute: dict | str | None = None) -> tvm.IRModule:
    """Composite groups -> ``R.call_dps_packed`` calls; groups not in `keep` (a set of
    GlobalVars; None: all) are inlined back as the plain ops they were.

    Args:
        compute: the compute precision of the library calls: one name from COMPUTE for every
            group, or a dict GlobalVar -> name (groups missing from it: fp32).
    """
    # A copy: the caller may lower the same partitioned module again (the dispatch timing
    # lowers it once per compute precision).
    mod = mod.clone()
    groups = composites(mod)
    back = {gv: f for gv, f in groups.items() if keep is not None and gv not in keep}
    if isinstance(compute, str):
        compute = dict.fromkeys(groups, compute)
    lowered = _Lower(mod, conv_layout, compute or {})
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and gv not in groups:
            if back:
                func = func.inline_functions(back)
            lowered.uses = _use_counts(func)
            mod[gv] = lowered.visit_expr(func)
    mod = _bf16_outputs(_merge_heads(mod))
    if back:
        # Inlining binds each composite parameter to its argument (`param_2 = R.const(0.0)`):
        # propagated back into the ops, a kernel left to codegen is the very function the
        # all-codegen pipeline fuses (clip bounds as immediates, not scalar buffers), so it
        # builds as well and a tuning record of it matches.
        mod = relax.transform.CanonicalizeBindings()(mod)
    if any(is_quantized(f) for f in back.values()):
        # Inlined int8 groups bring back their weights' dequantize (fold it into fp32 constants
        # again: a build would otherwise dequantize them on every run) and their private
        # copies of shared quantize/dequantize pairs.
        mod = tvm.ir.transform.Sequential([relax.transform.FoldConstant(),
                                           relax.transform.EliminateCommonSubexpr()])(mod)
    return relax.transform.DeadCodeElimination()(mod)


def dispatch_onednn(mod: tvm.IRModule, conv: bool = True, matmul: bool = True,
                    conv_layout: int = LAYOUT_AUTO, nhwc: bool = False) -> tvm.IRModule:
    """Replace supported conv2d / matmul chains with ``R.call_dps_packed`` oneDNN calls.

    Runs on high-level Relax (after import, DecomposeOpsForInference and FoldConstant, before
    LegalizeOps). Everything it does not match is left for the normal pipeline.

    ``nhwc`` first converts convolutions to NHWC/OHWI with relax's ConvertLayout (transposes
    only at the graph's layout boundaries). oneDNN's fast fp32 kernels want channels-last
    activations, so NCHW in and out of every call costs two activation reorders per conv.
    """
    return lower(partition(mod, conv, matmul, nhwc), None, conv_layout)
