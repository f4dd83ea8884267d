"""A one-line progress display of the step a command is in (import, each pipeline phase, code
generation, export, verification, tuning, each bench part), with its elapsed time, on stderr and
only when stderr is a terminal. Steps are the ones `tvmopt.stage.enter` marks, so the display
and the crash report name the same thing."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


class _Display:
    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None

    def process_renderables(self, renderables):
        """A report printed to stdout (its own rich console, which writes past the live
        display) first clears the progress line; the next stage shows it again."""
        self.close()
        return renderables

    def __call__(self, stage: str, detail: str) -> None:
        from rich.markup import escape
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        if self.progress is None:
            # stdout through the live display only when it shares the terminal: a redirected
            # stdout must stay a clean file
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), console=self.console, transient=True,
                                     redirect_stdout=sys.stdout.isatty(), redirect_stderr=True)
            self.progress.start()
            self.task = None
        if self.task is not None:
            self.progress.remove_task(self.task)
        what = f"{stage} ({Path(detail).name})" if detail else stage
        self.task = self.progress.add_task(escape(what), total=None)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@contextlib.contextmanager
def shown(console, enabled: bool = True):
    """Show each stage entered while the block runs (started lazily: commands that enter no
    stage print nothing)."""
    from .. import stage

    from ..console import console as stdout_console

    if not enabled or not console.is_terminal:
        yield
        return
    display = _Display(console)
    stage.listen(display)
    stdout_console.push_render_hook(display)
    try:
        yield
    finally:
        stdout_console.pop_render_hook()
        stage.unlisten(display)
        display.close()
