"""Move the pinned dependency versions forward on purpose, with the evidence that they still hold.

The suite and the conformance record are verified with the exact versions in constraints.txt.
Upstream releases change results under the suite (ml_dtypes 0.7 changed what onnx's cast cases
expect), so versions move only through this tool:

  1. a fresh venv resolves `.[test]` with no constraints but the pins pyproject itself holds
     (apache-tvm, apache-tvm-ffi, torch) and the upper bounds given with --allow (or pyproject's);
  2. the moved packages are listed old -> new;
  3. the conformance sample (the CI record) and the default test tier run in that venv;
  4. with --write, constraints.txt is rewritten, only when both pass; re-record the sample
     (tools/onnx_conformance.py --sample 100 --seed 1 --record ...) if its pass set moved.

Usage:
  python tools/update_constraints.py [--venv DIR] [--keep] [--write] [--skip-tests]
                                     [--allow 'onnxruntime<1.40' ...]

Run it when a dependency is to be moved (say monthly), never from CI: CI installs the pins.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
HEADER_LINES = 3  # the comment block at the top of constraints.txt


def read_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=None, help="where to build the trial venv (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the trial venv")
    ap.add_argument("--write", action="store_true", help="rewrite constraints.txt if all pass")
    ap.add_argument("--skip-tests", action="store_true", help="only resolve and list the moves")
    ap.add_argument("--allow", action="append", default=[],
                    help="an extra requirement for the resolution, e.g. 'onnxruntime<1.40' to "
                         "look past pyproject's upper bound")
    args = ap.parse_args(argv)

    venv = Path(args.venv) if args.venv else Path(tempfile.mkdtemp(prefix="tvmopt-deps-"))
    py = venv / "bin" / "python"
    try:
        if _run([sys.executable, "-m", "venv", str(venv)]).returncode:
            return 1
        # --allow lifts pyproject's upper bounds: install the package with them, deps resolved
        # together in one pip run so the result is one consistent set.
        if _run([str(py), "-m", "pip", "install", "-q", f"{ROOT}[test]", *args.allow]).returncode:
            print("the unconstrained resolution failed to install", file=sys.stderr)
            return 1
        frozen = _run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
        new = {k: v.split("+", 1)[0] if k == "torch" else v
               for k, v in read_pins(frozen).items() if k != "tvmopt"}
        old = read_pins(CONSTRAINTS.read_text())
        moved = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
                 if old.get(k) != new.get(k)}
        if not moved:
            print("nothing moved: constraints.txt is current")
            return 0
        print("\nmoved:")
        for k, (a, b) in moved.items():
            print(f"  {k:24s} {a or '-':>14s} -> {b or '-'}")
        if args.skip_tests:
            return 0
        ok = True
        tool = ROOT / "tools" / "onnx_conformance.py"
        with tempfile.TemporaryDirectory() as tmp:
            rec = Path(tmp) / "sample.json"
            ok &= _run([str(py), str(tool), "--sample", "100", "--seed", "1", "--quiet",
                        "--record", str(rec)], cwd=ROOT).returncode == 0
            if rec.exists():
                import json

                got = json.loads(rec.read_text())
                want = json.loads((ROOT / "tests" / "data" / "onnx_conformance_sample.json")
                                  .read_text())
                lost = sorted(set(want["passing"]) - set(got["passing"]))
                gained = sorted(set(got["passing"]) - set(want["passing"]))
                print(f"conformance sample: {got['passed']} passed (record {want['passed']}); "
                      f"lost {lost or 'none'}; gained {gained or 'none'}")
                ok &= not lost
        ok &= _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                   cwd=ROOT).returncode == 0
        if not ok:
            print("\nthe moved versions do not hold: constraints.txt left as it is", file=sys.stderr)
            return 1
        if args.write:
            header = "\n".join(CONSTRAINTS.read_text().splitlines()[:HEADER_LINES])
            body = "\n".join(f"{line.split('==')[0]}=={new[_norm(line.split('==')[0])]}"
                             for line in frozen.splitlines()
                             if "==" in line and _norm(line.split("==")[0]) in new)
            CONSTRAINTS.write_text(header + "\n" + body + "\n")
            print(f"wrote {CONSTRAINTS}; note the moves in CHANGELOG.md")
        return 0
    finally:
        if not args.keep and not args.venv:
            shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
