"""The model zoo: published architectures through both torch ONNX exporters and torch.export,
each compiled, loaded, run and checked the way a user's model is.

Every architecture in tools/zoo_models.py (random weights, fixed seeds, nothing downloaded) is
exported three ways: `torch.onnx.export(..., dynamo=False)` (the TorchScript exporter, opset
17), `torch.onnx.export(..., dynamo=True)` (the default in current torch: opset 18+, local
functions) and `torch.export` saved as a .pt2. Each export keeps the architecture's symbolic
dims (batch, sequence, past length, image size, audio length). Then the product path:
`compile_model` (fp32 precision, so a bf16-capable host does not blur the check; the default
dispatch) -> artifact -> `load` -> `run` at the export sizes and at other realistic sizes of
every symbolic dim, compared with onnxruntime (torch for the .pt2) at fp32 tolerance (tvmopt's
verify default: |d| <= 1e-4 + 1e-3 |ref|). A verified entry is then timed against onnxruntime
(the torch eager module for a .pt2), each runtime in its own worker process
(tvmopt.bench.isolated), interleaved.

Each entry runs in a child process (a crash in one does not end the run); results go to the
--json file after every entry, and a rerun skips the entries already there (--redo to run
them again).

Usage:
  python tools/zoo.py --json zoo.json [--only resnet,bert] [--exporter torchscript,dynamo,pt2]
                      [--threads 2] [--runs 10] [--no-time] [--out DIR] [--redo]
  python tools/zoo.py --markdown-from zoo.json     # the table in docs/model-zoo.md
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # zoo_models and bench_default beside this file
EXPORTERS = ("torchscript", "dynamo", "pt2")
MARK = "ZOO-RESULT "
TIMEOUT_S = 900  # one entry: export, compile, checks, timing


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", dest="json_path", default=None, help="results file (resumable)")
    ap.add_argument("--only", default="", help="architectures, comma-separated (default: all)")
    ap.add_argument("--exporter", default=",".join(EXPORTERS),
                    help=f"any of {', '.join(EXPORTERS)}")
    ap.add_argument("--target", default="host")
    ap.add_argument("--dispatch", default=None,
                    help="tvmopt's --dispatch (default: the product's default)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=10, help="timed calls per runtime")
    ap.add_argument("--no-time", action="store_true", help="compile and check only")
    ap.add_argument("--out", default="tvmopt-out/zoo", help="exports and artifacts")
    ap.add_argument("--redo", action="store_true", help="run entries already in --json again")
    ap.add_argument("--markdown-from", default=None, metavar="JSON")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # NAME:EXPORTER, in a child
    return ap.parse_args(argv)


# ------------------------------------------------------------------------ export
def _dims(arch):
    """The torch.export Dim of each symbolic dim name (shared across inputs); a dim the model
    needs a multiple of (an image size through three 2x poolings) as that multiple of a Dim."""
    import torch

    hi = {"batch": 16, "seq": 120, "past": 100, "height": 512, "width": 512, "ctx": 77}
    out = {}
    for d in {d for axes in arch.dynamic.values() for d in axes.values()}:
        k = arch.multiple_of.get(d, 1)
        lo, top = arch.ranges.get(d, (1, hi.get(d, 1024)))
        base = torch.export.Dim(d if k == 1 else f"{d}_{k}", min=max(1, lo // k), max=top // k)
        out[d] = base if k == 1 else k * base
    return out


def export(name: str, exporter: str, out: Path) -> Path:
    """The architecture exported one way (cached by file name)."""
    import torch

    import zoo_models

    arch = zoo_models.ZOO[name]
    path = out / "models" / f"{name}.{exporter}.{'pt2' if exporter == 'pt2' else 'onnx'}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    model = zoo_models.build(name)
    inputs = zoo_models.example(name)
    args = tuple(inputs.values())
    tmp = path.with_suffix(".partial" + path.suffix)
    if exporter == "torchscript":
        with torch.no_grad():
            torch.onnx.export(model, args, str(tmp), input_names=list(inputs), opset_version=17,
                              dynamo=False, dynamic_axes=arch.dynamic or None)
    else:
        dims = _dims(arch)
        shapes = tuple({ax: dims[d] for ax, d in arch.dynamic.get(k, {}).items()
                        if d not in arch.static_in_export.get(exporter, ())} or None
                       for k in inputs)
        if any(p.kind == p.VAR_POSITIONAL
               for p in inspect.signature(model.forward).parameters.values()):
            shapes = (shapes,)  # forward(*args): the args are one tuple to torch.export
        if exporter == "dynamo":
            prog = torch.onnx.export(model, args, input_names=list(inputs), dynamo=True,
                                     dynamic_shapes=shapes, verbose=False)
            prog.save(str(tmp))
        else:
            ep = torch.export.export(model, args, dynamic_shapes=shapes)
            torch.export.save(ep, str(tmp))
    tmp.rename(path)
    return path


# ------------------------------------------------------------------------ one entry
def _rel_err(got: dict, ref: dict) -> float:
    import numpy as np

    worst = 0.0
    for g, r in zip(got.values(), ref.values()):
        g, r = np.asarray(g, dtype=np.float64), np.asarray(r, dtype=np.float64)
        if g.shape != r.shape:
            return float("inf")
        scale = float(np.abs(r).max()) if r.size else 0.0
        worst = max(worst, float(np.abs(g - r).max()) / (scale or 1.0) if r.size else 0.0)
    return worst


def _feeds(name: str, dims: dict, names=None) -> dict:
    """The example inputs at `dims`, under `names` (the compiled model's input names, in order:
    torch.export names them after forward's parameters) when given."""
    import zoo_models

    values = [v.numpy() for v in zoo_models.example(name, dims).values()]
    keys = names or list(zoo_models.example(name, dims))
    return dict(zip(keys, values))


def run_one(name: str, exporter: str, args) -> dict:
    """Export, compile, check and time one entry; the result row."""
    import tvmopt
    import zoo_models
    from tvmopt.errors import TvmoptError, error_line
    from tvmopt.runtime import verify
    from tvmopt.runtime.loader import load

    arch = zoo_models.ZOO[name]
    out = Path(args.out)
    row = {"arch": name, "family": arch.family, "exporter": exporter}
    t0 = time.perf_counter()
    try:
        path = export(name, exporter, out)
    except Exception as err:  # noqa: BLE001 - the exporter's failure, recorded as such
        row.update(status="export failed", message=error_line(err))
        return row
    row["export_s"] = round(time.perf_counter() - t0, 1)
    t1 = time.perf_counter()
    try:
        res = tvmopt.compile_model(tvmopt.CompileOptions(
            model=str(path), target=args.target, precision="fp32", dispatch=args.dispatch,
            output=str(out / "artifacts" / f"{name}.{exporter}")), log=lambda s: None)
    except TvmoptError as err:
        row.update(status="refused", message=str(err).splitlines()[0],
                   compile_s=round(time.perf_counter() - t1, 1))
        return row
    except Exception as err:  # noqa: BLE001 - an internal error: named, counted, not hidden
        row.update(status="internal error", message=f"{type(err).__name__}: {error_line(err)}")
        return row
    row["compile_s"] = round(time.perf_counter() - t1, 1)
    row["precision"] = res.artifact.manifest["precision"]["default"]
    # Checked at the export sizes and at other realistic sizes of every symbolic dim.
    static = arch.static_in_export.get(exporter, ())
    checks = [{}, {k: v for k, v in arch.check.items() if k not in static}]
    errors, worst = [], 0.0
    try:
        lm = load(res.artifact.path)
        names = [i.name for i in lm.inputs]
        for dims in checks:
            feeds = _feeds(name, dims, names)
            got = lm.run(feeds)
            reference, ref = verify.reference_outputs(str(path), feeds)
            bad = [e for e in verify.compare(got, ref, verify.Tolerance(), reference)
                   if e.mismatched]
            worst = max(worst, _rel_err(got, ref))
            errors += [f"{e.name} at {dims or 'export sizes'}: {e.mismatched} of {e.total} "
                       f"elements off (max abs {e.max_abs:.2e})" for e in bad]
        row["reference"] = reference
    except TvmoptError as err:
        row.update(status="run failed", message=str(err).splitlines()[0])
        return row
    except Exception as err:  # noqa: BLE001
        row.update(status="internal error", message=f"run: {type(err).__name__}: "
                                                    f"{error_line(err)}")
        return row
    row["max_rel_err"] = worst
    row["checked_dims"] = [c for c in checks if c]
    if errors:
        row.update(status="mismatch", message=errors[0])
        return row
    row["status"] = "verified"
    if not args.no_time:
        row.update(_time(name, exporter, path, res.artifact.path, args))
    return row


def _time(name, exporter, model_path, artifact, args) -> dict:
    """P50 ms of the artifact and of the reference runtime, each in its own process."""
    import numpy as np

    from tvmopt.bench.isolated import Spec, Worker, interleaved

    import zoo_models

    from tvmopt.runtime.artifact import read_artifact

    names = [i["name"] for i in read_artifact(artifact).manifest["inputs"]]
    arch = zoo_models.ZOO[name]
    static = arch.static_in_export.get(exporter, ())
    feeds = _feeds(name, {k: v for k, v in arch.check.items() if k not in static}, names)
    specs = {"tvmopt": Spec("tvmopt", str(artifact))}
    if exporter == "pt2":
        specs["torch"] = Spec("torch", builder="zoo_models:build", builder_args=(name,),
                              sys_path=(str(HERE),))
    else:
        specs["onnxruntime"] = Spec("onnxruntime", str(model_path))
    workers = {}
    try:
        for k, spec in specs.items():
            workers[k] = Worker(k, spec, args.threads, feeds)
        times = interleaved(workers, args.runs, block=5)
    except Exception as err:  # noqa: BLE001 - a timing failure leaves the check's result
        return {"timing_error": str(err).splitlines()[0]}
    finally:
        for w in workers.values():
            w.close()
    base = "torch" if exporter == "pt2" else "onnxruntime"
    ms = {k: round(float(np.median(v)), 3) for k, v in times.items()}
    return {"ms": ms, "baseline": base, "ratio": round(ms["tvmopt"] / ms[base], 2)}


# ------------------------------------------------------------------------ driver
def _child(name, exporter, args) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--one", f"{name}:{exporter}", "--out", args.out,
           "--target", args.target, "--threads", str(args.threads), "--runs", str(args.runs)]
    if args.dispatch:
        cmd += ["--dispatch", args.dispatch]
    if args.no_time:
        cmd.append("--no-time")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"arch": name, "exporter": exporter, "status": "timeout",
                "message": f"over {TIMEOUT_S} s"}
    line = next((ln for ln in proc.stdout.splitlines()[::-1] if ln.startswith(MARK)), None)
    if line is None:
        from tvmopt.errors import error_line

        return {"arch": name, "exporter": exporter, "status": "crashed",
                "message": f"exit {proc.returncode}: "
                           f"{error_line(proc.stderr, default='no output')}"}
    row = json.loads(line[len(MARK):])
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    args = _args(argv)
    if args.markdown_from:
        print(markdown(json.loads(Path(args.markdown_from).read_text())))
        return 0
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    if args.one:
        name, exporter = args.one.split(":")
        print(MARK + json.dumps(run_one(name, exporter, args)), flush=True)
        return 0

    import zoo_models

    names = [n for n in args.only.split(",") if n] or list(zoo_models.ZOO)
    exporters = [e for e in args.exporter.split(",") if e]
    bad = [n for n in names if n not in zoo_models.ZOO] + [e for e in exporters
                                                           if e not in EXPORTERS]
    if bad:
        raise SystemExit(f"unknown: {', '.join(bad)} (architectures: {', '.join(zoo_models.ZOO)};"
                         f" exporters: {', '.join(EXPORTERS)})")
    path = Path(args.json_path) if args.json_path else None
    results = json.loads(path.read_text()) if path and path.exists() else {}
    results.setdefault("rows", {})
    if "host" not in results:
        from bench_default import host_description

        results["host"] = host_description()
    results["threads"] = args.threads
    t_run = time.perf_counter()
    for name in names:
        for exporter in exporters:
            key = f"{name}:{exporter}"
            if key in results["rows"] and not args.redo:
                continue
            row = _child(name, exporter, args)
            results["rows"][key] = row
            print(f"{key:32s} {row['status']:15s} "
                  + (f"err {row['max_rel_err']:.1e} " if "max_rel_err" in row else "")
                  + (f"compile {row['compile_s']}s " if "compile_s" in row else "")
                  + (f"{row['ratio']}x {row['baseline']} " if "ratio" in row else "")
                  + row.get("message", ""), flush=True)
            if path:
                path.write_text(json.dumps(results, indent=1))
    print(f"{time.perf_counter() - t_run:.0f} s")
    print(summary(results))
    return 0


# ------------------------------------------------------------------------ report
def summary(results: dict) -> str:
    rows = list(results["rows"].values())
    ok = sum(r["status"] == "verified" for r in rows)
    exported = [r for r in rows if r["status"] != "export failed"]
    compiled = sum("compile_s" in r and r["status"] not in ("refused",) for r in rows)
    return (f"{ok} of {len(rows)} entries compiled and verified ({100 * ok / max(1, len(rows)):.0f}%)"
            f"; {len(rows) - len(exported)} not exported by torch; of the {len(exported)} exported,"
            f" {ok} verified ({100 * ok / max(1, len(exported)):.0f}%), {compiled} compiled")


def _cell(r: dict) -> str:
    if r["status"] == "verified":
        return f"verified ({r['max_rel_err']:.0e})"
    return f"{r['status']}: {r.get('message', '')}".replace("|", "\\|")


def markdown(results: dict) -> str:
    host = results.get("host", {})
    out = []
    if host:
        out += [f"Host: {host['cpu']}, {host['cores']} cores "
                f"({' '.join(host.get('features', []))}); {results.get('threads')} threads per "
                "runtime, each runtime in its own process.", ""]
    out += ["| architecture | family | exporter | result (max error / max ref) | tvmopt P50 | "
            "baseline P50 | ratio | compile |", "|---|---|---|---|---|---|---|---|"]
    rows = sorted(results["rows"].values(),
                  key=lambda r: (r.get("family", ""), r["arch"], EXPORTERS.index(r["exporter"])))
    for r in rows:
        ms = r.get("ms", {})
        base = r.get("baseline", "")
        out.append("| " + " | ".join([
            r["arch"], r.get("family", ""), r["exporter"], _cell(r),
            f"{ms['tvmopt']:.2f} ms" if ms else "-",
            f"{ms[base]:.2f} ms ({base})" if ms else "-",
            f"{r['ratio']:.2f}x" if "ratio" in r else "-",
            f"{r['compile_s']:.0f} s" if "compile_s" in r else "-"]) + " |")
    out += ["", summary(results)]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
