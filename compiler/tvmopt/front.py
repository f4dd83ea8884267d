"""The front half as `compile` runs it: fuse, plan the precision, fuse again under the plan.

One function for `compile` and `tune`, so tuning extracts its tasks from exactly the module a
compile with the same options (layout, dispatch, precision, target) looks its records up in.
A database's manifest keeps those options and a fingerprint of the code that shapes the fused
functions; `compile --db` compares them with its own (`options_differ`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from . import pipeline

# The sources that decide what the fused functions (tuning workloads) and their default
# schedules are: a change there may change a task, so its records may no longer match.
_FINGERPRINTED = ("pipeline.py", "front.py", "frontend", "passes", "precision", "codegen",
                  "library")
# What `options_differ` says when only the fingerprint differs. Most code changes leave every
# task as it was, and compile knows which tasks still find their records, so that is what it
# reports to the user rather than this line alone.
CODE_CHANGED = "pipeline code changed since"


@dataclass
class FrontHalf:
    """The front half's result: the fused module, its precision plan, what the dispatch decided
    (`pipeline.Records`), and the config the rest of the build runs under (the one given, with
    the plan's precision passes)."""

    fused: object
    plan: object
    records: pipeline.Records
    cfg: pipeline.PipelineConfig


def fuse_and_plan(mod, target, hw, cfg: pipeline.PipelineConfig, precision: str,
                  dims: dict | None = None, dump=None, log=None) -> FrontHalf:
    """Run the front half on `mod` under `cfg`, plan its precision, and rerun it when the plan
    rewrites precision (those Relax rewrites come before legalization). `cfg` is not changed.
    """
    from .precision.kernel_plan import compiled_kernels, make_plan
    from .precision.schemes import passes_for

    front = pipeline.optimize(mod, target, cfg, until=pipeline.FRONT_HALF, dump=dump)
    plan = make_plan(front.mod, hw, precision, dims=dims or {}, library=front.records.choices)
    if log is not None:
        for d in plan.decisions:
            log(f"precision {d.precision}: {d.action}: {d.reason}")
    cfg = replace(cfg, precision_passes=passes_for(plan, hw))
    if cfg.precision_passes:
        front = pipeline.optimize(mod, target, cfg, until=pipeline.FRONT_HALF, dump=dump)
        # the kernels as built after the rewrites (compare matches profiles against them)
        plan.compiled = compiled_kernels(front.mod, plan.dims)
    return FrontHalf(front.mod, plan, front.records, cfg)


def pipeline_fingerprint() -> str:
    """sha256 over the sources that shape the fused functions (see _FINGERPRINTED)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in _FINGERPRINTED:
        p = root / name
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def pipeline_options(cfg: pipeline.PipelineConfig, precision: str) -> dict:
    """What a database manifest records about the module its tasks came from."""
    return {"layout": "NHWC" if cfg.use_channels_last else "as imported",
            "dispatch": cfg.dispatch, "precision": precision,
            "weight_prepack": bool(cfg.weight_prepack), "fingerprint": pipeline_fingerprint()}


def options_differ(recorded: dict | None, current: dict) -> list[str]:
    """The pipeline options a database was tuned under that differ from `current`, as
    'name: theirs -> ours' lines ([] when they match). A manifest from before the options were
    recorded was tuned on the layout as imported, with the code of its day."""
    recorded = recorded or {"layout": "as imported", "fingerprint": None}
    out = []
    for key in ("layout", "dispatch", "precision", "weight_prepack"):
        if key in recorded and recorded[key] != current[key]:
            out.append(f"{key} {recorded[key]} (this compile: {current[key]})")
    if recorded.get("fingerprint") != current["fingerprint"]:
        out.append(CODE_CHANGED)
    return out
