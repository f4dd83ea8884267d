"""Transformers exported the ordinary way (torch.onnx, dynamo and legacy) import, build and match ORT.

Tiny BERT-style (padding mask, GELU, post-norm) and GPT-style (causal mask, pre-norm, LM head)
models, exported with symbolic batch/seq and with static shapes, compiled through the CLI with
--verify; the symbolic artifacts are then run at two other (batch, seq) and compared with ORT.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
nn = torch.nn

EXPORT_BATCH, EXPORT_SEQ = 2, 8


class Bert(nn.Module):
    def __init__(self, vocab=50, d=32, heads=2, layers=1):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, activation="gelu", batch_first=True,
                                           dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids, mask):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.emb(ids) + self.pos(pos)
        x = self.enc(x, src_key_padding_mask=(mask == 0))
        return self.head(x[:, 0])


class GPT(nn.Module):
    def __init__(self, vocab=50, d=32, heads=2, layers=1):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, activation="gelu", batch_first=True,
                                           dropout=0.0, norm_first=True)
        self.dec = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.lm = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t).unsqueeze(0)
        x = self.emb(ids) + self.pos(pos)
        m = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.dec(x, mask=m, is_causal=True)
        return self.lm(self.ln(x))


def _export(kind: str, dynamo: bool, dynamic: bool, path: str,
            dims: tuple[str, ...] = ("batch", "seq")) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (EXPORT_BATCH, EXPORT_SEQ))
    if kind == "bert":
        model, args, names = Bert().eval(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    else:
        model, args, names = GPT().eval(), (ids,), ["input_ids"]
    axes = ({n: {i: d for i, d in enumerate(("batch", "seq")) if d in dims} for n in names}
            if dynamic else None)
    # Not under no_grad: the legacy exporter would then meet PyTorch's fused encoder fast path
    # (aten::_transformer_encoder_layer_fwd), which it cannot export.
    torch.onnx.export(model, args, path, input_names=names, output_names=["logits"],
                      dynamic_axes=axes, opset_version=17, dynamo=dynamo)


def _compile(model: str, out: str, *extra: str):
    from tvmopt.cli.main import main

    res = CliRunner().invoke(main, ["compile", model, "-o", out, "--verify", *extra])
    assert res.exit_code == 0, res.output
    assert "vs onnxruntime ok" in res.output, res.output
    return res.output


def _run_at(artifact: str, model: str, dims: dict[str, int]) -> None:
    from tvmopt.runtime import loader as runtime, verify

    lm = runtime.load(artifact)
    assert any(isinstance(d, str) for i in lm.inputs for d in i.shape), "dims were made static"
    feeds = runtime.random_inputs(lm.inputs, dims, seed=dims["seq"])
    if "attention_mask" in feeds:  # pad the tail of one sequence, as a real batch would
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
        feeds["attention_mask"][0, dims["seq"] // 2:] = 0
    got = lm.run(feeds)
    ref = verify.run_onnxruntime(model, feeds)
    for err in verify.compare(got, ref, verify.Tolerance(atol=1e-4, rtol=1e-3)):
        assert err.mismatched == 0, (dims, err)


CASES = [(k, dyn) for k in ("bert", "gpt") for dyn in (True, False)]


@pytest.mark.parametrize("kind,dynamo", CASES, ids=[f"{k}-{'dynamo' if d else 'legacy'}" for k, d in CASES])
def test_export_compiles_and_matches(kind, dynamo, tmp_path):
    static = str(tmp_path / f"{kind}_static.onnx")
    _export(kind, dynamo, False, static)
    out = _compile(static, str(tmp_path / "static.tvmopt"))
    assert f"[{EXPORT_BATCH}x" in out  # static shapes kept

    dyn = str(tmp_path / f"{kind}_dyn.onnx")
    _export(kind, dynamo, True, dyn)
    art = str(tmp_path / "dyn.tvmopt")
    if dynamo:
        _compile(dyn, art, "--dim", "batch=3", "--dim", "seq=7")
        _run_at(art, dyn, {"batch": 1, "seq": 5})
        _run_at(art, dyn, {"batch": 4, "seq": 11})
    else:
        # The legacy (TorchScript) exporter traces nn.MultiheadAttention's reshape with the
        # example's seq baked in (onnxruntime itself fails at any other seq), so only batch varies.
        _compile(dyn, art, "--dim", "batch=3", "--dim", f"seq={EXPORT_SEQ}")
        _run_at(art, dyn, {"batch": 1, "seq": EXPORT_SEQ})
        _run_at(art, dyn, {"batch": 5, "seq": EXPORT_SEQ})


def _libm_calls(executable) -> set[str]:
    """Scalar libm functions the executable's kernels call (expf, erff, tanhf, powf, ...)."""
    import re

    asm = "\n".join(lib.inspect_source("asm") for lib in executable.mod.imports)
    called = set(re.findall(r"call\w*\s+\*?([A-Za-z_]\w*)@PLT", asm))
    return called & {"expf", "erff", "tanhf", "powf", "exp", "erf", "tanh", "pow"}


@pytest.mark.parametrize("kind", ["bert", "gpt"])
def test_symbolic_export_gets_the_fast_math_forms(kind, tmp_path):
    """With symbolic batch/seq, softmax, GELU's erf and exp still compile to the vectorizable
    fast forms (no scalar libm call per element), and match onnxruntime at two shapes."""
    import onnx

    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime import verify
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    path = str(tmp_path / f"{kind}.onnx")
    _export(kind, True, True, path)
    model = onnx.load(path)
    imported = import_onnx(model)
    ex = build_in_memory(imported.mod)
    assert _libm_calls(ex) == set()

    rng = np.random.default_rng(0)
    for batch, seq in ((1, 5), (3, 13)):
        feeds = {"input_ids": rng.integers(0, 50, (batch, seq)).astype("int64")}
        if kind == "bert":
            feeds["attention_mask"] = np.ones((batch, seq), "int64")
            feeds["attention_mask"][0, seq // 2:] = 0
        got = run_executable(ex, [feeds[i.name] for i in imported.inputs])
        ref = verify.run_onnxruntime(path, feeds)
        for a, b in zip(got, ref.values()):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4, err_msg=f"{batch}x{seq}")
