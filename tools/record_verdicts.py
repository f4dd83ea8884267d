"""Does `compile --db` keep the same tuned records every time? Compiles a model from a tuning
database N times, each in a fresh process with an empty timing cache and `--retime`, and
tabulates the artifact manifest's `records_vs_default`: per task, how often its record was
kept, and the tuned / default times each compile measured.

`--code DIR` runs the tvmopt sources in DIR (a checkout's `compiler/` folder) instead of the
installed package, so an older revision's check can be set beside this one on the same host.

Usage:
  python tools/record_verdicts.py [--model compiler/tvmopt/models/mobile_cnn.onnx]
                                  [--db schedules/mobile_cnn/x86-zen4] [--target x86-zen4]
                                  [--shape input=1x3x96x96]
                                  [--runs 5] [--code OLD_CHECKOUT/compiler] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _one(args, out: Path) -> list[dict]:
    from tvmopt.files import cache_root

    # An empty timing cache for each compile, whatever --retime covers in the code under test;
    # the built oneDNN extension is copied in so it is not rebuilt every time.
    cache = out.with_suffix(".cache")
    cache.mkdir()
    for ext in cache_root().glob("tvmopt_onednn_*"):
        shutil.copytree(ext, cache / ext.name)
    env = dict(os.environ, TVMOPT_CACHE_DIR=str(cache))
    if args.code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.code, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "tvmopt.cli", "compile", args.model, "--target", args.target,
           "--shape", args.shape, "--db", args.db, "--retime", "-o", str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"compile failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest["tuning"]["records_vs_default"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="compiler/tvmopt/models/mobile_cnn.onnx")
    ap.add_argument("--db", default="schedules/mobile_cnn/x86-zen4")
    ap.add_argument("--target", default="x86-zen4")
    ap.add_argument("--shape", default="input=1x3x96x96", help="as the database was tuned")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--code", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tvmopt-verdicts-") as tmp:
        for i in range(args.runs):
            runs.append(_one(args, Path(tmp) / f"run{i}.tvmopt"))
            print(f"compile {i + 1}/{args.runs}: kept "
                  f"{sum(c['kept'] for c in runs[-1])} of {len(runs[-1])}", flush=True)
    from bench_default import host_description, host_line

    host = host_description()
    if args.json:
        Path(args.json).write_text(json.dumps({"command": sys.argv, "host": host, "runs": runs},
                                              indent=1))
    print(f"{host_line(host)}; {args.runs} compiles of {Path(args.model).name} with {args.db} "
          f"({args.code or 'installed tvmopt'})")
    # A task's name can differ between compiles (the dispatch's timings decide which kernels
    # are tasks, and fused functions are numbered in order), so each name is counted where
    # it occurs.
    tasks = list(dict.fromkeys(c["task"] for r in runs for c in r))
    for t in tasks:
        rows = [c for r in runs for c in r if c["task"] == t]
        times = ", ".join(f"{c['tuned_ms'] * 1e3:.1f}/{c['default_ms'] * 1e3:.1f}"
                          for c in rows if c["tuned_ms"] is not None)
        print(f"  {t}: kept in {sum(c['kept'] for c in rows)} of the {len(rows)} compiles "
              f"that had it; tuned/default us: {times}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
