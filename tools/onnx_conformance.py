"""Run the ONNX backend node conformance cases through tvmopt and onnxruntime.

The installed `onnx` wheel no longer ships the cases' data files, so they are generated in
memory from its case scripts (`onnx.backend.test.case.node.collect_testcases`). Each case runs
in a worker process (one per --jobs) with a timeout; a worker that hangs or crashes is killed
and replaced, so one case cannot take down the run. For each case:

  tvmopt:       the path a user takes: `compile_model` (what `tvmopt compile` runs: load with
                the onnx checker, import, plan, build, export) to an artifact folder for the
                host target -> `runtime.load` (manifest, hashes) -> `LoadedModel.run` on the
                case's inputs -> compare with the case's expected outputs (its rtol/atol, dtype
                and shape).
  onnxruntime:  session -> run -> the same comparison.

A failure is reported at the stage its TvmoptError names (load, import, build, run, mismatch);
any other exception escaping tvmopt is "internal": what the CLI reports with exit code 2.

Usage:
  python tools/onnx_conformance.py [--sample N --seed S] [--ops Abs,Relu] [--jobs 2]
                                   [--timeout 60] [--json report.json] [--failures]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait

STAGES = ("load", "import", "build", "run", "mismatch", "internal", "timeout", "crash")


@dataclass
class Case:
    """One node case, in a form that pickles cheaply to a worker."""

    name: str
    op: str
    expanded: bool
    model: bytes
    inputs: list
    outputs: list
    rtol: float
    atol: float


@dataclass
class Result:
    name: str
    op: str
    expanded: bool
    stage: str | None = None  # first stage that failed for tvmopt; None = passed
    reason: str = ""
    ort_stage: str | None = None
    ort_reason: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.stage is None


# ---------------------------------------------------------------------------------------------
# Collecting cases


# Operand names (ONNX schema) that exported models carry as constants, not as data.
NON_DATA_OPERANDS = {"axes", "shape", "pads", "scales", "sizes", "repeats", "K", "k", "starts",
                     "ends", "steps", "split", "depth", "roi", "axis", "output_shape", "size",
                     "constant_value", "max_output_boxes_per_class", "iou_threshold",
                     "score_threshold", "limit", "delta", "start", "block_shape", "image_shape",
                     "frame_step", "frame_length", "dft_length", "window", "training_mode", "ratio"}


def bind_non_data_inputs(model_bytes: bytes, inputs: list) -> tuple[bytes, list]:
    """Make operand inputs (axes, shape, pads, scales, ...) initializers, as exporters write them.

    Returns the new model and the remaining (data) inputs.
    """
    import onnx
    from onnx import defs, numpy_helper

    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    operand = set()
    for node in model.graph.node:
        try:
            schema = defs.get_schema(node.op_type, opsets.get(node.domain or "", 1), node.domain)
        except Exception:  # noqa: BLE001 - unknown op: nothing to bind
            continue
        formal = [f.name for f in schema.inputs]
        for k, name in enumerate(node.input):
            fname = formal[min(k, len(formal) - 1)] if formal else ""
            if fname in NON_DATA_OPERANDS:
                operand.add(name)
    keep_vi, keep_vals, changed = [], [], False
    for vi, value in zip(model.graph.input, inputs):
        if vi.name in operand and value is not None and not isinstance(value, list):
            model.graph.initializer.append(numpy_helper.from_array(value, vi.name))
            changed = True
        else:
            keep_vi.append(vi)
            keep_vals.append(value)
    if not changed:
        return model_bytes, inputs
    del model.graph.input[:]
    model.graph.input.extend(keep_vi)
    return model.SerializeToString(), keep_vals


def collect(ops: set[str] | None = None, bind_operands: bool = False) -> list[Case]:
    """All node cases of the installed onnx package, each tagged with the op it tests.

    Args:
        ops: only cases of these op types.
        bind_operands: make operand inputs (axes, shapes, pads, ...) constants.
    """
    import numpy as np
    from onnx import numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = collect_testcases(None)
    cases, op = [], None
    for tc in raw:
        expanded = "_expanded" in tc.name
        if not expanded:  # expect() writes the one-node case, then its function expansions
            node = tc.model.graph.node[0]
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if ops and op not in ops:
            continue
        inputs, outputs = tc.data_sets[0]

        def arr(x):
            if hasattr(x, "SerializeToString") and hasattr(x, "dims"):
                return numpy_helper.to_array(x)
            if isinstance(x, list):
                return [arr(v) for v in x]
            return x if x is None else np.asarray(x)

        model_bytes, ins = tc.model.SerializeToString(), [arr(x) for x in inputs]
        if bind_operands:
            model_bytes, ins = bind_non_data_inputs(model_bytes, ins)
        cases.append(Case(tc.name, op, expanded, model_bytes, ins, [arr(x) for x in outputs],
                          tc.rtol, tc.atol))
    return cases


# ---------------------------------------------------------------------------------------------
# Running one case (in a worker)


def _last_line(err: BaseException) -> str:
    from tvmopt.errors import error_line

    return error_line(err)[:300]


def _flatten(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flatten(v))
        else:
            out.append(v)
    return out


def unspecified(case: Case):
    """(per-output masks, reason) for the expected values ONNX leaves undefined, else None.

    The node cases' expectations are whatever their generator computes (numpy / ml_dtypes
    astype) even where the specification says "undefined": a float cast to int4/uint4/int2/
    uint2 outside the type's range (ml_dtypes 0.5 wrapped it, 0.7 gives 0). Those elements are
    not compared; every such case is listed in the report with this reason.
    """
    import numpy as np

    from tvmopt.frontend.narrow_types import by_name, float_to_int_unspecified

    if case.op not in ("Cast", "CastLike") or not case.inputs or len(case.outputs) != 1:
        return None
    x, out = case.inputs[0], np.asarray(case.outputs[0])
    t = by_name(out.dtype)
    if t is None or t.is_float or not isinstance(x, np.ndarray):
        return None
    src = by_name(x.dtype)
    if not (x.dtype.kind == "f" or x.dtype.name == "bfloat16" or (src and src.is_float)):
        return None
    mask = float_to_int_unspecified(x.astype(np.float64), out.dtype.name)
    if not mask.any():
        return None
    return [mask], (f"{int(mask.sum())}/{mask.size} values: float -> {out.dtype.name} out of "
                    f"range, undefined in ONNX's Cast (tvmopt truncates and wraps)")


def compare(got: list, expected: list, rtol: float, atol: float, skip=None) -> str | None:
    """None when outputs match (shape, dtype kind and values), else the first difference.

    `skip`: per-output boolean masks of elements not compared (see `unspecified`).
    """
    import numpy as np

    got, expected = _flatten(got), _flatten(expected)
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return f"output {k}: shape {g.shape}, expected {e.shape}"
        if g.dtype != e.dtype:
            return f"output {k}: dtype {g.dtype}, expected {e.dtype}"
        if skip and k < len(skip) and skip[k] is not None:
            g, e = g[~skip[k]], e[~skip[k]]
        if e.dtype.kind in "OUS":
            if not np.array_equal(g, e):
                return f"output {k}: values differ"
            continue
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        if not np.allclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True):
            bad = ~np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
            diff = np.abs(g64 - e64)[bad]
            return (f"output {k}: {int(bad.sum())}/{e.size} values differ, "
                    f"max abs diff {np.nanmax(diff) if diff.size else float('nan'):.3g}")
    return None


def run_ort(case: Case) -> tuple[str | None, str]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
    except Exception as err:
        return "import", _last_line(err)
    try:
        names = [i.name for i in sess.get_inputs()]
        feeds = {n: v for n, v in zip(names, case.inputs) if v is not None}
        got = sess.run(None, feeds)
    except Exception as err:
        return "run", _last_line(err)
    skip = unspecified(case)
    diff = compare(got, case.outputs, case.rtol, case.atol, skip[0] if skip else None)
    return ("mismatch", diff) if diff else (None, "")


def _stage_of(err: BaseException) -> str:
    """The report stage of an error `compile_model` raised: a TvmoptError names where it failed;
    any other exception escaped the product uncaught (the CLI's exit 2) and is "internal"."""
    from tvmopt.errors import ImportFailure, ModelError, ShapeError, TvmoptError, UnsupportedOpError

    if not isinstance(err, TvmoptError):
        return "internal"
    if isinstance(err, ModelError):
        return "load"
    if isinstance(err, (UnsupportedOpError, ImportFailure, ShapeError)):
        return "import"
    return "build"


def _reason(err: BaseException) -> str:
    text = _last_line(err)
    from tvmopt.errors import TvmoptError

    return text if isinstance(err, TvmoptError) else f"{type(err).__name__}: {text}"


def run_tvmopt(case: Case, target: str) -> tuple[str | None, str]:
    """The case through the path a user takes: `compile_model` (what `tvmopt compile` runs) to
    an artifact folder, then `runtime.load` and `LoadedModel.run` on the case's inputs."""
    import tempfile

    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.errors import TvmoptError
    from tvmopt.runtime.loader import load

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(case.model)
        try:
            opts = CompileOptions(model=path, target=target, output=os.path.join(tmp, "art"))
            result = compile_model(opts, log=lambda *_: None)
        except Exception as err:  # noqa: BLE001 - classified, never fatal to the run
            return _stage_of(err), _reason(err)
        try:
            lm = load(result.artifact.path)
            names = [i.name for i in lm.inputs]
            feeds = {}
            for name, value in zip(names, case.inputs):
                if value is None or isinstance(value, list):
                    return "run", f"input '{name}': sequence/optional inputs are not fed by tvmopt"
                feeds[name] = value
            outs = lm.run(feeds)
            got = [outs[o.name] for o in lm.outputs]
        except TvmoptError as err:
            return "run", _reason(err)
        except Exception as err:  # noqa: BLE001
            return "internal", _reason(err)
    skip = unspecified(case)
    diff = compare(got, case.outputs, case.rtol, case.atol, skip[0] if skip else None)
    return ("mismatch", diff) if diff else (None, "")


def _worker(conn) -> None:
    """Worker loop: receive a Case, send back a Result; None ends the loop."""
    import contextlib
    import io

    warnings.simplefilter("ignore")
    # TVM's C++ logging writes straight to fd 2 ("BlockBuilder destroyed..."); keep the report clean.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.environ.setdefault("TVM_NUM_THREADS", "1")  # --jobs workers share the cores
    from tvmopt.runtime.in_memory import host_target

    target = host_target().name
    while True:
        case = conn.recv()
        if case is None:
            return
        t0 = time.perf_counter()
        res = Result(case.name, case.op, case.expanded)
        skip = unspecified(case)
        if skip:
            res.extra["unspecified"] = skip[1]
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                res.ort_stage, res.ort_reason = run_ort(case)
                res.stage, res.reason = run_tvmopt(case, target)
        except BaseException as err:  # noqa: BLE001 - a case must never kill the worker loop
            res.stage, res.reason = "crash", _last_line(err) or traceback.format_exc()[-300:]
        res.seconds = round(time.perf_counter() - t0, 3)
        conn.send(res)


# ---------------------------------------------------------------------------------------------
# The pool


class _Slot:
    def __init__(self, ctx):
        self.ctx = ctx
        self.start()

    def start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.case = None
        self.since = 0.0
        self.done = 0

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def run_cases(cases: list[Case], jobs: int, timeout: float, progress=None,
              recycle_every: int = 150) -> list[Result]:
    """Run every case in `jobs` worker processes; hung or crashed cases are recorded, not fatal."""
    ctx = mp.get_context("spawn")
    todo = collections.deque(cases)
    slots = [_Slot(ctx) for _ in range(max(1, min(jobs, len(cases))))]
    results: list[Result] = []

    def send(slot):
        if slot.done >= recycle_every:  # bound memory growth of long-lived TVM processes
            slot.kill()
            slot.start()
        slot.case = todo.popleft()
        slot.since = time.monotonic()
        slot.conn.send(slot.case)

    try:
        for slot in slots:
            if todo:
                send(slot)
        while any(s.case for s in slots):
            busy = [s for s in slots if s.case]
            # Worker start-up (importing TVM) is not the case's fault: count from first send.
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=1.0)
            now = time.monotonic()
            for slot in busy:
                res = None
                if slot.conn in ready:
                    try:
                        res = slot.conn.recv()
                    except (EOFError, OSError):
                        res = None
                if res is None and (slot.proc.sentinel in ready or not slot.proc.is_alive()):
                    res = Result(slot.case.name, slot.case.op, slot.case.expanded, "crash",
                                 f"worker died (exit code {slot.proc.exitcode})")
                    slot.kill()
                    slot.start()
                elif res is None and now - slot.since > timeout:
                    res = Result(slot.case.name, slot.case.op, slot.case.expanded, "timeout",
                                 f"no result after {timeout:.0f} s", seconds=timeout)
                    slot.kill()
                    slot.start()
                if res is None:
                    continue
                results.append(res)
                slot.done += 1
                slot.case = None
                if progress:
                    progress(res, len(results), len(cases))
                if todo:
                    send(slot)
    finally:
        for slot in slots:
            try:
                if slot.proc.is_alive() and slot.case is None:
                    slot.conn.send(None)
                    slot.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
            slot.kill()
    return results


# ---------------------------------------------------------------------------------------------
# Reports


def summarize(results: list[Result]) -> dict:
    """Pass rates overall, per op type and per failure stage, for tvmopt and onnxruntime."""
    n = len(results)

    def rate(k):
        return round(100.0 * k / n, 1) if n else 0.0

    tv_pass = sum(r.passed for r in results)
    ort_pass = sum(r.ort_stage is None for r in results)
    per_op: dict[str, dict] = {}
    for r in results:
        d = per_op.setdefault(r.op, {"cases": 0, "tvmopt": 0, "onnxruntime": 0, "failures": {}})
        d["cases"] += 1
        d["tvmopt"] += r.passed
        d["onnxruntime"] += r.ort_stage is None
        if r.stage:
            d["failures"][r.stage] = d["failures"].get(r.stage, 0) + 1
    stages = collections.Counter(r.stage for r in results if r.stage)
    ort_stages = collections.Counter(r.ort_stage for r in results if r.ort_stage)
    return {
        "cases": n,
        "tvmopt": {"passed": tv_pass, "rate": rate(tv_pass),
                   "failures_by_stage": {s: stages[s] for s in STAGES if stages[s]}},
        "onnxruntime": {"passed": ort_pass, "rate": rate(ort_pass),
                        "failures_by_stage": {s: ort_stages[s] for s in STAGES if ort_stages[s]}},
        "both_pass": sum(r.passed and r.ort_stage is None for r in results),
        "unspecified": {r.name: r.extra["unspecified"] for r in sorted(results, key=lambda r: r.name)
                        if r.extra.get("unspecified")},
        "per_op": dict(sorted(per_op.items())),
    }


def print_report(summary: dict, results: list[Result], show_failures: bool, out=sys.stdout):
    tv, ort = summary["tvmopt"], summary["onnxruntime"]
    n = summary["cases"]
    print(f"\nONNX node conformance: {n} cases", file=out)
    print(f"  tvmopt       {tv['passed']:5d}/{n}  {tv['rate']:5.1f}%   failures by stage: "
          f"{tv['failures_by_stage']}", file=out)
    print(f"  onnxruntime  {ort['passed']:5d}/{n}  {ort['rate']:5.1f}%   failures by stage: "
          f"{ort['failures_by_stage']}", file=out)
    if summary.get("unspecified"):
        print(f"\n  {len(summary['unspecified'])} cases expect values ONNX leaves undefined; "
              "those values are not compared:", file=out)
        for name, why in summary["unspecified"].items():
            print(f"    {name}: {why}", file=out)
    failing = [(op, d) for op, d in summary["per_op"].items() if d["tvmopt"] < d["cases"]]
    failing.sort(key=lambda x: (x[1]["tvmopt"] - x[1]["cases"], x[0]))
    if failing:
        print("\n  op types with tvmopt failures (passed/cases, onnxruntime, stages):", file=out)
        for op, d in failing:
            print(f"    {op:32s} {d['tvmopt']:3d}/{d['cases']:<3d}  ort {d['onnxruntime']:3d}  "
                  f"{d['failures']}", file=out)
    if show_failures:
        print("\n  failing cases:", file=out)
        for r in sorted(results, key=lambda r: r.name):
            if r.stage:
                print(f"    {r.name}: [{r.stage}] {r.reason}", file=out)


def _versions() -> dict:
    from importlib.metadata import version

    out = {}
    for pkg in ("onnx", "onnxruntime", "apache-tvm", "apache-tvm-ffi", "numpy", "ml_dtypes"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # noqa: BLE001
            out[pkg] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=None, help="run N cases drawn at random")
    ap.add_argument("--seed", type=int, default=0, help="seed for --sample")
    ap.add_argument("--ops", default=None, help="only these op types, comma-separated")
    ap.add_argument("--names", default=None, help="only these case names, comma-separated")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--json", dest="json_path", default=None, help="write the full report here")
    ap.add_argument("--failures", action="store_true", help="list every failing case")
    ap.add_argument("--const-operands", action="store_true",
                    help="bind operand inputs (axes, shape, pads, scales, ...) as initializers, "
                         "as exported models have them")
    ap.add_argument("--record", default=None, metavar="PATH",
                    help="write the sample's passing cases as the regression record "
                         "(tests/data/onnx_conformance_sample.json)")
    ap.add_argument("--quiet", action="store_true", help="no per-case progress")
    args = ap.parse_args(argv)

    ops = set(args.ops.split(",")) if args.ops else None
    cases = collect(ops, args.const_operands)
    total_cases = len(cases)
    if args.names:
        wanted = set(args.names.split(","))
        cases = [c for c in cases if c.name in wanted]
    if args.sample is not None and args.sample < len(cases):
        cases = sorted(random.Random(args.seed).sample(cases, args.sample), key=lambda c: c.name)
    if not cases:
        print("no cases selected", file=sys.stderr)
        return 2

    t0 = time.time()

    def progress(res, done, total):
        if args.quiet:
            return
        mark = "ok" if res.passed else f"FAIL [{res.stage}] {res.reason[:120]}"
        print(f"[{done}/{total}] {res.name}: {mark}", flush=True)

    results = run_cases(cases, args.jobs, args.timeout, progress)
    summary = summarize(results)
    print_report(summary, results, args.failures)
    wall = time.time() - t0
    print(f"\n  wall time {wall:.0f} s with --jobs {args.jobs}", flush=True)
    if args.record:
        record = {"total_cases": total_cases, "sample": len(cases), "seed": args.seed,
                  "passed": summary["tvmopt"]["passed"],
                  "passing": sorted(r.name for r in results if r.passed)}
        with open(args.record, "w") as f:
            json.dump(record, f, indent=1)
    if args.json_path:
        report = {"versions": _versions(), "selection": {"sample": args.sample, "seed": args.seed,
                                                         "ops": args.ops, "jobs": args.jobs,
                                                         "const_operands": args.const_operands,
                                                         "timeout": args.timeout},
                  "wall_s": round(wall, 1), "summary": summary,
                  "cases": [asdict(r) for r in sorted(results, key=lambda r: r.name)]}
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
