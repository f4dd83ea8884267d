"""`tvmopt plan` as an API: import a model with its symbolic dims bound, run the front half once,
and plan the fused module."""

from __future__ import annotations

from ..errors import TvmoptError
from ..targets.registry import HardwareTarget


def _static_shapes(inputs, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(d if isinstance(d, int) else int(dims.get(d, 1)) for d in i.shape)
            for i in inputs if i.shape is not None}


def _import_bound(mod, dims: dict[str, int]):
    """`mod` with every symbolic dim of main's inputs bound to `dims` (default 1)."""
    from tvm import relax, tirx

    free = {}
    for p in mod["main"].params:
        for v in getattr(getattr(p.ty, "shape", None), "values", None) or []:
            for var in tirx.analysis.undefined_vars(v) if not isinstance(v, tirx.Var) else [v]:
                free[var.name] = int(dims.get(var.name, 1))
    if free:
        mod = relax.transform.BindSymbolicVars(free, "main")(mod)
    return mod, free


def plan_model(model, hw: HardwareTarget, precision: str = "auto",
               dims: dict[str, int] | None = None,
               shapes: dict[str, tuple[int, ...]] | None = None, dispatch: str = "codegen"):
    """Plan the compilation of `model` (a path, an onnx.ModelProto or a torch ExportedProgram)
    for `hw`.

    FLOPs need numbers, so the model is imported with every symbolic dim bound to `dims`
    (default 1); `shapes` (--shape overrides) take precedence. `dispatch` other than
    "codegen" also decides library vs default schedule per kernel as compile would (timing
    on this host, cached), and records each choice with its timings.

    Returns:
        The `precision.kernel_plan.Plan`.

    Raises:
        TargetError: unknown precision, or the target lacks the figures a roofline needs.
    """
    from .. import pipeline
    from ..frontend import model_file
    from ..frontend.importer import import_onnx
    from ..frontend.onnx_model import resolve_input_shapes
    from ..precision.kernel_plan import make_plan
    from ..precision.policy import parse
    from ..precision.schemes import library_compute

    parse(precision)
    dims = dict(dims or {})
    proto = (model_file.load(model) if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__")
             else model)
    if model_file.is_program(proto):
        # symbols of a torch program may be derived (2*s0): bind the free ones after import
        mod, used_dims = _import_bound(model_file.import_loaded(proto, shapes).mod, dims)
    else:
        infos = resolve_input_shapes(proto, dict(shapes or {}))
        used_dims = {d: int(dims.get(d, 1)) for i in infos for d in (i.shape or ())
                     if isinstance(d, str)}
        static = _static_shapes(infos, dims)
        static.update(shapes or {})
        try:
            mod = import_onnx(proto, static).mod
        except TvmoptError:
            # Some graphs only import with symbolic dims: import as compile does, then bind them.
            mod, used_dims = _import_bound(import_onnx(proto, dict(shapes or {})).mod, dims)
    # codegen: the plan reads the fused functions; library dispatch is planned below
    fused = pipeline.optimize(mod, hw.to_tvm(), pipeline.PipelineConfig(dispatch="codegen"),
                              until=pipeline.FRONT_HALF).mod
    choices, notes = [], []
    if dispatch != "codegen":
        # The library kernels' choices (and the precisions decided by timing them) first: the
        # plan reports them beside the roofline's kernels.
        cfg = pipeline.PipelineConfig(dispatch=dispatch,
                                      library_compute=library_compute(hw, precision))
        records = pipeline.optimize(mod, hw.to_tvm(), cfg, until="dispatch").records
        choices, notes = records.choices, list(records.notes)
    plan = make_plan(fused, hw, precision, dims, library=choices)
    plan.dims = used_dims  # the model's symbolic dims, as bound for the import
    plan.dispatch = [c.to_json() for c in choices]
    plan.dispatch_notes = notes
    return plan
