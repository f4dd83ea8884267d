"""The generation harness (tvmopt.bench.generate, `tvmopt bench --generate`, `tvmopt.generate`):
signature detection, the prefill + decode loop on a fake session, and a tiny LLaMA
decoder-with-past export (tools/llm_exports.py) built for this host, whose greedy tokens must
equal onnxruntime's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tvmopt.bench import generate as G
from tvmopt.tensor_info import TensorInfo


def _sig_infos(past="past_key_values.{i}.{k}", present="present.{i}.{k}", layers=2,
               extra_inputs=(), mask=True, positions=True):
    ins = [TensorInfo("input_ids", ("batch", "seq"), "int64")]
    if mask:
        ins.append(TensorInfo("attention_mask", ("batch", "total"), "int64"))
    if positions:
        ins.append(TensorInfo("position_ids", ("batch", "seq"), "int64"))
    outs = [TensorInfo("logits", ("batch", "seq", 50), "float32")]
    for i in range(layers):
        for k in ("key", "value"):
            ins.append(TensorInfo(past.format(i=i, k=k), ("batch", 2, "past", 4), "float32"))
            outs.append(TensorInfo(present.format(i=i, k=k), ("batch", 2, "total", 4), "float32"))
    ins += [TensorInfo(n, (1,), "bool") for n in extra_inputs]
    return ins, outs


# ------------------------------------------------------------------------------------ signature
@pytest.mark.parametrize("past,present", [
    ("past_key_values.{i}.{k}", "present.{i}.{k}"),        # optimum, onnxruntime-genai, ours
    ("past_key_values_{i}_{k}", "present_key_values_{i}_{k}"),
    ("past_{k}_{i}", "present_{k}_{i}"),                   # onnxruntime-genai's per-model names
])
def test_the_signature_is_found_under_each_naming(past, present):
    sig = G.detect_signature(*_sig_infos(past, present))
    assert sig.layers == 2 and (sig.kv_heads, sig.head_dim, sig.vocab) == (2, 4, 50)
    assert sig.past[1] == (past.format(i=1, k="key"), past.format(i=1, k="value"))
    assert sig.present[0] == (present.format(i=0, k="key"), present.format(i=0, k="value"))
    assert sig.kv_bytes(1, 10) == 2 * 2 * 2 * 10 * 4 * 4


def test_a_model_without_past_is_refused_in_one_line():
    from tvmopt.cli.options import default_model

    with pytest.raises(G.NotADecoderError) as err:  # the bundled model: an encoder
        G.detect_signature(*G.onnx_signature(default_model()))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("not a decoder-with-past model: missing input 'input_ids'")
    assert "past_key_values.N.key/value" in msg and "output 'logits'" not in msg
    assert "present.N.key/value" in msg


def test_a_missing_value_or_an_unknown_input_is_named():
    ins, outs = _sig_infos()
    with pytest.raises(G.NotADecoderError, match=r"missing output 'present\.1\.value'"):
        G.detect_signature(ins, [o for o in outs if o.name != "present.1.value"])
    with pytest.raises(G.NotADecoderError, match="cannot fill: use_cache_branch"):
        G.detect_signature(*_sig_infos(extra_inputs=["use_cache_branch"]))


# ------------------------------------------------------------------------------------ the loop
class _Fake:
    """A decoder that appends one 'token' to every past per input token and predicts
    (last id + 1) % vocab; it records what it was fed."""

    def __init__(self, **kw):
        self.inputs, self.outputs = _sig_infos(**kw)
        self.fed = []

    def run(self, feeds):
        self.fed.append(feeds)
        ids = feeds["input_ids"]
        b, s = ids.shape
        logits = np.zeros((b, s, 50), np.float32)
        for r in range(b):
            logits[r, -1, (ids[r, -1] + 1) % 50] = 1
        out = {"logits": logits}
        for i in range(2):
            for k in ("key", "value"):
                past = feeds[f"past_key_values.{i}.{k}"]
                out[f"present.{i}.{k}"] = np.concatenate(
                    [past, np.ones((b, 2, s, 4), np.float32)], axis=2)
        return out


def test_prefill_then_decode_steps_feed_present_back_as_past():
    fake = _Fake()
    ticks = iter(range(100))
    g = G.generate(fake, [[3, 4, 5], [7, 8, 9]], 4, clock=lambda: next(ticks))
    assert g.tokens.tolist() == [[6, 7, 8, 9], [10, 11, 12, 13]]
    assert g.prefill_ms == 1000 and g.step_ms == [1000] * 3
    first, second, last = fake.fed[0], fake.fed[1], fake.fed[-1]
    assert first["past_key_values.0.key"].shape == (2, 2, 0, 4)  # empty past for the prefill
    assert first["attention_mask"].shape == (2, 3)
    assert first["position_ids"].tolist() == [[0, 1, 2]] * 2
    assert second["input_ids"].tolist() == [[6], [10]]
    assert second["past_key_values.1.value"].shape == (2, 2, 3, 4)
    assert second["attention_mask"].shape == (2, 4) and second["position_ids"].tolist() == [[3]] * 2
    assert last["position_ids"].tolist() == [[5]] * 2 and last["attention_mask"].shape == (2, 6)


def test_without_mask_and_positions_only_the_ids_and_past_are_fed():
    fake = _Fake(mask=False, positions=False)
    assert G.generate_ids(fake, [1, 2], 2).tolist() == [3, 4]
    assert set(fake.fed[1]) == {"input_ids"} | {f"past_key_values.{i}.{k}" for i in range(2)
                                                 for k in ("key", "value")}


def test_rounds_alternate_the_order_of_the_runtimes():
    order = []

    class W:
        def __init__(self, name):
            self.name = name

        def generate(self):
            order.append(self.name)
            return self.name

    out = G.rounds_alternating({"a": W("a"), "b": W("b")}, 3, sleep=lambda s: None)
    assert order == ["a", "b", "b", "a", "a", "b"] and out["a"] == ["a"] * 3


def test_the_floor_is_weights_plus_the_cache_over_bandwidth():
    sig = G.detect_signature(*_sig_infos())
    opts = G.GenerateOptions(prompt_len=10, new_tokens=3)
    f = G.floor_estimate(sig, opts, 10**9, "test", 100.0)
    assert f["estimate"] and f["kv_bytes_first_step"] == sig.kv_bytes(1, 10)
    assert f["ms_first_step"] == pytest.approx((1e9 + sig.kv_bytes(1, 10)) / 100e9 * 1e3)
    assert f["kv_bytes_last_step"] == sig.kv_bytes(1, 11)
    assert G.floor_estimate(sig, opts, 10**9, "test", None) is None
    assert opts.baselines == ["ort"]  # onnxruntime always runs: the ratios and the token check


@pytest.mark.parametrize("args,needle", [
    (["--csv", "x.csv"], "--generate takes --json"),
    (["--batch", "1,8"], "--generate takes --json"),
    (["--baselines", "torch"], "--baselines with --generate: unknown torch"),
])
def test_bench_generate_refuses_what_it_cannot_do_in_one_line(tmp_path, args, needle):
    from click.testing import CliRunner

    from tvmopt.cli.main import main

    res = CliRunner().invoke(main, ["bench", str(tmp_path / "none.tvmopt"), "--generate", *args])
    assert res.exit_code != 0
    assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output


# ------------------------------------------------------------------------------------ real model
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny LLaMA decoder-with-past (TorchScript exporter) and its tvmopt build for this host,
    side by side (as `bench` finds an artifact's model)."""
    pytest.importorskip("transformers")
    import tvmopt
    from tools import llm_exports

    d = tmp_path_factory.mktemp("llama")
    onnx_path = d / "llama.onnx"
    if not llm_exports.export("llama", "torchscript", str(onnx_path)):
        pytest.skip("the TorchScript exporter cannot export the tiny LLaMA here")
    # dispatch codegen: no per-kernel timing against oneDNN (nothing depends on the clock)
    res = tvmopt.compile_model(tvmopt.CompileOptions(model=str(onnx_path), target="host",
                                                     dispatch="codegen",
                                                     output=str(d / "llama.tvmopt")))
    return str(res.artifact.path), str(onnx_path)


def test_greedy_tokens_equal_onnxruntimes(llama):
    import tvmopt
    from tvmopt.runtime.verify import ort_session

    art, onnx_path = llama
    prompt = np.random.default_rng(0).integers(0, 1000, 5)
    want = G.generate(ort_session(onnx_path, threads=1), prompt, 6)
    got = tvmopt.generate(tvmopt.load(art), prompt, max_new_tokens=6)
    assert got.shape == (6,)
    assert got.tolist() == want.tokens[0].tolist()
    assert len(want.step_ms) == 5


def test_a_past_bounded_from_zero_takes_the_prefill(llama, tmp_path):
    """`--dim past=0..N`: the memory plan holds N, and the prefill's empty past is inside the
    range (a range had to start at 1, which refused every prefill)."""
    import tvmopt
    from tvmopt.runtime.verify import ort_session

    _, onnx_path = llama
    res = tvmopt.compile_model(tvmopt.CompileOptions(
        model=onnx_path, target="host", dispatch="codegen", output=str(tmp_path / "b.tvmopt"),
        dim_bounds={"past": (0, 32), "total": (1, 32), "seq": (1, 32)},
        verify_dims={"past": 0, "total": 5, "seq": 5}))
    assert res.artifact.manifest["dim_bounds"]["past"] == [0, 32]
    prompt = np.random.default_rng(1).integers(0, 1000, 5)
    want = G.generate(ort_session(onnx_path, threads=1), prompt, 6)
    got = tvmopt.generate(tvmopt.load(res.artifact.path), prompt, max_new_tokens=6)
    assert got.tolist() == want.tokens[0].tolist()


def test_bench_generate_prints_the_figures_and_writes_json(llama, cli, tmp_path):
    art, onnx_path = llama
    out = tmp_path / "gen.json"
    res = cli("bench", art, "--generate", "--prompt-len", 5, "--new-tokens", 3, "--runs", 1,
              "--threads", 1, "--json", out, "-q")
    assert res.exit_code == 0, res.output
    text = res.output
    for line in ("time to first token (prefill): p50", "per-token decode: p50", "p95",
                 "tokens/s (prefill + decode)", "tokens: tvmopt's greedy tokens equal "
                 "onnxruntime's", "floor per decode token", "host: "):
        assert line in text, (line, text)
    doc = json.loads(out.read_text())
    assert doc["schema"] == G.SCHEMA and doc["model"] == onnx_path
    assert [r["runner"] for r in doc["runtimes"]] == ["tvmopt", "onnxruntime"]
    assert doc["tokens"]["match"] is True
    tv = doc["runtimes"][0]
    assert tv["decode"]["n"] == 2 and tv["ratio_to_ort"]["decode_p50"] > 0
    assert doc["host"]["cpu_count"] and doc["signature"]["layers"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_longer_greedy_generations_equal_onnxruntimes(tmp_path, name, exporter):
    """Both models, both exporters, batch 2, prompt 16, 12 new tokens."""
    pytest.importorskip("transformers")
    import tvmopt
    from tools import llm_exports
    from tvmopt.runtime.verify import ort_session

    path = tmp_path / f"{name}_{exporter}.onnx"
    if not llm_exports.export(name, exporter, str(path)):
        pytest.skip(f"{exporter} cannot export {name} here")
    art = tvmopt.compile_model(tvmopt.CompileOptions(model=str(path), target="host",
                                                     dispatch="codegen",
                                                     output=str(tmp_path / "a"))).artifact.path
    prompt = np.random.default_rng(1).integers(0, 1000, (2, 16))
    want = G.generate(ort_session(str(path), threads=1), prompt, 12).tokens
    assert tvmopt.generate(str(art), prompt, max_new_tokens=12).tolist() == want.tolist()
