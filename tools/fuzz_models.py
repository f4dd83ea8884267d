"""Fuzz tvmopt with mutated ONNX models: nothing may crash, hang, leak a traceback, or compile
to results that differ from onnxruntime's where onnxruntime accepts the model.

Hypothesis draws a seed model (small valid graphs built here) and one mutation of it: an
attribute, a shape, a dtype, an edge, an initializer, the opset or a domain, a truncated file or
flipped bits. Each mutated model goes through what `inspect`, `compile` and `run` do, in-process
(load -> inspect -> import -> build -> run on random inputs), inside a worker process with a
timeout, so a native crash or a hang is caught and counted instead of ending the run; the same
model is run by onnxruntime on the same inputs and the outputs compared. A crash is replayed
through the real `tvmopt compile` entry point, which must turn it into its one-line exit 3.

Outcome classes (what `summarize` counts):
  refused:<stage>   a TvmoptError at load / inspect / import / build / run: one line, exit 1
  ok:match          compiled, ran, and matched onnxruntime
  ok:ort-refuses-model   compiled and ran; onnxruntime refused the model itself
  ok:ort-refuses-inputs  compiled and ran; onnxruntime refused these (random) inputs at run
  known:nan-through-min-max  only NaNs of onnxruntime's came out as numbers (TVM's Relu, Clip,
                    Max, Min drop a NaN operand), in a model whose NaN weights or inputs
                    compile/inspect/run warn about
  bug:traceback     an exception that is not a TvmoptError (the CLI's "internal error", exit 2)
  bug:mismatch      compiled and ran, onnxruntime accepts it, and the results differ
  bug:crash         the worker died by a signal (and whether the CLI isolated it)
  bug:hang          no answer within --timeout

Usage:
  python tools/fuzz_models.py --examples 200 [--seed 0] [--timeout 120] [--json report.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

KINDS = ("attribute", "shape", "dtype", "edge", "initializer", "opset", "domain", "truncate",
         "bitflip")
RTOL, ATOL = 1e-3, 1e-4


# ------------------------------------------------------------------------------ seed models
def _model(nodes, inputs, outputs, inits, opset=17):
    from onnx import helper

    g = helper.make_graph(nodes, "seed", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="fuzz")
    m.ir_version = 8
    return m


def seed_models() -> dict:
    """Small valid models covering common op families (every one compiles and matches)."""
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def vi(name, shape, t=TP.FLOAT):
        return helper.make_tensor_value_info(name, t, shape)

    node = helper.make_node
    seeds = {}
    seeds["mlp"] = _model(
        [node("MatMul", ["x", "w1"], ["h"]), node("Add", ["h", "b1"], ["h1"]),
         node("Relu", ["h1"], ["h2"]), node("MatMul", ["h2", "w2"], ["h3"]),
         node("Softmax", ["h3"], ["y"], axis=-1)],
        [vi("x", ["batch", 8])], [vi("y", ["batch", 4])], [w("w1", 8, 16), w("b1", 16), w("w2", 16, 4)])
    seeds["conv"] = _model(
        [node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1],
              kernel_shape=[3, 3]),
         node("LeakyRelu", ["c"], ["r"], alpha=0.1),
         node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         node("Flatten", ["p"], ["f"], axis=1),
         node("Gemm", ["f", "g", "gb"], ["y"], transB=1, alpha=0.5)],
        [vi("x", [1, 3, 8, 8])], [vi("y", [1, 5])],
        [w("k", 4, 3, 3, 3), w("kb", 4), w("g", 5, 64), w("gb", 5)])
    seeds["shape_ops"] = _model(
        [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
         node("Reshape", ["t", "shape"], ["r"]),
         node("ReduceMean", ["r"], ["m"], axes=[1], keepdims=1),
         node("Gather", ["x", "idx"], ["g"], axis=1),
         node("Concat", ["m", "g"], ["y"], axis=1)],
        [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])],
        [numpy_helper.from_array(np.array([2, 3, 4], np.int64), "shape"),
         numpy_helper.from_array(np.array([0, 2], np.int64), "idx")], opset=17)
    seeds["norm"] = _model(
        [node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
         node("Clip", ["n", "lo", "hi"], ["c"]),
         node("Pow", ["c", "two"], ["p"]),
         node("Cast", ["p"], ["y"], to=TP.FLOAT)],
        [vi("x", [2, 6])], [vi("y", [2, 6])],
        [w("gamma", 6), w("beta", 6),
         numpy_helper.from_array(np.array(-1.0, np.float32), "lo"),
         numpy_helper.from_array(np.array(1.0, np.float32), "hi"),
         numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    return seeds


# ------------------------------------------------------------------------------ mutations
def _strategies():
    from hypothesis import strategies as st

    return st


def _value_infos(m):
    return list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)


def _mutate_attribute(m, draw):
    import onnx
    from onnx import helper

    st = _strategies()
    node = m.graph.node[draw(st.integers(0, len(m.graph.node) - 1))]
    try:
        schema = onnx.defs.get_schema(node.op_type, 17)
        names = sorted(set(schema.attributes) | {a.name for a in node.attribute})
        types = {k: v.type for k, v in schema.attributes.items()}
    except Exception:  # noqa: BLE001
        names, types = [a.name for a in node.attribute], {}
    name = draw(st.sampled_from(names + ["not_an_attribute"]))
    A = onnx.AttributeProto
    kind = types.get(name, draw(st.sampled_from([A.INT, A.FLOAT, A.INTS, A.STRING])))
    if draw(st.booleans()) and draw(st.booleans()):  # one in four: the wrong type
        kind = draw(st.sampled_from([A.INT, A.FLOAT, A.INTS, A.STRING]))
    if kind == A.INT:
        value = draw(st.integers(-3, 9) | st.sampled_from([-2**31, 2**31 - 1, 2**62]))
    elif kind == A.FLOAT:
        value = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
    elif kind == A.INTS:
        value = draw(st.lists(st.integers(-3, 9), min_size=1, max_size=6))
    elif kind == A.FLOATS:
        value = draw(st.lists(st.floats(-4, 4, width=32), min_size=1, max_size=4))
    else:
        value = draw(st.sampled_from(["", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID",
                                      "constant", "reflect", "edge", "nearest", "linear", "?"]))
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))
    return f"{node.op_type}.{name} = {value!r}"


def _mutate_shape(m, draw):
    st = _strategies()
    vis = _value_infos(m)
    v = vis[draw(st.integers(0, len(vis) - 1))]
    shape = v.type.tensor_type.shape
    action = draw(st.sampled_from(["dim", "param", "add", "drop", "clear"]))
    if action == "clear" or not shape.dim:
        v.type.tensor_type.ClearField("shape")
        return f"{v.name}: shape removed"
    k = draw(st.integers(0, len(shape.dim) - 1))
    if action == "dim":
        value = draw(st.sampled_from([0, 1, 2, 3, 5, 64, 1 << 20]))
        shape.dim[k].Clear()
        shape.dim[k].dim_value = value
        return f"{v.name}[{k}] = {value}"
    if action == "param":
        shape.dim[k].Clear()
        shape.dim[k].dim_param = draw(st.sampled_from(["n", "batch", "seq"]))
        return f"{v.name}[{k}] = '{shape.dim[k].dim_param}'"
    if action == "add":
        shape.dim.add().dim_value = draw(st.integers(1, 4))
        return f"{v.name}: a dim added"
    del shape.dim[k]
    return f"{v.name}: dim {k} dropped"


def _mutate_dtype(m, draw):
    st = _strategies()
    code = draw(st.integers(0, 25))
    if m.graph.initializer and draw(st.booleans()):
        t = m.graph.initializer[draw(st.integers(0, len(m.graph.initializer) - 1))]
        t.data_type = code
        return f"initializer {t.name}: data_type {code}"
    vis = _value_infos(m)
    v = vis[draw(st.integers(0, len(vis) - 1))]
    v.type.tensor_type.elem_type = code
    return f"{v.name}: elem_type {code}"


def _mutate_edge(m, draw):
    st = _strategies()
    nodes = m.graph.node
    names = sorted({o for n in nodes for o in n.output} | {i.name for i in m.graph.input}
                   | {t.name for t in m.graph.initializer})
    action = draw(st.sampled_from(["rewire", "ghost", "drop", "reorder", "dup_output", "extra"]))
    n = nodes[draw(st.integers(0, len(nodes) - 1))]
    if action == "reorder":
        order = list(nodes)[::-1]
        del nodes[:]
        nodes.extend(order)
        return "nodes reversed (not topologically sorted)"
    if action == "dup_output":
        n.output[0] = nodes[0].output[0]
        return f"{n.op_type} writes {nodes[0].output[0]} too"
    if action == "extra":
        n.input.append(draw(st.sampled_from(names)))
        return f"{n.op_type}: an extra input"
    if not n.input:
        return "no input to change"
    k = draw(st.integers(0, len(n.input) - 1))
    if action == "rewire":
        n.input[k] = draw(st.sampled_from(names))
    elif action == "ghost":
        n.input[k] = "ghost"
    else:
        n.input[k] = ""
    return f"{n.op_type}.input[{k}] = {n.input[k]!r}"


def _mutate_initializer(m, draw):
    from onnx import numpy_helper

    st = _strategies()
    if not m.graph.initializer:
        return "no initializer"
    t = m.graph.initializer[draw(st.integers(0, len(m.graph.initializer) - 1))]
    action = draw(st.sampled_from(["dims", "values", "nonfinite", "cut", "drop"]))
    if action == "dims":
        dims = draw(st.lists(st.integers(0, 6), max_size=4))
        del t.dims[:]
        t.dims.extend(dims)
        return f"{t.name}: dims {dims}, data unchanged"
    if action == "cut":
        arr = numpy_helper.to_array(t)
        t.ClearField("float_data"), t.ClearField("int64_data")
        t.raw_data = arr.tobytes()[: max(0, arr.nbytes - draw(st.integers(1, 8)))]
        return f"{t.name}: raw data cut short"
    if action == "drop":
        name = t.name
        m.graph.initializer.remove(t)
        return f"initializer {name} removed"
    arr = numpy_helper.to_array(t).copy()
    if arr.dtype.kind == "f":
        if action == "nonfinite":
            arr.reshape(-1)[0] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        else:
            arr = (arr * draw(st.floats(-1e6, 1e6, width=32))).astype(arr.dtype)
    else:
        arr = arr + draw(st.integers(-5, 5))
    t.CopyFrom(numpy_helper.from_array(arr, t.name))
    return f"{t.name}: values changed ({action})"


def _mutate_opset(m, draw):
    import onnx

    st = _strategies()
    newest = onnx.defs.onnx_opset_version()
    action = draw(st.sampled_from(["version", "remove", "ir"]))
    if action == "ir":
        m.ir_version = draw(st.sampled_from([0, 1, 3, 7, 99]))
        return f"ir_version {m.ir_version}"
    if action == "remove":
        del m.opset_import[:]
        return "no opset_import"
    v = draw(st.sampled_from([0, 1, 6, 7, 9, 11, 13, newest, newest + 1, 10**6]))
    m.opset_import[0].version = v
    return f"ai.onnx opset {v}"


def _mutate_domain(m, draw):
    from onnx import helper

    st = _strategies()
    n = m.graph.node[draw(st.integers(0, len(m.graph.node) - 1))]
    n.domain = draw(st.sampled_from(["com.microsoft", "ai.onnx.ml", "com.example", "ai.onnx"]))
    if draw(st.booleans()):
        m.opset_import.append(helper.make_opsetid(n.domain, 1))
    return f"{n.op_type}.domain = {n.domain!r}"


_PROTO_MUTATIONS = {"attribute": _mutate_attribute, "shape": _mutate_shape,
                    "dtype": _mutate_dtype, "edge": _mutate_edge,
                    "initializer": _mutate_initializer, "opset": _mutate_opset,
                    "domain": _mutate_domain}


def mutated_models():
    """A hypothesis strategy of (seed name, kind, description, model bytes)."""
    import onnx

    st = _strategies()
    seeds = {k: v.SerializeToString() for k, v in seed_models().items()}

    @st.composite
    def build(draw):
        name = draw(st.sampled_from(sorted(seeds)))
        kind = draw(st.sampled_from(KINDS))
        data = seeds[name]
        if kind == "truncate":
            cut = draw(st.integers(0, len(data) - 1))
            return name, kind, f"cut at byte {cut} of {len(data)}", data[:cut]
        if kind == "bitflip":
            bits = draw(st.lists(st.integers(0, 8 * len(data) - 1), min_size=1, max_size=8))
            buf = bytearray(data)
            for b in bits:
                buf[b // 8] ^= 1 << (b % 8)
            return name, kind, f"{len(bits)} bits flipped", bytes(buf)
        m = onnx.ModelProto()
        m.ParseFromString(data)
        what = _PROTO_MUTATIONS[kind](m, draw)
        return name, kind, what, m.SerializeToString()

    return build()


# ------------------------------------------------------------------------------ one check
def _last_line(err: BaseException) -> str:
    from tvmopt.errors import error_line

    return f"{type(err).__name__}: {error_line(err, '')}"[:300]


def _compare(ours: dict, theirs: dict) -> str | None:
    for name, ref in theirs.items():
        got = ours.get(name)
        if got is None:
            return f"output {name}: missing"
        got, ref = np.asarray(got), np.asarray(ref)
        if got.shape != ref.shape:
            return f"output {name}: shape {got.shape}, onnxruntime {ref.shape}"
        if got.dtype != ref.dtype:
            return f"output {name}: dtype {got.dtype}, onnxruntime {ref.dtype}"
        if got.dtype.kind in "fc":
            if not np.allclose(got, ref, rtol=RTOL, atol=ATOL, equal_nan=True):
                err = np.nanmax(np.abs(got.astype(np.float64) - ref.astype(np.float64)))
                return f"output {name}: max |diff| {err:.3g}"
        elif not np.array_equal(got, ref):
            return f"output {name}: values differ"
    return None


def _only_nan_lost(ours: dict, theirs: dict) -> bool:
    """Whether every difference is a NaN of onnxruntime's that tvmopt computed as a number."""
    for name, ref in theirs.items():
        got = np.asarray(ours.get(name))
        ref = np.asarray(ref)
        if got.shape != ref.shape or got.dtype != ref.dtype or got.dtype.kind not in "fc":
            return False
        close = np.isclose(got, ref, rtol=RTOL, atol=ATOL, equal_nan=True)
        if not np.all(close | np.isnan(ref)):
            return False
    return True


def check(data: bytes) -> dict:
    """What inspect, compile and run make of one model file, compared with onnxruntime."""
    from tvmopt.errors import TvmoptError
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.model_info import inspect_model
    from tvmopt.frontend.onnx_model import load_onnx
    from tvmopt.runtime.in_memory import load_in_memory
    from tvmopt.runtime.loader import random_inputs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        state: dict = {}
        stages = [
            ("load", lambda: state.__setitem__("model", load_onnx(path))),
            ("inspect", lambda: inspect_model(path, state["model"])),
            ("import", lambda: state.__setitem__("imported", import_onnx(state["model"]))),
            ("build", lambda: state.__setitem__("lm", load_in_memory(state["imported"]))),
            ("run", lambda: state.__setitem__("ours", state["lm"].run(
                state.setdefault("feeds", random_inputs(state["imported"].inputs))))),
        ]
        for stage, step in stages:
            try:
                step()
            except TvmoptError as err:
                return {"outcome": f"refused:{stage}", "reason": str(err)[:300]}
            except Exception as err:  # noqa: BLE001 - what the fuzzer looks for
                return {"outcome": "bug:traceback", "stage": stage, "reason": _last_line(err),
                        "traceback": traceback.format_exc()[-2000:]}
        try:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.log_severity_level = 4
            sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001
            return {"outcome": "ok:ort-refuses-model", "reason": _last_line(err)}
        try:
            names = [o.name for o in sess.get_outputs()]
            theirs = dict(zip(names, sess.run(None, state["feeds"])))
        except Exception as err:  # noqa: BLE001
            return {"outcome": "ok:ort-refuses-inputs", "reason": _last_line(err)}
        diff = _compare(state["ours"], theirs)
        if diff and _only_nan_lost(state["ours"], theirs):
            # TVM's Relu/Clip/Max/Min return the other operand of a NaN where onnxruntime
            # propagates it; compile and inspect warn of NaN weights, run of NaN inputs
            from tvmopt.frontend.onnx_model import nonfinite_weights
            from tvmopt.runtime.loader import nonfinite

            warned = nonfinite_weights(state["model"]) or nonfinite(state["feeds"], "input")
            if warned:
                return {"outcome": "known:nan-through-min-max", "reason": f"{diff}; warned: "
                        f"{warned[0]}"}
        if diff:
            return {"outcome": "bug:mismatch", "reason": diff}
        return {"outcome": "ok:match"}


# ------------------------------------------------------------------------------ isolation
def _worker(conn) -> None:
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    import warnings

    warnings.simplefilter("ignore")
    while True:
        data = conn.recv()
        if data is None:
            return
        conn.send(check(data))


class Worker:
    """One worker process running `check`; replaced when it crashes or hangs."""

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self.ctx = mp.get_context("spawn")
        self.proc = None

    def _start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()

    def check(self, data: bytes) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(data)
        # the first call also pays for importing TVM in the worker
        if self.conn.poll(self.timeout_s):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        self.proc.join(timeout=1.0)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()
            self.proc = None
            return {"outcome": "bug:hang", "reason": f"no answer within {self.timeout_s:g} s"}
        code = self.proc.exitcode
        self.proc = None
        return {"outcome": "bug:crash", "reason": f"worker exit {code}", "cli": cli_verdict(data)}

    def close(self):
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()


def cli_verdict(data: bytes, command: str = "compile", timeout_s: float = 300.0) -> dict:
    """Run the real `tvmopt` entry point (crash isolation included) on one model file.

    Returns:
        {"rc", "stderr_lines", "one_line"}: one_line is True when stderr holds exactly one
        line starting with 'tvmopt: error: ' (or nothing when rc is 0) and no traceback.
    """
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        args = [command, str(path)] + (["-o", str(Path(tmp) / "a.tvmopt")]
                                       if command == "compile" else [])
        env = dict(os.environ, TVM_NUM_THREADS="1")
        env.pop("TVMOPT_IN_CHILD", None)
        try:
            proc = subprocess.run([sys.executable, "-c", "from tvmopt.cli.isolate import run; run()",
                                   *args], capture_output=True, text=True, timeout=timeout_s,
                                  env=env)
        except subprocess.TimeoutExpired:
            return {"rc": None, "stderr_lines": [], "one_line": False}
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("tvmopt: warning: ")]
    ok = "Traceback" not in proc.stderr and (
        (proc.returncode == 0 and not errors) or
        (len(errors) == 1 and errors[0].startswith("tvmopt: error: ")))
    return {"rc": proc.returncode, "stderr_lines": lines[-3:], "one_line": ok}


# ------------------------------------------------------------------------------ a run
def fuzz(examples: int, seed: int = 0, timeout_s: float = 120.0, progress=None) -> list[dict]:
    """Draw `examples` mutated models with hypothesis and check each in a worker process."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    results: list[dict] = []
    worker = Worker(timeout_s)

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=["generate"])
    @given(mutated_models())
    def one(case):
        name, kind, what, data = case
        t = time.perf_counter()
        res = worker.check(data)
        res.update(seed_model=name, kind=kind, mutation=what, seconds=time.perf_counter() - t)
        results.append(res)
        if progress:
            progress(res, len(results))

    try:
        one()
    finally:
        worker.close()
    return results


def summarize(results: list[dict]) -> dict:
    by_outcome = collections.Counter(r["outcome"] for r in results)
    by_kind: dict = collections.defaultdict(collections.Counter)
    for r in results:
        by_kind[r["kind"]][r["outcome"]] += 1
    bugs = [r for r in results if r["outcome"].startswith("bug:")]
    return {"examples": len(results), "outcomes": dict(sorted(by_outcome.items())),
            "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
            "bugs": bugs,
            "ort_refuses": [{k: r[k] for k in ("seed_model", "kind", "mutation", "reason")}
                            for r in results if r["outcome"].startswith("ok:ort-refuses")]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per model")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()

    def progress(res, n):
        if not args.quiet:
            print(f"[{n}/{args.examples}] {res['seed_model']} {res['kind']}: {res['mutation']} "
                  f"-> {res['outcome']} {res.get('reason', '')[:100]}", flush=True)

    results = fuzz(args.examples, args.seed, args.timeout, progress)
    summary = summarize(results)
    summary["wall_s"] = round(time.time() - t0, 1)
    summary["seed"] = args.seed
    print(json.dumps({k: summary[k] for k in ("examples", "outcomes", "by_kind", "wall_s")},
                     indent=1))
    for b in summary["bugs"]:
        print(f"BUG {b['outcome']}: {b['seed_model']} {b['kind']} {b['mutation']}: "
              f"{b.get('stage', '')} {b.get('reason', '')}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary, indent=1, default=str))
    return 1 if summary["bugs"] else 0


if __name__ == "__main__":
    sys.exit(main())
