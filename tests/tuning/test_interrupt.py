"""Ctrl-C handling of `tvmopt tune` (tuning.interrupt.CtrlC), without TVM: fast and exact."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tvmopt.tuning.interrupt import STOP_MESSAGE, CtrlC, StopTuning

_CHILD_MASK = ("import signal; "
               "print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))")


@pytest.fixture(autouse=True)
def live_ctrl_c():
    """Ctrl-C as a terminal delivers it. A test run started as a background job of a
    non-interactive shell inherits SIGINT ignored, which CtrlC rightly keeps ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _wait_for(cond, what, timeout=10.0):
    end = time.monotonic() + timeout  # a hang guard, not a speed check
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_first_ctrl_c_sets_a_flag_and_raises_nothing():
    with CtrlC() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
        _wait_for(lambda: ctrl_c.requested, "the watcher to see the SIGINT")
        time.sleep(0.1)  # bytecode runs here: a KeyboardInterrupt would have been raised
    assert ctrl_c.requested and not ctrl_c.stopped


def test_checkpoint_stops_only_after_a_request():
    with CtrlC() as ctrl_c:
        ctrl_c.checkpoint()  # nothing requested: a no-op
        os.kill(os.getpid(), signal.SIGINT)
        _wait_for(lambda: ctrl_c.requested, "the watcher to see the SIGINT")
        with pytest.raises(StopTuning) as err:
            ctrl_c.checkpoint()
    assert ctrl_c.stopped and ctrl_c.is_stop_error(err.value)
    # What comes back through TVM's FFI is another exception type carrying our message.
    assert ctrl_c.is_stop_error(RuntimeError(f"Traceback ...\n{STOP_MESSAGE}"))
    assert not ctrl_c.is_stop_error(RuntimeError("a real TVM error"))


def test_sigint_blocked_for_workers_and_restored_after():
    before_handler = signal.getsignal(signal.SIGINT)
    before_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with CtrlC():
        # A worker started now (as MetaSchedule's PopenPool starts them) inherits the block,
        # so a terminal's Ctrl-C to the process group cannot kill a build or a measurement.
        child = subprocess.run([sys.executable, "-c", _CHILD_MASK], capture_output=True,
                               text=True, check=True)
        assert child.stdout.strip() == "True"
    assert signal.getsignal(signal.SIGINT) is before_handler
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before_mask
    if before_handler is signal.default_int_handler:  # not when started with SIGINT ignored
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)


def test_second_ctrl_c_exits_at_once_with_130_and_kills_workers(tmp_path):
    # The main thread sits in a long call that never returns to Python bytecode (as inside
    # TVM's C++), and a worker process runs; two Ctrl-Cs to the group must end both.
    script = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from tvmopt.tuning.interrupt import CtrlC
        with CtrlC(db_dir="DBDIR") as ctrl_c:
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("worker", worker.pid, flush=True)
            time.sleep(600)
        print("not reached", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = _readline(proc)
        assert line.startswith("worker"), line
        worker = int(line.split()[1])
        os.killpg(proc.pid, signal.SIGINT)
        # The second only after the first was seen: two pending SIGINTs would merge into one.
        first = _readline(proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        out = first + out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out
    assert "Ctrl-C: stopping after the current batch" in " ".join(out.split())
    assert "second Ctrl-C: quitting now" in out and "DBDIR" in out
    assert "not reached" not in out and "Traceback" not in out
    _wait_for(lambda: not _alive(worker), "the worker to be gone")


def _readline(proc, timeout=30.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no output from the child"
    return proc.stdout.readline()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child not yet reaped by its (dead) parent is a zombie until init reaps it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_inert_when_sigint_is_ignored():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup or in a background job
    try:
        with CtrlC() as ctrl_c:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert not ctrl_c.requested
    finally:
        signal.signal(signal.SIGINT, old)


class _FakeTask:
    def __init__(self, pending, terminated=False):
        self.runner_futures = object() if pending else None
        self.is_terminated = terminated


class _FakeScheduler:
    """MetaSchedule's task scheduler as commit_measured sees it: tasks_ and join_running_task."""

    def __init__(self, tasks, on_join=None):
        self.tasks_ = tasks
        self.joined = []
        self.on_join = on_join

    def join_running_task(self, i):
        self.joined.append(i)
        self.tasks_[i].runner_futures = None
        if self.on_join:
            self.on_join(i)


def test_measured_batches_are_committed_before_the_next_build():
    # A kill -9 must not lose batches the scheduler has not come back to yet.
    ctrl_c = CtrlC()
    sched = _FakeScheduler([_FakeTask(True), _FakeTask(False), _FakeTask(True, terminated=True),
                            _FakeTask(True)])
    ctrl_c.scheduler = sched
    ctrl_c.commit_measured(current_task=3)
    assert sched.joined == [0]  # not idle, not terminated, not the task being committed
    ctrl_c.commit_measured()
    assert sched.joined == [0, 3]
    ctrl_c.commit_measured()
    assert sched.joined == [0, 3]  # nothing pending: nothing joined twice


def test_commit_measured_is_not_reentered_from_measure_callbacks():
    ctrl_c = CtrlC()
    sched = _FakeScheduler([_FakeTask(True), _FakeTask(True)],
                           on_join=lambda i: ctrl_c.commit_measured())
    ctrl_c.scheduler = sched
    ctrl_c.commit_measured()
    assert sched.joined == [0, 1]
