"""`tvmopt compile`: MODEL (.onnx or torch.export .pt2) -> a deployable artifact folder."""

from __future__ import annotations

import click

from . import options


@click.command()
@options.model_argument()
@options.target()
@click.option("-o", "--output", type=click.Path(),
              help="Artifact folder [default: MODEL.tvmopt]; with --bundle the .tar.gz "
                   "[default: MODEL-edge.tar.gz].")
@options.shapes()
@click.option("--verify", is_flag=True, help="Compare with onnxruntime (a .pt2: the program in torch) on random inputs.")
@click.option("--atol", type=float, default=1e-4, show_default=True)
@click.option("--rtol", type=float, default=1e-3, show_default=True)
@options.dim_ranges()
@options.precision("auto: the plan picks per target ('tvmopt plan' shows why); on CPUs with "
                   "AMX or AVX512-BF16, bf16 library convolutions/matmuls where each times "
                   "faster, behind the accuracy gate (--max-error). fp32: exact.")
@options.max_error()
@options.calibration()
@click.option("--retime", is_flag=True,
              help="Time every kernel again instead of reading the timing cache (then cache "
                   "the new timings); with --db, also decide library or codegen again instead "
                   "of taking the database's choices.")
@click.option("--db", type=click.Path(file_okay=False),
              help="Replay this tuning database (from `tvmopt tune`): each kernel goes to the "
                   "library or to codegen, in the precision, as when it was tuned (no timing), "
                   "so the module has the database's tasks.")
@click.option("--require-db", is_flag=True,
              help="Fail if --db misses any task (library choices as tuned even with --retime).")
@options.dispatch()
@options.allow_newer_opset()
@click.option("--max-elements", type=click.IntRange(min=1), default=None,
              help="Refuse at run time (before allocating) any tensor whose shape is read from "
                   "the inputs and holds more elements than this [default: 2^31].")
@click.option("--bundle", is_flag=True,
              help="Write one tarball for a Linux board instead: the library, the TVM runtime "
                   "libraries and a C++ runner (bin/tvmopt-run), no Python needed (docs/edge.md).")
def compile(model, target, output, shapes, verify, atol, rtol, dims, precision, max_error,
            calibration, retime, db, require_db, dispatch, allow_newer_opset, max_elements,
            bundle):
    """Compile MODEL (.onnx, or a torch.export.save'd .pt2) into a deployable artifact folder
    (or, with --bundle, a tarball for a board)."""
    from ..interface.compile import CompileOptions, compile_model
    from ..report import print_compile_result
    from ..runtime.verify import Tolerance

    verify_dims, dim_bounds = options.parse_dim_ranges(dims)
    opts = CompileOptions(model=model or options.default_model(), target=target, output=output,
                          shapes=list(shapes), verify=verify, tolerance=Tolerance(atol, rtol),
                          verify_dims=verify_dims, dim_bounds=dim_bounds,
                          precision=precision,
                          max_error=max_error, calibration=calibration, retime=retime, db=db,
                          require_db=require_db, dispatch=dispatch,
                          allow_newer_opset=allow_newer_opset, max_elements=max_elements)
    if bundle:
        from ..edge.bundle import compile_bundle
        from ..report import print_bundle

        result, packed = compile_bundle(opts, output)
        print_compile_result(result, shown_path=f"{packed.path} (model/)")
        print_bundle(packed)
    else:
        result = compile_model(opts)
        print_compile_result(result)
    if result.replay is not None:
        from ..tuning.report import print_replay

        print_replay(result.replay)
