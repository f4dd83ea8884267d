"""`tvmopt rpc tracker|server`: TVM RPC trackers and servers for distributed measurement."""

from __future__ import annotations

import click


@click.group()
def rpc():
    """Start TVM RPC trackers and servers for distributed measurement."""


@rpc.command("tracker")
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", type=int, default=9190, show_default=True)
def rpc_tracker(host, port):
    """Run a TVM RPC tracker (servers register with it; tune --rpc-tracker asks it)."""
    from ..tuning.rpc import run_tracker

    run_tracker(host, port)


@rpc.command("server")
@click.option("--tracker", "tracker", required=True, metavar="HOST:PORT")
@click.option("--key", required=True, help="Device key to register under.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The server runs any code sent to it: it listens on "
                   "loopback unless told otherwise (--host 0.0.0.0 for a trusted network).")
@click.option("--port", type=int, default=9090, show_default=True,
              help="First port to try; the server takes the next free one.")
@click.option("--arch", default=None, metavar="ARCH",
              help="Run tvmopt-rpc-server, the C++ server without Python, built for ARCH "
                   "(e.g. aarch64): natively, or under qemu-user for a foreign ARCH.")
@click.option("--board", is_flag=True,
              help="With --arch: build the server for a board and print what to copy there and "
                   "the command to run on it, instead of running it here.")
def rpc_server(tracker, key, host, port, arch, board):
    """Run a TVM RPC server on this device, registered with TRACKER under KEY.

    Whoever can reach its port can run code on this machine.
    """
    from ..errors import TvmoptError
    from ..tuning.measure import parse_host_port
    from ..tuning.rpc import check_key, is_loopback, run_server

    parse_host_port(tracker)
    check_key(key)
    if board and not arch:
        raise click.UsageError("--board needs --arch (the board's architecture, e.g. aarch64)")
    if not is_loopback(host) and not board:
        click.echo(f"tvmopt: warning: the RPC server runs any code sent to it; listening on "
                   f"{host}, anyone who can reach port {port} can run code here", err=True)
    if arch is None:
        run_server(tracker, key, host, port)
        return
    from ..edge import rpc_server as native

    def log(msg):
        click.echo(msg, err=True)

    if board:
        click.echo(native.board_recipe(native.server_folder(arch, log), arch, tracker, key))
        return
    rc = native.run_local_server(arch, tracker, key, host, port, log)
    if rc:
        raise TvmoptError(f"{native.NAME} exited with status {rc}")
