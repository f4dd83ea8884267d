"""The `tvmopt compare` API: CompareOptions in, one JSON-ready document out.

Order of work: check both signatures -> build the variants worth timing (dynamic quantization
folded back to fp32) -> compile every model for tvmopt with the same options / open onnxruntime
sessions -> time every (model, runtime) interleaved in one closed loop -> profile each per
kernel -> attribute B - A per runtime -> recommendations and a verdict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError, ShapeError, TargetError, TvmoptError, error_line

SCHEMA = "tvmopt.compare/1"
RUNTIMES = ("tvmopt", "onnxruntime", "both")
PRECISIONS = ("fp32", "fp16", "int8")


class CompareOptionError(TvmoptError):
    """An option value `compare` cannot use."""


@dataclass
class CompareOptions:
    """Everything `tvmopt compare` needs (validated on construction).

    Attributes:
        a, b: the two .onnx models (B is the variant: "is B slower than A, and why").
        target: target name or alias from targets/; this host must run it.
        runtime: 'tvmopt', 'onnxruntime' or 'both'.
        shapes: --shape overrides for compiling (both models take the same inputs).
        output: folder for artifacts and rewritten models.
        runs, warmup, max_seconds: the interleaved closed loop (per model and runtime).
        profile_runs: instrumented runs per profile.
        threads: threads for every runtime (default: all cores).
        measure_variants: build and time the recommended rewrites.
        compile_precision: tvmopt `--precision` per side ('a'/'b'; default 'auto' for both).
    """

    a: str
    b: str
    target: str = "x86"
    runtime: str = "tvmopt"
    shapes: list[str] = field(default_factory=list)
    output: str | None = None
    runs: int = 30
    warmup: int = 3
    max_seconds: float = 30.0
    profile_runs: int = 10
    threads: int | None = None
    measure_variants: bool = True
    seed: int = 0
    compile_precision: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.runtime not in RUNTIMES:
            raise CompareOptionError(f"--runtime: unknown '{self.runtime}' "
                                     f"(choose {', '.join(RUNTIMES)})")
        if self.runs < 3 or self.warmup < 0 or self.profile_runs < 1:
            raise CompareOptionError("--runs must be >= 3, --warmup >= 0, --profile-runs >= 1")
        self.threads = self.threads or os.cpu_count() or 1

    @property
    def runtimes(self) -> list[str]:
        return ["tvmopt", "onnxruntime"] if self.runtime == "both" else [self.runtime]


# ------------------------------------------------------------------------------ models
def model_precision(model) -> str:
    """A short precision label of an ONNX model, from its ops and weights."""
    ops = {n.op_type for n in model.graph.node}
    if "DynamicQuantizeLinear" in ops or ops & {"ConvInteger", "MatMulInteger"}:
        return "int8 (dynamic)"
    if ops & {"QLinearConv", "QLinearMatMul"} or {"QuantizeLinear", "DequantizeLinear"} <= ops:
        return "int8 (QDQ)"
    import onnx

    kinds = [t.data_type for t in model.graph.initializer]
    if kinds and kinds.count(onnx.TensorProto.FLOAT16) > len(kinds) / 2:
        return "fp16"
    return "fp32"


def check_signatures(a_path: str, a, b_path: str, b) -> None:
    """Both models take the same inputs and give outputs of the same shapes and dtypes.

    Raises:
        ShapeError: naming the first difference.
    """
    from ..frontend.onnx_model import graph_inputs, graph_outputs

    ia, ib = graph_inputs(a), graph_inputs(b)
    if [i.name for i in ia] != [i.name for i in ib]:
        raise ShapeError(f"{b_path} takes inputs {[i.name for i in ib]}, {a_path} takes "
                         f"{[i.name for i in ia]}: compare needs the same inputs")
    for x, y in zip(ia, ib):
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            raise ShapeError(f"input '{x.name}': {a_path} has {x.dtype}[{x.shape_str()}], "
                             f"{b_path} has {y.dtype}[{y.shape_str()}]")
    oa, ob = graph_outputs(a), graph_outputs(b)
    if len(oa) != len(ob):
        raise ShapeError(f"{a_path} has {len(oa)} outputs, {b_path} has {len(ob)}")
    for x, y in zip(oa, ob):
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            raise ShapeError(f"output {x.name!r}/{y.name!r}: {a_path} gives "
                             f"{x.dtype}[{x.shape_str()}], {b_path} gives "
                             f"{y.dtype}[{y.shape_str()}]")


@dataclass
class _Model:
    key: str  # "a", "b", "a_folded", "b_folded"
    path: str
    proto: object
    quantized: bool


def _variants(opts: CompareOptions, out: Path, log) -> list[_Model]:
    from ..frontend.onnx_model import load_onnx
    from .rewrite import fold_dynamic_quantization, has_dynamic_quantization

    import onnx

    models = []
    for key, path in (("a", opts.a), ("b", opts.b)):
        proto = load_onnx(path)
        models.append(_Model(key, path, proto, has_dynamic_quantization(proto)))
    check_signatures(opts.a, models[0].proto, opts.b, models[1].proto)
    if opts.measure_variants:
        for m in list(models):
            if not m.quantized:
                continue
            folded, n = fold_dynamic_quantization(m.proto)
            if n:
                path = out / f"{Path(m.path).stem}.fp32w.onnx"
                onnx.save(folded, str(path))
                log(f"folded {n} integer ops of {Path(m.path).name} back to fp32 -> {path}")
                models.append(_Model(f"{m.key}_folded", str(path), folded, False))
    return models


# ------------------------------------------------------------------------------ runners
def _tvm_runner(m: _Model, opts: CompareOptions, out: Path, log):
    from ..bench.runner import ArtifactRunner, InputFactory
    from ..interface.compile import CompileOptions, compile_model
    from ..runtime.loader import load

    precision = opts.compile_precision.get(m.key.split("_")[0]) or "auto"
    art = out / f"{m.key}-{Path(m.path).stem}.tvmopt"
    log(f"compiling {Path(m.path).name} for {opts.target} (precision {precision}) -> {art}")
    try:
        res = compile_model(CompileOptions(model=m.path, target=opts.target, output=str(art),
                                           shapes=list(opts.shapes), precision=precision),
                            log=lambda msg: None)
    except TvmoptError as err:
        raise type(err)(f"tvmopt cannot build {m.path}: {err}", hint=err.hint) from None
    lm = load(res.artifact.path)
    return ArtifactRunner(lm, InputFactory(lm.inputs, seed=opts.seed),
                          name=f"tvmopt:{m.key}")


def _ort_runner(m: _Model, opts: CompareOptions):
    from ..bench.runner import InputFactory, OrtRunner
    from ..frontend.onnx_model import graph_inputs

    try:
        r = OrtRunner(m.path, InputFactory(graph_inputs(m.proto), seed=opts.seed), opts.threads)
    except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph/NotImplemented
        reason = error_line(err)
        raise ModelError(f"onnxruntime cannot load {m.path}: {reason}") from None
    r.name = f"onnxruntime:{m.key}"
    return r


def _feeds_check(runner, m: _Model) -> None:
    try:
        runner.prepare(1)
        runner.run(1)
    except TvmoptError:
        raise
    except Exception as err:
        reason = error_line(err)
        raise ModelError(f"{runner.name.split(':')[0]} cannot run {m.path}: {reason}") from None


# ------------------------------------------------------------------------------ main
def run_compare(opts: CompareOptions, log=print) -> dict:
    """Measure, profile and explain B against A on every runtime `opts` asks for.

    Returns:
        The result document (schema SCHEMA; docs/compare.md describes it).

    Raises:
        TvmoptError: bad options, models, signatures, target, or a model a runtime cannot load.
    """
    from ..bench.clock import RealClock
    from ..bench.closed_loop import measure
    from ..frontend.model_info import estimate_flops
    from ..targets.registry import check_host_can_run, get_target
    from .attribution import Profile, attribute, median_noise
    from .profiles import profile_ort, profile_tvm
    from .recommend import ModelFacts, recommend, tie_noise, verdict

    hw = get_target(opts.target)
    if "onnxruntime" in opts.runtimes and hw.device != "cpu":
        raise TargetError(f"--runtime onnxruntime runs on this host's CPU; target '{hw.name}' "
                          f"is a {hw.device} device (use --runtime tvmopt)")
    check_host_can_run(hw.device, hw.arch, list(hw.features))
    os.environ.setdefault("TVM_NUM_THREADS", str(opts.threads))
    out = Path(opts.output or f"tvmopt-out/compare/{Path(opts.a).stem}-vs-{Path(opts.b).stem}")
    out.mkdir(parents=True, exist_ok=True)
    models = _variants(opts, out, log)
    by_key = {m.key: m for m in models}
    peak = hw.peak_gflops_total("fp32")
    bw = hw.bandwidth_gbs()
    ridge = peak / bw if peak and bw else None

    if "tvmopt" in opts.runtimes:  # refuse before spending a compile on the other model
        from ..errors import UnsupportedOpError
        from ..frontend.importer import unsupported_ops

        for m in models:
            missing = unsupported_ops(m.proto)
            if missing:
                ops = "; ".join(f"{op} (nodes: {', '.join(nodes[:3])})"
                                for op, nodes in sorted(missing.items()))
                raise UnsupportedOpError(f"tvmopt cannot build {m.path}: unsupported ONNX op "
                                         f"types: {ops}")
    runners = {}
    # onnxruntime sessions first: a model it cannot load fails before any compile
    for rt in sorted(opts.runtimes, key=lambda r: r != "onnxruntime"):
        for m in models:
            r = _tvm_runner(m, opts, out, log) if rt == "tvmopt" else _ort_runner(m, opts)
            _feeds_check(r, m)
            runners[(rt, m.key)] = r
    log(f"timing {len(runners)} (model, runtime) pairs interleaved")
    results = measure(list(runners.values()), RealClock(), 1, warmup=opts.warmup,
                      runs=opts.runs, max_seconds=opts.max_seconds)
    med = {key: res.steady.p50_ms for key, res in zip(runners, results)}
    samples = {key: [s * 1e3 for s in res.samples_s] for key, res in zip(runners, results)}

    facts = {}
    for m in models[:2]:
        flops, _ = estimate_flops(m.proto)
        folded = by_key.get(f"{m.key}_folded")
        facts[m.key] = ModelFacts(Path(m.path).name, m.path, model_precision(m.proto),
                                  float(flops), m.quantized, folded.path if folded else None)

    docs = {}
    for rt in opts.runtimes:
        log(f"per-kernel profiles on {rt}")
        profiles = {}
        for m in models[:2]:
            r = runners[(rt, m.key)]
            if rt == "tvmopt":
                ks = profile_tvm(r.lm, r.device_args(1), opts.profile_runs, ridge, m.quantized)
            else:
                ks = profile_ort(m.path, r.factory.feeds(1), opts.threads,
                                 runs=opts.profile_runs, ridge=ridge)
            profiles[m.key] = Profile(med[(rt, m.key)], ks, samples[(rt, m.key)])
        att = attribute(profiles["a"], profiles["b"], bw,
                        b_fewer_flops=facts["b"].flops < 0.9 * facts["a"].flops)
        dense = [k for k in profiles["a"].kernels + profiles["b"].kernels
                 if k.cause in ("compute", "low_intensity_conv") and k.flops and k.ms > 0]
        rate = (sum(k.flops for k in dense) / sum(k.ms for k in dense) / 1e6) if dense else None
        measured = {by_key[k].path: v for (r2, k), v in med.items() if r2 == rt}
        other = None
        if len(opts.runtimes) > 1:
            o = "onnxruntime" if rt == "tvmopt" else "tvmopt"
            other = {"a": med[(o, "a")], "b": med[(o, "b")]}
        noise = {by_key[k].path: median_noise(samples[(r2, k)]) for (r2, k) in med if r2 == rt}
        recs = recommend(att, facts["a"], facts["b"], rt, hw.name, measured, rate, bw, other,
                         noise)
        doc = {**att, "runtime": rt,
               "recommendations": [r.to_json() for r in recs],
               "verdict": verdict(recs, att, facts["a"], facts["b"], rt, hw.name),
               "variants": {k: {"path": by_key[k].path, "p50_ms": v,
                                "p50_noise_ms": noise[by_key[k].path],
                                "cv": next(res.steady.cv for key, res in zip(runners, results)
                                           if key == (rt, k))}
                            for (r2, k), v in med.items() if r2 == rt},
               "profiles": {side: [k.to_json() for k in p.kernels]
                            for side, p in profiles.items()},
               "fp32_dense_gflops": rate}
        docs[rt] = doc
    head = {"schema": SCHEMA, "target": hw.name, "a": facts["a"].__dict__,
            "b": facts["b"].__dict__, "threads": opts.threads, "runs": opts.runs,
            "host": _host()}
    if len(docs) == 1:
        return {**head, **next(iter(docs.values()))}
    ranked = sorted(((rt, k, v) for (rt, k), v in med.items()), key=lambda t: t[2])
    spread = {key: median_noise(samples[key]) for key in med}
    # a rewritten model within the noise of a model as it is does not win
    if ranked[0][1].endswith("_folded"):
        plain = next((t for t in ranked if not t[1].endswith("_folded")), None)
        if plain is not None:
            ties = tie_noise({"x": spread[ranked[0][:2]], "y": spread[plain[:2]]}, "x", "y",
                             ranked[0][2])
            if plain[2] - ranked[0][2] <= ties:
                ranked.remove(plain)
                ranked.insert(0, plain)
    best, runner_up = ranked[0], ranked[1]
    name = Path(by_key[best[1]].path).name
    rec = next((r for r in docs[best[0]]["recommendations"]
                if r["model"] == by_key[best[1]].path), None)
    return {**head, "runtimes": docs,
            "verdict": (f"on {hw.name}: ship {name} with {best[0]} ({best[2]:.2f} ms, the fastest "
                        f"of {len(med)} measured (model, runtime) pairs; next "
                        f"{Path(by_key[runner_up[1]].path).name} with {runner_up[0]}, "
                        f"{runner_up[2]:.2f} ms)" + (f"; {rec['why']}" if rec else ""))}


def _host() -> dict:
    import platform

    return {"platform": platform.platform(), "cpu_count": os.cpu_count()}
