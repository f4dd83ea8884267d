"""TVM RPC tracker and servers for measuring tuning candidates on remote devices.

Thin wrappers over tvm.rpc (the same as `python -m tvm.exec.rpc_tracker` / `rpc_server`).
TVM's RPC server runs any code sent to it: use it on trusted networks only.
"""

from __future__ import annotations

import contextlib
import socket
import time

from ..errors import TuningError
from .measure import parse_host_port


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for tests and local farms)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_tracker(host: str = "0.0.0.0", port: int = 9190):
    """Start a tracker in a child process; returns tvm.rpc.tracker.Tracker (.port, .terminate())."""
    from tvm.rpc.tracker import Tracker

    return Tracker(host, port=port, port_end=port + 10, silent=True)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_server(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9090):
    """Start an RPC server in a child process registered with `tracker` ('HOST:PORT') as `key`."""
    from tvm.rpc.server import Server

    thost, tport = parse_host_port(tracker)
    return Server(host, port=port, port_end=port + 50, tracker_addr=(thost, tport), key=key,
                  silent=True)


def wait_for_servers(tracker: str, key: str, count: int, timeout_s: float = 30.0) -> int:
    """Block until `count` servers of `key` are free on the tracker.

    Raises:
        TuningError: not enough servers registered in time.
    """
    from tvm import rpc

    host, port = parse_host_port(tracker)
    deadline = time.monotonic() + timeout_s
    free = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            summary = rpc.connect_tracker(host, port).summary()
            free = sum(q.get("free", 0) for k, q in summary.get("queue_info", {}).items()
                       if k == key)
            if free >= count:
                return free
        time.sleep(0.2)
    raise TuningError(f"only {free} of {count} RPC servers with key '{key}' registered at "
                      f"{tracker} within {timeout_s:.0f} s")


def run_tracker(host: str, port: int) -> None:
    """Run a tracker until Ctrl-C."""
    _serve(lambda: start_tracker(host, port),
           lambda t: f"RPC tracker on {host}:{t.port}; start servers with: tvmopt rpc server "
                     f"--tracker HOST:{t.port} --key KEY")


def run_server(tracker: str, key: str, host: str, port: int) -> None:
    """Run one RPC server until Ctrl-C."""
    _serve(lambda: start_server(tracker, key, host, port),
           lambda s: f"RPC server on {host}:{s.port}, key '{key}', tracker {tracker}")


def _serve(start, describe) -> None:
    proc = None
    try:
        proc = start()
        print(describe(proc), flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if proc is not None:
            proc.terminate()
