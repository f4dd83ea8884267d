"""Ctrl-C during `tvmopt tune`: stop MetaSchedule at a safe point, never in the middle of TVM.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to
be. During tuning that is almost always inside a Python callback that TVM's C++ task scheduler
is running (builder, runner, cost model, measure callback, logging). The worst of them:
MetaSchedule's C++ calls its Python logger from the destructor of `PyLogMessage`
(TVM_PY_LOG), hundreds of times a round; a KeyboardInterrupt raised there leaves a noexcept
destructor as a C++ exception and the process dies with SIGSEGV in `__cxa_begin_catch`
(tests/tuning/test_resume.py sends its Ctrl-C from exactly there). Elsewhere the exception
unwinds from an arbitrary point and, inside LocalBuilder.build, leaves its worker pool to a
`__del__` that fails in its own thread. And a terminal sends SIGINT to the whole foreground
process group, so the PopenPool workers die too and the batch in flight is lost.

What happens instead:

- SIGINT is blocked in the main thread for the whole run, so every thread and process started
  after it inherits the block: the builder/runner workers (the mask survives fork and exec),
  TVM's and XGBoost's threads. One watcher thread, started before the block, is the only
  thread that takes the signal; `signal.set_wakeup_fd` hands it the signal number and the
  Python-level handler does nothing, so no exception is ever raised asynchronously.
- First Ctrl-C: a flag, and a line saying what will happen. Tuning stops at the next safe point:
  entering the builder (nothing of that task in flight; batches of other tasks that were already
  measured are joined, i.e. committed, first), or after a batch's measure callbacks have
  committed its records. The stop is a `StopTuning` raised from our own callback there, which
  TVM propagates like any other callback error.
- Second Ctrl-C: exit at once (`os._exit(130)`) after killing the worker processes. Every record
  MetaSchedule appended so far is on disk (its JSON database writes each line as it is
  measured); at most a line cut mid-write is lost, and the next run drops and counts it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

STOP_MESSAGE = "tuning stopped at a safe point"
_SENTINEL = 0  # written to the wakeup pipe to end the watcher; never a signal number


class StopTuning(Exception):
    """Raised from a tvmopt callback to end MetaSchedule's tuning loop after a Ctrl-C or when
    the time budget is spent."""

    def __init__(self):
        super().__init__(STOP_MESSAGE)


def _ignore(_signum, _frame):
    """Python-level SIGINT handler: the watcher thread does the work (see module doc)."""


class CtrlC:
    """Context manager that owns SIGINT for one tuning run.

    Inert outside the main thread (signals can only be handled there), e.g. when tune() is
    called from a worker thread of an embedding application, and when SIGINT is ignored.

    Attributes:
        requested: a Ctrl-C arrived; tuning stops at the next safe point.
        stopped: StopTuning was raised (the loop ended early).
        deadline: time.monotonic() past which tuning stops at the next safe point (the
            `--minutes` budget), or None.
    """

    def __init__(self, db_dir=None, console=None):
        self.requested = False
        self.stopped = False
        self.deadline = None
        self.scheduler = None  # the TaskScheduler, set by tune(); needed to join pending tasks
        self._db_dir = db_dir
        self._console = console
        self._joining = False
        self._active = False

    # -------------------------------------------------------------- signal plumbing
    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return self  # started ignoring SIGINT (nohup, a background job): keep it that way
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)  # the C-level handler must never block on it
        self._old_handler = signal.signal(signal.SIGINT, _ignore)
        self._old_wakeup = signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        # Started before the block below, so it is the one thread left that takes SIGINT.
        self._watcher = threading.Thread(target=self._watch, name="tvmopt-ctrl-c", daemon=True)
        self._watcher.start()
        self._old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        self._active = True
        return self

    def __exit__(self, *exc):
        self.scheduler = None  # drop the reference cycle scheduler -> callbacks -> self
        if not self._active:
            return False
        self._active = False
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        signal.set_wakeup_fd(self._old_wakeup)
        signal.signal(signal.SIGINT, self._old_handler)
        os.write(self._wfd, bytes([_SENTINEL]))
        self._watcher.join(timeout=10)
        os.close(self._rfd)
        os.close(self._wfd)
        return False

    def _watch(self):
        presses = 0
        while True:
            try:
                data = os.read(self._rfd, 64)
            except OSError:
                return
            for signum in data:
                if signum == _SENTINEL:
                    return
                if signum != signal.SIGINT:
                    continue
                presses += 1
                if presses == 1:
                    self.requested = True
                    self._say("Ctrl-C: stopping after the current batch, records are kept "
                              "(Ctrl-C again to quit at once)")
                else:
                    self._hard_exit()

    def _say(self, text: str):
        if self._console is not None:
            self._console.print(f"[yellow]{text}[/]")
        else:
            print(text, file=sys.stderr, flush=True)

    def _hard_exit(self):
        where = f" in {self._db_dir}" if self._db_dir else ""
        msg = (f"\ntvmopt: second Ctrl-C: quitting now; records measured so far are kept{where} "
               "(rerun the same command to continue)\n")
        try:
            # sys.stderr, not fd 2: the CLI may have made fd 2 a pipe to a filtering thread,
            # which os._exit kills before it forwards the line
            try:
                fd = sys.stderr.fileno()
            except (AttributeError, OSError, ValueError):
                fd = 2
            show_cursor = b"\x1b[?25h" if os.isatty(fd) else b""  # a progress bar hid it
            os.write(fd, show_cursor + msg.encode())
        except OSError:
            pass
        try:
            _kill_children()
        finally:
            os._exit(130)  # whatever killing the workers raised, the process quits

    # -------------------------------------------------------------- safe points
    def checkpoint(self, current_task: int | None = None) -> None:
        """Stop here if a Ctrl-C arrived: join other tasks' measured batches, then StopTuning.

        Args:
            current_task: the task whose measure callbacks are running (its batch is being
                committed by the caller; it must not be joined again).
        """
        if not (self.requested or self.out_of_time) or self._joining:
            return
        self.commit_measured(current_task)
        self.stopped = True
        raise StopTuning()

    @property
    def out_of_time(self) -> bool:
        """The time budget is spent (Ctrl-C's safe points end the run then too)."""
        import time

        return self.deadline is not None and time.monotonic() >= self.deadline

    def commit_measured(self, current_task: int | None = None) -> None:
        """Join every other task's measured batch, so its records reach the database now.

        MetaSchedule's task scheduler commits a batch (database, cost model) only when it next
        picks that task, which with tens of tasks can be the end of the run: a kill -9 would
        lose nearly everything measured. Joining them before each new build writes each batch
        one build later at most.
        """
        sched = self.scheduler
        if sched is None or self._joining:
            return
        self._joining = True  # the joins below run our measure callback again
        try:
            for i, task in enumerate(sched.tasks_):
                if (i != current_task and not task.is_terminated
                        and task.runner_futures is not None):
                    sched.join_running_task(i)
        finally:
            self._joining = False

    def measure_callback(self):
        """A MeasureCallback (put it last) that stops after a batch's records are committed."""
        from tvm.ir.utils import derived_object
        from tvm.s_tir import meta_schedule as ms

        ctrl_c = self

        @derived_object
        class _StopAfterBatch(ms.measure_callback.PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                      runner_results):
                ctrl_c.checkpoint(current_task=task_id)

        return _StopAfterBatch()

    def builder(self, inner):
        """Wrap a Builder so that no new batch starts building after a Ctrl-C."""
        from tvm.ir.utils import derived_object
        from tvm.s_tir import meta_schedule as ms

        ctrl_c = self

        @derived_object
        class _StopBeforeBuild(ms.builder.PyBuilder):
            def build(self, build_inputs):
                ctrl_c.checkpoint()
                ctrl_c.commit_measured()
                return inner.build(build_inputs)

        return _StopBeforeBuild()

    def cost_model(self, inner):
        """Wrap a CostModel so that no time goes into training it once tuning is stopping.

        Training XGBoost after each batch takes seconds on a busy 2-core machine; the model
        is thrown away when tuning stops, so the batches joined on the way out skip it.
        """
        from tvm.ir.utils import derived_object
        from tvm.s_tir import meta_schedule as ms

        ctrl_c = self

        @derived_object
        class _NoTrainingWhenStopping(ms.cost_model.PyCostModel):
            def load(self, path):
                inner.load(path)

            def save(self, path):
                inner.save(path)

            def update(self, context, candidates, results):
                if not (ctrl_c.requested or ctrl_c.out_of_time):
                    inner.update(context, candidates, results)

            def predict(self, context, candidates):
                return inner.predict(context, candidates)

        return _NoTrainingWhenStopping()

    def is_stop_error(self, err: BaseException) -> bool:
        """Whether `err` (as TVM's FFI hands it back) is the StopTuning we raised."""
        return self.stopped and STOP_MESSAGE in str(err)


def _kill_children():
    """Kill this process's worker processes (a hard exit must not leave them running)."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except (psutil.Error, OSError):  # the process table cannot be read here: none to kill
        return
    for child in children:
        try:
            child.kill()
        except psutil.Error:  # it has exited already, or is not this user's to kill
            pass
