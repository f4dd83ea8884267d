"""torch.export programs whose ops take symbolic sizes: a slice of a position table to the
sequence length (transformers text encoders) and `repeat` by the batch size (DETR's queries),
imported with their dims symbolic and run at several sizes against torch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class Positions(nn.Module):
    """Token plus position embeddings, the positions a slice of a registered table (as BERT,
    DistilBERT, ALBERT, CLIP text do): `position_ids[:, :seq]`."""

    def __init__(self, vocab=50, table=64, d=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(table, d)
        self.register_buffer("position_ids", torch.arange(table).expand((1, -1)))

    def forward(self, ids):
        return self.tok(ids) + self.pos(self.position_ids[:, :ids.shape[1]])


class Queries(nn.Module):
    """Learned queries repeated over the batch (DETR) and added to a projection of the input."""

    def __init__(self, q=6, d=8):
        super().__init__()
        self.q = nn.Parameter(torch.randn(1, q, d))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return self.q.repeat(x.shape[0], 1, 1) + self.proj(x).mean(1, keepdim=True)


def _run(module, example, dynamic, sizes):
    from tvmopt.frontend.torch_program import import_program
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    torch.manual_seed(0)
    module = module.eval()
    ep = torch.export.export(module, (example,), dynamic_shapes=(dynamic,))
    imported = import_program(ep)
    assert any(isinstance(d, str) for d in imported.inputs[0].shape)  # kept symbolic
    exe = build_in_memory(imported.mod)
    for x in sizes:
        got = run_executable(exe, [x.numpy()])[0]
        with torch.inference_mode():
            want = module(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_slice_of_a_position_table_to_the_sequence_length():
    seq = torch.export.Dim("seq", min=2, max=60)
    batch = torch.export.Dim("batch", min=1, max=8)
    ids = [torch.randint(0, 50, s) for s in [(2, 5), (3, 37), (1, 60)]]
    _run(Positions(), torch.randint(0, 50, (2, 9)), {0: batch, 1: seq}, ids)


def test_repeat_by_the_batch_size():
    batch = torch.export.Dim("batch", min=1, max=16)
    _run(Queries(), torch.randn(2, 5, 8), {0: batch},
         [torch.randn(b, 5, 8) for b in (1, 3, 7)])
