"""Cold start: a fresh Python process imports the runtime, loads the artifact, runs once.

The parent times the whole process (interpreter start included); the child reports its own
phases. The OS file cache is left as it is (dropping it needs root and disturbs other users),
so this is a warm-disk cold start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ..errors import ArtifactError, last_line

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import tvm
from tvm import relax
from tvmopt.runtime.loader import load, random_inputs
t1 = time.perf_counter()
lm = load(sys.argv[1])
t2 = time.perf_counter()
dims = json.loads(sys.argv[2])
lm.run(random_inputs(lm.inputs, dims))
lm.device.sync()
t3 = time.perf_counter()
print("TVMOPT_COLDSTART " + json.dumps({"import_s": t1 - t0, "load_s": t2 - t1,
                                        "first_run_s": t3 - t2}))
"""


def cold_start(artifact_path, dims: dict[str, int], repeats: int = 1,
               timeout_s: float = 300) -> dict:
    """Measure load + first inference in `repeats` fresh processes.

    Returns:
        {"repeats", "process_s" (wall, parent-measured), "import_s", "load_s", "first_run_s",
         "load_plus_first_run_s"}: each the median over repeats.

    Raises:
        ArtifactError: the child failed (its last stderr line is quoted).
    """
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(artifact_path), json.dumps(dims)],
                              capture_output=True, text=True, timeout=timeout_s)
        wall = time.perf_counter() - t
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TVMOPT_COLDSTART ")),
                    None)
        if proc.returncode != 0 or line is None:
            tail = last_line(proc.stderr, "no output")
            raise ArtifactError(f"{artifact_path}: cold-start process failed: {tail}")
        d = json.loads(line.split(" ", 1)[1])
        d["process_s"] = wall
        runs.append(d)

    def med(k):
        return sorted(r[k] for r in runs)[len(runs) // 2]

    out = {k: med(k) for k in ("process_s", "import_s", "load_s", "first_run_s")}
    out["load_plus_first_run_s"] = med("load_s") + med("first_run_s")
    out["repeats"] = repeats
    return out
