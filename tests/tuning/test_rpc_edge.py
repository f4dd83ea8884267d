"""RPC measurement on an edge device: tvmopt-rpc-server (C++, no Python) for aarch64, emulated
here under qemu-user; the tuned database then compiled into an aarch64 bundle and checked."""

from __future__ import annotations

import json
import socket
import tarfile

import pytest

from tests.models import tiny_mlp
from tvmopt import errors
from tvmopt.tuning import rpc, tune

KEY = "tvmopt-a76"


def _need_emulation():
    from tvmopt.edge import rpc_server
    from tvmopt.edge.toolchain import missing_for_emulation

    why = missing_for_emulation("aarch64")
    if why:
        pytest.skip(f"the aarch64 RPC server runs under qemu-user here: {why}")
    try:
        rpc_server.server_folder("aarch64", log=lambda m: None)
    except errors.BuildError as err:
        if "cannot download" in str(err):
            pytest.skip(f"the aarch64 TVM runtime wheels are not cached and cannot be fetched: "
                        f"{err}")
        raise


@pytest.mark.slow  # cross-builds, emulates two servers and tunes: a few minutes on 2 busy cores
def test_tune_an_aarch64_target_on_emulated_rpc_servers_then_bundle(tmp_path):
    from tests.harness import emulated_rpc_farm
    from tvmopt.edge import bundle as edge_bundle
    from tvmopt.interface.compile import CompileOptions
    from tvmopt.tuning import database

    _need_emulation()
    model = tiny_mlp(tmp_path / "mlp.onnx", batch=1)
    db = tmp_path / "db"
    with emulated_rpc_farm(KEY, 2, "aarch64", tmp_path) as (tracker, logs):
        result = tune.tune(tune.TuneOptions(
            model=model, target="arm-cortex-a76", trials=8, db=str(db), dispatch="codegen",
            precision="fp32",
            rpc_tracker=tracker, rpc_key=KEY, trials_per_round=4, population=32))
    assert result.trials_run == 8
    assert result.build_failures == 0 and result.run_failures == 0
    assert result.tasks and all(t.best_s is not None for t in result.tasks)
    # Every measurement was a session on the emulated servers (the only ones of the key).
    sessions = [ln for log in logs for ln in log.read_text().splitlines() if " session " in ln]
    assert len(sessions) >= 8 and all(ln.endswith("status 0") for ln in sessions), sessions
    manifest = database.read_manifest(db)
    assert manifest["rpc"] == {"tracker": tracker, "key": KEY}
    assert "aarch64" in json.dumps(manifest["target"])

    opts = CompileOptions(model=model, target="arm-cortex-a76", precision="fp32", db=str(db),
                          require_db=True, verify=True)
    compiled, packed = edge_bundle.compile_bundle(opts, tmp_path / "mlp-edge.tar.gz",
                                                  log=lambda m: None)
    assert compiled.replay is not None and compiled.replay.hits and not compiled.replay.misses
    # verified by the bundle's own runner under qemu-aarch64 against onnxruntime (fp32)
    assert packed.verification
    assert all(e.mismatched == 0 and e.max_abs < 1e-4 for e in packed.verification)
    with tarfile.open(packed.path) as tar:
        record = json.load(tar.extractfile(f"{packed.top}/model/manifest.json"))["verification"]
    assert record["runner"] == "bin/tvmopt-run under qemu-aarch64"


def test_a_foreign_arch_target_needs_rpc(tmp_path):
    model = tiny_mlp(tmp_path / "m.onnx", batch=1)
    with pytest.raises(errors.TuningError, match="can only be timed on an aarch64 device.*"
                                                 "rpc server --arch aarch64"):
        tune.tune(tune.TuneOptions(model=model, target="arm-cortex-a76", trials=4,
                                   db=str(tmp_path / "db")))


def test_an_unreachable_tracker_is_one_line(tmp_path):
    import shutil

    # The cross compiler is checked first (a local prerequisite, named with its package when
    # missing: test_missing_cross_compiler_or_emulator_names_the_package).
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("tuning an aarch64 target needs aarch64-linux-gnu-g++ (package "
                    "g++-aarch64-linux-gnu), which .ci/run installs")
    port = rpc.free_port()
    with pytest.raises(errors.TuningError, match=f"no RPC tracker at 127.0.0.1:{port} "):
        tune.tune(tune.TuneOptions(model=tiny_mlp(tmp_path / "m.onnx", batch=1),
                                   target="arm-cortex-a76", trials=4, db=str(tmp_path / "db"),
                                   rpc_tracker=f"127.0.0.1:{port}", rpc_key=KEY))
    assert not (tmp_path / "db").exists()


def test_something_else_at_the_tracker_port_is_named(tmp_path):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        import threading

        def answer():
            conn, _ = srv.accept()
            conn.recv(4)
            conn.sendall(b"HTTP")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(errors.TuningError, match="answers but is not a TVM RPC tracker"):
            rpc.tracker_summary(f"127.0.0.1:{port}")


def test_a_tracker_without_the_key_names_the_keys_it_has():
    from tests.harness import loopback_rpc_farm

    with loopback_rpc_farm("other-key", 1, timeout_s=30) as tracker:
        assert rpc.check_servers(tracker, "other-key") == 1
        with pytest.raises(errors.TuningError,
                           match="no RPC server with key 'tvmopt-a76'.*keys there: other-key"):
            rpc.check_servers(tracker, KEY)


@pytest.mark.parametrize("key", ["", "a b", "a:b", 'a"b'])
def test_a_bad_rpc_key_is_refused(key):
    with pytest.raises(errors.TuningError, match="RPC key"):
        rpc.check_key(key)


def test_missing_cross_compiler_or_emulator_names_the_package(monkeypatch, tmp_path):
    import shutil as _shutil

    from tvmopt.edge import rpc_server, toolchain

    real = _shutil.which
    monkeypatch.setattr(toolchain.shutil, "which",
                        lambda n: None if n == "qemu-aarch64" else real(n))
    with pytest.raises(errors.BuildError, match=r"qemu-aarch64 \(package qemu-user\)"):
        rpc_server.local_command("aarch64", "127.0.0.1:9190", KEY)
    monkeypatch.setattr(rpc_server.shutil, "which",
                        lambda n: None if n == "aarch64-linux-gnu-g++" else real(n))
    with pytest.raises(errors.BuildError, match="needs aarch64-linux-gnu-g\\+\\+, from the "
                                                "package g\\+\\+-aarch64-linux-gnu"):
        rpc_server.server_folder("aarch64")


def test_board_recipe_names_what_to_copy_and_the_command(tmp_path):
    from tvmopt.edge import rpc_server

    text = rpc_server.board_recipe(tmp_path / "srv", "aarch64", "10.0.0.2:9190", KEY)
    assert f"scp -r {tmp_path / 'srv'} BOARD:" in text
    assert f"bin/tvmopt-rpc-server --tracker 10.0.0.2:9190 --key {KEY} --host 0.0.0.0" in text


def test_rpc_server_cli_board_prints_the_recipe(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from tvmopt.cli.main import main
    from tvmopt.edge import rpc_server

    monkeypatch.setattr(rpc_server, "server_folder", lambda arch, log=print: tmp_path / arch)
    res = CliRunner().invoke(main, ["rpc", "server", "--tracker", "10.0.0.2:9190", "--key",
                                    "pi5", "--arch", "aarch64", "--board"])
    assert res.exit_code == 0, res.output
    assert f"scp -r {tmp_path / 'aarch64'} BOARD:tvmopt-rpc-server-aarch64" in res.output
    res = CliRunner().invoke(main, ["rpc", "server", "--tracker", "10.0.0.2:9190", "--key",
                                    "pi5", "--board"])
    assert res.exit_code != 0 and "--board needs --arch" in res.output
    res = CliRunner().invoke(main, ["rpc", "server", "--tracker", "nohost", "--key", "pi5",
                                    "--arch", "aarch64"])
    assert res.exit_code == 1 and "expected HOST:PORT" in res.output
