"""Default (untuned) CPU schedules for fused Relax PrimFuncs.

The wheel's ``dl.cpu`` only has GEMV and Reduction, so convolutions and matmuls otherwise
run as LLVM's naive loop nests.  These rules give every contraction an output-stationary
register tile: the reduction loops sit outside a small ``rows x (vectors * lanes)`` block
of accumulators that LLVM keeps in registers, the outermost tile loops are fused and
parallelised, and fused elementwise epilogues run on the tile while it is still hot.

Usage::

    mod = tvm.ir.transform.Sequential(layout.channels_last())(mod)   # before LegalizeOps
    ...LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR...
    with target:
        mod = dl.ApplyDefaultSchedule(*default_rules())(mod)

Every rule returns None for anything it does not recognise, and any schedule error
makes it return None as well, so the next rule (or the unscheduled loop nest) is used; an
error is a fallback the user should see, so it is recorded (tvmopt.fallbacks) first.
Schedule primitives check their own legality, so a rule can be slow but not wrong.
"""

import math
import os
import re
import traceback
from dataclasses import dataclass

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.s_tir.dlight import cpu as dl_cpu
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr, normalize_prim_func
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features, llvm_get_vector_width

from .. import fallbacks

# TVMOPT_DEBUG_RULES=1 prints why a rule fell through (the kernel goes to the next rule).
_DEBUG = os.environ.get("TVMOPT_DEBUG_RULES", "") not in ("", "0")


# ---------------------------------------------------------------------------------------
# Target description
# ---------------------------------------------------------------------------------------


# The widest vector ISA a feature names, widest first (targets/*.toml `features`, LLVM names).
_VECTOR_BITS = (("avx512f", 512), ("avx2", 256), ("neon", 128))


def _default_registers(bits: int, arch: str) -> int:
    """Vector registers when the target's data does not say: AArch64 has 32 V registers
    (Arm ARM), x86-64 has 32 ZMM with AVX-512 and 16 XMM/YMM without (Intel SDM)."""
    return 32 if bits >= 512 or arch in ("aarch64", "arm64") else 16


def _isa_vector_bits(target: Target) -> int | None:
    """The widest vector ISA the TVM target's mcpu/mattr has, asked of LLVM (None: unknown)."""
    mattr = {str(a).lstrip("+") for a in (target.attrs.get("mattr", None) or [])
             if not str(a).startswith("-")}
    for feature, bits in _VECTOR_BITS:
        if feature in mattr:
            return bits
        try:
            if llvm_cpu_has_features(feature, target):
                return bits
        except RuntimeError:
            # LLVM built without the triple's backend: TVM's LOG(FATAL), an InternalError
            # (a RuntimeError). This feature cannot be asked about; the next one may.
            continue
    return None


def _arch_of(target: Target) -> str:
    triple = str(target.attrs.get("mtriple", "") or "")
    if not triple:
        from ..targets.registry import host_arch

        return host_arch()
    return {"arm64": "aarch64"}.get(triple.split("-")[0], triple.split("-")[0])


@dataclass(frozen=True)
class CPUParams:
    """What the schedules need to know about the CPU, read from its target data.

    Attributes:
        vector_bits: width of one vector register.
        num_vector_regs: vector registers the register tile may use (see register_tile).
        l1d_kb, l2_kb: per-core data caches (None: the target's file does not list them).
    """

    vector_bits: int
    num_vector_regs: int
    l1d_kb: float | None = None
    l2_kb: float | None = None

    @staticmethod
    def from_hardware(hw) -> "CPUParams":
        """Read from a targets/ entry (tvmopt.targets.registry.HardwareTarget).

        The vector width is the widest of the ISA its `features` list and the one its TVM
        target's mcpu/mattr has: the code is generated for the latter, and `host` lists the
        features of the preset it matched, which may be narrower than this CPU. The register
        count is `compute.vector_registers` where the file describes registers of that width.
        """
        target = hw.to_tvm()
        listed = next((b for f, b in _VECTOR_BITS if f in hw.features), None)
        isa = _isa_vector_bits(target)
        bits = max([b for b in (listed, isa) if b] or [0]) or _unknown_isa_bits(target, hw.arch)
        regs = hw.compute.get("vector_registers")
        num = int(regs.value) if regs and bits == listed else _default_registers(bits, hw.arch)
        cache = {k: hw.memory[k].value if k in hw.memory else None for k in ("l1d_kb", "l2_kb")}
        return CPUParams(bits, num, **cache)

    @staticmethod
    def from_target(target: Target) -> "CPUParams":
        """For a bare TVM target: the targets/ preset it was made from (same triple, mcpu and
        mattr), or this host's description when it names this CPU; otherwise what its mcpu
        and mattr have, as LLVM knows them."""
        key = str(target.attrs.get("mtriple", "") or ""), str(target.attrs.get("mcpu", "") or ""), \
            tuple(sorted(str(a) for a in (target.attrs.get("mattr", None) or [])))
        if key not in _FROM_TARGET:
            hw = _hardware_of(*key)
            if hw is not None:
                _FROM_TARGET[key] = CPUParams.from_hardware(hw)
            else:
                arch = _arch_of(target)
                bits = _isa_vector_bits(target) or _unknown_isa_bits(target, arch)
                _FROM_TARGET[key] = CPUParams(bits, _default_registers(bits, arch))
        return _FROM_TARGET[key]

    def lanes(self, dtype: str) -> int:
        if str(dtype) == "bool":
            # LLVM codegen refuses a vector store of bools (their lanes are computed as int8):
            # masks stay scalar.
            return 1
        return max(self.vector_bits // tvm_dtype_bits(dtype), 1)


_FROM_TARGET: dict[tuple, CPUParams] = {}


def _hardware_of(triple: str, mcpu: str, mattr: tuple):
    """The targets/ entry a TVM target was made from, or None."""
    from tvm.target.codegen import llvm_get_system_cpu

    from ..targets.registry import detect_host, host_arch, load_targets

    for hw in load_targets().values():
        t = hw.tvm
        if hw.device == "cpu" and (str(t.get("mtriple", "")), str(t.get("mcpu", "")),
                                   tuple(sorted(t.get("mattr", ())))) == (triple, mcpu, mattr):
            return hw
    if mcpu == llvm_get_system_cpu() and (not triple or triple.split("-")[0] == host_arch()):
        host = detect_host()  # its -mattr: the matrix/dot-product features the CPU reports
        if not mattr or mattr == tuple(sorted(host.tvm.get("mattr", ()))):
            return host
    return None


def _unknown_isa_bits(target: Target, arch: str) -> int:
    """The vector width when neither the data nor LLVM names a vector ISA: NEON's on AArch64
    (always present there), else LLVM's width, 128 when it cannot say. LLVM answers for the
    host, not for the mcpu asked for, so it is the last resort."""
    if arch in ("aarch64", "arm64"):
        return 128
    try:
        bits = int(llvm_get_vector_width(target))
    except RuntimeError:
        # LLVM built without the triple's backend (TVM's InternalError, a RuntimeError): no
        # width from LLVM. A non-LLVM target is no error: LLVM answers -1.
        bits = 0
    return bits if bits > 0 else 128


def tvm_dtype_bits(dtype) -> int:
    return tvm.DataType(str(dtype)).bits


def _is_llvm(target: Target) -> bool:
    return target is not None and target.kind.name == "llvm"


# ---------------------------------------------------------------------------------------
# Small analysis helpers
# ---------------------------------------------------------------------------------------


def _const_int(x):
    if isinstance(x, int):
        return x
    return int(x.value) if isinstance(x, tirx.IntImm) else None


def _guarded_blocks(func) -> set[str]:
    """Names of the blocks of `func` that run under a predicate (T.where): read from its
    script, since the wheel's Python has no TIR statement visitor."""
    names = set()
    for chunk in func.script().split('with T.sblock("')[1:]:
        name, body = chunk.split('"', 1)
        if "T.where(" in body:
            names.add(name)
    return names


def _extent(sch, loop):
    return _const_int(sch.get(loop).extent)


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect_vars_used_in_prim_expr(expr))


def _unit_stride_in(index, var) -> bool:
    """Whether ``index`` is ``var`` plus terms that do not depend on ``var``."""
    if isinstance(index, tirx.Var):
        return index.same_as(var)
    if isinstance(index, tirx.Add):
        a_has, b_has = _uses(index.a, var), _uses(index.b, var)
        if a_has and not b_has:
            return _unit_stride_in(index.a, var)
        if b_has and not a_has:
            return _unit_stride_in(index.b, var)
    return False


def _divisors_leq(n, cap):
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def _symbolic_expression(extent) -> bool:
    """An extent that is neither a constant nor a plain symbolic dim (h + 2, (n - 1) // 8 + 1)."""
    return not isinstance(extent, (int, tirx.IntImm, tirx.Var))


def _whole_vectors(extent, lanes) -> bool:
    """A symbolic extent provably a multiple of `lanes` (a row padded up to whole vectors)."""
    from tvm.sym.analyzer import Analyzer

    return (not isinstance(extent, (int, tirx.IntImm))
            and Analyzer().can_prove_equal(tirx.floormod(extent, lanes), 0))


def _vectorize_tail(sch, block, lanes):
    """Vectorize the innermost loop of ``block`` by at most ``lanes``."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    ext = _extent(sch, inner)
    if ext is None and lanes > 1 and _whole_vectors(sch.get(inner).extent, lanes):
        _, vec = sch.split(inner, factors=[None, lanes])
        sch.vectorize(vec)
        return
    if ext is None or ext <= 1 or lanes <= 1:
        return
    if ext <= lanes:
        sch.vectorize(inner)
    elif ext % lanes == 0:
        _, vec = sch.split(inner, factors=[None, lanes])
        sch.vectorize(vec)


def _reads_permuted(sch, block) -> bool:
    """Whether a read of `block` indexes its buffer by the block's axes in another order
    than the write does (a transpose), rather than in the same order or a subset of it."""
    blk = sch.get(block)
    axes = [iv.var for iv in blk.iter_vars]

    def order(region):
        seen = []
        for r in region:
            seen += [i for i, v in enumerate(axes) if _uses(r.min, v) and i not in seen]
        return seen

    written = order(blk.writes[0].region)
    for read in blk.reads:
        got = order(read.region)
        if [i for i in written if i in got] != got:
            return True
    return False


# A spatial block of at most this many elements runs on one thread: waking the pool costs
# more than the whole loop (a mask, a classifier's bias, a pooled vector), while a few
# thousand elements of even a costly op are where the second core starts to pay.
SERIAL_ELEMENTS = 1024


def _parallel_vectorize(sch, block, lanes, max_inner=None):
    """Parallelise the outer loops and vectorize the innermost one of a spatial block (the
    same loops without the parallel one up to SERIAL_ELEMENTS elements)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [_extent(sch, lp) for lp in loops]
    serial = all(e is not None for e in extents) and math.prod(extents) <= SERIAL_ELEMENTS
    parallel = (lambda loop: None) if serial else sch.parallel
    inner_ext = extents[-1]
    if any(_symbolic_expression(sch.get(lp).extent) for lp in loops):
        # A loop over an expression of a symbolic dim (a padded image's h + 2): fusing it with
        # the others gives an index LLVM codegen cannot split ("padding factor ... is not
        # divisible"). The outer loop alone runs in parallel, the inner one vectorized.
        parallel(loops[0])
        if len(loops) > 1:
            _vectorize_tail(sch, block, lanes)
        return
    if len(loops) > 1 and inner_ext is None:
        # A symbolic innermost extent (a sequence length): fused into one flat loop, every
        # element would recompute its indices with a division and a modulo per axis. The
        # outer loops run in parallel; the inner one stays a plain loop (LLVM vectorizes it
        # where it can), split into vectors here where it provably holds whole ones.
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        parallel(outer)
        _vectorize_tail(sch, block, lanes)
        return
    if len(loops) > 1 and inner_ext is not None and inner_ext >= lanes:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        parallel(outer)
        _vectorize_tail(sch, block, lanes)
        return
    if len(loops) > 1 and _reads_permuted(sch, block):
        # A short innermost axis read in another order (NCHW -> NHWC of a 3-channel image):
        # one flat vector loop would gather every lane at indices with a division and a
        # modulo. The outer loops run in parallel, the short axis is unrolled inside the
        # next one, which LLVM vectorizes on the read's unit stride with interleaved stores.
        outer = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        parallel(outer)
        sch.unroll(loops[-1])
        return
    # Short innermost extent: treat the whole nest as one flat loop.
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    ext = _extent(sch, fused)
    if ext is not None and ext % lanes == 0 and ext > lanes:
        outer, vec = sch.split(fused, factors=[None, lanes])
        parallel(outer)
        sch.vectorize(vec)
    elif ext is None or ext > 1:
        parallel(fused)


# Inlining substitutes the producer's expression at every load of its buffer, so a producer
# read k times by a consumer that is itself inlined k times grows as k^depth (the float8
# encoders' bit-by-bit search: minutes in LLVM).  A producer is inlined into a consumer that
# loads it more than once only while its own expression is short, which keeps growth linear.
# The wheel exposes no TIR visitor to Python, so sizes and loads are read off the printed body.
INLINE_DUPLICATE_CHARS = 400


def _loads_of(text: str, name: str) -> int:
    return len(re.findall(r"(?<![\w.])" + re.escape(name) + r"\[", text))


def _duplicates_large_expr(sch, block_rv) -> bool:
    """Whether inlining ``block_rv`` would copy a long expression into some consumer twice."""
    stmt = sch.get(block_rv)
    if len(str(stmt.body)) <= INLINE_DUPLICATE_CHARS:
        return False
    name = stmt.writes[0].source.name
    return any(_loads_of(str(sch.get(c).body), name) > 1 for c in sch.get_consumers(block_rv))


def _write_numel(sch, block_rv):
    """Elements of the buffer a block writes (None if a dim is symbolic)."""
    n = 1
    for d in sch.get(block_rv).writes[0].source.shape:
        d = _const_int(d)
        if d is None:
            return None
        n *= d
    return n


def _inline_spatial_producers(sch, blocks, keep):
    """Inline every spatial block except ``keep`` where TVM allows it and the inlined
    expression stays small; return the blocks left in place."""
    remaining = []
    for info in blocks:
        if info.block_rv in keep or not info.is_injective():
            remaining.append(info)
            continue
        try:
            if _duplicates_large_expr(sch, info.block_rv):
                remaining.append(info)
                continue
            sch.compute_inline(info.block_rv)
        except s_tir.ScheduleError:  # TVM refuses to inline this block: it stays in place
            remaining.append(info)
    return remaining


# ---------------------------------------------------------------------------------------
# Contractions: matmul, conv2d, pooling
# ---------------------------------------------------------------------------------------


class _Contraction:
    """Index analysis of the single reduction block of a fused PrimFunc."""

    def __init__(self, sch, info):
        self.block = info.block_rv
        stmt = sch.get(self.block)
        self.stmt = stmt
        self.spatial = [it for it in info.iters if it.kind == "S"]
        self.reduce = [it for it in info.iters if it.kind == "R"]
        self.loops = [it.loop_rv for it in info.iters]
        self.order_ok = all(it.kind == "S" for it in info.iters[: len(self.spatial)])
        self.reads = list(stmt.reads)
        self.write = stmt.writes[0] if len(stmt.writes) == 1 else None
        self.dtype = self.write.source.dtype if self.write is not None else "float32"

    def write_is_spatial_identity(self) -> bool:
        if self.write is None:
            return False
        # normalize_prim_func drops unit iterators, which leaves constant indices behind.
        idx = [r.min for r in self.write.region if not isinstance(r.min, tirx.IntImm)]
        svars = [it.var for it in self.spatial]
        if len(idx) != len(svars):
            return False
        return all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(idx, svars))

    def readers_of(self, var):
        """Read regions whose index uses ``var``."""
        return [r for r in self.reads if any(_uses(rg.min, var) for rg in r.region)]

    def innermost_index_is_reduction(self, region) -> bool:
        """Whether the operand's contiguous axis is walked by reduction iterators only."""
        last = region.region[-1].min if region.region else None
        if last is None:
            return False
        uses_reduce = any(_uses(last, it.var) for it in self.reduce)
        uses_spatial = any(_uses(last, it.var) for it in self.spatial)
        return uses_reduce and not uses_spatial


def register_tile(nvec_total: int, rows_opts, num_vector_regs: int):
    """(vectors, rows) of the register tile: the most accumulators that fit, squarer first.

    Each of the rows x vectors accumulators holds a register, and so does each weight vector
    of the tile and the broadcast input. Past that LLVM spills the accumulators to the stack
    and reloads every one at each reduction step, which costs more than a smaller tile.
    """
    best = None
    for nv in _divisors_leq(nvec_total, 4):
        for rt in rows_opts:
            if rt * nv + nv + 1 > num_vector_regs:
                continue
            key = (rt * nv, -(rt + nv))
            if best is None or key > best[0]:
                best = (key, nv, rt)
    return None if best is None else best[1:]


class _LLVMRule(ScheduleRule):
    """A rule for LLVM targets whose failure on a kernel is recorded, not raised: the next
    rule (or LLVM's default loop nest) gets the kernel."""

    def is_target_available(self, target: Target) -> bool:
        return _is_llvm(target)

    def apply(self, func, target, tunable):  # pylint: disable=unused-argument
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self._apply(func, target)
        except Exception as err:  # pylint: disable=broad-except
            # A rule's own code and TVM's primitives raise any type; whatever it is, the kernel
            # passes to the next rule and the fallback is recorded.
            if _DEBUG:
                traceback.print_exc()
            fallbacks.record("schedule_rule", fallbacks.kernel_name(func), err,
                             rule=type(self).__name__)
            return None

    def _apply(self, func, target):
        raise NotImplementedError


class _VectorRule(_LLVMRule):
    """A rule that reads its vector width from the target's data (CPUParams) and starts from
    the kernel's normalized blocks."""

    def __init__(self, params: CPUParams | None = None):
        self.params = params

    def _start(self, func, target):
        """(CPUParams, a Schedule of `func`, its normalized blocks or None)."""
        sch = s_tir.Schedule(func)
        return self.params or CPUParams.from_target(target), sch, normalize_prim_func(sch)


class ContractionRule(_LLVMRule):
    """Register-tiled schedule for a PrimFunc with one reduction block.

    The vector axis is the innermost output axis; the row axis is an output axis whose
    operands are disjoint from the vector axis's operands (matmul ``i``, NHWC conv ``x``,
    NCHW conv ``f``), so each loaded vector is reused across rows and each broadcast
    scalar across vectors.  Subclasses only decide which reduction blocks they accept.
    """

    def __init__(self, params: CPUParams | None = None, pack_weights: bool = True):
        self.params = params
        self.pack_weights = pack_weights

    def accepts(self, c: _Contraction) -> bool:  # pylint: disable=unused-argument
        return True

    def _apply(self, func, target):
        return self._schedule(s_tir.Schedule(func), func, target, pad=True)

    def _schedule(self, sch, func, target, pad):
        params = self.params or CPUParams.from_target(target)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [b for b in infos if b.is_reduction()]
        if len(reductions) != 1 or any(
            not (b.is_reduction() or b.is_injective()) for b in infos
        ):
            return None
        main_info = reductions[0]
        c = _Contraction(sch, main_info)
        if not c.spatial or not c.reduce or not c.order_ok:
            return None
        if not c.write_is_spatial_identity() or not self.accepts(c):
            return None
        # An extent that is an expression of a symbolic dim (a convolution's output length,
        # (n - 105) // 80 + 1; a padded image, h + 2) defeats the index analysis of the tiles:
        # the register tile's cache came out shared between the fused parallel iterations (a
        # race: wrong results on two threads), and the split of a padded producer failed LLVM
        # codegen. A plain symbolic dim (batch, seq) is analysed exactly; such kernels keep
        # the fallback schedules.
        if any(not isinstance(it.dom, (int, tirx.IntImm, tirx.Var))
               for it in c.spatial + c.reduce):
            return None
        # Reductions along every operand's contiguous axis (layer norm, softmax, A @ B^T)
        # get nothing from vectorizing an output axis: leave them to GEMV / Reduction.
        if all(c.innermost_index_is_reduction(r) for r in c.reads):
            return None
        main_pos = infos.index(main_info)
        producers = infos[:main_pos]
        consumers = infos[main_pos + 1 :]
        lanes = params.lanes(c.dtype)
        tile = self._choose_tile(sch, c, lanes, params)
        if tile is None:
            return None
        padding = self._ragged_padding(c, tile, lanes) if pad else None
        if padding is not None:
            # On the same schedule, so its trace (a tuning record's, tuning/seed.py) holds
            # the padding too.
            try:
                sch.pad_einsum(c.block, padding)
            except s_tir.ScheduleError:  # not an einsum (a conv): scheduled unpadded
                return self._schedule(s_tir.Schedule(func), func, target, pad=False)
            return self._schedule(sch, func, target, pad=False)

        # Epilogue: chain of elementwise blocks -> inline all but the last into it.
        epilogue = None
        if consumers:
            keep = {consumers[-1].block_rv}
            rest = _inline_spatial_producers(sch, consumers, keep)
            if len(rest) == 1:
                epilogue = rest[0].block_rv
            else:
                epilogue = None
                leftover = [b.block_rv for b in rest]
        else:
            leftover = []
        if epilogue is not None and _write_numel(sch, epilogue) != _write_numel(sch, c.block):
            # The epilogue writes more than the contraction (squeeze-excite: a 1x1 conv's
            # sigmoid scaling a whole feature map): at the tile it would be unrolled over the
            # whole map. It runs as its own elementwise pass instead.
            leftover, epilogue = [epilogue], None
        if epilogue is not None:
            leftover = []

        if self.pack_weights:
            self._pack_weight(sch, c, tile)
        outer, first_reduce = self._tile_main(sch, c, tile, lanes)
        if epilogue is not None:
            sch.set_scope(c.block, 0, "local")
            sch.reverse_compute_at(epilogue, outer, preserve_unit_loops=True)
            self._vectorize_under(sch, epilogue, outer, lanes)
        else:
            wb = sch.cache_write(c.block, 0, "local")
            sch.reverse_compute_at(wb, outer, preserve_unit_loops=True)
            self._vectorize_under(sch, wb, outer, lanes)
            for blk in leftover:
                _parallel_vectorize(sch, blk, lanes)
        init = sch.decompose_reduction(c.block, first_reduce)
        self._vectorize_under(sch, init, outer, lanes)

        # Producers (padding, fused transposes) run as their own vectorized pass: one
        # extra sweep over the input is cheap next to the contraction itself -- except where
        # every operand is indexed by the vector axis (depthwise conv, pooling): there the
        # contraction is a sweep too and a padded copy doubles its memory traffic, so the
        # padding is read in place, a bounds test per window step.
        vec_readers = {r.source for r in c.readers_of(tile[0].var)}
        if all(r.source in vec_readers for r in c.reads):
            producers = _inline_spatial_producers(sch, producers, keep=set())
        for info in producers:
            _parallel_vectorize(sch, info.block_rv, lanes)
        return sch

    # -- tiling -----------------------------------------------------------------------

    def _choose_tile(self, sch, c, lanes, params):
        """Pick (vec iter, nvec, row iter, rows) for the register tile."""
        # Vector axis: innermost output axis with extent > 1.
        vec = None
        for it in reversed(c.spatial):
            ext = _const_int(it.dom)
            if ext is None or ext > 1:
                vec = it
                break
        if vec is None:
            return None
        vec_ext = _const_int(vec.dom)
        if vec_ext is None:
            return None
        vec_readers = {r.source for r in c.readers_of(vec.var)}
        # Operands indexed by the vector axis must not stride along it, or every vector
        # load becomes a gather; pooling over NCHW (stride 2 along x) is the usual case
        # that still passes with a unit stride only when the pooling stride is 1.
        strided = any(
            not _unit_stride_in(r.region[-1].min, vec.var)
            for r in c.readers_of(vec.var)
            if r.region
        )

        if vec_ext % lanes == 0:
            nvec_total, width = vec_ext // lanes, lanes
        else:
            nvec_total, width = 1, vec_ext if vec_ext < lanes else None
            if width is None:
                # Ragged innermost axis: vectorize a divisor so no predicate is needed.
                width = next((d for d in _divisors_leq(vec_ext, lanes) if d > 1), 1)
                nvec_total = vec_ext // width

        # Row axis: an output axis that some operand of the vector axis does not depend on,
        # so each vector of it is loaded once and reused across the rows: B across matmul
        # rows, the weights across an NHWC conv's pixels (a depthwise conv's too).
        row = None
        if not strided:
            for it in reversed(c.spatial):
                if it is vec:
                    continue
                ext = _const_int(it.dom)
                if ext == 1:
                    continue
                readers = {r.source for r in c.readers_of(it.var)}
                if readers and vec_readers - readers:
                    row = it
                    break
        if row is None:
            rows_opts = [1]
        else:
            row_ext = _const_int(row.dom)
            rows_opts = [4] if row_ext is None else _divisors_leq(row_ext, 8)
        picked = register_tile(nvec_total, rows_opts, params.num_vector_regs)
        if picked is None:
            return None
        nv, rt = picked
        return vec, width, nv, row, rt

    @staticmethod
    def _ragged_padding(c, tile, lanes):
        """Per block iter, the multiple to pad it to (pad_einsum), where the register tile
        would otherwise shrink to a sliver: a vector axis that is no multiple of the vector
        width (197 tokens: no divisor at all, so no vectors), or a row axis with no divisor
        from 4 to 8 (197 rows: one row, each weight vector loaded for one FMA). The padded
        rows and columns cost a few percent; None when nothing is ragged."""
        vec, width, _, row, _ = tile
        vec_ext = _const_int(vec.dom)
        row_ext = _const_int(row.dom) if row is not None else None
        pad_vec = vec_ext is not None and vec_ext > lanes and width * 2 < lanes
        pad_row = row_ext is not None and row_ext > 8 and \
            not any(row_ext % d == 0 for d in range(4, 9))
        if not (pad_vec or pad_row):
            return None
        return [lanes if pad_vec and it is vec else 8 if pad_row and it is row else 1
                for it in c.spatial + c.reduce]

    @staticmethod
    def _pack_weight(sch, c, tile):
        """Re-lay the stationary operand out as [vec_o, ..., vec tile] (e.g. OHWI32o).

        In HWIO/[K, N] order consecutive reduction steps are a full row apart, so a tile's
        weight stream crosses a 4 KiB page every few steps and the prefetcher gives up;
        blocked, it is one contiguous stream.  The copy is a layout-rewrite preproc block:
        SplitLayoutRewritePreproc + FoldConstant (post_schedule_passes) run it at compile
        time when the weight is a constant.
        """
        vec, width, nv, _, _ = tile
        block_n = width * nv
        func = sch.mod["main"]
        # Only operands the module passes as constants: the copy of any other runs on every
        # call (a global-average-pool's activation looks like a 1x1 weight to this analysis).
        free = func.attrs.get(LAYOUT_FREE) if func.attrs is not None else None
        consts = [func.params[int(i)] for i in free] if free is not None else func.params
        params = {p.name for p in consts}
        reduce_vars = [it.var for it in c.reduce]
        for idx, region in enumerate(c.reads):
            buf = region.source
            if buf.name not in params or not region.region:
                continue
            indices = [rg.min for rg in region.region]
            if not (isinstance(indices[-1], tirx.Var) and indices[-1].same_as(vec.var)):
                continue
            others = [it.var for it in c.spatial if not it.var.same_as(vec.var)]
            if any(_uses(i, v) for i in indices for v in others):
                continue
            # Every other index walks the reduction, or is a constant: a 1x1 conv's kernel
            # position, whose unit iterators normalize_prim_func drops.
            if not all(isinstance(i, tirx.IntImm) or any(_uses(i, v) for v in reduce_vars)
                       for i in indices[:-1]):
                continue
            n = _const_int(buf.shape[-1])
            if n is None or n % block_n != 0 or n == block_n:
                return
            cached = sch.cache_read(c.block, idx, "global")
            sch.transform_layout(
                c.block,
                ("read", idx),
                lambda *ax: (ax[-1] // block_n, *ax[:-1], ax[-1] % block_n),
            )
            sch.annotate(cached, "meta_schedule.layout_rewrite_preproc", True)
            return

    def _tile_main(self, sch, c, tile, lanes):  # pylint: disable=unused-argument
        vec, width, nv, row, rt = tile
        loop_of = {it.var: it.loop_rv for it in c.spatial + c.reduce}
        vec_o, vec_t, vec_i = sch.split(loop_of[vec.var], factors=[None, nv, width])
        if row is not None and rt > 1:
            row_o, row_i = sch.split(loop_of[row.var], factors=[None, rt])
        elif row is not None:
            row_o, row_i = loop_of[row.var], None
        else:
            row_o = row_i = None

        # Outer order: axes that index the vector operand (batch of B) first, then the
        # vector tile so that one slice of B stays in cache across the other axes.
        vec_readers = {r.source for r in c.readers_of(vec.var)}
        batch_of_vec, others = [], []
        for it in c.spatial:
            if it is vec or it is row:
                continue
            readers = {r.source for r in c.readers_of(it.var)}
            (batch_of_vec if readers & vec_readers else others).append(loop_of[it.var])
        outer = batch_of_vec + [vec_o] + others + ([row_o] if row_o is not None else [])
        inner = ([row_i] if row_i is not None else []) + [vec_t, vec_i]
        reduce_loops = [loop_of[it.var] for it in c.reduce]
        sch.reorder(*outer, *reduce_loops, *inner)
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(fused)
        for lp in inner[:-1]:
            sch.unroll(lp)
        if width > 1:
            sch.vectorize(vec_i)
        return fused, reduce_loops[0]

    @staticmethod
    def _vectorize_under(sch, block, outer, lanes):
        """Unroll the loops a block got under the tile and vectorize the innermost."""
        loops = sch.get_loops(block)
        idx = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(outer)))
        below = loops[idx + 1 :]
        if not below:
            return
        inner = below[-1]
        ext = _extent(sch, inner)
        if ext is not None and ext > lanes and ext % lanes == 0:
            head, inner = sch.split(inner, factors=[None, lanes])
            below = below[:-1] + [head, inner]
        # Unroll only what fits a register tile: a larger nest under the tile would be code
        # size, not speed (and minutes of LLVM time).
        body = 1
        for lp in below:
            body *= _extent(sch, lp) or 1 << 20
        for lp in below[:-1] if body <= 64 * lanes else []:
            if _extent(sch, lp) is not None:
                sch.unroll(lp)
        if ext is not None and ext > 1:
            sch.vectorize(inner)


def _is_mac(c: _Contraction) -> bool:
    return len(c.reads) >= 2


class MatmulRule(ContractionRule):
    """dense / matmul / batch_matmul with a single reduction axis."""

    def accepts(self, c):
        return _is_mac(c) and len(c.reduce) == 1


class Conv2dRule(ContractionRule):
    """conv2d (NCHW or NHWC, grouped, depthwise, strided, padded)."""

    def accepts(self, c):
        return _is_mac(c) and len(c.reduce) >= 2


class PoolRule(ContractionRule):
    """Window and global pooling, mean: one operand, reduction over spatial axes."""

    def accepts(self, c):
        return len(c.reads) == 1


# ---------------------------------------------------------------------------------------
# Elementwise / injective
# ---------------------------------------------------------------------------------------


class ElementwiseRule(_VectorRule):
    """Spatial-only PrimFuncs: inline what can be inlined, parallel outer, vector inner."""

    def _apply(self, func, target):
        params, sch, infos = self._start(func, target)
        if infos is None or not infos or not all(b.is_injective() for b in infos):
            return None
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
        keep = {b.block_rv for b in infos if sch.get(b.block_rv).name_hint in outputs}
        rest = _inline_spatial_producers(sch, infos, keep)
        for info in rest:
            dtype = sch.get(info.block_rv).writes[0].source.dtype
            _parallel_vectorize(sch, info.block_rv, params.lanes(dtype))
        return sch


# ---------------------------------------------------------------------------------------
# Row reductions (softmax, layer / RMS norm)
# ---------------------------------------------------------------------------------------


class RowReductionRule(_VectorRule):
    """dlight's CPU Reduction schedule, with each row's reductions vectorized.

    dlight sums a row into one scalar accumulator: one add after another, a chain of dependent
    adds (float addition is not reassociated), so a norm or softmax runs at the add latency,
    not the vector width. Here each reduction over the innermost axis is first split into
    `lanes` partial sums (rfactor): the partials accumulate as one vector, and only they are
    summed at the end. A row must be whole vectors: a static length that is, or a symbolic one
    provably so (softmax pads its rows: passes.fast_math). Kernels this does not fit (another
    row, several reduction axes) go to dlight's rule unchanged.
    """

    def _apply(self, func, target):
        params, sch, infos = self._start(func, target)
        if infos is None or len(infos) < 2 or not infos[-1].is_injective():
            return None
        kinds = [b.dom_kind() for b in infos]
        if any(not k or k[0] != "S" for k in kinds):
            return None
        reductions = [b for b, k in zip(infos, kinds) if not b.is_injective()]
        # The row is computed in its widest type (an fp32 softmax that stores bf16 for the
        # next bf16 kernel still sums fp32 vectors).
        lanes = min(params.lanes(str(w.source.dtype))
                    for b in infos for w in sch.get(b.block_rv).writes)
        if not reductions or lanes < 2:
            return None
        rows = len(kinds[-1]) - 1  # the output's axes but the last: one row each
        if rows < 1:
            return None
        for b, k in zip(infos, kinds):
            if b.is_injective():
                continue
            last = sch.get_loops(b.block_rv)[-1]
            ext = _extent(sch, last)
            # A row's reduction: the output's leading axes, then one reduction axis (a matmul
            # keeps every output axis and reduces another), a whole number of vectors long
            # (at least two; a symbolic row only where it is padded to whole vectors).
            if k != "S" * rows + "R":
                return None
            if ext is None and not _whole_vectors(sch.get(last).extent, lanes):
                return None
            if ext is not None and (ext % lanes or ext < 2 * lanes):
                return None
        partials = set()
        for b in reductions:
            loops = sch.get_loops(b.block_rv)
            _, lane = sch.split(loops[-1], factors=[None, lanes])
            # The partials' axis goes last in their buffer, so a vector of them is contiguous
            # (a unit axis of the output, which has no loop, would otherwise put it mid-way).
            ndim = len(sch.get(b.block_rv).writes[0].source.shape)
            partials.add(sch.get(sch.rfactor(lane, factor_axis=ndim)).name_hint)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        # An elementwise step that only the output reads (softmax's normalisation before a
        # padded row is cut back, or a cast) is computed in the output's own loop: computed
        # under the row instead, its region over a symbolic row is a guarded scalar loop.
        while len(blocks) > 2:
            prev = blocks[-2]
            consumers = sch.get_consumers(prev)
            if (len(consumers) != 1 or not sch.get(consumers[0]).same_as(sch.get(blocks[-1]))
                    or any(iv.iter_type != tirx.IterVar.DataPar
                           for iv in sch.get(prev).iter_vars)):
                break
            try:
                sch.compute_inline(prev)
            except s_tir.ScheduleError:  # TVM refuses to inline it: computed apart
                break
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
        loops = sch.get_loops(blocks[-1])
        row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
        sch.parallel(row)
        _vectorize_tail(sch, blocks[-1], lanes)
        for block in reversed(blocks[:-1]):
            sch.compute_at(block, row, preserve_unit_loops=True)
        for block in blocks[:-1]:
            if sch.get(block).name_hint in partials:
                # Under the row loop: [lane, unit loops..., chunk]. The chunk loop goes
                # outside and the lanes become the vector (the init runs on chunk 0).
                inner = sch.get_loops(block)
                sch.reorder(inner[-1], inner[1])
                sch.vectorize(sch.get_loops(block)[-1])
            elif all(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(block).iter_vars):
                _vectorize_tail(sch, block, lanes)
        reduced = {sch.get(b.block_rv).name_hint for b in reductions} | partials
        if any(name in reduced for name in _guarded_blocks(sch.mod["main"])):
            # A reduction split this could not prove exact: rfactor drops such a guard.
            return None
        return sch


# The PrimFunc attribute MetaSchedule's layout rewrite reads: indices of params that are
# constants at every call site, whose re-layout can be folded at compile time.
LAYOUT_FREE = "layout_free_buffers"


def pre_schedule_passes():
    """Relax passes before ApplyDefaultSchedule: note on each PrimFunc which params every
    call site passes a constant (`LAYOUT_FREE`), the ones whose packing folds away.

    Not relax.transform.AttachAttrLayoutFreeBuffers: that one renames the kernels it copies,
    and the names are what profiles, plans and reports match on.
    """

    call_tir = tvm.ir.Op.get("relax.call_tir")

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.MarkConstantParams")
    def mark(mod, _ctx):
        consts: dict = {}

        def visit(expr):
            if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
                callee, args = expr.args[0], expr.args[1]
                fields = args.fields if isinstance(args, relax.Tuple) else [args]
                idx = {i for i, a in enumerate(fields) if isinstance(a, tvm.ir.expr.Constant)}
                name = callee.name_hint
                consts[name] = consts[name] & idx if name in consts else idx

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and gv.name_hint in consts and (
                    func.attrs is None or LAYOUT_FREE not in func.attrs):
                mod[gv] = func.with_attr(LAYOUT_FREE, sorted(consts[gv.name_hint]))
        return mod

    return [mark]


def post_schedule_passes():
    """Relax passes after ApplyDefaultSchedule: fold the packed-weight copies into constants.

    SplitLayoutRewritePreproc asserts on some kernels it has nothing to do with (TopK's), so it
    runs only on modules holding a packing block, and if it still refuses, the packing stays
    inside its kernel: correct, done on every call instead of once (recorded as a fallback).
    """

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.FoldWeightPacking")
    def fold_packing(mod, _ctx):
        packed = any(isinstance(f, tirx.PrimFunc) and "layout_rewrite_preproc" in f.script()
                     for f in mod.functions.values())
        if not packed:
            return mod
        # The pass asserts that every PrimFunc has a root block; a kernel written scheduled
        # (the recurrent loop kernels) has none and has nothing to split, so it sits out.
        rootless = {gv: f for gv, f in mod.functions.items()
                    if isinstance(f, tirx.PrimFunc) and not isinstance(f.body, s_tir.SBlockRealize)}
        try:
            split = mod
            if rootless:
                split = mod.clone()
                for gv in rootless:
                    del split[gv]
            split = relax.transform.SplitLayoutRewritePreproc()(split)
            for gv, func in rootless.items():
                split[gv] = func
            return tvm.ir.transform.Sequential([
                relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])(split)
        except Exception as err:  # pylint: disable=broad-except
            fallbacks.record("post_schedule_pass", "tvmopt.FoldWeightPacking", err,
                             instead="weights are re-packed inside their kernels on every call")
            return mod

    return [fold_packing]


class BoolMaskRule(_LLVMRule):
    """A reduction with a boolean mask fused in (an attention mask built beside the matmul it
    gates): every rule after this one would vectorize the mask's blocks at a float width, and
    LLVM refuses a vector store of bools. Each block's outer loop runs in parallel instead."""

    def _apply(self, func, target):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos or not any(b.is_reduction() for b in infos):
            return None
        if not any(str(w.source.dtype) == "bool" for b in infos
                   for w in sch.get(b.block_rv).writes):
            return None
        for info in infos:
            loops = sch.get_loops(info.block_rv)
            if loops and info.is_injective():
                sch.parallel(loops[0])
        return sch


class FullReductionRule(_VectorRule):
    """A reduction of a whole tensor to one value (the min and max a dynamic quantization
    takes of each activation), vectorized and split over the threads.

    dlight reduces it as one scalar chain: every min waits for the previous one, at the
    instruction latency whatever the vector width. Here the flat reduction is
    split into `chunks` x `lanes` partial results (rfactor): each thread reduces its chunks a
    vector at a time, and only the partials are reduced at the end. Taken only where the read
    walks the tensor in its own order and the length splits evenly into chunks of vectors.
    """

    CHUNKS = (16, 8, 4, 2)
    MIN_ELEMENTS = 4096  # shorter: one chain is as quick as the split

    def _apply(self, func, target):
        params, sch, infos = self._start(func, target)
        if infos is None or len(infos) != 1 or infos[0].is_injective():
            return None
        block = infos[0].block_rv
        stmt = sch.get(block)
        ivs = list(stmt.iter_vars)
        red = [iv for iv in ivs if iv.iter_type == tirx.IterVar.CommReduce]
        spatial = [iv for iv in ivs if iv.iter_type == tirx.IterVar.DataPar]
        if not red or len(red) + len(spatial) != len(ivs):
            return None
        if any(_const_int(iv.dom.extent) != 1 for iv in spatial):
            return None  # not one output value
        exts = [_const_int(iv.dom.extent) for iv in red]
        if any(e is None for e in exts):
            return None
        total = 1
        for e in exts:
            total *= e
        lanes = params.lanes(str(stmt.writes[0].source.dtype))
        # The one read is the tensor in the reduction's own order (row-major over its axes),
        # so the fused flat index is the address and a vector of lanes is contiguous.
        if len(stmt.reads) != 1 or total < self.MIN_ELEMENTS or lanes < 2:
            return None
        # (unit axes, which normalize_prim_func turns into constant indices, aside)
        index = [rg.min for rg in stmt.reads[0].region
                 if not (isinstance(rg.min, tirx.IntImm) and _const_int(rg.extent) == 1)]
        if len(index) != len(red) or not all(isinstance(i, tirx.Var) and i.same_as(iv.var)
                                             for i, iv in zip(index, red)):
            return None
        chunks = next((c for c in self.CHUNKS if total % (c * lanes) == 0), None)
        if chunks is None:
            return None
        loops = sch.get_loops(block)
        r = sch.fuse(*loops[-len(red):]) if len(red) > 1 else loops[-1]
        chunk, mid, lane = sch.split(r, factors=[chunks, None, lanes])
        sch.reorder(chunk, lane, mid)
        rf = sch.rfactor(sch.fuse(chunk, lane), factor_axis=0)
        outer, inner = sch.get_loops(rf)[-2:]
        chunk, lane = sch.split(outer, factors=[chunks, lanes])
        sch.reorder(chunk, inner, lane)
        sch.parallel(chunk)
        sch.vectorize(lane)
        sch.decompose_reduction(rf, inner)
        return sch


def default_rules(params: CPUParams | None = None):
    """Rule order for ``dl.ApplyDefaultSchedule``: specific first, fallbacks last."""
    return [
        BoolMaskRule(),
        MatmulRule(params),
        Conv2dRule(params),
        PoolRule(params),
        dl_cpu.GEMV(),
        RowReductionRule(params),
        FullReductionRule(params),
        dl_cpu.Reduction(),
        ElementwiseRule(params),
    ]
