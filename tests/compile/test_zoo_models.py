"""Vision models as a new user exports them (torch.onnx, opset 17) compile for x86 and match ORT.

Tiny UNet (ConvTranspose2d upsampling, bilinear Upsample, skip concats), ConvTranspose variants
between NHWC convolutions, and a YOLOv8-style detector (Conv+BN+SiLU, C2f blocks that split with
`torch.chunk`, SPPF, nearest upsample, a concat head), each with a static and a symbolic batch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class UNet(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.e2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.e3 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(2 * c, 4 * c, 3, padding=1), nn.ReLU())
        self.up1 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.d1 = nn.Sequential(nn.Conv2d(4 * c, 2 * c, 3, padding=1), nn.ReLU())
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.d2 = nn.Sequential(nn.Conv2d(3 * c, c, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        u = self.d1(torch.cat([self.up1(self.e3(b)), b], 1))
        return self.out(self.d2(torch.cat([self.up2(u), a], 1)))


# ConvTranspose between two convolutions, so it sits among NHWC activations after the layout pass.
TRANSPOSE_KINDS = {
    "output_padding": dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    "groups": dict(kernel_size=2, stride=2, groups=4),
    "dilation": dict(kernel_size=3, stride=2, dilation=2, padding=1),
    "1d": dict(kernel_size=3, stride=2, padding=1, output_padding=1),
}


class Transposed(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        one_d = kind == "1d"
        conv = nn.Conv1d if one_d else nn.Conv2d
        self.a = conv(3, 8, 3, padding=1)
        self.t = (nn.ConvTranspose1d if one_d else nn.ConvTranspose2d)(8, 8, **TRANSPOSE_KINDS[kind])
        self.b = conv(8, 4, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.t(torch.relu(self.a(x)))))


class ConvBnSiLU(nn.Module):
    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return nn.functional.silu(self.bn(self.conv(x)))


class C2f(nn.Module):
    """YOLOv8's block: its split is `torch.chunk`, exported as Shape -> Gather -> Div -> Slice."""

    def __init__(self, cin, cout):
        super().__init__()
        h = cout // 2
        self.cv1, self.cv2 = ConvBnSiLU(cin, 2 * h), ConvBnSiLU(3 * h, cout)
        self.m = nn.Sequential(ConvBnSiLU(h, h, 3), ConvBnSiLU(h, h, 3))

    def forward(self, x):
        y = list(torch.chunk(self.cv1(x), 2, dim=1))
        y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.cv1, self.cv2 = ConvBnSiLU(c, c // 2), ConvBnSiLU(2 * c, c)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        a = self.pool(x)
        b = self.pool(a)
        return self.cv2(torch.cat([x, a, b, self.pool(b)], 1))


class Detector(nn.Module):
    def __init__(self, c=8, classes=3):
        super().__init__()
        self.p3 = nn.Sequential(ConvBnSiLU(3, c, 3, 2), ConvBnSiLU(c, 2 * c, 3, 2), C2f(2 * c, 2 * c))
        self.p4 = nn.Sequential(ConvBnSiLU(2 * c, 4 * c, 3, 2), C2f(4 * c, 4 * c), SPPF(4 * c))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck = C2f(6 * c, 2 * c)
        self.h3, self.h4 = nn.Conv2d(2 * c, classes + 4, 1), nn.Conv2d(4 * c, classes + 4, 1)

    def forward(self, x):
        p3 = self.p3(x)
        p4 = self.p4(p3)
        n = self.neck(torch.cat([self.up(p4), p3], 1))
        return torch.cat([self.h3(n).flatten(2), self.h4(p4).flatten(2)], 2)


class ChunkRows(nn.Module):
    """chunk along H with H symbolic: the split points are known only at run time."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        top, bottom = torch.chunk(self.a(x), 2, dim=2)
        return self.b(torch.cat([bottom * 2, top], 2))


def _compile(model, path, shape, dynamic_axes=None, dispatch="codegen", dims=None):
    from tvmopt.interface.compile import CompileOptions, compile_model

    torch.manual_seed(0)
    model = model.eval()
    axes = {"x": dynamic_axes, "y": dynamic_axes} if dynamic_axes else None
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(*shape),), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False, dynamic_axes=axes)
    result = compile_model(CompileOptions(model=str(path), output=str(path.with_suffix(".tvmopt")),
                                          target="x86", verify=True, dispatch=dispatch,
                                          verify_dims=dims or {}), log=lambda *a: None)
    assert all(e.mismatched == 0 for e in result.verification)
    return result


@pytest.mark.parametrize("batch", ["static", "symbolic"])
def test_unet_with_conv_transpose_builds(batch, tmp_path):
    # the default dispatch (oneDNN where it is faster) converts to NHWC/OHWI; codegen to NHWC/HWIO
    dispatch = "auto" if batch == "static" else "codegen"
    result = _compile(UNet(), tmp_path / "unet.onnx", (1, 3, 32, 32),
                      {0: "N"} if batch == "symbolic" else None, dispatch, {"N": 2})
    assert result.artifact.manifest["inputs"][0]["shape"][0] == (1 if batch == "static" else "N")


@pytest.mark.parametrize("kind", sorted(TRANSPOSE_KINDS))
def test_conv_transpose_variants_between_nhwc_convs(kind, tmp_path):
    shape = (1, 3, 16) if kind == "1d" else (1, 3, 16, 16)
    _compile(Transposed(kind), tmp_path / f"{kind}.onnx", shape)


@pytest.mark.parametrize("batch", ["static", "symbolic"])
def test_detector_with_chunk_builds(batch, tmp_path):
    result = _compile(Detector(), tmp_path / "det.onnx", (1, 3, 32, 32),
                      {0: "N"} if batch == "symbolic" else None, dims={"N": 3})
    # chunk's split points folded to constants: every shape stays known, the output's too
    assert result.artifact.manifest["outputs"][0]["shape"][1:] == [7, 80]


def test_chunk_along_a_symbolic_axis_builds(tmp_path):
    _compile(ChunkRows(), tmp_path / "rows.onnx", (2, 3, 8, 8), {0: "N", 2: "H"},
             dims={"N": 2, "H": 7})
