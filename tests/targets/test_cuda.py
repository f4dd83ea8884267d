"""CUDA artifacts build here without a GPU (nvcc + libcuda stub), use tensor cores for fp16
matmuls, record the plan in the manifest, and refuse to run on this GPU-less host."""

import json

import pytest

from tests.models import mlp_file
from tvmopt.interface.compile import CompileOptions, compile_model
from tvmopt.targets.cuda import ptx_of
from tvmopt.errors import TargetError
from tvmopt.runtime.loader import load


@pytest.fixture(scope="module")
def fp32_artifact(tmp_path_factory):
    """fp32 CUDA build of a small MLP: no tensor-core intrinsics, so it builds in seconds."""
    d = tmp_path_factory.mktemp("cuda32")
    model = mlp_file(d / "m.onnx", din=64, hid=128, dout=16, batch=32)
    return compile_model(CompileOptions(model=model, target="cuda", output=str(d / "a"),
                                        precision="fp32"), log=lambda s: None).artifact


def test_fp32_cuda_artifact_builds_with_a_binary(fp32_artifact):
    m = fp32_artifact.manifest
    assert m["target"]["tvm"]["arch"] == "sm_80" and m["precision"]["default"] == "fp32"
    assert any(d["precision"] == "fp16" for d in m["precision"]["decisions"]) is False
    data = (fp32_artifact.path / "model.so").read_bytes()
    assert b"sm_80" in data  # nvcc's fatbin names its arch; TVM's source-only fallback would not
    assert "__global__" in (fp32_artifact.path / "kernels.cu").read_text()


def test_running_a_cuda_artifact_here_is_refused(fp32_artifact):
    with pytest.raises(TargetError, match="cuda device"):
        load(fp32_artifact.path)


@pytest.fixture(scope="module")
def cuda_artifacts(tmp_path_factory):
    """fp16 MLP (static 128x256 -> 512 -> 64) built for sm_80 (A100) and sm_90 (H100).

    The first build pays TVM's CUDA tensor-intrinsic import (~20-90 s on 2 busy cores); the
    second reuses it, so both live in one fixture.
    """
    d = tmp_path_factory.mktemp("cuda")
    model = mlp_file(d / "m.onnx", din=256, hid=512, dout=64, batch=128)
    arts = {}
    for target in ("a100", "h100"):
        res = compile_model(CompileOptions(model=model, target=target, output=str(d / target)),
                            log=lambda s: None)
        arts[target] = res.artifact
    return arts


@pytest.mark.slow
@pytest.mark.parametrize("target,arch", [("a100", "sm_80"), ("h100", "sm_90")])
def test_cuda_artifact_manifest(cuda_artifacts, target, arch):
    art = cuda_artifacts[target]
    m = json.loads((art.path / "manifest.json").read_text())
    assert m["target"]["device"] == "cuda" and m["target"]["tvm"]["arch"] == arch
    assert m["precision"]["default"] == "fp16"
    assert any(d["precision"] == "fp16" and d["action"] == "chosen" for d in m["precision"]["decisions"])
    assert m["plan"]["kernels_after_fusion"] == len(m["plan"]["kernels"]) > 0
    assert (art.path / "model.so").stat().st_size > 0 and "kernels.cu" in m["files"]
    assert m["cuda"]["tensor_core_kernels"]  # the fp16 matmuls got MMA code
    acc = m["precision"]["accuracy"]["outputs"][0]
    assert 0 < acc["max_abs"] < 1e-2 * max(1.0, acc["ref_max_abs"])  # fp16 vs the fp32 build


@pytest.mark.slow
@pytest.mark.parametrize("target,arch", [("a100", "sm_80"), ("h100", "sm_90")])
def test_fp16_matmul_uses_tensor_cores(cuda_artifacts, target, arch):
    src = (cuda_artifacts[target].path / "kernels.cu").read_text()
    assert "wmma::mma_sync" in src or "mma.sync" in src
    ptx = ptx_of(src, arch)
    assert f".target {arch}" in ptx
    assert "wmma.mma.sync" in ptx or "mma.sync.aligned" in ptx  # tensor-core instructions
    assert ".f16" in ptx


