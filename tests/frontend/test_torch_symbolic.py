"""torch.export programs whose ops take symbolic sizes: a slice of a position table to the
sequence length (transformers text encoders), `repeat` by the batch size (DETR's queries) and a
residual whose operands spell one length two ways (wav2vec2), imported with their dims
symbolic and run at several sizes against torch."""

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
    assert not all(isinstance(d, int) for d in imported.inputs[0].shape), imported.inputs  # symbolic
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


class UpDown(nn.Module):
    """A strided conv, then bilinear and nearest upsampling back (a UNet's decoder steps)."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        y = self.down(x)
        up = nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        near = nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        return self.out(torch.cat([up, near], 1))


def test_upsampling_kept_whole_with_image_sizes_derived_from_a_dim(monkeypatch):
    """The converters an op kept whole reaches when torch's decomposition fails (simulated by
    importing the program undecomposed): upsampling gets torch's symbolic output size, and the
    input's derived dims `8 * h` are solved for h."""
    from tvmopt.frontend import torch_program

    monkeypatch.setattr(torch_program, "_decompose", lambda ep, convert_map=None: ep)
    h, w = torch.export.Dim("h8", min=2, max=32), torch.export.Dim("w8", min=2, max=32)
    _run(UpDown(), torch.randn(1, 3, 32, 48), {2: 8 * h, 3: 8 * w},
         [torch.randn(1, 3, s, t) for s, t in [(32, 48), (64, 16), (24, 40)]])


def test_a_saved_program_with_derived_image_sizes_is_decomposed(tmp_path):
    """A .pt2 exported with `8 * h` image sizes, as a user's file reaches us: torch's loader
    files ranges under the derived dims that stopped torch's own re-tracing ("expected
    sympy.Symbol"); decomposed to core ATen, it imports and matches torch."""
    from tvmopt.frontend.torch_program import import_program, load_program
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    torch.manual_seed(0)
    module = UpDown().eval()
    h, w = torch.export.Dim("h8", min=2, max=32), torch.export.Dim("w8", min=2, max=32)
    ep = torch.export.export(module, (torch.randn(1, 3, 32, 48),),
                             dynamic_shapes=({2: 8 * h, 3: 8 * w},))
    torch.export.save(ep, str(tmp_path / "updown.pt2"))
    imported = import_program(load_program(tmp_path / "updown.pt2"))
    assert [str(d) for d in imported.inputs[0].shape[2:]] != ["32", "48"]  # still symbolic
    exe = build_in_memory(imported.mod)
    for s, t in [(32, 48), (64, 16)]:
        x = torch.randn(1, 3, s, t)
        with torch.inference_mode():
            want = module(x).numpy()
        np.testing.assert_allclose(run_executable(exe, [x.numpy()])[0], want,
                                   rtol=1e-5, atol=1e-5)


class MaskedAttention(nn.Module):
    """Attention with a boolean causal mask and an explicit scale."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.qkv, self.heads = nn.Linear(d, 3 * d), heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        return out.transpose(1, 2).reshape(b, s, d)


def test_attention_kept_whole_takes_a_boolean_mask_and_a_scale(monkeypatch):
    """Where torch's decomposition fails (GPT-2's attention under torch.export: "Cannot view a
    tensor ... as a tensor"), scaled_dot_product_attention reaches TVM's converter whole."""
    from tvmopt.frontend import torch_program

    monkeypatch.setattr(torch_program, "_decompose", lambda ep, convert_map=None: ep)
    seq = torch.export.Dim("seq", min=2, max=64)
    _run(MaskedAttention(), torch.randn(2, 7, 16), {1: seq},
         [torch.randn(2, s, 16) for s in (3, 7, 40)])


class PaddingPositions(nn.Module):
    """RoBERTa's position ids: a cumsum of the padding mask (int32, summed as int64)."""

    def __init__(self, vocab=50, d=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(80, d)

    def forward(self, ids):
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        return self.tok(ids) + self.pos(positions)


def test_cumsum_of_a_padding_mask():
    seq = torch.export.Dim("seq", min=2, max=60)
    _run(PaddingPositions(), torch.randint(0, 50, (2, 9)), {1: seq},
         [torch.randint(0, 50, s) for s in [(2, 5), (2, 40)]])


class ConvPositions(nn.Module):
    """wav2vec2's feature encoder and positional convolution: the positions are a padded
    grouped conv with its last frame dropped (length `min(max(n + 1, 0), n + 2)` after the
    slice), added to a projection whose length torch spells as nested floor divisions."""

    def __init__(self, d=8):
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(1, d, 10, stride=5), nn.Conv1d(d, d, 3, stride=2)
        self.proj = nn.Linear(d, 2 * d)
        self.pos = nn.Conv1d(2 * d, 2 * d, 4, padding=2, groups=2)

    def forward(self, wave):
        h = self.c2(torch.nn.functional.gelu(self.c1(wave[:, None]))).transpose(1, 2)
        h = self.proj(h)
        p = self.pos(h.transpose(1, 2))[:, :, :-1]
        return torch.nn.functional.layer_norm(h + p.transpose(1, 2), (h.shape[-1],))


def test_residual_of_a_sliced_positional_conv_keeps_its_shape():
    samples = torch.export.Dim("samples", min=40, max=4000)
    batch = torch.export.Dim("batch", min=1, max=4)
    waves = [torch.randn(s) for s in [(2, 400), (1, 123)]]
    _run(ConvPositions(), torch.randn(2, 400), {0: batch, 1: samples}, waves)
