"""Offload fp32 conv2d / matmul chains of a Relax module to oneDNN, and a QDQ model's
quantized ones to oneDNN's int8 kernels.

Two halves:

* ``build_extension`` / ``load_extension`` compile ``onednn_ext.cc`` (next to this file) into a
  tvm-ffi library that registers the global functions ``tvmopt.onednn.conv2d`` and
  ``tvmopt.onednn.matmul``. The Relax VM resolves ``R.call_dps_packed`` names in the global
  function registry when it runs, so the library must be loaded in the process first (also
  before running an exported module that was built with ``dispatch_onednn``).
* ``dispatch_onednn`` rewrites high-level Relax ops (before ``LegalizeOps``) into
  ``R.call_dps_packed`` calls of those functions.

QDQ models: ``record_qdq_weights`` (before constant folding) notes each weight that is the
dequantize of an int8 constant; ``partition(..., int8=True)`` puts those int8 weights back in
front of the convolutions and matmuls whose input is a quantize/dequantize pair and groups them
as ``tvmopt_onednn.qconv2d*`` / ``qmatmul*`` composites, lowered to ``tvmopt.onednn.qconv2d`` /
``qmatmul`` (int8 compute, fp32 output, as the QDQ graph defines it).

The calling convention (argument order and the int64 attrs vector) is shared with
``onednn_ext.cc``: change both together. ``R.call_dps_packed`` passes the listed arguments
and then the output tensor, so the attrs ``R.shape`` sits just before the output.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi

from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..files import cache_root
from .layout import (_const_array, _f32_shape, _scalar, _static_f32_shape, channels_last,
                     lift_clip)

CONV_FUNC = "tvmopt.onednn.conv2d"
MATMUL_FUNC = "tvmopt.onednn.matmul"
QCONV_FUNC = "tvmopt.onednn.qconv2d"
QMATMUL_FUNC = "tvmopt.onednn.qmatmul"
BMM_FUNC = "tvmopt.onednn.batch_matmul"
ATTN_FUNC = "tvmopt.onednn.attention"
# attention's layout attr: a bit per tensor given (batch, seq, heads, d), not (batch, heads, ...)
ATTN_SEQ_MAJOR_Q, ATTN_SEQ_MAJOR_K, ATTN_SEQ_MAJOR_V, ATTN_SEQ_MAJOR_OUT = 1, 2, 4, 8
_PREFIX = "tvmopt_onednn."
_SOURCE = Path(__file__).with_name("onednn_ext.cc")  # shipped inside the package

# Activation codes understood by onednn_ext.cc.
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_GELU_ERF, ACT_GELU_TANH, ACT_SWISH = 0, 1, 2, 3, 4, 5
# Conv layout modes: let oneDNN pick blocked activation layouts (reordered around each call),
# or pin activations to NCHW.
LAYOUT_AUTO, LAYOUT_PLAIN = 0, 1
# Compute precisions understood by onednn_ext.cc (the last attrs entry of both calls): bf16
# converts activations and weights to bf16 inside the call, accumulates and returns fp32.
COMPUTE = {"fp32": 0, "bf16": 1}
# Module attribute holding the int8 weights of a QDQ model: [[int8 tensor, fp32 scales, axis]].
QDQ_WEIGHTS_ATTR = "tvmopt.qdq_weights"
# CPU flags (/proc/cpuinfo names) of int8 dot-product units. Without one oneDNN still runs u8s8
# kernels, but on vpmaddubsw, whose int16 intermediate sums saturate: wrong results, and slow.
INT8_FEATURES = ("amx_int8", "avx512_vnni", "avx_vnni")

_loaded: dict[str, object] = {}


# --------------------------------------------------------------------------------------------
# Building and loading the extension
# --------------------------------------------------------------------------------------------


def find_onednn(root: str | None = None) -> tuple[Path, Path]:
    """Return (include_dir, lib_dir) of a oneDNN install with dnnl.hpp and libdnnl.so.

    PyPI's ``onednn-devel-cpu-gomp`` wheels put their files under the install prefix's
    ``include/`` and ``lib/`` (``pip install --prefix DIR`` or a venv), not in site-packages.
    """
    candidates = []
    for r in (root, os.environ.get("TVMOPT_ONEDNN_ROOT"), sys.prefix, sys.base_prefix,
              "/usr/local", "/usr"):
        if r:
            candidates.append(Path(r))
    for r in candidates:
        inc = r / "include"
        for lib in (r / "lib", r / "lib64", r / "lib" / "x86_64-linux-gnu"):
            if (inc / "dnnl.hpp").exists() and glob.glob(str(lib / "libdnnl.so*")):
                return inc, lib
    raise FileNotFoundError(
        "oneDNN not found (need include/dnnl.hpp and lib/libdnnl.so); install "
        "onednn-cpu-gomp + onednn-devel-cpu-gomp or set TVMOPT_ONEDNN_ROOT. Searched: "
        + ", ".join(str(c) for c in candidates)
    )


def _dnnl_header(inc: Path, name: str) -> str:
    # The top-level headers are shims that include oneapi/dnnl/<name>.
    real = inc / "oneapi" / "dnnl" / name
    return (real if real.exists() else inc / name).read_text()


def _onednn_version(inc: Path) -> str:
    text = _dnnl_header(inc, "dnnl_version.h")
    parts = [re.search(rf"#define DNNL_VERSION_{k}\s+(\S+)", text) for k in
             ("MAJOR", "MINOR", "PATCH", "HASH")]
    return ".".join(m.group(1).strip('"') for m in parts if m)


def _threading_runtime(inc: Path) -> str:
    text = _dnnl_header(inc, "dnnl_config.h")
    m = re.search(r"#define DNNL_CPU_THREADING_RUNTIME\s+DNNL_RUNTIME_(\w+)", text)
    return m.group(1) if m else "UNKNOWN"


def build_extension(cache_dir: str | os.PathLike, onednn_root: str | None = None) -> str:
    """Compile the extension once per (source, oneDNN, tvm-ffi, flags); return the .so path.

    Raises FileNotFoundError when oneDNN is missing and RuntimeError when compiling fails.
    """
    inc, lib = find_onednn(onednn_root)
    threading = _threading_runtime(inc)
    if threading not in ("OMP", "SEQ"):
        # TBB/SYCL builds need Intel runtimes that the PyPI wheels pull in separately
        # (a SYCL build needs the DPC++ runtime); the thread control below assumes OpenMP.
        raise RuntimeError(f"oneDNN at {inc.parent} uses {threading} threading; need OMP")
    cflags = ["-O3", "-DNDEBUG", "-fopenmp"]
    ldflags = [f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}", "-fopenmp", "-ldl"]
    key = "\n".join([
        _SOURCE.read_text(), _onednn_version(inc), str(lib), tvm_ffi.__version__,
        " ".join(cflags + ldflags),
    ])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    build_dir = Path(cache_dir) / f"tvmopt_onednn_{digest}"
    out = build_dir / "tvmopt_onednn.so"
    if out.exists():
        return str(out)
    return tvm_ffi.cpp.build(
        name="tvmopt_onednn",
        sources=[str(_SOURCE)],
        extra_cflags=cflags,
        extra_ldflags=ldflags,
        extra_include_paths=[str(inc)],
        build_directory=str(build_dir),
    )


def load_extension(cache_dir: str | os.PathLike | None = None, num_threads: int | None = None):
    """Build if needed and load the extension, registering the ``tvmopt.onednn.*`` globals.

    ``num_threads`` overrides TVM_NUM_THREADS for oneDNN's OpenMP pool; None keeps the
    environment's choice (TVM_NUM_THREADS, else OpenMP's default).
    """
    if cache_dir is None and _loaded and num_threads is None:
        return next(iter(_loaded.values()))  # one extension per process is enough
    if cache_dir is None:
        cache_dir = cache_root()
    path = build_extension(cache_dir)
    # libgomp's default wait policy (spin briefly, then sleep) is kept: a model's kernels all
    # run on this one OpenMP team (share_pool), and waking sleeping workers for each of them
    # (OMP_WAIT_POLICY=PASSIVE) would add a wake-up to every kernel call.
    if path not in _loaded:
        # Keep the module object alive: the registered globals point into the library.
        _loaded[path] = tvm_ffi.load_module(path)
    if num_threads is not None:
        tvm_ffi.get_global_func("tvmopt.onednn.set_num_threads")(int(num_threads))
    return _loaded[path]


def share_pool(library_path: str) -> bool:
    """Run a loaded TVM library's parallel loops on oneDNN's OpenMP team (one pool per model:
    two pools on the same cores slow each other down at every hand-over). False when the
    library keeps TVM's pool; it is then correct, only slower beside oneDNN."""
    f = tvm_ffi.get_global_func("tvmopt.onednn.share_pool", allow_missing=True)
    return bool(f(str(library_path))) if f is not None else False


def load_library(library_path: str):
    """Load a compiled library that calls oneDNN kernels, its TVM kernels on oneDNN's team:
    how an artifact runs, and so how the dispatch timing must run the library side too."""
    import tvm

    lib = tvm.runtime.load_module(str(library_path))
    share_pool(library_path)
    return lib


def extension_id() -> str:
    """Identity of the extension's source, for caches of what it measured."""
    return hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# QDQ models: int8 weights survive constant folding
# --------------------------------------------------------------------------------------------


def int8_unavailable(features) -> str | None:
    """Why int8 library kernels are not offered on a CPU with these flags; None if they are."""
    if any(f in features for f in INT8_FEATURES):
        return None
    return ("no int8 dot-product instructions (needs " + ", ".join(INT8_FEATURES) +
            "); QDQ convolutions and matmuls stay fp32")


def _dequantized_weight(call) -> bool:
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
            and call.op.name == "relax.dequantize"):
        return False
    q, scale, zp = (_const_array(a) for a in call.args[:3])
    return (q is not None and q.dtype == np.int8 and scale is not None
            and scale.dtype == np.float32 and zp is not None and not zp.any())


def record_qdq_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Note every dequantize of an int8 constant (zero point 0) in a module attribute.

    FoldConstant turns them into fp32 constants, and ConvertLayout then transposes those;
    `partition` finds them again by value to give the int8 kernels their int8 weights.
    """
    found = []

    def visit(e):
        if _dequantized_weight(e):
            found.append([e.args[0].value, e.args[1].value, int(e.attrs.axis)])

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return mod.with_attr(QDQ_WEIGHTS_ATTR, found) if found else mod


@tvm.transform.module_pass(opt_level=0, name="tvmopt.RecordQDQWeights")
def RecordQDQWeights(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return record_qdq_weights(mod)


def strip_qdq_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """The module without the recorded int8 weights (they must not reach the build)."""
    return mod.without_attr(QDQ_WEIGHTS_ATTR) if mod.get_attr(QDQ_WEIGHTS_ATTR) else mod


class _WeightTable:
    """Recorded int8 weights, looked up by the fp32 constant they fold to, in any axis order."""

    def __init__(self, entries):
        self.entries = []
        for q, scale, axis in entries:
            q, scale = q.numpy(), scale.numpy()
            shape = [1] * q.ndim
            if scale.size > 1:
                shape[int(axis) % q.ndim] = scale.size
            deq = (q.astype(np.float32) * scale.reshape(shape)).astype(np.float32)
            self.entries.append((q, scale, int(axis) % q.ndim, deq))

    def find(self, w: np.ndarray):
        """(int8 weight laid out as w, scales, axis of the scales in w) or None."""
        import itertools

        for q, scale, axis, deq in self.entries:
            if sorted(deq.shape) != sorted(w.shape):
                continue
            for perm in itertools.permutations(range(w.ndim)):
                if tuple(deq.shape[p] for p in perm) != w.shape:
                    continue
                if np.allclose(deq.transpose(perm), w, rtol=1e-6, atol=0):
                    return np.ascontiguousarray(q.transpose(perm)), scale, perm.index(axis)
        return None


def _binding_of(mutator, e):
    if isinstance(e, relax.Var):
        try:
            return mutator.lookup_binding(e)
        except Exception:  # noqa: BLE001 - not bound in this function (a parameter)
            return None
    return None


def _is(e, name) -> bool:
    return isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name


@relax.expr_functor.mutator
class _QDQOperands(relax.PyExprMutator):
    """conv2d / matmul operands of a QDQ model made matchable by the int8 patterns.

    The weight: its recorded int8 constant dequantized again, in the layout the fp32 constant
    has now (the legalized build folds it back). The input: a private copy of its
    quantize -> dequantize [-> transpose] chain, since one pair often feeds several consumers
    (a block input, a residual) and a fused group may not share its intermediates.
    """

    def __init__(self, mod, table):
        super().__init__(mod)
        self.table = table

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (_is(call, "relax.nn.conv2d") or _is(call, "relax.matmul")):
            return call
        x = self._private_qdq(call.args[0])
        w = _const_array(call.args[1])
        if x is None or w is None or w.dtype != np.float32:
            return call
        found = self.table.find(w)
        if found is None:
            return call
        q, scale, axis = found
        zp = np.zeros(scale.shape, np.int8)
        weight = relax.op.dequantize(relax.const(q, "int8"), relax.const(scale, "float32"),
                                     relax.const(zp, "int8"), axis=axis, out_dtype="float32")
        return relax.Call(call.op, [x, weight], call.attrs, call.ty_args)

    def _private_qdq(self, x):
        chain = []
        e = _binding_of(self, x)
        if _is(e, "relax.permute_dims"):
            chain.append(e)
            e = _binding_of(self, e.args[0])
        if not _is(e, "relax.dequantize"):
            return None
        deq, quant = e, _binding_of(self, e.args[0])
        if not _is(quant, "relax.quantize"):
            return None
        out = relax.Call(quant.op, quant.args, quant.attrs, quant.ty_args)
        out = relax.Call(deq.op, [out, *deq.args[1:]], deq.attrs, deq.ty_args)
        for c in chain:
            out = relax.Call(c.op, [out, *c.args[1:]], c.attrs, c.ty_args)
        return out


@relax.expr_functor.mutator
class _DynamicOperands(relax.PyExprMutator):
    """Integer matmuls of a dynamically quantized model, each given a private copy of its
    input's quantize -> widen -> minus zero point chain: onnxruntime quantizes an activation
    once for all the matmuls reading it (Q, K and V of an attention block), and a fused group
    may not share its intermediates. Copies the int8 patterns leave are merged again."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if _is(call, "relax.matmul"):
            if str(call.attrs.out_dtype) != "int32":
                return call
        elif not _int32_conv(call):
            return call
        # A convolution's input may be transposed into its layout, and the quantize's input
        # out of it (ConvertLayout's doing): those transposes are copied too.
        into = _binding_of(self, call.args[0])
        into = into if _is(call, "relax.nn.conv2d") and _is(into, "relax.permute_dims") else None
        sub = _binding_of(self, into.args[0] if into is not None else call.args[0])
        if not _is(sub, "relax.subtract"):
            return call
        wide, zp = (_binding_of(self, a) for a in sub.args)
        if not (_is(wide, "relax.astype") and _is(zp, "relax.astype")):
            return call
        quant = _binding_of(self, wide.args[0])
        if not _is(quant, "relax.quantize"):
            return call
        copy = lambda c, *args: relax.Call(c.op, list(args), c.attrs, c.ty_args)  # noqa: E731
        lead = _binding_of(self, quant.args[0]) if into is not None else None
        data = copy(lead, *lead.args) if _is(lead, "relax.permute_dims") else quant.args[0]
        q = copy(quant, data, *quant.args[1:])
        x = copy(sub, copy(wide, q), copy(zp, *zp.args))
        if into is not None:
            x = copy(into, x)
        return relax.Call(call.op, [x, *call.args[1:]], call.attrs, call.ty_args)


def _private_dynamic(mod: tvm.IRModule) -> tvm.IRModule:
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _DynamicOperands(mod).visit_expr(func)
    return mod


def _restore_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    entries = mod.get_attr(QDQ_WEIGHTS_ATTR)
    if not entries:
        return mod
    table = _WeightTable(entries)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _QDQOperands(mod, table).visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


# --------------------------------------------------------------------------------------------
# Patterns
# --------------------------------------------------------------------------------------------


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


def _qdq_input(permute: bool):
    """quantize -> dequantize of an activation [-> transpose into the convolution's layout]."""
    q = is_op("relax.quantize")(wildcard(), is_const(), is_const())
    d = is_op("relax.dequantize")(q, is_const(), is_const())
    return (is_op("relax.permute_dims")(d) if permute else d), q, d


def _int8_weight():
    return is_op("relax.dequantize")(is_const(), is_const(), is_const())


def _int8_input(permute: bool):
    """dequantize of an 8-bit activation [-> transpose into the convolution's layout]: the
    output of another int8 call, or of a quantize left outside (`lower` may take it in)."""
    d = is_op("relax.dequantize")(wildcard(), is_const(), is_const())
    return (is_op("relax.permute_dims")(d) if permute else d), None, d


def _qconv_patterns():
    """conv2d of a QDQ input and an int8 weight [+bias] [+relu|clip] [QDQ of the output
    + residual [+relu]], largest first. The residual join of a QDQ ResNet block is
    dequantize(quantize(conv)) + residual: post-ops of the int8 call instead of TVM kernels.

    Every chain starts at the dequantize of its 8-bit input (`_u8`), whoever wrote it: so
    the quantize before it stays free for the chain that produces its input, whose output is
    then quantized in its int8 call (`_q`), and consecutive int8 convolutions pass u8/s8
    tensors, with no quantize / dequantize kernel between them. A quantize no call took, read
    by one call only, goes into that call when it is lowered (fp32 in)."""
    pats = []
    for res in (2, 1):  # 2: residual then relu, 1: residual
        pats += [p for p in _qconv_chain_patterns(res, src_int8=True)]
    pats += [p for p in _qconv_chain_patterns(0, src_int8=True, quantize_out=True)]
    pats += [p for p in _qconv_chain_patterns(0, src_int8=True)]
    return pats


def _qconv_chain_patterns(res: int, src_int8: bool = False, quantize_out: bool = False):
    pats = []
    for act in ("relu", "clip", None):
        for bias in (True, False):
            for permute in (True, False):
                x, q, d = (_int8_input if src_int8 else _qdq_input)(permute)
                w = _int8_weight()
                conv = is_op("relax.nn.conv2d")(x, w)
                ann = {"conv": conv, "dequantize": d, "weight": w, "input": x}
                if q is not None:
                    ann["quantize"] = q
                out, name = conv, "qconv2d_u8" if src_int8 else "qconv2d"
                if bias:
                    out = is_op("relax.add")(out, is_const())
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = _act_patterns(out)[act]
                    ann["act"], name = out, name + "_" + act
                if res:
                    oq = is_op("relax.quantize")(out, is_const(), is_const())
                    od = is_op("relax.dequantize")(oq, is_const(), is_const())
                    r = wildcard()
                    out = is_op("relax.add")(od, r) | is_op("relax.add")(r, od)
                    ann.update(out_quantize=oq, out_dequantize=od, res=out)
                    name += "_res"
                    if res == 2:
                        out = is_op("relax.nn.relu")(out)
                        ann["post"], name = out, name + "_relu"
                if quantize_out:
                    out = is_op("relax.quantize")(out, is_const(), is_const())
                    ann["quantize_out"], name = out, name + "_q"
                pats.append((_PREFIX + name, out, ann))
    return pats


def _qmatmul_patterns():
    pats = []
    for act in ("relu", "gelu", "gelu_tanh", None):
        for bias in (True, False):
            x, q, d = _qdq_input(False)
            w = _int8_weight()
            mm = is_op("relax.matmul")(x, w)
            ann = {"matmul": mm, "quantize": q, "dequantize": d, "weight": w}
            out, name = mm, "qmatmul"
            if bias:
                out = is_op("relax.add")(out, is_const())
                ann["bias"], name = out, name + "_bias"
            if act:
                out = is_op({"relu": "relax.nn.relu", "gelu": "relax.nn.gelu",
                             "gelu_tanh": "relax.nn.gelu_tanh"}[act])(out)
                ann["act"], name = out, name + "_" + act
            pats.append((_PREFIX + name, out, ann))
    return pats


def _dynamic_input():
    """ONNX DynamicQuantizeLinear + MatMulInteger's input side as imported: the activation
    quantized to u8 with run-time (scale, zero point), widened to int32, minus the zero point."""
    x, scale, zp = wildcard(), wildcard(), wildcard()
    q = is_op("relax.quantize")(x, scale, zp)
    d = is_op("relax.subtract")(is_op("relax.astype")(q), is_op("relax.astype")(zp))
    return d, q, scale


def _dqmatmul_patterns():
    """MatMulInteger of a dynamically quantized activation and a constant int8 weight (widened
    to int32, minus its zero point), cast to fp32, times x_scale * w_scale [+bias] [+act]."""
    pats = []
    for act in ("relu", "gelu", "gelu_tanh", None):
        for bias in (True, False):
            for wzp in (True, False):
                d, q, scale = _dynamic_input()
                w = is_const()
                wzpc = is_const()
                wq = is_op("relax.subtract")(w, is_op("relax.astype")(wzpc)) if wzp else w
                mm = is_op("relax.matmul")(d, wq)
                f = is_op("relax.astype")(mm)
                sc = is_op("relax.multiply")(scale, is_const())
                out = is_op("relax.multiply")(f, sc) | is_op("relax.multiply")(sc, f)
                ann = {"matmul": mm, "quantize": q, "weight": w,
                       "scales": sc, "scaled": out}
                if wzp:
                    ann["weight_zp"] = wzpc
                name = "qmatmul_dynamic"
                if bias:
                    out = is_op("relax.add")(out, is_const()) | is_op("relax.add")(is_const(), out)
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = is_op({"relu": "relax.nn.relu", "gelu": "relax.nn.gelu",
                                 "gelu_tanh": "relax.nn.gelu_tanh"}[act])(out)
                    ann["act"], name = out, name + "_" + act
                pats.append((_PREFIX + name, out, ann))
    return pats


def _dqconv_patterns():
    """ConvInteger of a dynamically quantized activation and a constant int8-valued weight, as
    imported and moved to NHWC: [transpose to NCHW ->] quantize with the run-time (scale, zero
    point) -> widen -> minus the zero point -> [transpose to NHWC ->] int32 conv2d, cast to
    fp32, times x_scale * w_scale [+bias] [+relu|clip] [+residual [+relu]]. The transposes
    around the quantize are ConvertLayout's (relax.quantize has no layout rule): taken into the
    call, they cancel."""
    pats = []
    for res in (2, 1, 0):  # 2: residual then relu, 1: residual, 0: none
        for act in ("relu", "clip", None):
            for bias in (True, False):
                x = is_op("relax.permute_dims")(wildcard()) | wildcard()
                scale, zp = wildcard(), wildcard()
                q = is_op("relax.quantize")(x, scale, zp)
                d = is_op("relax.subtract")(is_op("relax.astype")(q), is_op("relax.astype")(zp))
                d = is_op("relax.permute_dims")(d) | d
                w = is_const() | is_op("relax.subtract")(is_const(),
                                                         is_op("relax.astype")(is_const()))
                w = is_op("relax.permute_dims")(w) | w
                conv = is_op("relax.nn.conv2d")(d, w)
                f = is_op("relax.astype")(conv)
                sc = is_op("relax.multiply")(scale, is_const())
                out = is_op("relax.multiply")(f, sc) | is_op("relax.multiply")(sc, f)
                ann = {"conv": conv, "quantize": q, "input": d, "weight": w, "scales": sc,
                       "scaled": out}
                name = "qconv2d_dynamic"
                if bias:
                    out = is_op("relax.add")(out, is_const()) | is_op("relax.add")(is_const(), out)
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = _act_patterns(out)[act]
                    ann["act"], name = out, name + "_" + act
                if res:
                    r = wildcard()
                    out = is_op("relax.add")(out, r) | is_op("relax.add")(r, out)
                    ann["res"], name = out, name + "_res"
                    if res == 2:
                        out = is_op("relax.nn.relu")(out)
                        ann["post"], name = out, name + "_relu"
                pats.append((_PREFIX + name, out, ann))
    return pats


def _leaks(ctx) -> bool:
    """True if an intermediate of the match is used outside it (it would be lost)."""
    defined = set(ctx.matched_bindings.keys())
    out_var = ctx.value_to_bound_var[ctx.matched_expr]
    for v in ctx.matched_bindings.keys():
        if v == out_var:
            continue
        if not isinstance(v, relax.DataflowVar):
            return True
        if any(u not in defined for u in ctx.var_usages.get(v, [])):
            return True
    return False


def _other_operand(add_call, chain_expr, ctx=None):
    """The operand of a binary op that is not the matched chain (given as expr or its var)."""
    chain = [chain_expr]
    if ctx is not None and chain_expr in ctx.value_to_bound_var:
        chain.append(ctx.value_to_bound_var[chain_expr])
    a, b = add_call.args
    if any(a.same_as(c) for c in chain):
        return b
    if any(b.same_as(c) for c in chain):
        return a
    return None


def _bias_ok(bias_expr, channels: int, ndim_out: int, channel_axis: int) -> bool:
    shape = _static_f32_shape(bias_expr)
    if shape is None or int(np.prod(shape)) != channels or len(shape) > ndim_out:
        return False
    # Broadcasts along the channel axis only: (C,1,1), (1,C,1,1) for conv; (N,), (1,N) for matmul.
    full = [1] * (ndim_out - len(shape)) + shape
    return all(d == 1 for i, d in enumerate(full) if i != channel_axis)


def _clip_bounds(call, ctx) -> tuple[float, float] | None:
    """(lo, hi) of R.clip(x, lo, hi) or R.minimum(R.maximum(x, lo), hi) with scalar bounds."""
    if call.op.name == "relax.clip":
        lo, hi = _scalar(call.args[1]), _scalar(call.args[2])
    else:
        inner = call.args[0]
        inner = ctx.matched_bindings.get(inner, inner)
        if not isinstance(inner, relax.Call) or inner.op.name != "relax.maximum":
            return None
        lo, hi = _scalar(inner.args[1]), _scalar(call.args[1])
    if lo is None or hi is None:
        return None
    return lo, hi


# The activation/weight layouts the extension's convolutions take.
_CONV_LAYOUTS = (("NCHW", "OIHW", "NCHW"), ("NHWC", "OHWI", "NHWC"), ("NHWC", "HWIO", "NHWC"))


def _conv_layouts_ok(attrs) -> bool:
    return (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) in _CONV_LAYOUTS


def _conv_act_shape(e) -> list | None:
    """A convolution activation's 4 dims: static, but for the batch, which may be symbolic
    (a model exported with a dynamic batch): the extension makes one primitive per batch size
    it meets, as it does per row count for a dense layer."""
    dims = _f32_shape(e)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[1:]):
        return None
    return dims


def _same_shape(x, y) -> bool:
    return x is not None and y is not None and len(x) == len(y) and all(map(_same_dim, x, y))


def _check_conv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv = ann["conv"]
    a = conv.attrs
    if not _conv_layouts_ok(a):
        return False
    if a.out_dtype not in (None, "", "float32"):
        return False
    c_axis = 1 if a.data_layout == "NCHW" else 3
    data_s, out_s = _conv_act_shape(conv.args[0]), _conv_act_shape(conv)
    w_s = _static_f32_shape(conv.args[1])
    if data_s is None or w_s is None or out_s is None:
        return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], conv, ctx), out_s[c_axis], 4, c_axis):
            return False
    if "act" in ann and ann["act"].op.name in ("relax.clip", "relax.minimum"):
        if _clip_bounds(ann["act"], ctx) is None:
            return False
    if "res" in ann:
        res = ann["res"]
        prev = ann.get("act", ann.get("bias", conv))
        other = _other_operand(res, prev, ctx)
        # The residual must already have the output's shape: the sum post-op does not broadcast.
        if other is None or not _same_shape(_f32_shape(other), out_s) or \
                not _same_shape(_f32_shape(res), out_s):
            return False
        # conv -> relu -> add(relu, conv) would make the residual a value computed inside the
        # fused region, which the packed call cannot receive as an input.
        if any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True


def _check_matmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    b_s = _static_f32_shape(mm.args[1])
    if b_s is None:
        return False
    if len(b_s) == 2:
        # A dense layer: a's leading dims fold into the rows, so they may be symbolic (dynamic
        # batch / sequence); the library makes one primitive per row count it meets.
        a_s, o_s = _f32_shape(mm.args[0]), _f32_shape(mm)
        if a_s is None or o_s is None or not isinstance(a_s[-1], int) or \
                not isinstance(o_s[-1], int):
            return False
    else:
        a_s, o_s = _static_f32_shape(mm.args[0]), _static_f32_shape(mm)
        if a_s is None or o_s is None:
            return False
    if mm.attrs.out_dtype not in (None, "", "float32"):
        return False
    if len(a_s) < 2 or len(b_s) < 2 or len(o_s) > 4 or len(a_s) > 4:
        return False
    if len(b_s) > 2:
        # Batched constant b: same rank as a, each batch dim equal or broadcast from 1.
        if len(b_s) != len(a_s) or any(bd not in (1, ad) for ad, bd in zip(a_s[:-2], b_s[:-2])):
            return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], mm, ctx), o_s[-1], len(o_s), len(o_s) - 1):
            return False
    if "res" in ann:
        other = _other_operand(ann["res"], ann.get("bias", mm), ctx)
        # A tensor of the output's own shape (the sum post-op does not broadcast), from
        # outside the match, and not a constant (a second bias).
        r_s = _f32_shape(other) if other is not None else None
        if (r_s is None or len(r_s) != len(o_s) or not all(map(_same_dim, r_s, o_s))
                or _const_array(other) is not None
                or any(other.same_as(v) for v in ctx.matched_bindings.keys())):
            return False
    return True


def _same_dim(x, y) -> bool:
    if isinstance(x, int) or isinstance(y, int):
        return isinstance(x, int) and isinstance(y, int) and x == y
    return tvm_ffi.structural.structural_equal(x, y, map_free_vars=False)


def _check_bmm(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    b = mm.args[1]
    if "transpose" in ann:
        t = ann["transpose"]
        b = t.args[0]
        nd = len(_f32_shape(b) or [])
        axes = None if t.attrs.axes is None else [int(a) for a in t.attrs.axes]
        if nd < 2 or (axes or list(range(nd))[::-1]) != [*range(nd - 2), nd - 1, nd - 2]:
            return False
    a_s, b_s, o_s = _f32_shape(mm.args[0]), _f32_shape(b), _f32_shape(mm)
    if a_s is None or b_s is None or o_s is None or _const_array(b) is not None:
        return False
    if mm.attrs.out_dtype not in (None, "", "float32"):
        return False
    if not 2 <= len(a_s) <= 4 or len(b_s) != len(a_s) or len(o_s) != len(a_s):
        return False
    # Batch dims equal, or 1 on one side (what the library broadcasts).
    for x, y in zip(a_s[:-2], b_s[:-2]):
        if not (_same_dim(x, y) or x == 1 or y == 1):
            return False
    if "scale" in ann:
        arr = _const_array(ann["scale"].args[1])
        if arr is None or arr.size != 1 or not np.isfinite(arr).all() or float(arr.reshape(-1)[0]) == 0:
            return False
    return True


def _attention_mask_ok(ann, scores, ctx) -> bool:
    """The mask of an attention match: a boolean (where) or fp32 (add) tensor that broadcasts
    to the scores without changing their shape, and a where's fill a finite or -inf scalar."""
    m = ann["mask"]
    name = m.op.name
    if name == "relax.where":
        cond = m.args[0]
        fill = m.args[1] if _const_array(m.args[1]) is not None else m.args[2]
        arr = _const_array(fill)
        if arr is None or arr.size != 1 or np.isnan(arr).any():
            return False
        mask = cond
        ty = mask.ty
        if not isinstance(ty, relax.TensorType) or str(ty.dtype) not in ("bool", "uint8", "int8"):
            return False
        dims = None if ty.shape is None else [
            int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in ty.shape.values]
    else:
        mask = _other_operand(m, ann["scale"] if "scale" in ann else ann["matmul"], ctx)
        dims = _f32_shape(mask)
    if dims is None or len(dims) > len(scores):
        return False
    return all(d == 1 or _same_dim(d, s) for d, s in zip(dims[::-1], scores[::-1]))


def _check_attention(ctx) -> bool:
    """fp32 q, k, v of one rank (static or symbolic dims) with the same batch dims, the
    softmax over the scores' last axis, and a mask (if any) that broadcasts to the scores."""
    if not _check_bmm(ctx):
        return False
    ann = ctx.annotated_expr
    sm, out = ann["softmax"], ann["weighted"]
    q, v = ann["matmul"].args[0], out.args[1]
    k = ann["transpose"].args[0] if "transpose" in ann else ann["matmul"].args[1]
    shapes = [_f32_shape(e) for e in (q, k, v, ann["matmul"], out)]
    if any(s is None for s in shapes) or _const_array(v) is not None:
        return False
    q_s, k_s, v_s, s_s, o_s = shapes
    if not len(q_s) == len(k_s) == len(v_s) == len(o_s):
        return False
    if not all(_same_dim(a, b) and _same_dim(a, c)
               for a, b, c in zip(q_s[:-2], k_s[:-2], v_s[:-2])):
        return False
    if out.attrs.out_dtype not in (None, "", "float32"):
        return False
    if "mask" in ann:
        masked = _f32_shape(ann["mask"])
        if masked is None or len(masked) != len(s_s) or not all(
                _same_dim(a, b) for a, b in zip(masked, s_s)):
            return False  # the mask would broadcast the scores to a larger shape
        if not _attention_mask_ok(ann, s_s, ctx):
            return False
    return int(sm.attrs.axis) in (-1, len(s_s) - 1) and _same_dim(v_s[-2], s_s[-1])


def _qdq_pair_ok(ann) -> bool:
    """A per-tensor quantize to u8/s8 and the dequantize undoing it (same scale, zero point)."""
    q, d = ann["quantize"], ann["dequantize"]
    if str(q.attrs.out_dtype) not in ("uint8", "int8") or _static_f32_shape(q.args[0]) is None:
        return False
    qs, qz, ds, dz = (_const_array(e) for e in (*q.args[1:3], *d.args[1:3]))
    if any(a is None or a.size != 1 for a in (qs, qz, ds, dz)):
        return False
    return float(qs.reshape(())) == float(ds.reshape(())) and int(qz.reshape(())) == int(
        dz.reshape(())) and float(qs.reshape(())) > 0


def _int8_weight_ok(w, out_axis: int, ndim: int) -> bool:
    """Int8 weight with zero point 0 and one scale, or one per output channel (`out_axis`)."""
    q, scale, zp = (_const_array(e) for e in w.args[:3])
    if q is None or q.dtype != np.int8 or q.ndim != ndim or scale is None or zp is None:
        return False
    if zp.any() or scale.dtype != np.float32:
        return False
    return scale.size == 1 or (int(w.attrs.axis) % ndim == out_axis
                               and scale.size == q.shape[out_axis])


def _per_tensor_int8(q, dtype_of) -> bool:
    """A quantize / dequantize to or from u8/s8 with one constant scale (> 0) and zero point."""
    s, z = _const_array(q.args[1]), _const_array(q.args[2])
    return (dtype_of in ("uint8", "int8") and s is not None and z is not None and s.size == 1
            and z.size == 1 and float(s.reshape(())) > 0)


def _check_qconv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv = ann["conv"]
    a = conv.attrs
    if not _conv_layouts_ok(a) or a.out_dtype not in (None, "", "float32"):
        return False
    if "quantize" in ann:
        if not _qdq_pair_ok(ann) or len(_static_f32_shape(ann["quantize"].args[0]) or []) != 4:
            return False
    else:  # the 8-bit tensor another call (or a quantize outside) wrote
        d = ann["dequantize"]
        src = d.args[0]
        if not _per_tensor_int8(d, str(getattr(src.ty, "dtype", ""))) or \
                len(_static_shape(src) or []) != 4:
            return False
    if "quantize_out" in ann:
        oq = ann["quantize_out"]
        if not _per_tensor_int8(oq, str(oq.attrs.out_dtype)) or _static_shape(oq) is None:
            return False
    x = ann["input"]
    if _is(x, "relax.permute_dims") and (
            a.data_layout != "NHWC" or [int(i) for i in x.attrs.axes] != [0, 2, 3, 1]):
        return False
    if not _int8_weight_ok(ann["weight"], a.kernel_layout.index("O"), 4):
        return False
    out_s = _static_f32_shape(conv)
    if out_s is None:
        return False
    c_axis = a.data_layout.index("C")
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], conv, ctx), out_s[c_axis], 4, c_axis):
            return False
    if "act" in ann and ann["act"].op.name in ("relax.clip", "relax.minimum"):
        if _clip_bounds(ann["act"], ctx) is None:
            return False
    if "res" in ann:
        oq, odq = ann["out_quantize"], ann["out_dequantize"]
        if not _qdq_pair_ok({"quantize": oq, "dequantize": odq}):
            return False
        other = _other_operand(ann["res"], odq, ctx)
        # A residual made inside the match, or one that broadcasts, is not a sum post-op.
        if other is None or _static_f32_shape(other) != out_s or \
                any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True


def _check_qmatmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    a_s, o_s = _static_f32_shape(mm.args[0]), _static_f32_shape(mm)
    if a_s is None or o_s is None or not 2 <= len(a_s) <= 4:
        return False
    if mm.attrs.out_dtype not in (None, "", "float32") or not _qdq_pair_ok(ann):
        return False
    if not _int8_weight_ok(ann["weight"], 1, 2):
        return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], mm, ctx), o_s[-1], len(o_s), len(o_s) - 1):
            return False
    return True


def _int8_valued(arr) -> bool:
    """An integer constant whose values an s8 tensor holds (the importer widens int8 weights)."""
    return (arr is not None and arr.dtype.kind in "iu" and arr.size > 0
            and arr.min() >= -128 and arr.max() <= 127)


def _check_dqmatmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm, q = ann["matmul"], ann["quantize"]
    # Static shapes, as the other patterns: the dispatch timing runs each kernel alone.
    x_s = _static_f32_shape(q.args[0])
    w = _const_array(ann["weight"])
    if x_s is None or not 2 <= len(x_s) <= 4 or str(q.attrs.out_dtype) != "uint8":
        return False
    if not _int8_valued(w) or w.ndim != 2 or w.shape[0] != x_s[-1]:
        return False
    if "weight_zp" in ann:
        wzp = _const_array(ann["weight_zp"])
        if wzp is None or wzp.any():
            return False  # a weight zero point other than 0 is not an s8 oneDNN weight
    n = w.shape[1]
    wscale = _const_array(_other_operand(ann["scales"], q.args[1], ctx))
    if wscale is None or wscale.dtype != np.float32 or wscale.size not in (1, n):
        return False
    if "bias" in ann:
        bias = _const_array(_other_operand(ann["bias"], ann["scaled"], ctx))
        if bias is None or bias.dtype != np.float32 or bias.size != n:
            return False
    return str(mm.attrs.out_dtype) == "int32"


def _static_shape(e) -> list[int] | None:
    """A tensor's static dims, whatever its type; None if any is symbolic or unknown."""
    shape = getattr(e.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(
            isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return [int(d) for d in shape.values]


def _int_weight(e, look):
    """The integer weight a dynamic conv pattern matched (a constant [minus its zero point]
    [transposed]), as an array in the convolution's kernel layout; None unless the zero point
    is 0 (an s8 oneDNN weight has none). `look` maps a var to its bound value."""
    e = look(e)
    arr = _const_array(e)
    if arr is not None:
        return arr
    if _is(e, "relax.permute_dims"):
        inner = _int_weight(e.args[0], look)
        if inner is None:
            return None
        axes = e.attrs.axes
        return inner.transpose([int(i) for i in axes] if axes is not None else None)
    if _is(e, "relax.subtract"):
        w, wide = _const_array(look(e.args[0])), look(e.args[1])
        zp = _const_array(look(wide.args[0])) if _is(wide, "relax.astype") else None
        return w if w is not None and zp is not None and not zp.any() else None
    return None


def _check_dqconv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv, q = ann["conv"], ann["quantize"]
    a = conv.attrs
    look = lambda e: ctx.matched_bindings.get(e, e)  # noqa: E731
    if not _conv_layouts_ok(a) or str(q.attrs.out_dtype) != "uint8":
        return False
    if not _int32_conv(conv) or _static_f32_shape(q.args[0]) is None:
        return False
    # The data's layout as the call sees it: the transposes around the quantize cancel, or
    # only the one into the NHWC convolution is there (the data is then NCHW).
    lead, inp = look(q.args[0]), ann["input"]
    to_nchw = _is(lead, "relax.permute_dims")
    to_nhwc = _is(inp, "relax.permute_dims")
    if to_nchw and [int(i) for i in lead.attrs.axes] != [0, 3, 1, 2]:
        return False
    if to_nchw and not to_nhwc:
        return False
    if to_nhwc and (a.data_layout != "NHWC" or [int(i) for i in inp.attrs.axes] != [0, 2, 3, 1]):
        return False
    w = _int_weight(ann["weight"], look)
    w_shape, out_shape = _static_shape(conv.args[1]), _static_shape(conv)
    if not _int8_valued(w) or w_shape is None or list(w.shape) != w_shape or out_shape is None:
        return False
    c_axis = a.data_layout.index("C")
    n = out_shape[c_axis]
    wscale = _const_array(_other_operand(ann["scales"], q.args[1], ctx))
    if wscale is None or wscale.dtype != np.float32 or wscale.size not in (1, n):
        return False
    chain = ann["scaled"]
    if "bias" in ann:
        bias = _other_operand(ann["bias"], chain, ctx)
        if _const_array(bias) is None or not _bias_ok(bias, n, 4, c_axis):
            return False
        chain = ann["bias"]
    if "act" in ann:
        if ann["act"].op.name in ("relax.clip", "relax.minimum") and \
                _clip_bounds(ann["act"], ctx) is None:
            return False
        chain = ann["act"]
    if "res" in ann:
        other = _other_operand(ann["res"], chain, ctx)
        # A residual made inside the match, or one that broadcasts, is not a sum post-op; a
        # constant one would read as the bias.
        if other is None or _static_f32_shape(other) != out_shape or \
                _const_array(other) is not None or \
                any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True


# --------------------------------------------------------------------------------------------
# Rewriting composite functions into call_dps_packed
# --------------------------------------------------------------------------------------------


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def _composite_ops(func: relax.Function):
    """Calls of the composite body in order, each with its args mapped to outer exprs."""
    body = func.body
    calls = []
    for block in body.blocks:
        for b in block.bindings:
            calls.append((b.var, b.value))
    return calls


# The ops of a chain that bound it (ReLU6 as clip, or as maximum / minimum by constants).
_CLIPS = ("relax.clip", "relax.maximum", "relax.minimum")


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
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
            return _scalar(val.args[1]), _scalar(val.args[2])
        bound = _scalar(self._resolve(env, val.args[1]))
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
                arr = _const_array(other)
                # A constant that broadcasts over the channels is the bias; a full-shape
                # tensor (constant or not) is the residual.
                if (bias is None and act == ACT_NONE and not seen_res and arr is not None
                        and _static_f32_shape(other) != _static_f32_shape(call)):
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
                lo, hi = _scalar(val.args[1]), _scalar(val.args[2])
            elif name == "relax.maximum":
                act = ACT_CLIP
                lo = _scalar(self._resolve(env, val.args[1]))
            elif name == "relax.minimum":
                act = ACT_CLIP
                hi = _scalar(self._resolve(env, val.args[1]))
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

    def _quantized(self, env, ops, call):
        """A qconv2d / qmatmul composite -> the int8 packed call."""
        values = dict(ops)
        const = lambda e: _const_array(self._resolve(env, e))  # noqa: E731
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
                other = [a for a in val.args if _const_array(self._resolve(env, a)) is not None]
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
        if not _is(q, "relax.quantize") or _static_f32_shape(q.args[0]) is None:
            return None
        s, z = _const_array(q.args[1]), _const_array(q.args[2])
        if s is None or z is None or s.size != 1 or z.size != 1:
            return None
        same = (float(s.reshape(())) == scale and int(z.reshape(())) == zp
                and int(str(q.attrs.out_dtype) == "int8") == signed)
        return q.args[0] if same else None

    def _dynamic(self, env, ops, call):
        """A qmatmul_dynamic composite -> qmatmul with the input's quantization computed in
        the call (the graph's min/max -> scale chain outside becomes dead code)."""
        const = lambda e: _const_array(self._resolve(env, e))  # noqa: E731
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
                other = [a for a in val.args if _const_array(self._resolve(env, a)) is not None]
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
        const = lambda e: _const_array(look(e))  # noqa: E731
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
                arr = _const_array(other)
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
                c = float(_const_array(self._resolve(env, val.args[1])).reshape(-1)[0])
                scale = 1.0 / c if name == "relax.divide" else c
        attrs = relax.ShapeExpr([trans, _f32_bits(scale), compute])
        return relax.call_dps_packed(
            BMM_FUNC, [self._bf16(a, compute), self._bf16(b, compute), attrs], call.ty)


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
                c = float(_const_array(self._resolve(env, val.args[1])).reshape(-1)[0])
                scale = 1.0 / c if name == "relax.divide" else c
                scores = var
            elif name == "relax.where":
                cond, a, b = (self._resolve(env, x) for x in val.args)
                fill_true = _const_array(a) is not None and not val.args[1].same_as(scores)
                const = a if fill_true else b
                mask, mode = cond, 1 if fill_true else 2
                fill = float(_const_array(const).reshape(-1)[0])
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


def _use_counts(func) -> dict:
    counts: dict = {}

    def visit(e):
        if isinstance(e, relax.Call):
            for a in e.args:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1
        elif isinstance(e, relax.Tuple):
            for a in e.fields:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1

    relax.analysis.post_order_visit(func, visit)
    return counts


@relax.expr_functor.mutator
class _SingleUseFirst(relax.PyExprMutator):
    """Put the single-use operand of an add first.

    In add(convA, convB) where convA's output also feeds another op, only convB can absorb
    the add as a residual post-op; the matcher takes the first operand as the chain and
    does not retry the other order when the check rejects the leak.
    """

    def __init__(self, mod, counts):
        super().__init__(mod)
        self.counts = counts

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.add" and all(
                isinstance(a, relax.Var) for a in call.args):
            a, b = call.args
            if self.counts.get(a, 0) > 1 and self.counts.get(b, 0) == 1:
                return relax.op.add(b, a)
        return call


def _prepare(mod: tvm.IRModule, conv: bool, nhwc: bool) -> tvm.IRModule:
    if conv:
        # Before ConvertLayout too: it cannot see through call_tir and would wrap every
        # ReLU6 in a pair of transposes.
        mod = lift_clip(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = _SingleUseFirst(mod, _use_counts(func)).visit_expr(func)
    if conv and nhwc:
        # The weight transposes fold back into constants: the patterns need a constant weight.
        mod = tvm.ir.transform.Sequential(channels_last("OHWI"))(mod)
    return mod


def has_integer_matmul(mod: tvm.IRModule) -> bool:
    """The module has int32 matmuls (a dynamically quantized model's MatMulInteger)."""
    found = []

    def visit(e):
        if _is(e, "relax.matmul") and str(e.attrs.out_dtype) == "int32":
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)


def _int32_conv(e) -> bool:
    if not _is(e, "relax.nn.conv2d"):
        return False
    out = str(e.attrs.out_dtype or "")  # "" / None: the input's type
    return (out or str(e.args[0].ty.dtype)) == "int32"


def has_integer_conv(mod: tvm.IRModule) -> bool:
    """The module has int32 convolutions (a dynamically quantized model's ConvInteger)."""
    found = []

    def visit(e):
        if _int32_conv(e):
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)


def partition(mod: tvm.IRModule, conv: bool = True, matmul: bool = True,
              nhwc: bool = False, int8: bool = False) -> tvm.IRModule:
    """Group every chain oneDNN can take into a composite function (one per call site), for
    `lower` to turn into packed calls; nothing else changes.

    Args:
        int8: group a QDQ model's quantized convolutions / matmuls (whose int8 weights
            `record_qdq_weights` noted), and a dynamically quantized model's integer matmuls
            (``qmatmul_dynamic*``), for the int8 kernels; only for a CPU with one of
            INT8_FEATURES. Those the int8 patterns do not take are offered to the fp32 ones.
    """
    mod = _prepare(mod, conv, nhwc)
    if int8 and mod.get_attr(QDQ_WEIGHTS_ATTR):
        mod = _restore_qdq(mod)
        qpats = []
        if conv:
            qpats += [relax.transform.FusionPattern(n, p, ann, _check_qconv)
                      for n, p, ann in _qconv_patterns()]
        if matmul:
            qpats += [relax.transform.FusionPattern(n, p, ann, _check_qmatmul)
                      for n, p, ann in _qmatmul_patterns()]
        mod = relax.transform.FuseOpsByPattern(qpats, bind_constants=False)(mod)
        # Weights the int8 patterns did not take fold back into fp32 constants, and the copies
        # of shared quantize/dequantize pairs merge again.
        mod = tvm.ir.transform.Sequential([relax.transform.FoldConstant(),
                                           relax.transform.EliminateCommonSubexpr(),
                                           relax.transform.DeadCodeElimination()])(mod)
    dynamic_conv = int8 and conv and has_integer_conv(mod)
    if dynamic_conv or (int8 and matmul and has_integer_matmul(mod)):
        # onnxruntime quantize_dynamic models: MatMulInteger / ConvInteger on a
        # DynamicQuantizeLinear input.
        mod = _private_dynamic(mod)
        pats = [relax.transform.FusionPattern(n, p, ann, _check_dqconv)
                for n, p, ann in (_dqconv_patterns() if dynamic_conv else [])]
        pats += [relax.transform.FusionPattern(n, p, ann, _check_dqmatmul)
                 for n, p, ann in (_dqmatmul_patterns() if matmul else [])]
        mod = relax.transform.FuseOpsByPattern(pats, bind_constants=False)(mod)
        mod = tvm.ir.transform.Sequential([relax.transform.EliminateCommonSubexpr(),
                                           relax.transform.DeadCodeElimination()])(mod)
    mod = strip_qdq_weights(mod)
    patterns = []
    if conv:
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_conv)
                     for n, p, ann in _conv_patterns()]
    if matmul:
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_matmul)
                     for n, p, ann in _matmul_patterns()]
        # Before the single matmuls: the first pattern that matches takes its ops.
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_attention)
                     for n, p, ann in _attention_patterns()]
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_bmm)
                     for n, p, ann in _bmm_patterns()]
    if not patterns:
        return mod
    # bind_constants=False keeps weights as call arguments, so they become arguments of the
    # packed call instead of being buried in a function nobody legalizes.
    return relax.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)


def composites(mod: tvm.IRModule) -> dict:
    """GlobalVar -> composite function, for every oneDNN group `partition` made."""
    return {gv: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and str(f.attrs.get("Composite", "")).startswith(_PREFIX)}


def workload_key(func: relax.Function) -> str:
    """What a composite computes, independent of its weights: pattern, shapes, attributes."""
    anchor = next(c for _, c in _composite_ops(func)
                  if c.op.name in ("relax.nn.conv2d", "relax.matmul"))
    shapes = [str(p.ty) for p in func.params]
    attrs = anchor.attrs
    fields = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout",
              "transpose_a", "transpose_b")
    attr_text = ",".join(f"{k}={getattr(attrs, k)}" for k in fields if hasattr(attrs, k))
    return "|".join([str(func.attrs["Composite"])[len(_PREFIX):], *shapes, str(func.ret_ty),
                     attr_text])


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


def is_conv(func: relax.Function) -> bool:
    """A composite around a 2-D convolution (fp32/bf16 or int8)."""
    return any(isinstance(c, relax.Call) and isinstance(c.op, tvm.ir.Op)
               and c.op.name == "relax.nn.conv2d" for _, c in _composite_ops(func))


def is_quantized(func: relax.Function) -> bool:
    """A composite for the int8 kernels (qconv2d / qmatmul)."""
    return str(func.attrs.get("Composite", "")).startswith(_PREFIX + "q")


def is_dynamic(func: relax.Function) -> bool:
    """A composite for a dynamically quantized integer matmul or convolution
    (qmatmul_dynamic, qconv2d_dynamic)."""
    return str(func.attrs.get("Composite", "")).startswith(
        (_PREFIX + "qmatmul_dynamic", _PREFIX + "qconv2d_dynamic"))


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


# --------------------------------------------------------------------------------------------
# Recurrent layers: a whole ONNX LSTM / GRU / RNN node on oneDNN's RNN primitives
# --------------------------------------------------------------------------------------------

RNN_FUNC = "tvmopt.onednn.rnn"
# Cell codes and vanilla-RNN activation codes understood by onednn_ext.cc (tvmopt.onednn.rnn).
RNN_CELLS = {"LSTM": 0, "GRU": 1, "GRU_LBR": 2, "RNN": 3}
RNN_ACTS = {"Tanh": 0, "Relu": 1, "Sigmoid": 2}
# ONNX gate order -> oneDNN's, as indices into the ONNX gates: LSTM i o f c -> i f c o; GRU's
# z r h is oneDNN's u r o; LSTM peepholes i o f -> i f o.
_LSTM_GATES = (0, 2, 3, 1)
_PEEPHOLE_ORDER = (0, 2, 1)
_RNN_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _recurrent_acts(op: str, attrs: dict, dirs: int) -> list[str]:
    names = [str(a) for a in attrs.get("activations") or []]
    if not names:
        return _RNN_DEFAULT_ACTS.get(op, ["Tanh"]) * dirs
    per_dir = len(_RNN_DEFAULT_ACTS.get(op, ["Tanh"]))
    return names * 2 if dirs == 2 and len(names) == per_dir else names


def recurrent_unsupported(spec: dict, args) -> str | None:
    """Why oneDNN's RNN primitives cannot run this node (a passes.recurrent spec with its call
    arguments); None when they can."""
    from ..passes.recurrent import RECURRENT_ATTR  # noqa: F401 - the spec's producer

    op, attrs, names = spec["op"], spec["attrs"], spec["inputs"]
    by_name = dict(zip(names, args))
    if str(by_name["X"].ty.dtype) != "float32":
        return f"{by_name['X'].ty.dtype} input"
    for w in ("W", "R", "B", "P"):
        if w in by_name and _const_array(by_name[w]) is None:
            return f"{w} is not a constant"
    if attrs.get("clip") is not None:
        return "clip"
    if attrs.get("input_forget"):
        return "input_forget"
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    acts = _recurrent_acts(op, attrs, dirs)
    if op == "RNN":
        if len(set(acts)) != 1 or acts[0] not in RNN_ACTS:
            return f"activations {acts}"
    elif acts != _RNN_DEFAULT_ACTS[op] * dirs:
        return f"activations {acts}"
    return None


def _recurrent_weights(spec: dict, by_name: dict):
    """The ONNX constants in oneDNN's logical layouts: w_layer [1, D, I, G, H], w_iter
    [1, D, H, G, H] (ldigo), bias [1, D, Gb, H], peephole [1, D, 3, H] or None."""
    op, attrs = spec["op"], spec["attrs"]
    w, r = _const_array(by_name["W"]), _const_array(by_name["R"])
    dirs, gh, inp = w.shape
    hidden = r.shape[-1]
    gates = gh // hidden
    order = list(_LSTM_GATES) if op == "LSTM" else list(range(gates))
    b = (_const_array(by_name["B"]) if "B" in by_name
         else np.zeros((dirs, 2 * gh), np.float32))

    def ldigo(m, k):  # [D, G*H, K] -> [1, D, K, G, H], gates in oneDNN's order
        m = m.reshape(dirs, gates, hidden, k)[:, order]
        return np.ascontiguousarray(m.transpose(0, 3, 1, 2)[None], dtype=np.float32)

    wb = b[:, :gh].reshape(dirs, gates, hidden)[:, order]
    rb = b[:, gh:].reshape(dirs, gates, hidden)[:, order]
    lbr = op == "GRU" and attrs.get("linear_before_reset", 0)
    if lbr:  # the candidate's recurrent bias stays inside the reset product: a fourth row
        bias = np.concatenate([wb[:, :2] + rb[:, :2], wb[:, 2:], rb[:, 2:]], axis=1)
    else:
        bias = wb + rb
    peep = None
    if "P" in by_name:
        p = _const_array(by_name["P"]).reshape(dirs, 3, hidden)[:, list(_PEEPHOLE_ORDER)]
        peep = np.ascontiguousarray(p[None], dtype=np.float32)
    return (ldigo(w, inp), ldigo(r, hidden),
            np.ascontiguousarray(bias[None], dtype=np.float32), peep)


def _recurrent_call(bb, spec: dict, args):
    """Emit the library call for one node; returns the tuple (Y, Y_h[, Y_c]) in the node's
    layout."""
    op, attrs = spec["op"], spec["attrs"]
    by_name = dict(zip(spec["inputs"], args))
    w_layer, w_iter, bias, peep = _recurrent_weights(spec, by_name)
    dirs, hidden = w_iter.shape[1], w_iter.shape[2]
    layout = attrs.get("layout", 0)
    x = by_name["X"]
    if layout:  # [B, T, I] -> [T, B, I]; states [B, D, H] -> [D, B, H]
        x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
    steps, batch = x.ty.shape.values[0], x.ty.shape.values[1]
    call_args = [x, relax.const(w_layer), relax.const(w_iter), relax.const(bias)]
    if peep is not None:
        call_args.append(relax.const(peep))
    states = []
    for name in ("initial_h", "initial_c"):
        s = by_name.get(name)
        if s is not None and layout:
            s = bb.emit(relax.op.permute_dims(s, [1, 0, 2]))
        states.append(s)
    call_args += [s for s in states if s is not None]
    lens = by_name.get("sequence_lens")
    if lens is not None:
        call_args.append(lens)
    cell = "GRU_LBR" if op == "GRU" and attrs.get("linear_before_reset", 0) else op
    acts = _recurrent_acts(op, attrs, dirs)
    attr_vals = [RNN_CELLS[cell], dirs, int(attrs.get("direction") == "reverse"),
                 RNN_ACTS.get(acts[0], 0) if op == "RNN" else 0, int(peep is not None),
                 int(states[0] is not None), int(states[1] is not None), int(lens is not None)]
    call_args.append(relax.ShapeExpr(attr_vals))
    dtype = "float32"
    out = [relax.TensorType([steps, dirs, batch, hidden], dtype),
           relax.TensorType([dirs, batch, hidden], dtype)]
    if op == "LSTM":
        out.append(relax.TensorType([dirs, batch, hidden], dtype))
    res = bb.emit(relax.call_dps_packed(RNN_FUNC, call_args, out))
    fields = [bb.emit(relax.TupleGetItem(res, i)) for i in range(len(out))]
    if layout:
        fields[0] = bb.emit(relax.op.permute_dims(fields[0], [2, 0, 1, 3]))
        fields[1:] = [bb.emit(relax.op.permute_dims(f, [1, 0, 2])) for f in fields[1:]]
    return relax.Tuple(fields)


@relax.expr_functor.mutator
class _LowerRecurrent(relax.PyExprMutator):
    def __init__(self, mod, chosen: dict):
        super().__init__(mod)
        self.chosen = chosen  # GlobalVar -> spec

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, relax.GlobalVar) and call.op in self.chosen:
            return _recurrent_call(self.builder_, self.chosen[call.op], list(call.args))
        return call


def recurrent_sites(mod: tvm.IRModule) -> dict:
    """GlobalVar -> (spec, call args) of every recurrent body oneDNN can run (each body is
    called once: the importer makes one per node); the reasons for the others as a second
    dict GlobalVar -> text."""
    from ..passes.recurrent import recurrent_functions, spec_of

    bodies = recurrent_functions(mod)
    args_of: dict = {}

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar) and e.op in bodies:
            args_of[e.op] = list(e.args)

    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and gv not in bodies:
            relax.analysis.post_order_visit(f, visit)
    ok, why = {}, {}
    for gv, args in args_of.items():
        spec = spec_of(bodies[gv])
        reason = recurrent_unsupported(spec, args)
        if reason is None:
            ok[gv] = (spec, args)
        else:
            why[gv] = reason
    return ok, why


def recurrent_workload_key(spec: dict, args) -> str:
    """What a recurrent node computes, independent of its weights."""
    shapes = [str(a.ty) for a in args]
    attrs = ",".join(f"{k}={v}" for k, v in sorted(spec["attrs"].items()))
    return "|".join(["rnn", spec["op"], *spec["inputs"], *shapes, attrs])


def lower_recurrent(mod: tvm.IRModule, keep=None) -> tvm.IRModule:
    """Replace the calls of the recurrent bodies in `keep` (GlobalVars; None: every one oneDNN
    can run) with ``tvmopt.onednn.rnn`` calls; the other bodies stay for InlineRecurrent."""
    ok, _ = recurrent_sites(mod)
    chosen = {gv: spec for gv, (spec, _) in ok.items() if keep is None or gv in keep}
    if not chosen:
        return mod
    mod = mod.clone()
    lowering = _LowerRecurrent(mod, chosen)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and gv not in chosen:
            mod[gv] = lowering.visit_expr(func)
    for gv in chosen:
        del mod[gv]
    return mod
