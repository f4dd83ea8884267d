"""`compile --bundle --verify`: the bundle's own runner, on random inputs, against onnxruntime.

The runner runs natively for this host's architecture and under qemu-user for aarch64, so
what is verified is what the board will run: the cross-compiled library, the bundled runtime
and bin/tvmopt-run, not the Python loader.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import BuildError, VerificationError, last_line
from ..runtime.artifact import MANIFEST
from ..runtime.verify import OutputError, Tolerance, compare, run_onnxruntime
from ..tensor_info import TensorInfo
from .runner import NAME as RUNNER
from .toolchain import missing_for_emulation, run_prefix


def verify_bundle(root: Path, model: str, tol: Tolerance, dims: dict[str, int] | None = None,
                  timeout_s: float = 1800.0) -> tuple[list[OutputError], dict]:
    """Run the unpacked bundle at `root` once and compare its outputs with onnxruntime's.

    Returns:
        (per-output errors, the manifest's "verification" record).

    Raises:
        BuildError: this host cannot run the bundle's architecture (names the packages).
        VerificationError: the runner failed (its one-line error is quoted) or an output's
            shape differs.
    """
    from ..runtime.loader import random_inputs

    manifest = json.loads((root / "model" / MANIFEST).read_text())
    arch = manifest["bundle"]["arch"]
    prefix = run_prefix(arch)
    if prefix is None:
        raise BuildError(f"--verify runs the {arch} bundle here; this host "
                         f"{missing_for_emulation(arch)}")
    inputs = [TensorInfo.from_json(d) for d in manifest["inputs"]]
    feeds = random_inputs(inputs, dims)
    with tempfile.TemporaryDirectory(prefix="tvmopt-verify.") as tmp:
        args = []
        for i, info in enumerate(inputs):
            path = Path(tmp) / f"in{i}.npy"
            np.save(path, feeds[info.name])
            args += ["--input", f"{info.name}={path}"]
        out = Path(tmp) / "out"
        cmd = [*prefix, str(root / "bin" / RUNNER), str(root / "model"), *args,
               "--output-dir", str(out), "--warmup", "0", "--repeat", "1", "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            last = last_line(proc.stderr, f"exit status {proc.returncode}")
            raise VerificationError(f"the bundle's {RUNNER} failed on random inputs: {last}")
        report = json.loads(proc.stdout)
        got = {name: np.load(path) for name, path in report["outputs"].items()}
    ref = run_onnxruntime(model, feeds)
    errors = compare(got, ref, tol)
    from ..runtime.verify import to_json

    record = {"reference": "onnxruntime", "atol": tol.atol, "rtol": tol.rtol,
              "runner": f"bin/{RUNNER}" + (f" under {prefix[0]}" if prefix else " (native)"),
              "outputs": to_json(errors)}
    return errors, record
