"""Manifest sections of `compile`: the precision decisions, fallbacks and the CUDA report."""

from __future__ import annotations

import os

from ..targets.registry import HardwareTarget


def precision_manifest(plan) -> dict:
    """The manifest's "precision" section: what was asked, what was chosen, and every decision."""
    return {
        "requested": plan.requested,
        "default": plan.precision,
        "decisions": [{"precision": d.precision, "action": d.action, "reason": d.reason}
                      for d in plan.decisions],
        "kernels": {k.name: {"precision": k.precision, "why": k.why} for k in plan.kernels},
    }


def kernels_manifest(cfg, records, replay=None) -> dict:
    """Who computes the heavy kernels: the build kind, the per-kernel choices with their timings
    (`records`, the pipeline's Records), and the libraries the artifact needs loaded before it
    runs."""
    library = [c for c in records.choices if c.choice == "library"]
    if replay is not None:
        kind = "tuned"
    elif library:
        kind = "dispatched"
    else:
        kind = "untuned"
    return {"build": kind, "dispatch": cfg.dispatch,
            "layout": "NHWC" if cfg.use_channels_last else "as imported",
            "requires": ["onednn"] if library else [],
            "choices": [c.to_json() for c in records.choices],
            "notes": list(records.notes)}


def fallbacks_manifest(events, log=print) -> tuple[list[dict], list[dict]]:
    """The manifest's `fallbacks` (every kind, see tvmopt.fallbacks) and `schedule_fallbacks`
    (the schedule-rule ones in their older form: rule, kernel, error); each is printed.

    Args:
        events: the Fallback records one compile collected.
    """
    out, schedule = [], []
    for f in events:
        out.append(f.to_json())
        if f.kind == "schedule_rule":
            schedule.append({"rule": f.rule, "kernel": f.where, "error": f.reason})
            why = " (no tensor cores)" if f.rule == "Matmul" else ""
            log(f"fallback: schedule rule {f.rule} failed on {f.where} ({f.reason}); "
                f"the kernel uses the next rule{why}")
        elif f.kind != "library_unavailable":  # already printed as a note, with its reason
            log(f"fallback: {f.kind.replace('_', ' ')} {f.where} failed ({f.reason}): "
                f"{f.to_json()['instead']}")
    return out, schedule


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
