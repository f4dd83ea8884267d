"""tvmopt: a compiler-based optimization pipeline for ML models on Apache TVM (Relax).

The Python API (the `tvmopt` command is a thin layer over it)::

    import tvmopt

    result = tvmopt.compile_model(tvmopt.CompileOptions(model="model.onnx", target="x86",
                                                        verify=True))
    loaded = tvmopt.load(result.artifact.path)
    outputs = loaded.run({"input": x})

    plan = tvmopt.plan_model("model.onnx", tvmopt.get_target("arm"))
    tuned = tvmopt.tune(tvmopt.TuneOptions(model="model.onnx", target="x86", trials=64))

Names:
    compile_model, CompileOptions, CompileResult: ONNX file -> artifact folder
        (`tvmopt.interface.compile`).
    plan_model: the per-kernel roofline plan and precision decisions (`tvmopt.interface.plan_model`).
    tune, TuneOptions: MetaSchedule tuning into a database folder, of the module compile keeps
        after its accuracy gate (`tvmopt.interface.tune`, `tvmopt.tuning.tune`).
    run_compare, CompareOptions: why model B is slower or faster than A, in named causes, with
        measured recommendations (`tvmopt.compare.run`).
    load: check and load an artifact to run it (`tvmopt.runtime.loader`).
    generate: token ids a decoder-with-past artifact generates after a prompt (prefill, then
        one-token decode steps; `tvmopt.bench.generate.generate_ids`).
    get_target: a hardware target from the registry (`tvmopt.targets.registry`).
    TvmoptError: the base class of every error the user can act on (`tvmopt.errors`).

TVM is imported only when a name that needs it is first used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "compile_model": "tvmopt.interface.compile",
    "CompileOptions": "tvmopt.interface.compile",
    "CompileResult": "tvmopt.interface.compile",
    "plan_model": "tvmopt.interface.plan_model",
    "tune": "tvmopt.interface.tune",
    "TuneOptions": "tvmopt.tuning.tune",
    "run_compare": "tvmopt.compare.run",
    "CompareOptions": "tvmopt.compare.run",
    "load": "tvmopt.runtime.loader",
    "generate": "tvmopt.bench.generate:generate_ids",  # module:attribute where they differ
    "get_target": "tvmopt.targets.registry",
    "TvmoptError": "tvmopt.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        module, _, attr = _API[name].partition(":")
        return getattr(importlib.import_module(module), attr or name)
    raise AttributeError(f"module 'tvmopt' has no attribute '{name}'")


def __dir__():
    return sorted(__all__)
