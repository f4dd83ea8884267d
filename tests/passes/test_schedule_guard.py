"""The dlight guard records a failing rule instead of failing the build; CUDA source scanning."""

from tvmopt.targets.cuda import tensor_core_kernels
from tvmopt import fallbacks
from tvmopt.passes.schedule_guard import guarded


class _Raises:
    def apply(self, func, target, tunable):
        raise RuntimeError("first line\nAll the statements in the scope are schedulable")

    def is_target_available(self, target):
        return True


class _Works(_Raises):
    def apply(self, func, target, tunable):
        return "schedule"


def _prim_func():
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def test_guard_records_and_passes_on():
    func = _prim_func()
    with fallbacks.collect() as events:
        assert guarded(_Raises()).apply(func, None, False) is None
        assert guarded(_Works()).apply(func, None, False) == "schedule"
    (rec,) = events
    assert rec.kind == "schedule_rule" and rec.rule == "_Raises"
    assert "schedulable" in rec.reason and "T_add" in rec.where
    # Outside a collect() block nothing is kept: one compile's record holds only its own.
    guarded(_Raises()).apply(func, None, False)
    assert len(events) == 1


def test_tensor_core_kernels_scan():
    src = ('extern "C" __global__ void __launch_bounds__(128) fused_matmul_kernel(half* A) {\n'
           '  nvcuda::wmma::mma_sync(c, a, b, c);\n}\n'
           'extern "C" __global__ void __launch_bounds__(256) add_kernel(float* A) { A[0] += 1; }\n')
    assert tensor_core_kernels(src) == (["fused_matmul_kernel"], ["fused_matmul_kernel", "add_kernel"])
