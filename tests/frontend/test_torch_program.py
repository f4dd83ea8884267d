"""torch.export programs (.pt2) in: a CNN and a transformer block exported here with a symbolic
batch (torch.export.Dim), compiled, verified against the program run in torch, and run at other
batch sizes; --shape binding, bad files and unsupported ops give one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
nn = torch.nn

from tvmopt.cli.main import main  # noqa: E402
from tvmopt.errors import ModelError, ShapeError, UnsupportedOpError  # noqa: E402
from tvmopt.frontend import torch_program  # noqa: E402


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = nn.functional.relu6(self.conv2(y))
        return self.fc(y.mean((2, 3)))


class Block(nn.Module):
    """Pre-norm self-attention and a GELU MLP, with a residual around each."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def _export(module, example, path):
    torch.manual_seed(0)
    module = module.eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(path))
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt2")
    torch.manual_seed(0)
    return {"cnn": _export(CNN(), torch.randn(2, 3, 16, 16), d / "cnn.pt2"),
            "block": _export(Block(), torch.randn(2, 8, 32), d / "block.pt2")}


def _torch_outputs(path, x):
    ep = torch_program.load_program(path)
    with torch.inference_mode():
        out = ep.module()(torch.from_numpy(x))
    return out.numpy()


@pytest.mark.parametrize("name", ["cnn", "block"])
def test_program_compiles_keeps_batch_symbolic_and_matches_torch(programs, name, tmp_path):
    from tvmopt.runtime.loader import load

    path = programs[name]
    art = tmp_path / f"{name}.tvmopt"
    res = CliRunner().invoke(main, ["compile", str(path), "-o", str(art), "--verify"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "vs torch" in res.output
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["model"]["format"] == "torch.export"
    assert manifest["verification"]["reference"] == "torch"
    (inp,) = manifest["inputs"]
    assert inp["name"] == "x" and inp["dtype"] == "float32"
    batch = inp["shape"][0]
    assert isinstance(batch, str) and inp["shape"][1:] == ([3, 16, 16] if name == "cnn" else [8, 32])
    assert manifest["outputs"][0]["name"] == "output"
    assert manifest["outputs"][0]["shape"][0] == batch
    # one artifact, any batch the program allows
    lm = load(art)
    for b in (1, 5):
        x = np.random.default_rng(b).standard_normal((b, *inp["shape"][1:])).astype("float32")
        got = lm.run({"x": x})["output"]
        np.testing.assert_allclose(got, _torch_outputs(path, x), rtol=1e-4, atol=1e-4)
    # The memory plan holds the exported range (Dim max=64): past it, refused in one line.
    assert manifest["dim_bounds"] == {batch: [1, 64]}
    with pytest.raises(ShapeError, match="outside 1..64"):
        lm.run({"x": np.zeros((65, *inp["shape"][1:]), "float32")})


def test_shape_override_binds_the_batch_and_is_checked(programs):
    ep = torch_program.load_program(programs["cnn"])
    (sym,) = {d for d in torch_program.program_inputs(ep)[0].shape if isinstance(d, str)}
    imported = torch_program.import_program(ep, {"x": (4, 3, 16, 16)})
    assert imported.inputs[0].shape == (4, 3, 16, 16)
    assert imported.outputs[0].shape == (4, 5)
    with pytest.raises(ShapeError, match="dimension 2 is fixed to 16"):
        torch_program.import_program(ep, {"x": (4, 3, 8, 8)})
    with pytest.raises(ShapeError, match=rf"\({sym}\) must be in \[1, 64\]"):
        torch_program.import_program(ep, {"x": (65, 3, 16, 16)})
    with pytest.raises(ShapeError, match="not a program input"):
        torch_program.import_program(ep, {"y": (1, 3, 16, 16)})


def test_bad_pt2_files_are_one_line_errors(programs, tmp_path):
    data = programs["cnn"].read_bytes()
    cases = {"truncated.pt2": data[: len(data) // 2], "empty.pt2": b"",
             "text.pt2": b"not a zip archive\n"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        res = CliRunner().invoke(main, ["compile", str(tmp_path / name)])
        assert res.exit_code == 1, (name, res.output)
        assert res.output.count("\n") == 1 and res.output.startswith("tvmopt: error:"), res.output
        assert name in res.output
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "missing.pt2")])
    assert res.exit_code == 1 and "no such file" in res.output


def test_unsupported_torch_ops_are_listed_with_their_nodes(tmp_path):
    class Gamma(nn.Module):
        def forward(self, x):
            return torch.lgamma(x) + 1

    ep = torch.export.export(Gamma(), (torch.rand(2, 3) + 1,))
    with pytest.raises(UnsupportedOpError, match=r"lgamma\.default \(nodes: lgamma\)"):
        torch_program.import_program(ep)
    with pytest.raises(ModelError, match="no such file"):
        torch_program.load_program(tmp_path / "nothing.pt2")


def test_inspect_and_plan_take_a_program(programs):
    res = CliRunner().invoke(main, ["inspect", str(programs["cnn"]), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["format"] == "torch.export"
    assert info["inputs"][0]["name"] == "x" and isinstance(info["inputs"][0]["shape"][0], str)
    assert info["op_histogram"].get("convolution.default") == 2
    assert info["unsupported"] == {}
    conv_flops = 2 * (16 * 16 * 8 * 27 + 8 * 8 * 8 * 9)
    assert info["flops"] >= conv_flops  # batch 1: both convolutions and the linear layer
    assert info["parameter_count"] == sum(p.numel() for p in CNN().state_dict().values())
    sym = info["inputs"][0]["shape"][0]
    res = CliRunner().invoke(main, ["plan", str(programs["cnn"]), "--dim", f"{sym}=2", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert any("conv2d" in ",".join(k["ops"]) for k in plan["kernels"])
