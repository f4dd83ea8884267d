"""`compile --dim seq=LO..HI`: memory is planned once for the upper bound (fewer storage
allocations per call than the unbounded build), the bounds are recorded in the manifest, the
artifact is correct inside the range, and an input outside it is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.compile.test_transformer_export import _export

pytest.importorskip("torch")


def _allocations_per_call(artifact: str) -> int:
    """`vm.builtin.alloc_storage` instructions in the VM's `main` (each runs once per call:
    `main` has no loops)."""
    import tvm
    from tvm import relax

    from tvmopt.runtime.artifact import read_artifact

    ex = relax.VMExecutable(tvm.runtime.load_module(str(read_artifact(artifact).library)))
    return ex.as_text().count("vm.builtin.alloc_storage")


def _compile(model: str, out: str, *extra: str):
    from tvmopt.cli.main import main

    return CliRunner().invoke(main, ["compile", model, "-o", out, "--dispatch", "codegen",
                                     *extra])


@pytest.fixture(scope="module")
def seq_model(tmp_path_factory):
    """A BERT-style encoder with a fixed batch and a symbolic sequence length."""
    path = str(tmp_path_factory.mktemp("bounds") / "bert_seq.onnx")
    _export("bert", True, True, path, dims=("seq",))
    return path


def test_bounded_seq_plans_memory_once_and_refuses_past_the_bound(seq_model, tmp_path):
    from tvmopt.errors import ShapeError
    from tvmopt.runtime import loader, verify

    free, bounded = str(tmp_path / "free.tvmopt"), str(tmp_path / "bounded.tvmopt")
    res = _compile(seq_model, free)
    assert res.exit_code == 0, res.output
    res = _compile(seq_model, bounded, "--dim", "seq=1..64", "--verify")
    assert res.exit_code == 0, res.output
    assert "vs onnxruntime ok" in res.output, res.output  # verified at the bound, seq 64

    manifest = json.loads((tmp_path / "bounded.tvmopt" / "manifest.json").read_text())
    assert manifest["dim_bounds"] == {"seq": [1, 64]}
    assert "tvmopt.SetDimUpperBounds" in manifest["passes"]["lower"]
    assert _allocations_per_call(bounded) < _allocations_per_call(free)

    lm = loader.load(bounded)
    for seq in (7, 64):
        feeds = loader.random_inputs(lm.inputs, {"seq": seq}, seed=seq)
        got, ref = lm.run(feeds), verify.run_onnxruntime(seq_model, feeds)
        for err in verify.compare(got, ref, verify.Tolerance(atol=1e-4, rtol=1e-3)):
            assert err.mismatched == 0, (seq, err)

    with pytest.raises(ShapeError, match=r"\('seq'\) is 65, outside 1\.\.64"):
        lm.run(loader.random_inputs(lm.inputs, {"seq": 65}))
    feeds = loader.random_inputs(lm.inputs, {"seq": 65})
    np.savez(tmp_path / "long.npz", **feeds)
    from tvmopt.cli.main import main

    res = CliRunner().invoke(main, ["run", bounded, "--inputs", str(tmp_path / "long.npz")])
    assert res.exit_code == 1 and "outside 1..64" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("dim,why", [("seq=0..0", "0 <= LO <= HI and HI >= 1"),
                                     ("seq=9..8", "0 <= LO <= HI and HI >= 1"),
                                     ("seq=1..x", "integers"),
                                     ("len=1..8", "not a symbolic dim of the model's inputs")])
def test_bad_ranges_are_refused(seq_model, tmp_path, dim, why):
    res = _compile(seq_model, str(tmp_path / "a.tvmopt"), "--dim", dim)
    assert res.exit_code != 0 and why in res.output, res.output
