"""Decoder-with-past exports of a tiny LLaMA (grouped-query attention) and GPT-2, as
onnxruntime-genai and optimum name them (tools/llm_exports.py; issue 47), built by tvmopt and
compared with onnxruntime on a prefill (seq 5, past 0) and then a decode step (seq 1, past 5)
fed the prefill's present keys and values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_onnxruntime

pytest.importorskip("transformers")

STEPS = 3  # decode steps after the prefill


def _export(tmp_path, name, exporter):
    import onnx

    from tools import llm_exports

    path = tmp_path / f"{name}_{exporter}.onnx"
    if not llm_exports.export(name, exporter, str(path)):
        pytest.skip(f"{exporter} cannot export {name} in this environment")
    return onnx.load(str(path))


def _check_steps(model, build, kv_heads, decode_only=False):
    """A prefill and STEPS decode steps, present fed back as past, each compared with
    onnxruntime on the same inputs (decode_only: the prefill, which a build for seq 1 cannot
    take, runs in onnxruntime only)."""
    from tools import llm_exports as L

    _, outs = L.names()
    past = None
    for step in range(STEPS + 1):
        seq, past_len = (5, 0) if step == 0 else (1, 4 + step)
        feeds = L.sample(1, seq, past_len, kv_heads, 16, seed=10 + step, past_arrays=past)
        want = run_onnxruntime(model, feeds)
        if step > 0 or not decode_only:
            got = build.run(feeds)
            for name, w in zip(outs, want):
                assert got[name].shape == w.shape, (step, name)
                np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4,
                                           err_msg=f"step {step}, {name}")
        past = {f"past_key_values.{i}.{k}": want[outs.index(f"present.{i}.{k}")]
                for i in range(L.LAYERS) for k in ("key", "value")}


def _build(model, shapes=None):
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import load_in_memory

    return load_in_memory(import_onnx(model, shapes))


_KV_HEADS = {"llama": 2, "gpt2": 4}


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_prefill_then_decode_matches_onnxruntime(tmp_path, name, exporter):
    model = _export(tmp_path, name, exporter)
    _check_steps(model, _build(model), _KV_HEADS[name])


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_decode_step_with_seq_fixed_at_one(tmp_path, name, exporter):
    """`--shape input_ids=1x1 --shape position_ids=1x1`: batch and seq 1, past symbolic (the
    issue's 'Unsqueeze axis 3 is out of range for rank 3')."""
    model = _export(tmp_path, name, exporter)
    build = _build(model, {"input_ids": (1, 1), "position_ids": (1, 1)})
    _check_steps(model, build, _KV_HEADS[name], decode_only=True)


def test_llama_decode_step_fixed_shapes(tmp_path):
    """The issue's first case, fast: LLaMA (TorchScript exporter), every shape fixed for one
    decode step (seq 1, past 5), against onnxruntime."""
    from tools import llm_exports as L

    model = _export(tmp_path, "llama", "torchscript")
    shapes = {"input_ids": (1, 1), "position_ids": (1, 1), "attention_mask": (1, 6)}
    shapes.update({f"past_key_values.{i}.{k}": (1, 2, 5, 16)
                   for i in range(L.LAYERS) for k in ("key", "value")})
    build = _build(model, shapes)
    feeds = L.sample(1, 1, 5, 2, 16, seed=4)
    got = build.run(feeds)
    _, outs = L.names()
    for name, w in zip(outs, run_onnxruntime(model, feeds)):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=name)
