"""The `tvmopt bench` API: one BenchOptions in, one JSON-ready result dict out.

Order of work: resolve/compile the artifact(s) -> runners (tvmopt + baselines) -> closed-loop
batch sweep, interleaved -> per-kernel profile -> open-loop load test -> soak -> cold start
(last: a child process must not compete with the timed runs). RSS is sampled throughout.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import stage
from ..errors import ArtifactError, ShapeError, TvmoptError
from ..frontend.onnx_model import parse_shapes
from .runner import BaselineUnavailable

SCHEMA = "tvmopt.bench/1"
BASELINES = ("ort", "openvino", "openvino-f32", "torch", "torch.compile")
LOADS = ("poisson", "burst")


class BenchOptionError(TvmoptError):
    """An option value `bench` cannot use."""


@dataclass
class BenchOptions:
    """Everything `tvmopt bench` needs (validated on construction).

    Attributes:
        path: an artifact folder, or a model (.onnx or a torch.export .pt2; compiled first).
        model: the model for baselines when `path` is an artifact.
        target: compile target when `path` is a model.
        output: where compiled artifacts go (default tvmopt-out/bench/<stem>).
        shapes: --shape overrides for compiling, {input: shape}; 'NAME=1x3x96x96' strings are
            parsed on construction, as `compile` parses them.
        batches: batch sizes of the closed-loop sweep.
        dims: values of symbolic dims other than the batch (`--dim seq=128`); one not given
            runs at the lower bound the artifact was compiled for, else 1, and the report says
            which value each dim got.
        runs, warmup: timed and warm-up calls per runner and batch.
        max_seconds: time budget per batch size of the sweep (all runners together).
        baselines: subset of BASELINES.
        threads: onnxruntime intra-op and torch threads (default: all cores, like TVM's pool).
        load: None, 'poisson' or 'burst'; rate (requests/s), duration (s), burst phases spec,
            sizes (request-size mix spec), max_batch, max_wait_ms, timeout_ms, max_queue.
        soak: seconds of soak (default: `duration` when there is no load test).
        coldstart: measure cold start in a fresh process.
        profile_top: rows of the per-kernel profile (0: no profile).
        seed: inputs and arrivals.
        rpc_tracker, rpc_key: run the closed loop on a remote device through this TVM RPC
            tracker ('HOST:PORT') and the servers registered under this key.
    """

    path: str
    model: str | None = None
    target: str = "x86"
    output: str | None = None
    shapes: dict[str, tuple[int, ...]] | list[str] = field(default_factory=dict)
    batches: list[int] = field(default_factory=lambda: [1])
    dims: dict[str, int] = field(default_factory=dict)
    runs: int = 50
    warmup: int = 5
    max_seconds: float = 10.0
    baselines: list[str] = field(default_factory=list)
    threads: int | None = None
    load: str | None = None
    rate: float = 50.0
    duration: float | None = None
    burst: str | None = None
    sizes: str | None = None
    max_batch: int = 8
    max_wait_ms: float = 5.0
    timeout_ms: float = 1000.0
    max_queue: int = 1000
    coldstart: bool = True
    profile_top: int = 10
    seed: int = 0
    soak: float | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None

    def __post_init__(self):
        if isinstance(self.shapes, (list, tuple)):
            self.shapes = parse_shapes(self.shapes)
        if not self.batches or any(b < 1 for b in self.batches):
            raise BenchOptionError("--batch: batch sizes must be positive integers")
        bad = [f"{k}={v}" for k, v in self.dims.items() if not isinstance(v, int) or v < 1]
        if bad:
            raise BenchOptionError(f"--dim {bad[0]}: dim values must be positive integers")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad:
            raise BenchOptionError(f"--baselines: unknown {', '.join(bad)} "
                                   f"(choose from {', '.join(BASELINES)})")
        if self.load is not None and self.load not in LOADS:
            raise BenchOptionError(f"--load: unknown '{self.load}' (choose {' or '.join(LOADS)})")
        if self.soak is None and self.duration and not self.load:
            self.soak = self.duration
        if self.load and not self.duration:
            self.duration = 10.0
        if self.soak is not None and self.soak <= 0:
            raise BenchOptionError("--soak must be > 0 seconds")
        if self.runs < 1 or self.warmup < 0:
            raise BenchOptionError("--runs must be >= 1 and --warmup >= 0")
        if self.duration is not None and self.duration <= 0:
            raise BenchOptionError("--duration must be > 0 seconds")
        if self.rate <= 0:
            raise BenchOptionError("--rate must be > 0 requests/s")
        self.threads = self.threads or os.cpu_count() or 1
        if self.rpc_tracker:
            from ..tuning.measure import parse_host_port

            parse_host_port(self.rpc_tracker)
            if not self.rpc_key:
                raise BenchOptionError("--rpc-tracker needs --rpc-key (the key the servers "
                                       "registered with)")
            local = [flag for flag, on in (("--baselines", self.baselines), ("--load", self.load),
                                           ("--soak/--duration", self.soak)) if on]
            if local:
                raise BenchOptionError(f"{', '.join(local)}: measured on this machine, not "
                                       "over RPC; bench locally for them")
        elif self.rpc_key:
            raise BenchOptionError("--rpc-key needs --rpc-tracker HOST:PORT")

    @property
    def is_model(self) -> bool:
        from ..frontend.model_file import is_model_file

        return is_model_file(self.path)


# ------------------------------------------------------------------------------------ artifacts
def _compile(model: str, opts: BenchOptions, out: Path, shapes: dict, log) -> str:
    from ..interface.compile import CompileOptions, compile_model

    log(f"compiling {model} for {opts.target} -> {out}")
    res = compile_model(CompileOptions(model=model, target=opts.target, output=str(out),
                                       shapes=shapes))
    return str(res.artifact.path)


def resolve_artifacts(opts: BenchOptions, log) -> tuple[dict, str | None]:
    """{batch or None (any batch): artifact path} and the model path for baselines.

    A model whose batch dim is symbolic compiles once; a static-batch model is recompiled per
    batch with --shape (its other dims kept).
    """
    from ..runtime.artifact import read_artifact
    from ..frontend.model_file import model_inputs

    if not opts.is_model:
        art = read_artifact(opts.path)
        return {None: opts.path}, opts.model or _find_model(art.manifest["model"], opts.path)
    model = opts.path
    stem = Path(model).stem
    out = Path(opts.output or f"tvmopt-out/bench/{stem}")
    infos = model_inputs(model)
    first = infos[0].shape[0] if infos and infos[0].shape else None
    fixed = bool(infos) and infos[0].name in opts.shapes
    if isinstance(first, str) and not fixed:
        return {None: _compile(model, opts, out / f"{stem}.tvmopt", opts.shapes, log)}, model
    # static batch: one artifact per batch size, the first input's leading dim replaced
    arts = {}
    for b in opts.batches:
        shape = list(opts.shapes.get(infos[0].name, infos[0].shape or ()))
        if not shape:
            raise ShapeError(f"input '{infos[0].name}' has no batch dimension to set with "
                             "--batch; give its shape with --shape")
        if any(not isinstance(d, int) for d in shape[1:]):
            raise ShapeError(f"input '{infos[0].name}' has symbolic dims besides the batch; "
                             "give --shape for it")
        shape[0] = b
        shapes = {**opts.shapes, infos[0].name: tuple(shape)}
        arts[b] = _compile(model, opts, out / f"{stem}.b{b}.tvmopt", shapes, log)
    return arts, model


def _find_model(entry: dict, artifact_path: str) -> str | None:
    """The model an artifact was compiled from: beside the artifact or a bundled model, matched
    by the sha256 in the manifest (a same-named but different file is not used)."""
    from ..models import bundled
    from ..files import sha256_file

    beside = Path(artifact_path).parent / entry["file"]
    for cand in [beside, *bundled().values()]:
        if cand.exists() and sha256_file(cand) == entry.get("sha256"):
            return str(cand)
    return None


# ------------------------------------------------------------------------------------ baselines
def _make_baselines(opts, model, factory, log) -> tuple[list, dict]:
    """Each baseline in a worker process of its own (bench.runner.ProcessRunner)."""
    from .runner import ProcessRunner

    runners, status = [], {}
    for name in opts.baselines:
        if model is None:
            status[name] = ("unavailable: the artifact's model was not found beside it or among "
                            "the bundled models (pass --model)")
            continue
        stage.enter(f"baseline {name}", model)
        try:
            if name.startswith("torch") and Path(model).suffix.lower() == ".onnx":
                log(f"converting {Path(model).name} with onnx2torch for {name}")
            r = ProcessRunner(name, model, factory, opts.threads)
            runners.append(r)
            # OpenVINO picks its precision from the CPU (bf16 on AMX): label what ran.
            status[name] = "ok" + (f" (precision {r.precision})" if r.precision else "")
        except BaselineUnavailable as err:
            status[name] = f"unavailable: {err}"
    return runners, status


def _ratios(rows: list[dict]) -> None:
    """Add 'ratio_to_ort' to each row: every steady figure divided by onnxruntime's."""
    ort = {(r["batch"], r["size"]): r["steady"] for r in rows if r["runner"] == "onnxruntime"}
    for r in rows:
        ref = ort.get((r["batch"], r["size"]))
        r["ratio_to_ort"] = ({k: (v / ref[k] if ref[k] else None) for k, v in r["steady"].items()
                              if isinstance(v, float)} if ref else None)


# ------------------------------------------------------------------------------------ main
def _dim_values(given: dict[str, int], factory, bounds: dict) -> dict[str, int]:
    """The values of the non-batch symbolic dims: --dim, else the compiled lower bound.

    Raises:
        BenchOptionError: a --dim that is no symbolic dim, is the batch dim, or is outside
            the range the artifact was compiled for.
    """
    symbolic = factory.symbolic_dims
    for name, value in given.items():
        if name == factory.batch_dim:
            raise BenchOptionError(f"--dim {name}: '{name}' is the batch dim; set it with --batch")
        if name not in symbolic:
            others = [d for d in symbolic if d != factory.batch_dim]
            raise BenchOptionError(f"--dim {name}: not a symbolic dim of the artifact's inputs "
                                   f"(its other symbolic dims: {', '.join(others) or 'none'})")
        lo, hi = bounds.get(name, (value, value))
        if not lo <= value <= hi:
            raise BenchOptionError(f"--dim {name}={value}: outside {lo}..{hi}, the range the "
                                   "artifact was compiled for")
    defaults = {k: lo for k, (lo, _) in bounds.items() if k != factory.batch_dim}
    return {**defaults, **given}


def run_bench(opts: BenchOptions, log=print) -> dict:
    """Run every part of the benchmark `opts` asks for.

    Returns:
        The result document (schema SCHEMA, documented in docs/performance.md).

    Raises:
        TvmoptError: bad options, model, artifact or shapes.
    """
    from ..runtime.loader import load
    from .clock import RealClock
    from .closed_loop import measure
    from .memory import RssSampler, memory_report
    from .runner import ArtifactRunner, InputFactory

    if opts.rpc_tracker:
        from .remote import run_remote_bench

        arts, model = resolve_artifacts(opts, log)
        return run_remote_bench(opts, arts, model, {"schema": SCHEMA, "versions": _versions([])},
                                log)
    # Same thread count for every runtime: TVM's CPU pool defaults to half the logical cores
    # (it assumes hyper-threads), 1 of 2 here, while onnxruntime and torch get `threads`. The
    # pool reads this when it starts, so it must be set before anything runs a kernel.
    os.environ.setdefault("TVM_NUM_THREADS", str(opts.threads))
    arts, model = resolve_artifacts(opts, log)
    loaded = {b: load(p) for b, p in arts.items()}
    first = next(iter(loaded.values()))
    fixed = _dim_values(opts.dims, InputFactory(first.inputs), first.dim_bounds)
    factory = InputFactory(first.inputs, seed=opts.seed, fixed=fixed)
    if None not in loaded and factory.static_batch is None:
        raise ArtifactError("internal: per-batch artifacts without a static batch")
    clock = RealClock()
    warnings: list[str] = []
    doc = {"schema": SCHEMA, "versions": _versions(opts.baselines),
           "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "threads": opts.threads, "tvm_threads": _tvm_threads()},
           "artifacts": {("any" if b is None else str(b)): str(p) for b, p in arts.items()},
           "model": model, "target": first.artifact.manifest["target"]["name"],
           "device": first.artifact.manifest["target"]["device"],
           "options": asdict(opts), "warnings": warnings,
           # Which value each symbolic dim ran at, and where it came from: a dynamic-sequence
           # model timed at seq 1 measures something else than at 128.
           "dims": {d: {"value": v, "from": ("--batch" if v == "--batch" else
                                             "--dim" if d in opts.dims else
                                             "bound" if d in first.dim_bounds else "default")}
                    for d, v in factory.dim_values().items()}}

    def tvm_runner(b):
        lm = loaded[None] if None in loaded else loaded[b]
        return ArtifactRunner(lm, InputFactory(lm.inputs, seed=opts.seed, fixed=fixed)
                              if None not in loaded else factory)

    # baselines take inputs from the model's own signature: a model compiled per static batch
    # (--shape) may still be symbolic in batch for onnxruntime and torch
    base_factory = factory
    if model is not None and opts.baselines:
        from ..frontend.model_file import model_inputs

        base_factory = InputFactory(model_inputs(model), seed=opts.seed, fixed=fixed)
    if doc["device"] == "cpu" and doc["host"]["tvm_threads"] != opts.threads:
        warnings.append(f"TVM's thread pool runs {doc['host']['tvm_threads']} threads, the "
                        f"baselines {opts.threads} (TVM_NUM_THREADS is "
                        f"{os.environ.get('TVM_NUM_THREADS')!r}, or the pool started earlier)")
    base_runners, doc["baselines"] = _make_baselines(opts, model, base_factory, log)
    for name, st in doc["baselines"].items():
        if not st.startswith("ok"):
            warnings.append(f"baseline {name} {st}")
    # timing a model that computes NaN or Inf measures nothing worth having: say so up front
    from ..runtime.loader import nonfinite

    probe = tvm_runner(opts.batches[0])
    probe_outs = probe.lm.run(probe.factory.feeds(opts.batches[0]), check=False)
    bad = nonfinite(probe_outs, "output")
    if bad:
        warnings.append(f"batch {opts.batches[0]}, random inputs: {'; '.join(bad)}")

    with RssSampler() as rss:
        # closed loop, batch sweep, interleaved with the baselines
        rows = []
        for b in opts.batches:
            runners = [tvm_runner(b)]
            for br in base_runners:
                try:
                    br.prepare(b)
                    runners.append(br)
                except (BaselineUnavailable, TvmoptError) as err:
                    warnings.append(f"{br.name} skipped at batch {b}: {err}")
            log(f"closed loop: batch {b}, {', '.join(r.name for r in runners)}")
            stage.enter(f"closed loop, batch {b}")
            results = measure(runners, clock, b, warmup=opts.warmup, runs=opts.runs,
                              max_seconds=opts.max_seconds)
            rows += [res.to_json() for res in results]
            if results[0].steady.n < opts.runs:
                warnings.append(f"batch {b}: --max-seconds {opts.max_seconds:g} reached after "
                                f"{results[0].steady.n} of {opts.runs} runs per runner")
        noisy = [f"{r['runner']}@{r['batch']} {r['steady']['cv']:.0%}" for r in rows
                 if r["steady"]["noisy"]]
        if noisy:
            warnings.append("coefficient of variation above 10% (" + ", ".join(noisy) + "): "
                            "the machine is too noisy to trust small differences")
        _ratios(rows)
        doc["closed_loop"] = rows
        for br in base_runners:  # their worker processes are done
            br.close()

        doc["profile"] = None
        if opts.profile_top > 0:
            from .profile import kernel_profile

            b0 = opts.batches[0]
            r0 = tvm_runner(b0)
            log(f"per-kernel profile: batch {b0}")
            stage.enter("per-kernel profile")
            doc["profile"] = kernel_profile(r0.lm, r0.device_args(b0), top=opts.profile_top)
            doc["profile"]["batch"] = b0

        doc["load"] = _load_test(opts, loaded, factory, clock, log, warnings) if opts.load else None

        doc["soak"] = None
        if opts.soak:
            from .soak import soak

            b0 = opts.batches[0]
            log(f"soak: batch {b0} for {opts.soak:g} s")
            stage.enter("soak")
            doc["soak"] = soak(tvm_runner(b0), clock, b0, opts.soak)
            if doc["soak"]["leak_suspected"]:
                warnings.append(f"soak: RSS grew {doc['soak']['rss_growth']:.1%} and kept "
                                "growing in the second half: possible leak")
            if doc["soak"]["drifting"]:
                warnings.append(f"soak: median latency drifted {doc['soak']['p50_drift']:+.0%}")
    doc["memory"] = memory_report(rss, doc["device"])

    doc["cold_start"] = None
    if opts.coldstart:
        from .coldstart import cold_start

        b0 = opts.batches[0]
        p = arts[None] if None in arts else arts[b0]
        log("cold start: fresh process")
        stage.enter("cold start")
        doc["cold_start"] = cold_start(p, factory.dims(b0) if None in arts else {})
        doc["cold_start"]["batch"] = b0
    return doc


def _load_test(opts, loaded, factory, clock, log, warnings) -> dict:
    from .load import generate, parse_sizes
    from .runner import ArtifactRunner
    from .server import BatchPolicy, serve

    if None not in loaded:
        raise ShapeError("the load test batches requests dynamically, which needs a symbolic "
                         "batch dim; this model has a static batch",
                         hint="export the model with a dynamic batch axis")
    sizes = parse_sizes(opts.sizes)
    size_is_items = factory.size_dim is None
    policy = BatchPolicy(max_batch=opts.max_batch, max_wait_s=opts.max_wait_ms / 1e3,
                         timeout_s=opts.timeout_ms / 1e3 if opts.timeout_ms else None,
                         max_queue=opts.max_queue)
    if size_is_items and max(s.value for s in sizes) > opts.max_batch:
        raise BenchOptionError(f"--sizes: a request of {max(s.value for s in sizes)} items does "
                               f"not fit --max-batch {opts.max_batch}")
    reqs = generate(opts.load, opts.rate, opts.duration, sizes, opts.burst, opts.seed)
    log(f"load test: {opts.load}, {len(reqs)} requests over {opts.duration:g} s, "
        f"max batch {opts.max_batch}, max wait {opts.max_wait_ms:g} ms")
    runner = ArtifactRunner(loaded[None], factory)
    stage.enter("load test")
    res = serve(runner, clock, reqs, policy, size_is_items=size_is_items,
                drain_s=max(2.0, opts.duration / 2), duration=opts.duration)
    summary = res.summary()
    if summary["overloaded"]:
        g = summary["queueing_growth"]
        warnings.append(f"load: over capacity: {summary['offered_rate']:.1f} req/s offered, "
                        f"{summary['achieved_rate']:.1f} served, "
                        f"{summary['dropped'] + summary['timed_out']} dropped or timed out, "
                        f"queue up to {summary['max_queue_depth']}, mean latency "
                        f"{g['first_third_mean_ms'] or 0:.0f} -> {g['last_third_mean_ms'] or 0:.0f} ms "
                        "first to last third")
    from .load import parse_burst

    phases = (parse_burst(opts.burst, opts.rate, opts.duration) if opts.load == "burst"
              else [(opts.duration, opts.rate)])
    return {"kind": opts.load, "rate": opts.rate, "duration_s": opts.duration,
            "burst": opts.burst, "phases": [list(p) for p in phases], "size_dim": factory.size_dim or "batch items",
            "sizes": [asdict(s) for s in sizes], "policy": asdict(policy),
            "summary": summary,
            "timeline": {"arrival_s": res.arrival.tolist(),
                         "latency_ms": ((res.finish - res.arrival) * 1e3).tolist(),
                         "status": res.status,
                         "batches": [list(b) for b in res.batches],
                         "queue_depth": [list(d) for d in res.depth]}}


def _tvm_threads() -> int | None:
    import tvm

    f = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    return int(f()) if f is not None else None


def _versions(baselines) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ["tvmopt", "apache-tvm", "onnxruntime"] + (
            ["torch", "onnx2torch"] if any(b.startswith("torch") for b in baselines) else []):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out
