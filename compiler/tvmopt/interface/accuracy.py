"""The accuracy report of a non-fp32 build: its outputs against an fp32 build of the same
graph, both built and run in memory on the host CPU."""

from __future__ import annotations

import numpy as np

from ..errors import VerificationError
from ..targets.registry import HardwareTarget


def accuracy_report(art, imported, cfg, hw: HardwareTarget, opts, log=print) -> dict:
    """Max/mean error of the chosen precision against an fp32 build, on the same random inputs.

    Both builds run here on the host CPU (llvm): the CUDA or ARM artifact itself cannot run on this
    machine, and the numerics under test are those of the rewritten graph (fp16 casts, int8
    weights), which the host build shares. The result goes into the manifest; with
    `opts.max_error` a larger max error raises VerificationError.
    """
    from .. import pipeline
    from ..runtime.artifact import update_manifest
    from ..runtime.in_memory import host_target, run_in_memory
    from ..runtime.loader import random_inputs

    host = host_target()
    feeds = random_inputs(imported.inputs, opts.verify_dims)
    args = [feeds[i.name] for i in imported.inputs]
    outs = [run_in_memory(imported.mod, args, host.to_tvm(), pipeline.PipelineConfig(
                dispatch="codegen", database=None, precision_passes=list(passes),
                extra_passes=list(cfg.extra_passes)))
            for passes in (cfg.precision_passes, [])]
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
    # --max-error is relative to each output's magnitude, as in the bf16 gate (interface.gate)
    worst = max((o["max_abs"] / (o["ref_max_abs"] or 1.0) for o in per_output), default=0.0)
    report["relative_error"] = worst
    if opts.max_error is not None and worst > opts.max_error:
        raise VerificationError(f"precision {report['precision']}: error {worst:.3g} (max abs "
                                f"error / max |fp32 output|) vs the fp32 build exceeds "
                                f"--max-error {opts.max_error:g}; use --precision fp32 or raise "
                                "the limit")
    return report


def own_arithmetic_report(art, opts, log=print) -> dict:
    """The accuracy record of a pre-quantized model built with no precision rewrite: its int8
    arithmetic is the model's own (its quantize / dequantize steps), so there is no fp32 build
    of a rewritten graph to measure against. The reference for the artifact itself is
    onnxruntime, which `--verify` runs."""
    from ..runtime.artifact import update_manifest

    report = {"reference": None, "precision": art.manifest["precision"]["default"],
              "outputs": [], "max_error_limit": opts.max_error,
              "note": "no precision rewrite: the integer arithmetic is the model's own "
                      "quantization; --verify compares the artifact with onnxruntime"}
    prec = art.manifest["precision"]
    prec["accuracy"] = report
    update_manifest(art, precision=prec)
    log(f"accuracy {report['precision']}: {report['note']}")
    return report
