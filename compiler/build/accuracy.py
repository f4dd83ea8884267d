"""The hardware-aware part of `compile` (issue 5): plan -> precision passes -> manifest, the
accuracy report of non-fp32 builds, and the cross compiler for foreign-arch targets.

Kept out of compile.py so that file only gains one call per step.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import VerificationError
from ..targets.cross import cross_cc
from ..targets.registry import HardwareTarget, host_arch

def plan_and_passes(opts, hw: HardwareTarget, model, log=print):
    """Make the plan for `opts`, print its decisions, and return (plan, precision passes)."""
    from ..precision.plan import make_plan
    from ..precision.rewrites import passes_for

    cross_cc(hw)  # a missing cross compiler fails now, not after the build
    if hw.device == "cuda":
        from ..targets.cuda import enable_cuda_codegen

        enable_cuda_codegen()
    from ..passes.schedule_guard import take_fallbacks

    take_fallbacks()  # start this build's record empty
    plan = make_plan(model, hw, opts.precision, dims=opts.verify_dims, shapes=opts.shapes)
    for d in plan.decisions:
        log(f"precision {d.precision}: {d.action}: {d.reason}")
    return plan, passes_for(plan, hw)


def precision_manifest(plan) -> dict:
    """The manifest's "precision" section: what was asked, what was chosen, and every decision."""
    return {
        "requested": plan.requested,
        "default": plan.precision,
        "decisions": [{"precision": d.precision, "action": d.action, "reason": d.reason}
                      for d in plan.decisions],
        "kernels": {k.name: {"precision": k.precision, "why": k.why} for k in plan.kernels},
    }


def schedule_fallbacks(log=print) -> list[dict]:
    """Kernels whose preferred dlight rule failed during this build (printed, for the manifest)."""
    from ..passes.schedule_guard import take_fallbacks

    out = take_fallbacks()
    for f in out:
        why = " (no tensor cores)" if f["rule"] == "Matmul" else ""
        log(f"schedule: {f['rule']} failed on {f['kernel']} ({f['error']}); "
            f"the kernel uses the next dlight rule{why}")
    return out


def cuda_report(executable, hw: HardwareTarget, plan, log=print) -> tuple[bytes, dict]:
    """The CUDA source for the artifact, and which kernels got tensor-core (MMA) code.

    The plan predicts fp16 matmul/conv time at the tensor-core peak; when dlight gave no kernel
    a tensor-core schedule that prediction does not hold, and this says so.
    """
    from ..targets.cuda import cuda_source, tensor_core_kernels

    src = cuda_source(executable)
    with_tc, kernels = tensor_core_kernels(src)
    info = {"arch": hw.tvm.get("arch"), "compiler": os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc"),
            "kernels": len(kernels), "tensor_core_kernels": with_tc}
    log(f"cuda {info['arch']}: {len(kernels)} kernels, {len(with_tc)} with tensor-core MMA")
    if plan.precision == "fp16" and not with_tc:
        note = ("fp16 was chosen assuming tensor-core matmul/conv, but no kernel got a tensor-core "
                "schedule from dlight; fp16 still halves memory traffic")
        info["note"] = note
        log(f"warning: {note}")
    return src.encode(), info



def accuracy_report(art, imported, cfg, hw: HardwareTarget, opts, log=print) -> dict:
    """Max/mean error of the chosen precision against an fp32 build, on the same random inputs.

    Both builds run here on the host CPU (llvm): the CUDA or ARM artifact itself cannot run on this
    machine, and the numerics under test are those of the rewritten graph (fp16 casts, int8
    weights), which the host build shares. The result goes into the manifest; with
    `opts.max_error` a larger max error raises VerificationError.
    """
    import tvm
    from tvm import relax

    from .. import pipeline
    from ..runtime.artifact import update_manifest
    from ..runtime.loader import flatten_result, random_inputs
    from ..targets.registry import get_target

    host = get_target("x86") if host_arch() == "x86_64" else get_target("host")
    target = host.to_tvm()
    feeds = random_inputs(imported.inputs, opts.verify_dims)
    outs = []
    for passes in (cfg.precision_passes, []):
        ex = pipeline.build(imported.mod, target, "cpu", pipeline.PipelineConfig(
            database=None, precision_passes=list(passes), extra_passes=list(cfg.extra_passes)))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        args = [tvm.runtime.tensor(np.ascontiguousarray(feeds[i.name])) for i in imported.inputs]
        res = vm["main"](*args)
        outs.append(flatten_result(res))
    per_output = []
    for info, got, ref in zip(imported.outputs, outs[0], outs[1]):
        d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        per_output.append({"name": info.name, "max_abs": float(d.max(initial=0.0)),
                           "mean_abs": float(d.mean()) if d.size else 0.0,
                           "ref_max_abs": float(np.abs(ref).max(initial=0.0))})
    chosen = art.manifest["precision"]["default"]
    # fp32 chosen for a quantized model: the question is what computing its integer matmuls in
    # fp32 changes against the integer build as imported
    reference = ("integer-matmul build as imported (host llvm)" if chosen == "fp32"
                 else "fp32 build (host llvm)")
    report = {"reference": reference, "measured_on": f"host {host.name} build of "
              "the same rewritten graph", "precision": art.manifest["precision"]["default"],
              "outputs": per_output, "max_error_limit": opts.max_error}
    prec = art.manifest["precision"]
    prec["accuracy"] = report
    update_manifest(art, precision=prec)
    for o in per_output:
        log(f"accuracy {report['precision']} vs {reference.split(' (')[0]}: {o['name']}: max abs err {o['max_abs']:.3g}, "
            f"mean abs err {o['mean_abs']:.3g} (output magnitude {o['ref_max_abs']:.3g})")
    worst = max((o["max_abs"] for o in per_output), default=0.0)
    if opts.max_error is not None and worst > opts.max_error:
        raise VerificationError(f"precision {report['precision']}: max abs error {worst:.3g} vs the "
                                f"fp32 build exceeds --max-error {opts.max_error:g}; use "
                                "--precision fp32 or raise the limit")
    return report
