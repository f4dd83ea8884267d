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
def rpc_server(tracker, key, host, port):
    """Run a TVM RPC server on this device, registered with TRACKER under KEY.

    Whoever can reach its port can run code on this machine.
    """
    from ..tuning.rpc import is_loopback, run_server

    if not is_loopback(host):
        click.echo(f"tvmopt: warning: the RPC server runs any code sent to it; listening on "
                   f"{host}, anyone who can reach port {port} can run code here", err=True)

    run_server(tracker, key, host, port)
