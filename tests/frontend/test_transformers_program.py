"""A real transformers model class (a tiny BertModel built from its config: nothing downloaded),
exported with torch.export (keyword inputs, symbolic batch, a ModelOutput structure), compiled
by tvmopt and checked against the program in torch at two batch sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tvmopt.interface.compile import CompileOptions, compile_model  # noqa: E402
from tvmopt.frontend import torch_program  # noqa: E402
from tvmopt.runtime.loader import load  # noqa: E402

SEQ, VOCAB = 8, 64


@pytest.fixture(scope="module")
def bert_program(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, attn_implementation="eager")
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask},
                             dynamic_shapes={"input_ids": {0: batch},
                                             "attention_mask": {0: batch}})
    path = tmp_path_factory.mktemp("bert") / "bert.pt2"
    torch.export.save(ep, str(path))
    return path


def test_bert_model_compiles_and_matches_torch(bert_program, tmp_path):
    res = compile_model(CompileOptions(model=str(bert_program), output=str(tmp_path / "b.tvmopt"),
                                       verify=True), log=lambda _: None)
    manifest = json.loads((res.artifact.path / "manifest.json").read_text())
    names = [i["name"] for i in manifest["inputs"]]
    assert names == ["input_ids", "attention_mask"]
    assert all(i["dtype"] == "int64" and isinstance(i["shape"][0], str) for i in manifest["inputs"])
    assert [o["name"] for o in manifest["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert manifest["verification"]["reference"] == "torch"

    ep = torch_program.load_program(bert_program)
    lm = load(res.artifact.path)
    rng = np.random.default_rng(0)
    for b in (1, 3):
        ids = rng.integers(0, VOCAB, (b, SEQ)).astype("int64")
        mask = np.ones((b, SEQ), dtype="int64")
        mask[:, SEQ - 2:] = 0  # padded tail
        got = lm.run({"input_ids": ids, "attention_mask": mask})
        ref = torch_program.run_program(ep, {"input_ids": ids, "attention_mask": mask})
        for name in ("last_hidden_state", "pooler_output"):
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-4)
