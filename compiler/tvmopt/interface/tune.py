"""`tvmopt tune` as an API: MetaSchedule tuning (`tvmopt.tuning.tune`) of the module compile
keeps, which takes compile's accuracy gate (the gate lives up here, with compile)."""

from __future__ import annotations

from ..tuning.tune import TuneOptions, TuneResult
from ..tuning.tune import tune as tune_module
from .compile import accuracy_gate_outcome


def tune(opts: TuneOptions, console=None) -> TuneResult:
    """Tune `opts.model` into `opts.db` (see tvmopt.tuning.tune.tune); where the front half
    puts library calls in bf16, compile's accuracy gate runs first and the tasks come from the
    module it keeps."""
    if opts.accuracy_gate is None:
        opts.accuracy_gate = lambda dispatch, db: accuracy_gate_outcome(
            opts.model, opts.target, opts.shapes, opts.precision, dispatch, db,
            max_error=opts.max_error, calibration=opts.calibration)
    return tune_module(opts, console=console)
