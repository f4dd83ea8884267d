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


def check_key(key: str) -> str:
    """A device key usable in the tracker protocol and the handshake (words split on blanks,
    match keys built as KEY:random).

    Raises:
        TuningError: the key is empty or has blanks, quotes, backslashes or ':'.
    """
    if not key or any(c.isspace() or c in "\"\\:" for c in key):
        raise TuningError(f"RPC key '{key}': use letters, digits, '-', '_' or '.' "
                          "(no blanks, quotes, backslashes or ':')")
    return key


def start_server(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9090):
    """Start an RPC server in a child process registered with `tracker` ('HOST:PORT') as `key`."""
    from tvm.rpc.server import Server

    thost, tport = parse_host_port(tracker)
    return Server(host, port=port, port_end=port + 50, tracker_addr=(thost, tport), key=key,
                  silent=True)


def tracker_summary(tracker: str, timeout_s: float = 5.0) -> dict:
    """The tracker's summary ({"queue_info": {key: {"free": n, "pending": n}}, "server_info":
    [...]}), asked once with the tracker protocol of tvm.rpc.base, without retrying.

    Raises:
        TuningError: nothing answers at `tracker`, or what answers is not a TVM RPC tracker.
    """
    import json
    import struct

    from tvm.rpc import base

    host, port = parse_host_port(tracker)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(sock, 4))[0]
            if magic != base.RPC_TRACKER_MAGIC:
                raise TuningError(f"{tracker} answers but is not a TVM RPC tracker")
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            reply = base.recvjson(sock)
    except (OSError, struct.error, json.JSONDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise TuningError(f"no RPC tracker at {tracker} ({reason}); start one with 'tvmopt rpc "
                          "tracker' and servers with 'tvmopt rpc server'") from None
    if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == base.TrackerCode.SUCCESS):
        raise TuningError(f"{tracker}: unexpected tracker reply {str(reply)[:80]}")
    return reply[1]


def check_servers(tracker: str, key: str) -> int:
    """How many servers of `key` are connected to the tracker (free or busy); at least one.

    Raises:
        TuningError: the tracker is unreachable, or has no server of `key` (naming the keys it
            has).
    """
    summary = tracker_summary(tracker)
    queue = summary.get("queue_info", {})
    servers = sum(1 for s in summary.get("server_info", [])
                  if str(s.get("key", "")).split(":")[:2] == ["server", key])
    info = queue.get(key, {})
    count = max(servers, info.get("free", 0))
    if count == 0:
        known = sorted(set(queue) | {str(s.get("key", "")).split(":")[1]
                                     for s in summary.get("server_info", [])
                                     if str(s.get("key", "")).startswith("server:")})
        raise TuningError(f"no RPC server with key '{key}' is registered at {tracker} "
                          f"(keys there: {', '.join(known) or 'none'}); start one with 'tvmopt "
                          f"rpc server --tracker {tracker} --key {key}'")
    return count


def wait_for_servers(tracker: str, key: str, count: int, timeout_s: float = 30.0) -> int:
    """Block until `count` servers of `key` are free on the tracker.

    Raises:
        TuningError: not enough servers registered in time.
    """
    deadline = time.monotonic() + timeout_s
    free = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(TuningError):
            summary = tracker_summary(tracker, timeout_s=2.0)
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
