"""LoadedModel.run: numpy in, numpy out, one call after another on its own input tensors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.models import tiny_mlp


def _loaded_mlp(tmp_path):
    """(the tiny MLP's file, its fp32 host build loaded)."""
    import tvmopt

    model = tiny_mlp(str(tmp_path / "mlp.onnx"))
    res = tvmopt.compile_model(tvmopt.CompileOptions(model=model, target="host", precision="fp32",
                                                     output=str(tmp_path / "art")),
                               log=lambda _s: None)
    return model, tvmopt.load(res.artifact.path)


def test_each_call_runs_on_the_inputs_it_was_given(tmp_path):
    model, lm = _loaded_mlp(tmp_path)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    # run() refills its input tensors in place: new values, a new batch size, and back again
    for batch in (2, 2, 5, 2):
        x = rng.standard_normal((batch, 32)).astype(np.float32)
        kept = x.copy()
        got = next(iter(lm.run({"x": x}).values()))
        ref = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(x, kept)  # the caller's array is only read
    first = next(iter(lm.run({"x": kept}).values()))
    next(iter(lm.run({"x": kept * 3}).values()))
    np.testing.assert_array_equal(next(iter(lm.run({"x": kept}).values())), first)


def test_outputs_are_the_callers_and_a_changed_input_is_checked_again(tmp_path):
    import pytest

    from tvmopt.errors import ShapeError

    _, lm = _loaded_mlp(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    a = next(iter(lm.run({"x": x}).values()))
    kept = a.copy()
    a[...] = 7.0  # the caller owns the array it got: the next call neither sees nor reuses it
    b = next(iter(lm.run({"x": x}).values()))
    np.testing.assert_array_equal(b, kept)
    assert not np.shares_memory(a, b)
    # a call that passed does not let a different dtype or rank through on the next one
    with pytest.raises(ShapeError, match="dtype"):
        lm.run({"x": x.astype(np.float64)})
    with pytest.raises(ShapeError, match="rank"):
        lm.run({"x": x[0]})
    np.testing.assert_array_equal(next(iter(lm.run({"x": x}).values())), kept)


def test_load_runs_tvm_kernels_on_every_core(tmp_path):
    """Without TVM_NUM_THREADS, TVM's pool would take half the logical CPUs (one thread on a
    2-vCPU machine); load() sets every core, as the compile-time timing assumed, and an
    explicit setting wins."""
    import os
    import subprocess
    import sys

    _loaded_mlp(tmp_path)
    code = ("import os, tvmopt.runtime.loader as l; l.load(%r); "
            "print(os.environ['TVM_NUM_THREADS'])" % str(tmp_path / "art"))
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}

    def threads(environ):
        return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                              text=True, check=True).stdout.split()[-1]

    assert threads(env) == str(os.cpu_count())
    assert threads({**env, "TVM_NUM_THREADS": "1"}) == "1"


def test_a_full_openmp_team_pins_its_workers_not_the_caller(tmp_path):
    """oneDNN's OpenMP team (which the TVM kernels share) pins its workers to a CPU each
    where it has one thread per allowed CPU: unpinned, a worker woken after the model sat idle
    was put on the caller's CPU by Linux, and each call after an idle spell took a spin period.
    The caller's thread, the user's, keeps the CPUs it had."""
    import os
    import subprocess
    import sys

    import tvmopt

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: the team has no workers to pin")
    model = tiny_mlp(str(tmp_path / "mlp.onnx"))
    tvmopt.compile_model(tvmopt.CompileOptions(model=model, target="host", precision="fp32",
                                               dispatch="library", output=str(tmp_path / "art")),
                         log=lambda _s: None)
    code = (
        "import glob, os, numpy as np, tvmopt\n"
        f"m = tvmopt.load({str(tmp_path / 'art')!r})\n"
        "m.run({'x': np.ones((2, 32), np.float32)})\n"
        "for t in sorted(glob.glob(f'/proc/{os.getpid()}/task/*')):\n"
        "    tid = int(t.rsplit('/', 1)[1])\n"
        "    print(tid == os.getpid(), ','.join(map(str, sorted(os.sched_getaffinity(tid)))))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    rows = [ln.split() for ln in out if ln.strip()]
    main = [cpus for is_main, cpus in rows if is_main == "True"]
    pinned = {cpus for is_main, cpus in rows if is_main == "False" and "," not in cpus}
    assert main == [",".join(map(str, allowed))], rows
    assert pinned == {str(c) for c in allowed[1:]}, rows
