"""Lowering of the int8 composites: QDQ convolutions and matmuls into the int8 packed calls
(int8 compute, fp32 output, as the QDQ graph defines it), and dynamically quantized ones
(activation quantized inside the call)."""

from __future__ import annotations


import numpy as np
from tvm import relax

from ...passes.values import const_array, static_f32_shape
from .checks import _other_operand
from .common import _CLIPS, _binding_of, _f32_bits, _is
from .extension import ACT_CLIP, ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE, ACT_RELU, QCONV_FUNC, QMATMUL_FUNC
from .int8_patterns import _int_weight


class _Int8Lowering:
    """The int8 cases of `lower._Lower`."""

    def _quantized(self, env, ops, call):
        """A qconv2d / qmatmul composite -> the int8 packed call."""
        values = dict(ops)
        const = lambda e: const_array(self._resolve(env, e))  # noqa: E731
        anchor_var, anchor = next((v, c) for v, c in ops
                                  if c.op.name in ("relax.nn.conv2d", "relax.matmul"))
        x, wdq = (values.get(e, e) for e in anchor.args[:2])
        src_nchw = int(x.op.name == "relax.permute_dims")
        deq = values[x.args[0]] if src_nchw else x
        quant = values.get(deq.args[0])  # None: the composite starts at the dequantize
        src_int8 = int(quant is None)
        if quant is not None:
            scale, zp = (float(const(quant.args[1]).reshape(())),
                         int(const(quant.args[2]).reshape(())))
            signed = int(str(quant.attrs.out_dtype) == "int8")
            data = self._resolve(env, quant.args[0])
        else:
            scale, zp = float(const(deq.args[1]).reshape(())), int(const(deq.args[2]).reshape(()))
            data = self._resolve(env, deq.args[0])
            signed = int(str(data.ty.dtype) == "int8")
            fp32 = self._single_use_quantize(data, scale, zp, signed)
            if fp32 is not None:  # quantized in the call instead, as the QDQ patterns do
                data, src_int8 = fp32, 0
        weight = relax.const(const(wdq.args[0]), "int8")
        wscale = relax.const(const(wdq.args[1]).reshape(-1).astype(np.float32), "float32")
        bias = residual = None
        act, lo, hi = ACT_NONE, -np.inf, np.inf
        out_q, post_relu = [0, 0, 0], 0  # signed, scale bits, zero point of the output QDQ
        dst_q = None  # the same of a quantize ending the chain: the call's output is 8-bit
        seen, prev = False, anchor_var
        for var, val in ops:
            if var.same_as(anchor_var):
                seen = True
                continue
            if not seen:
                continue
            name = val.op.name
            last, prev = prev, var
            if name == "relax.quantize":
                q_attrs = [int(str(val.attrs.out_dtype) == "int8"),
                           _f32_bits(float(const(val.args[1]).reshape(()))),
                           int(const(val.args[2]).reshape(()))]
                if var.same_as(ops[-1][0]):
                    dst_q = q_attrs
                else:
                    out_q = q_attrs
            elif name == "relax.dequantize":
                continue
            elif name == "relax.add" and residual is None and out_q[1]:
                residual = self._resolve(env, _other_operand(val, last))
            elif name == "relax.nn.relu" and residual is not None:
                post_relu = 1
            elif name == "relax.add":
                other = [a for a in val.args if const_array(self._resolve(env, a)) is not None]
                bias = relax.const(const(other[0]).reshape(-1).astype(np.float32), "float32")
            elif name in _CLIPS:
                act, (lo, hi) = ACT_CLIP, self._clip(env, name, val, lo, hi)
            else:
                act = {"relax.nn.relu": ACT_RELU, "relax.nn.gelu": ACT_GELU_ERF,
                       "relax.nn.gelu_tanh": ACT_GELU_TANH}[name]
        args = [data, weight, wscale] + ([bias] if bias is not None else [])
        quant_attrs = [signed, _f32_bits(scale), zp]
        if anchor.op.name != "relax.matmul" and residual is not None:
            args.append(residual)
        if anchor.op.name == "relax.matmul":
            attrs = [0, int(bias is not None), act, *quant_attrs]
            return relax.call_dps_packed(QMATMUL_FUNC, [*args, relax.ShapeExpr(attrs)], call.ty)
        a = anchor.attrs
        pad = [int(p) for p in a.padding]
        attrs = [int(a.strides[0]), int(a.strides[1]), *pad, int(a.dilation[0]),
                 int(a.dilation[1]), int(a.groups), int(bias is not None), act, _f32_bits(lo),
                 _f32_bits(hi), int(a.data_layout == "NHWC") + int(a.kernel_layout == "HWIO"),
                 src_nchw, *quant_attrs]
        if residual is not None or src_int8 or dst_q:
            attrs += [int(residual is not None), *out_q, post_relu]
        if src_int8 or dst_q:
            attrs += [0, src_int8, int(dst_q is not None), *(dst_q or [0, 0, 0])]
        return relax.call_dps_packed(QCONV_FUNC, [*args, relax.ShapeExpr(attrs)], call.ty)

    def _single_use_quantize(self, data, scale: float, zp: int, signed: int):
        """The fp32 input of the per-tensor quantize that wrote `data` with these parameters
        when the call is its only reader (so it need not exist on its own); None otherwise."""
        if self.uses.get(data, 0) != 1:
            return None
        q = _binding_of(self, data)
        if not _is(q, "relax.quantize") or static_f32_shape(q.args[0]) is None:
            return None
        s, z = const_array(q.args[1]), const_array(q.args[2])
        if s is None or z is None or s.size != 1 or z.size != 1:
            return None
        same = (float(s.reshape(())) == scale and int(z.reshape(())) == zp
                and int(str(q.attrs.out_dtype) == "int8") == signed)
        return q.args[0] if same else None

    def _dynamic(self, env, ops, call):
        """A qmatmul_dynamic composite -> qmatmul with the input's quantization computed in
        the call (the graph's min/max -> scale chain outside becomes dead code)."""
        const = lambda e: const_array(self._resolve(env, e))  # noqa: E731
        values = dict(ops)
        quant = next(c for _, c in ops if c.op.name == "relax.quantize")
        mm_var, mm = next((v, c) for v, c in ops if c.op.name == "relax.matmul")
        w = values.get(mm.args[1], mm.args[1])
        if isinstance(w, relax.Call):  # int32 weight minus its (zero) zero point
            w = w.args[0]
        weight = relax.const(const(w).astype(np.int8), "int8")
        wscale = bias = None
        act = ACT_NONE
        for var, val in ops:
            name = val.op.name
            if name == "relax.multiply" and wscale is None and any(
                    a.same_as(quant.args[1]) for a in val.args):
                other = [a for a in val.args if not a.same_as(quant.args[1])][0]
                wscale = const(other).reshape(-1).astype(np.float32)
            elif name == "relax.add":
                other = [a for a in val.args if const_array(self._resolve(env, a)) is not None]
                bias = relax.const(const(other[0]).reshape(-1).astype(np.float32), "float32")
            elif name in ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh"):
                act = {"relax.nn.relu": ACT_RELU, "relax.nn.gelu": ACT_GELU_ERF,
                       "relax.nn.gelu_tanh": ACT_GELU_TANH}[name]
        args = [self._resolve(env, quant.args[0]), weight, relax.const(wscale, "float32")]
        if bias is not None:
            args.append(bias)
        # trans_b, has_bias, act, src signed / scale / zero point (unused), dynamic
        attrs = [0, int(bias is not None), act, 0, 0, 0, 1]
        return relax.call_dps_packed(QMATMUL_FUNC, [*args, relax.ShapeExpr(attrs)], call.ty)

    def _dynamic_conv(self, env, ops, call):
        """A qconv2d_dynamic composite -> qconv2d quantizing its input at run time (kQDynamic);
        the graph's min/max -> scale chain outside becomes dead code."""
        values = dict(ops)
        look = lambda e: values.get(e, self._resolve(env, e))  # noqa: E731
        const = lambda e: const_array(look(e))  # noqa: E731
        quant = next(c for _, c in ops if c.op.name == "relax.quantize")
        conv_var, conv = next((v, c) for v, c in ops if c.op.name == "relax.nn.conv2d")
        lead = values.get(quant.args[0])
        lead = lead if lead is not None and lead.op.name == "relax.permute_dims" else None
        data = self._resolve(env, lead.args[0] if lead is not None else quant.args[0])
        inp = values.get(conv.args[0])
        src_nchw = int(lead is None and inp.op.name == "relax.permute_dims")
        weight = relax.const(_int_weight(conv.args[1], look).astype(np.int8), "int8")
        # x_scale * w_scale, wherever it is bound
        sc = next(c for _, c in ops if c.op.name == "relax.multiply"
                  and any(a.same_as(quant.args[1]) for a in c.args))
        wscale = const(next(a for a in sc.args if not a.same_as(quant.args[1])))
        wscale = wscale.reshape(-1).astype(np.float32)
        bias = residual = None
        act, lo, hi, post_relu = ACT_NONE, -np.inf, np.inf, 0
        seen = False
        for var, val in ops:
            if var.same_as(conv_var):
                seen = True
                continue
            name = val.op.name
            if not seen or val.same_as(sc) or name in ("relax.astype", "relax.multiply"):
                continue
            if name == "relax.add":
                consts = [a for a in val.args if const(a) is not None]
                if consts and bias is None and residual is None and act == ACT_NONE:
                    bias = relax.const(const(consts[0]).reshape(-1).astype(np.float32),
                                       "float32")
                else:
                    residual = next(self._resolve(env, a) for a in val.args
                                    if not any(a.same_as(v) for v in values))
            elif name == "relax.nn.relu":
                if residual is not None:
                    post_relu = 1
                else:
                    act = ACT_RELU
            elif name in _CLIPS:
                act, (lo, hi) = ACT_CLIP, self._clip(env, name, val, lo, hi)
            else:
                raise ValueError(f"unexpected op {name} in oneDNN dynamic int8 conv composite")
        args = [data, weight, relax.const(wscale, "float32")]
        args += [t for t in (bias, residual) if t is not None]
        a = conv.attrs
        pad = [int(p) for p in a.padding]
        attrs = [int(a.strides[0]), int(a.strides[1]), *pad, int(a.dilation[0]),
                 int(a.dilation[1]), int(a.groups), int(bias is not None), act, _f32_bits(lo),
                 _f32_bits(hi), int(a.data_layout == "NHWC") + int(a.kernel_layout == "HWIO"),
                 src_nchw, 0, 0, 0,
                 # a plain residual (no output QDQ: out scale 0), then the dynamic flag
                 int(residual is not None), 0, 0, 0, post_relu, 1, 0, 0, 0, 0, 0]
        return relax.call_dps_packed(QCONV_FUNC, [*args, relax.ShapeExpr(attrs)], call.ty)
