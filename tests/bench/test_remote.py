"""`tvmopt bench --rpc-tracker`: an artifact benched on an RPC server over loopback reports the
closed-loop statistics of a local bench."""

from __future__ import annotations

import json

import pytest

from tests.models import tiny_mlp
from tests.harness import loopback_rpc_farm
from tvmopt.bench.suite import BenchOptions
from tvmopt.errors import TvmoptError
from tvmopt.tuning import rpc


@pytest.fixture(scope="module")
def farm():
    """A tracker and one server on 127.0.0.1, random free ports; terminated afterwards."""
    with loopback_rpc_farm("tvmopt-bench", 1, timeout_s=60) as addr:
        yield addr


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from tvmopt.interface.compile import CompileOptions, compile_model

    tmp = tmp_path_factory.mktemp("remote")
    model = tiny_mlp(tmp / "mlp.onnx")
    # Default schedules only: a TVM RPC server is a bare runtime without tvmopt's oneDNN
    # extension, and this MLP's symbolic-batch dense layer would otherwise be a library call.
    res = compile_model(CompileOptions(model=model, target="x86", output=str(tmp / "mlp.tvmopt"),
                                       dispatch="codegen"), log=lambda m: None)
    return res.artifact.path


@pytest.mark.slow  # starts a tracker and a server process (TVM imported in each)
def test_bench_over_rpc_reports_local_statistics(farm, artifact, cli, tmp_path):
    out = tmp_path / "b.json"
    res = cli("bench", artifact, "--rpc-tracker", farm, "--rpc-key", "tvmopt-bench",
              "--batch", "1,2", "--runs", "6", "--warmup", "2", "--json", out, "-q")
    assert res.exit_code == 0, res.output
    assert "closed-loop latency" in res.output and "remote: RPC tracker" in res.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tvmopt.bench/1"
    rows = {(r["runner"], r["batch"]): r for r in doc["closed_loop"]}
    assert set(rows) == {("tvmopt@tvmopt-bench", 1), ("tvmopt@tvmopt-bench", 2)}
    for r in rows.values():
        s = r["steady"]
        assert s["n"] == 6 and len(r["samples_ms"]) == 6 and r["warmup"]["n"] == 2
        assert 0 < s["min_ms"] <= s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["throughput"] == pytest.approx(r["batch"] * 1e3 / s["mean_ms"])
    assert doc["remote"]["key"] == "tvmopt-bench"
    assert doc["remote"]["loads"][0]["upload_bytes"] > 0


@pytest.mark.parametrize("kw, message", [
    ({"rpc_tracker": "127.0.0.1:9190"}, "--rpc-tracker needs --rpc-key"),
    ({"rpc_key": "k"}, "--rpc-key needs --rpc-tracker"),
    ({"rpc_tracker": "nohostport", "rpc_key": "k"}, "expected HOST:PORT"),
    ({"rpc_tracker": "127.0.0.1:9190", "rpc_key": "k", "baselines": ["ort"]},
     "--baselines: measured on this machine, not over RPC"),
])
def test_rpc_options_are_checked(kw, message):
    with pytest.raises(TvmoptError, match=message):
        BenchOptions(path="x.tvmopt", **kw)


def test_an_unreachable_tracker_is_one_line(artifact, cli):
    port = rpc.free_port()
    res = cli("bench", artifact, "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "k", "-q")
    assert res.exit_code == 1
    assert f"cannot reach the RPC tracker at 127.0.0.1:{port}" in res.output
    assert res.output.strip().count("\n") == 0
