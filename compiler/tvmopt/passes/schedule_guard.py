"""A dlight rule wrapper: when a rule raises on a kernel, the next rule gets it, and it is recorded.

TVM 0.27's tensor-core matmul rule (`dl.gpu.Matmul`) raises on some fp16 kernels with a symbolic
batch dimension (e.g. a fused 1x1 conv2d + bias + clip: "All the statements in the scope are
schedulable statements"), which fails the whole build. Guarded, that kernel falls through to the
next rule (GEMV/Reduction/GeneralReduction/Fallback: correct, without tensor cores) and the
fallback is recorded (tvmopt.fallbacks), so `compile` prints it and stores it in the manifest
instead of hiding it.
"""

from __future__ import annotations

from .. import fallbacks


def guarded(rule):
    """Wrap a dlight ScheduleRule so that an exception means "not applicable", recorded."""
    from tvm.s_tir.dlight.base import ScheduleRule

    class Guarded(ScheduleRule):
        def apply(self, func, target, tunable):
            try:
                return rule.apply(func, target, tunable)
            except Exception as err:  # noqa: BLE001 - TVM raises TVMError/InternalError subclasses
                fallbacks.record("schedule_rule", fallbacks.kernel_name(func), err,
                                 rule=type(rule).__name__)
                return None

        def is_target_available(self, target):
            return rule.is_target_available(target)

    return Guarded()
