"""`tvmopt-rpc-server` (rpc_server.cc): a TVM RPC server without Python, for measuring tuning
candidates on a board, or here under qemu-user.

It is built per architecture against the same runtime libraries a bundle carries and laid out as
a folder to copy to the board: bin/tvmopt-rpc-server and lib/ (libtvm_runtime.so, libtvm_ffi.so,
found through the rpath). Cached by everything that shapes the binary, like the runner.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import BuildError
from ..files import cache_root
from ..targets.cross import Toolchain
from .runner import build_key
from .runtime import LIBS, Runtime, runtime_for
from .toolchain import SETUP_COMMAND, missing_for_emulation, run_prefix, toolchain_for

SOURCE = Path(__file__).with_name("rpc_server.cc")
NAME = "tvmopt-rpc-server"


def compile_command(tc: Toolchain, rt: Runtime, out: Path) -> list[str]:
    """The command line that builds the server at `out` (in a bin/ beside lib/)."""
    includes = [f"-I{d}" for d in rt.include_dirs]
    lib_dirs = sorted({str(p.parent) for p in rt.lib_paths.values()})
    # libtvm_runtime.so is linked although no symbol of it is used: loading it registers the
    # RPC endpoint ("rpc.ServerLoop") and the file functions the session calls.
    return [tc.cxx, "-std=c++17", "-O2", "-s", str(SOURCE), *includes,
            *[f"-L{d}" for d in lib_dirs], "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi",
            "-Wl,--as-needed", "-lpthread", "-Wl,-rpath,$ORIGIN/../lib",
            "-Wl,--enable-new-dtags", "-o", str(out)]


def build_rpc_server(tc: Toolchain, rt: Runtime, log=print) -> Path:
    """The folder (bin/tvmopt-rpc-server, lib/) for `tc.arch`, built once and cached.

    Raises:
        BuildError: the compiler is missing or failed (its first error line is quoted).
    """
    if shutil.which(tc.cxx) is None:
        raise BuildError(f"building {NAME} for {tc.arch} needs {tc.cxx}, from the package "
                         f"{tc.package}: apt-get install -y {tc.package}")
    folder = cache_root() / "edge" / f"rpc-server-{tc.arch}-{build_key(SOURCE, tc, rt)}"
    if (folder / "bin" / NAME).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"building {NAME} for {tc.arch} with {tc.cxx} (once; cached in {folder})")
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / "bin").mkdir()
        (tmp / "lib").mkdir()
        proc = subprocess.run(compile_command(tc, rt, tmp / "bin" / NAME), capture_output=True,
                              text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or \
                proc.stderr.strip().splitlines() or ["no output"]
            raise BuildError(f"building {NAME} with {tc.cxx} failed: {lines[0]}")
        for name in LIBS:
            shutil.copy2(rt.lib_paths[name], tmp / "lib" / name)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would follow the folder to the board
        try:
            os.replace(tmp, folder)
        except OSError:  # built meanwhile by another process
            if not (folder / "bin" / NAME).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def server_folder(arch: str, log=print) -> Path:
    """The cached server folder for `arch`, downloading its runtime and building it if needed.

    Raises:
        BuildError: no toolchain or runtime for `arch`, or the build failed.
    """
    tc = toolchain_for(arch)
    if shutil.which(tc.cxx) is None:
        raise BuildError(f"building {NAME} for {arch} needs {tc.cxx}, from the package "
                         f"{tc.package} (edge set-up: {SETUP_COMMAND})")
    return build_rpc_server(tc, runtime_for(arch, log), log)


def server_args(tracker: str, key: str, host: str, port: int) -> list[str]:
    """The server's own arguments."""
    return ["--tracker", tracker, "--key", key, "--host", host, "--port", str(port),
            "--port-end", str(port + 100)]


def local_command(arch: str, tracker: str, key: str, host: str = "127.0.0.1",
                  port: int = 9090, log=print) -> list[str]:
    """The command that runs the `arch` server on this machine: natively, or under qemu-user.

    Raises:
        BuildError: this machine cannot build or run `arch` binaries (names the packages).
    """
    why = missing_for_emulation(arch)
    if why is not None:
        raise BuildError(f"running {NAME} for {arch} here {why}")
    folder = server_folder(arch, log)
    return [*run_prefix(arch), str(folder / "bin" / NAME), *server_args(tracker, key, host, port)]


def start_local_server(arch: str, tracker: str, key: str, host: str = "127.0.0.1",
                       port: int = 9090, log=print, output=None) -> subprocess.Popen:
    """Start the `arch` server here (under qemu-user when foreign) registered with `tracker`.

    It runs until terminated (see stop), writing its log (a line per session) to `output`, a
    binary file object (None: this process's stdout and stderr). A server that exits at once
    is reported with its error line.

    Raises:
        BuildError: it cannot be built or run here, or it exited at start.
    """
    cmd = local_command(arch, tracker, key, host, port, log)
    proc = subprocess.Popen(cmd, stdout=output, stderr=output, start_new_session=True)
    time.sleep(0.5)
    if proc.poll() is not None:
        err = []
        if output is not None and getattr(output, "name", None):
            err = Path(output.name).read_text(errors="replace").strip().splitlines()
        raise BuildError(f"{NAME} exited at start: {err[-1] if err else proc.returncode}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server started by start_local_server, with the session children it forked."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def board_recipe(folder: Path, arch: str, tracker: str, key: str) -> str:
    """How to run the server on an `arch` board: what to copy and the command there."""
    from .bundle import system_requirements

    name = f"tvmopt-rpc-server-{arch}"
    files = [p for p in (folder / "bin").glob("*")] + [p for p in (folder / "lib").glob("*")]
    need = system_requirements(files) if files else {}
    needs = ", ".join(f"{k} >= {v}" for k, v in need.items() if k != "gcc")
    return "\n".join([
        f"On the {arch} board (Linux{', ' + needs if needs else ''}; no Python needed):",
        f"  scp -r {folder} BOARD:{name}",
        f"  ssh BOARD ./{name}/bin/{NAME} --tracker {tracker} --key {key} --host 0.0.0.0",
        "The tracker address must be reachable from the board (not 127.0.0.1). The server runs "
        "any code sent to it: trusted networks only.",
    ])


def run_local_server(arch: str, tracker: str, key: str, host: str, port: int, log=print) -> int:
    """Run the `arch` server here in the foreground until it exits or Ctrl-C; its exit status."""
    cmd = local_command(arch, tracker, key, host, port, log)
    emulated = bool(run_prefix(arch))
    log(f"{NAME} for {arch}" + (" under qemu-user (timings rank schedules; they are not the "
                                "board's latencies)" if emulated else ""))
    # Its own process group, so that stopping it also ends the sessions it forked; a Ctrl-C
    # or SIGTERM to this process stops the group.
    proc = subprocess.Popen(cmd, start_new_session=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(proc)
        signal.signal(signal.SIGTERM, old)
