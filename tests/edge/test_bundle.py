"""Edge bundles: built with `compile --bundle`, unpacked, run by bin/tvmopt-run without Python
(natively for x86_64; under qemu-user for aarch64 in the slow tier), compared with onnxruntime."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models import cnn, encoder_block, tiny_mlp
from tvmopt.interface.compile import CompileOptions
from tvmopt.edge import bundle as edge_bundle
from tvmopt.edge import runtime as edge_runtime
from tvmopt.edge.toolchain import missing_for_emulation, run_prefix
from tvmopt.errors import BuildError, VerificationError
from tvmopt.runtime.verify import run_onnxruntime
from tvmopt.targets.registry import host_arch

ATOL, RTOL = 1e-4, 1e-3  # fp32


def _build(tmp: Path, model_path: Path, target: str, name: str, verify=False) -> Path:
    """compile --bundle through the API, unpacked; returns the bundle's root folder."""
    opts = CompileOptions(model=str(model_path), target=target, precision="fp32", verify=verify)
    _, packed = edge_bundle.compile_bundle(opts, tmp / f"{name}.tar.gz", log=lambda m: None)
    with tarfile.open(packed.path) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    return tmp / "unpacked" / packed.top


def _run(root: Path, feeds: dict, out: Path, prefix=(), extra=()) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    args = []
    for name, arr in feeds.items():
        np.save(out / f"in-{name}.npy", arr)
        args += ["--input", f"{name}={out / f'in-{name}.npy'}"]
    cmd = [*prefix, str(root / "bin" / "tvmopt-run"), str(root / "model"), *args,
           "--output-dir", str(out / "outputs"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _check_matches_onnxruntime(root, model_path, feeds, tmp, prefix=()):
    res = _run(root, feeds, tmp / "run", prefix, ["--warmup", "1", "--repeat", "3", "--json"])
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["runs"] == 3
    lat = report["latency_ms"]
    assert set(lat) == {"p50", "p95", "p99", "min", "max"}
    assert 0 < lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert report["load_ms"] > 0 and report["peak_rss_kb"] > 0
    ref = run_onnxruntime(str(model_path), feeds)
    manifest = json.loads((root / "model" / "manifest.json").read_text())
    for o in manifest["outputs"]:
        got = np.load(report["outputs"][o["name"]])
        np.testing.assert_allclose(got, ref[o["name"]], atol=ATOL, rtol=RTOL)
    return report


def _python_in(root: Path) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and (p.suffix in (".py", ".pyc") or b"libpython" in p.read_bytes()):
            found.append(p.relative_to(root).as_posix())
    return found


def _tamper(root: Path, rel: str, tmp: Path) -> Path:
    copy = tmp / "tampered" / root.name
    shutil.copytree(root, copy)
    data = bytearray((copy / rel).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / rel).write_bytes(bytes(data))
    return copy


# ------------------------------------------------------------------- x86_64, run natively
needs_x86_host = pytest.mark.skipif(
    host_arch() != "x86_64" or shutil.which("g++") is None,
    reason=f"the native bundle test needs an x86_64 host with g++ (this host: {host_arch()}, "
           f"g++ {'found' if shutil.which('g++') else 'missing'})")


@pytest.fixture(scope="module")
def x86_cli_build(tmp_path_factory):
    """`tvmopt compile --bundle` through the CLI: (click result, tarball, model path)."""
    from click.testing import CliRunner

    from tvmopt.cli.main import main

    tmp = tmp_path_factory.mktemp("edge-x86")
    model = Path(tiny_mlp(tmp / "mlp.onnx"))
    tar = tmp / "mlp-edge.tar.gz"
    res = CliRunner().invoke(main, ["compile", str(model), "--target", "x86", "--bundle",
                                    "--verify", "-o", str(tar)], catch_exceptions=False)
    return res, tar, model


@pytest.fixture(scope="module")
def x86_bundle(x86_cli_build):
    res, tar, model = x86_cli_build
    assert res.exit_code == 0, res.output
    with tarfile.open(tar) as t:
        t.extractall(tar.parent / "unpacked", filter="data")
    return tar.parent / "unpacked" / "mlp-edge", model


@needs_x86_host
def test_compile_prints_the_bundle_size_and_how_to_run_it(x86_cli_build, x86_bundle):
    res, tar, _ = x86_cli_build
    assert f"({tar.stat().st_size} bytes)" in res.output
    assert "bin/tvmopt-run model/ --input x=x.npy --output-dir out --json" in res.output


@needs_x86_host
def test_verify_runs_the_bundles_own_runner(x86_cli_build, x86_bundle):
    res, _, _ = x86_cli_build
    assert "verify y: max abs err" in res.output
    m = json.loads((x86_bundle[0] / "model" / "manifest.json").read_text())
    v = m["verification"]
    assert v["reference"] == "onnxruntime" and v["runner"] == "bin/tvmopt-run (native)"
    assert v["outputs"][0]["name"] == "y" and v["outputs"][0]["mismatched"] == 0


@needs_x86_host
def test_a_failed_bundle_verification_writes_no_bundle(x86_bundle, tmp_path, monkeypatch):
    from tvmopt.edge import verify as edge_verify

    root, model = x86_bundle
    real = edge_verify.run_onnxruntime
    monkeypatch.setattr(edge_verify, "run_onnxruntime",
                        lambda m, feeds: {k: v + 1 for k, v in real(m, feeds).items()})
    with pytest.raises(VerificationError, match="'y'"):
        edge_bundle.write_bundle(root / "model", tmp_path / "x.tar.gz", log=lambda m: None,
                                 verify_model=str(model))
    assert list(tmp_path.iterdir()) == []


@needs_x86_host
def test_x86_bundle_runs_natively_and_matches_onnxruntime(x86_bundle, tmp_path):
    root, model = x86_bundle
    # the batch dim is symbolic: any batch the runner is given runs
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)}
    _check_matches_onnxruntime(root, model, feeds, tmp_path)


@needs_x86_host
def test_bundle_layout_and_manifest(x86_bundle):
    root, _ = x86_bundle
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert names == ["README.txt", "bin/tvmopt-run", "lib/libtvm_ffi.so", "lib/libtvm_runtime.so",
                     "model/manifest.json", "model/model.so"]
    m = json.loads((root / "model" / "manifest.json").read_text())
    hashed = {f"model/{k}" for k in m["files"]} | set(m["bundle"]["files"])
    assert hashed == set(names) - {"model/manifest.json"}
    assert m["tvm_version"] and m["tvm_ffi_version"] == edge_runtime.installed_versions()["apache-tvm-ffi"]
    assert m["target"]["name"] == "x86-avx2" and m["bundle"]["arch"] == "x86_64"
    assert [i["name"] for i in m["inputs"]] == ["x"] and [o["name"] for o in m["outputs"]] == ["y"]
    assert "tvmopt-run model/ --input x=x.npy" in (root / "README.txt").read_text()
    # found through $ORIGIN/../lib, not the build machine's paths
    dyn = subprocess.run(["readelf", "-d", str(root / "bin" / "tvmopt-run")], capture_output=True,
                         text=True).stdout
    assert "$ORIGIN/../lib" in dyn and "site-packages" not in dyn


@needs_x86_host
def test_bundle_holds_no_python(x86_bundle):
    root, _ = x86_bundle
    assert _python_in(root) == []


def test_the_python_check_can_fail(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.so").write_bytes(b"\x7fELF....libpython3.11.so.1.0\x00")
    assert _python_in(tmp_path) == ["lib/x.so"]
    with pytest.raises(BuildError, match="Python"):
        (tmp_path / "a.py").write_text("")
        edge_bundle._refuse_python(tmp_path)


@needs_x86_host
@pytest.mark.parametrize("rel, message", [
    ("model/model.so", "model file 'model.so'"),
    ("lib/libtvm_runtime.so", "bundle file 'lib/libtvm_runtime.so'"),
    ("README.txt", "bundle file 'README.txt'"),
])
def test_a_tampered_file_is_refused(x86_bundle, tmp_path, rel, message):
    root, _ = x86_bundle
    bad = _tamper(root, rel, tmp_path)
    res = _run(bad, {"x": np.zeros((1, 32), np.float32)}, tmp_path / "run")
    assert res.returncode == 1
    assert res.stderr.startswith(f"tvmopt-run: error: {message} does not match its sha256")
    assert res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "run" / "outputs").exists()


@needs_x86_host
@pytest.mark.parametrize("feeds, message", [
    ({}, "missing input 'x'"),
    ({"x": np.zeros((1, 32), np.float32), "z": np.zeros(1, np.float32)}, "unexpected input 'z'"),
    ({"x": np.zeros((1, 31), np.float32)}, "input 'x': dimension 1 is 31, expected 32"),
    ({"x": np.zeros((32,), np.float32)}, "input 'x': shape 32 has rank 1, expected rank 2"),
    ({"x": np.zeros((1, 32), np.float64)}, "input 'x': dtype float64, expected float32"),
])
def test_a_mismatched_input_is_one_line(x86_bundle, tmp_path, feeds, message):
    root, _ = x86_bundle
    res = _run(root, feeds, tmp_path / "run")
    assert res.returncode == 1
    assert res.stderr.startswith(f"tvmopt-run: error: {message}"), res.stderr
    assert res.stderr.count("\n") == 1


def _write_bad_npy(path: Path, kind: str) -> None:
    if kind == "text":
        path.write_text("not numpy")
    elif kind == "fortran":
        np.save(path, np.asfortranarray(np.zeros((2, 32), np.float32)))
    elif kind == "big-endian":
        np.save(path, np.zeros((1, 32), ">f4"))
    elif kind == "truncated":
        np.save(path, np.zeros((1, 32), np.float32))
        path.write_bytes(path.read_bytes()[:-4])
    elif kind == "no shape end":
        np.save(path, np.zeros((1, 32), np.float32))
        path.write_bytes(path.read_bytes().replace(b"(1, 32)", b"(1, 32 "))


@needs_x86_host
@pytest.mark.parametrize("kind, message", [
    ("text", "not a .npy file"), ("fortran", "Fortran-ordered array"),
    ("big-endian", "dtype '>f4' is not supported"), ("truncated", "holds 124 data bytes"),
    ("no shape end", "malformed"),
])
def test_a_bad_npy_file_is_one_line(x86_bundle, tmp_path, kind, message):
    root, _ = x86_bundle
    _write_bad_npy(tmp_path / "x.npy", kind)
    res = subprocess.run([str(root / "bin" / "tvmopt-run"), str(root / "model"), "--input",
                          f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1


def test_missing_cross_compiler_names_the_package(cli, tmp_path, monkeypatch, save):
    monkeypatch.setenv("PATH", str(tmp_path))  # no compilers at all
    model = save(cnn(), "cnn")
    res = cli("compile", model, "--target", "arm-cortex-a76", "--bundle", "-o", tmp_path / "b.tar.gz")
    assert res.exit_code == 1
    assert "needs aarch64-linux-gnu-g++, from the package g++-aarch64-linux-gnu" in res.output
    assert "apt-get install -y g++-aarch64-linux-gnu" in res.output
    assert not (tmp_path / "b.tar.gz").exists()


def test_bundle_output_must_be_a_tarball(cli, tmp_path, save):
    res = cli("compile", save(cnn(), "cnn"), "--bundle", "-o", tmp_path / "b.zip")
    assert res.exit_code == 1 and "a bundle is a .tar.gz (or .tgz) file" in res.output


def test_cuda_targets_have_no_bundle(cli, tmp_path, save):
    res = cli("compile", save(cnn(), "cnn"), "-t", "a100", "--bundle", "-o", tmp_path / "b.tar.gz")
    assert res.exit_code == 1 and "--bundle builds CPU bundles" in res.output


def test_a_runtime_wheel_with_the_wrong_sha256_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path))
    _, specs = edge_runtime.wheel_specs("aarch64")
    wheels = tmp_path / "edge" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / specs[0]["file"]).write_bytes(b"not the wheel PyPI published")
    with pytest.raises(BuildError, match="differs from PyPI's"):
        edge_runtime._download(specs[0], "manylinux_2_28_aarch64", wheels, log=lambda m: None)
    assert not (wheels / specs[0]["file"]).exists()


def test_runtime_wheels_match_the_versions_tvmopt_compiles_with():
    have = edge_runtime.installed_versions()
    for arch in ("aarch64", "x86_64"):
        _, specs = edge_runtime.wheel_specs(arch)
        assert {s["project"]: s["version"] for s in specs} == have
        assert all(arch in s["file"] and len(s["sha256"]) == 64 for s in specs)


def test_system_requirements_read_version_needs(tmp_path):
    f = tmp_path / "x.so"
    f.write_bytes(b"\x7fELF\x00GLIBC_2.17\x00GLIBC_2.34\x00GLIBCXX_3.4.21\x00GLIBCXX_3.4.29\x00")
    assert edge_bundle.system_requirements([f]) == {"glibc": "2.34", "libstdc++": "GLIBCXX_3.4.29",
                                                    "gcc": "11"}


# ------------------------------------------------------------------- aarch64, under qemu-user
def _aarch64_bundle(tmp: Path, model: onnx.ModelProto, target: str, name: str):
    why = missing_for_emulation("aarch64")
    if why:
        pytest.skip(f"aarch64 bundles run under qemu-user here: {why}")
    path = tmp / f"{name}.onnx"
    onnx.save(model, str(path))
    try:
        root = _build(tmp, path, target, name, verify=True)
    except BuildError as err:
        if "cannot download" in str(err):
            pytest.skip(f"the aarch64 TVM runtime wheels are not cached and cannot be fetched: {err}")
        raise
    return root, path


@pytest.mark.slow  # cross-compiles and emulates: about a minute each on 2 busy cores
@pytest.mark.parametrize("family, target", [("cnn", "arm-cortex-a76"),
                                            ("encoder_block", "arm-cortex-a72")])
def test_aarch64_bundle_under_qemu_matches_onnxruntime(tmp_path, family, target):
    model = {"cnn": cnn, "encoder_block": encoder_block}[family]()
    root, path = _aarch64_bundle(tmp_path, model, target, f"{family}-edge")
    for rel in ("bin/tvmopt-run", "lib/libtvm_runtime.so", "lib/libtvm_ffi.so", "model/model.so"):
        assert edge_bundle.elf_machine(root / rel) == "aarch64", rel
    assert _python_in(root) == []
    manifest = json.loads((root / "model" / "manifest.json").read_text())
    assert manifest["verification"]["runner"] == "bin/tvmopt-run under qemu-aarch64"
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    prefix = run_prefix("aarch64")
    _check_matches_onnxruntime(root, path, feeds, tmp_path, prefix)
    # a tampered library is refused before it is loaded
    bad = _tamper(root, "model/model.so", tmp_path)
    res = _run(bad, feeds, tmp_path / "bad", prefix)
    assert res.returncode == 1 and "'model.so' does not match its sha256" in res.stderr
    assert res.stderr.count("\n") == 1
