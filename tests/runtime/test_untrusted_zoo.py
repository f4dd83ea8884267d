"""Hostile values in the integer inputs of the zoo's models with token ids (text encoders,
decoders, recurrent taggers), through the artifact path, at symbolic sizes nobody passed.

Slow tier: each entry is exported (TorchScript) and compiled once. Where onnxruntime refuses the
values, the artifact must raise InputValueError (no signal, no output); where it answers, the
artifact answers the same within fp32 tolerance; afterwards it answers the zoo's own example.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import zoo_models  # noqa: E402 - from tools/

from tvmopt.errors import InputValueError, ShapeError  # noqa: E402
from tvmopt.interface.compile import CompileOptions, compile_model  # noqa: E402
from tvmopt.runtime.loader import load  # noqa: E402

TEXT = sorted(n for n, a in zoo_models.ZOO.items() if a.vocab)
HOSTILE = st.one_of(st.integers(-3, 1200), st.integers(-2**62, 2**62),
                    st.sampled_from([-2**63, 2**63 - 1, -1, 10**6]))


@pytest.mark.slow
@pytest.mark.parametrize("name", TEXT)
def test_hostile_token_ids_in_the_zoos_text_models(name, tmp_path):
    import onnxruntime as ort

    from tools import zoo

    path = zoo.export(name, "torchscript", tmp_path)
    res = compile_model(CompileOptions(model=str(path), target="host", dispatch="codegen",
                                       output=str(tmp_path / "a")), log=lambda *a: None)
    model, sess = load(res.artifact.path), ort.InferenceSession(str(path))
    arch = zoo_models.ZOO[name]
    example = {k: v.numpy() for k, v in zoo_models.example(name, arch.check).items()}
    ints = [k for k, v in example.items() if v.dtype.kind == "i" and "mask" not in k]
    assert ints, f"{name}: no integer input"
    names = [i.name for i in model.inputs]

    def run_both(feeds):
        feeds = dict(zip(names, feeds.values()))
        try:
            ref = sess.run(None, feeds)
        except Exception:  # noqa: BLE001 - onnxruntime's refusal is the expectation
            ref = None
        if ref is None:
            with pytest.raises((InputValueError, ShapeError)):
                model.run(feeds)
            return
        got = model.run(feeds)
        for want, have in zip(ref, got.values()):
            np.testing.assert_allclose(have, want, rtol=1e-3, atol=1e-3)

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.data())
    def check(data):
        feeds = dict(example)
        for k in ints:
            values = data.draw(st.lists(HOSTILE, min_size=1, max_size=4))
            feeds[k] = np.resize(np.array(values, np.int64), example[k].shape).astype(
                example[k].dtype)
        run_both(feeds)
        run_both(example)  # still answers

    check()
