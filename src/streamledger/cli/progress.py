"""Progress of long CLI work on stderr (docs/cli.md, "Output"): how much, how fast and, when the
planned total is known, the ETA. On a terminal a live display (rich) is redrawn in place; in logs and
pipes a line is written every ``$STREAMLEDGER_PROGRESS_SECONDS`` (default 5) seconds, so that a
scheduler's task log shows the same figures. A closing line is always written."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, TypeVar

from streamledger.progress import ENV, Planned, Tasks, clock, eta, every_seconds

T = TypeVar("T")
__all__ = ["ENV", "AuditProgress", "BatchDisplay", "Progress", "StderrHandler", "batch_display",
           "live_console"]

LIVE_SECONDS = 0.5  # how often a live display takes new figures


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):  # closed
        return False


def live_console(stream: IO[str] | None = None) -> Any:
    """A rich console drawing on ``stream`` (stderr) when it is a terminal that can redraw, else None
    (no terminal, ``TERM=dumb``, or rich missing): then progress is written as lines."""
    stream = stream or sys.stderr
    if not _is_tty(stream) or os.environ.get("TERM") == "dumb":
        return None
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - a dependency; lines still work without it
        return None
    return Console(file=stream, highlight=False, soft_wrap=False)


def _columns(unit: str) -> list[Any]:
    """The live display's columns: what (shortened to fit), bar, count, rate, ETA, elapsed."""
    from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column
    from rich.text import Text

    def fixed() -> Column:
        return Column(no_wrap=True)

    class Count(ProgressColumn):
        def render(self, task: Any) -> Text:
            total = f"/{task.total:,.0f}" if task.total is not None else ""
            return Text(f"{task.completed:,.0f}{total} {unit}")

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            elapsed = task.elapsed or 0.0
            return Text(f"{task.completed / elapsed if elapsed > 0 else 0:,.0f} {unit}/s")

    class Left(ProgressColumn):
        def render(self, task: Any) -> Text:
            left = task.fields.get("eta")
            if left is None and task.total and task.completed and task.elapsed:
                left = task.elapsed * (task.total - task.completed) / task.completed
            return Text("ETA " + (clock(left) if left is not None else "-:--:--"))

    return [TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
            BarColumn(bar_width=20, table_column=fixed()), Count(table_column=fixed()),
            Rate(table_column=fixed()), Left(table_column=fixed()),
            TextColumn("elapsed", table_column=fixed()), TimeElapsedColumn(table_column=fixed())]


class Progress:
    """Counts units of work toward an optional ``total``: a live bar on a terminal, else a line at
    most every few seconds; :meth:`done` writes the closing line."""

    def __init__(self, what: str, *, total: int | None = None, unit: str = "records",
                 stream: IO[str] | None = None) -> None:
        import time

        self._now = time.monotonic
        self.what = what
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = _is_tty(self.stream)
        self.every = every_seconds(LIVE_SECONDS if self.tty else 5.0)
        self.started = self._now()
        self.count = 0
        self._last = self.started
        self._bar: Any = None
        console = live_console(self.stream)
        if console is not None:
            from rich.progress import Progress as Bar

            self._bar = Bar(*_columns(unit), console=console, refresh_per_second=4, expand=True)
            self._task = self._bar.add_task(what, total=total)
            self._bar.start()

    def line(self, now: float | None = None) -> str:
        now = self._now() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.count / elapsed
        parts = [f"{self.count:,}" + (f" / {self.total:,}" if self.total else "") + f" {self.unit}"]
        if self.total:
            parts.append(f"{min(100.0, 100.0 * self.count / self.total):.0f}%")
        parts.append(f"{rate:,.0f} {self.unit}/s")
        if self.total and rate > 0 and self.count < self.total:
            parts.append(f"ETA {clock((self.total - self.count) / rate)}")
        parts.append(f"elapsed {clock(elapsed)}")
        return f"streamledger: {self.what}: " + ", ".join(parts)

    def advance(self, n: int) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.count)
            return
        now = self._now()
        if now - self._last >= self.every:
            self._last = now
            self._write(self.line(now))

    def track(self, items: Iterable[T], *, size: Callable[[T], int]) -> Iterator[T]:
        """``items`` unchanged, counting ``size(item)`` units as each one passes."""
        try:
            for item in items:
                self.advance(size(item))
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the live display (idempotent): on failure too, so the terminal is left as it was."""
        if self._bar is not None:
            bar, self._bar = self._bar, None
            try:
                bar.stop()
            except (OSError, ValueError):
                pass

    def done(self, records: int | None = None) -> None:
        """The closing line (always written): the totals of the work."""
        if self.total is not None:
            self.count = max(self.count, self.total)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.count)
        self.close()
        line = self.line()
        if records is not None and self.unit != "records":
            line += f"; {records:,} records"
        self._write(line)

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # stderr gone: progress is not worth failing the work for
            pass


class BatchDisplay:
    """``batch run``'s live display on a terminal (a :class:`streamledger.progress.ReadProgress`):
    the planned offsets per partition, then a bar of the Spark job's tasks with its ETA, then the
    records read and their rate. Without a terminal the batch's own log lines say the same."""

    every = LIVE_SECONDS

    def __init__(self, console: Any) -> None:
        self.console = console
        self._bar: Any = None
        self._task: Any = None

    def planned(self, pipeline: str, parts: Sequence[Planned]) -> None:
        from rich.progress import Progress as Bar

        offsets = sum(p.offsets for p in parts)
        self.console.print(f"streamledger: batch {pipeline}: reading {len(parts)} partition(s), "
                           f"{offsets:,} offsets planned", markup=False)
        if len(parts) > 1:
            for p in parts:
                self.console.print(f"  {p.stream} [{p.start}, {p.end}): {p.offsets:,} offsets", markup=False)
        self._bar = Bar(*_columns("tasks"), console=self.console, refresh_per_second=4, expand=True)
        self._task = self._bar.add_task(f"batch {pipeline}: Spark tasks", total=None)
        self._bar.start()

    def running(self, pipeline: str, elapsed: float, tasks: Tasks | None) -> None:
        if self._bar is None or tasks is None:
            return
        self._bar.update(self._task, completed=tasks.done, total=tasks.total, eta=eta(elapsed, tasks))

    def finished(self, pipeline: str, records: int, elapsed: float) -> None:
        if self._bar is not None:
            task = self._bar.tasks[0]
            self._bar.update(self._task, completed=task.total or task.completed, eta=0.0)
        self.close()
        self.console.print(f"streamledger: batch {pipeline}: read {records:,} records in {clock(elapsed)} "
                           f"({records / max(elapsed, 1e-9):,.0f} records/s)", markup=False)

    def close(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.stop()


def batch_display(stream: IO[str] | None = None) -> BatchDisplay | None:
    """The live display when stderr is a terminal, else None (the batch's log lines)."""
    console = live_console(stream)
    return BatchDisplay(console) if console is not None else None


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Log lines to whatever ``sys.stderr`` is when each is written, so a live display (which
    redirects stderr while it draws) prints them above itself instead of through it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


class AuditProgress:
    """``ledger audit``'s progress over the published outputs it checks (the total is known once the
    audit has the ranges): a :class:`Progress` of ranges, shown only when there are outputs to check."""

    def __init__(self, what: str, *, stream: IO[str] | None = None) -> None:
        self.what = what
        self.stream = stream
        self.progress: Progress | None = None

    def step(self, checked: int, total: int) -> None:
        if self.progress is None:
            self.progress = Progress(self.what, total=total, unit="ranges", stream=self.stream)
        self.progress.advance(checked - self.progress.count)

    def done(self) -> None:
        if self.progress is not None:
            self.progress.done()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
