"""Progress of long CLI work on stderr (docs/cli.md, "Output"): how much, how fast and, when the
planned total is known, the ETA. On a terminal one line is redrawn in place every half second; in logs
and pipes a line is written every ``$STREAMLEDGER_PROGRESS_SECONDS`` (default 5) seconds, so that a
scheduler's task log shows the same figures."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")
ENV = "STREAMLEDGER_PROGRESS_SECONDS"


def _every(tty: bool) -> float:
    try:
        return max(0.0, float(os.environ.get(ENV, "0.5" if tty else "5")))
    except ValueError:
        return 5.0


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):  # closed
        return False


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts units of work toward an optional ``total`` and reports them at most every few seconds."""

    def __init__(self, what: str, *, total: int | None = None, unit: str = "records",
                 stream: IO[str] | None = None) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = _is_tty(self.stream)
        self.every = _every(self.tty)
        self.started = time.monotonic()
        self.count = 0
        self._last = self.started

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.count / elapsed
        parts = [f"{self.count:,}" + (f" / {self.total:,}" if self.total else "") + f" {self.unit}"]
        if self.total:
            parts.append(f"{min(100.0, 100.0 * self.count / self.total):.0f}%")
        parts.append(f"{rate:,.0f} {self.unit}/s")
        if self.total and rate > 0 and self.count < self.total:
            parts.append(f"ETA {_clock((self.total - self.count) / rate)}")
        parts.append(f"elapsed {_clock(elapsed)}")
        return f"streamledger: {self.what}: " + ", ".join(parts)

    def advance(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._write(self.line(now), final=False)

    def track(self, items: Iterable[T], *, size: Callable[[T], int]) -> Iterator[T]:
        """``items`` unchanged, counting ``size(item)`` units as each one passes."""
        for item in items:
            self.advance(size(item))
            yield item

    def done(self, records: int | None = None) -> None:
        """The closing line (always written): the totals of the work."""
        if self.total is not None:
            self.count = max(self.count, self.total)
        line = self.line()
        if records is not None and self.unit != "records":
            line += f"; {records:,} records"
        self._write(line, final=True)

    def _write(self, line: str, *, final: bool) -> None:
        try:
            if self.tty:
                self.stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # stderr gone: progress is not worth failing the work for
            pass


class JobProgress:
    """``batch run``'s progress, driven by the batch's step hook: once the claims are settled it names
    the planned offsets, then reports the Spark job's tasks every few seconds until the job returns
    (local Spark's status tracker; a Spark Connect job reports elapsed time only), then the records
    read and their rate."""

    def __init__(self, pipeline: str, runner: object, *, stream: IO[str] | None = None) -> None:
        self.pipeline = pipeline
        self.runner = runner
        self.stream = stream or sys.stderr
        self.every = 2.0 if _is_tty(self.stream) else _every(False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.began = 0.0
        self.planned = 0

    def step(self, name: str, batch: Any) -> None:
        if name == "probed":
            todo = [p.result for p in batch.to_read()]
            self.planned = sum(r.end - r.start for r in todo)
            if not todo:
                return
            self._say(f"reading {len(todo)} partition(s), {self.planned:,} offsets planned")
            self.began = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="streamledger-progress", daemon=True)
            self._thread.start()
        elif name == "job":
            self.stop()
        elif name == "read" and self.began:
            elapsed = max(time.monotonic() - self.began, 1e-9)
            records = sum(p.result.records for p in batch.parts if p.result.read)
            self._say(f"read {records:,} records in {_clock(elapsed)} ({records / elapsed:,.0f} records/s)")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _tasks(self) -> tuple[int, int] | None:
        spark = getattr(self.runner, "_spark", None)
        context = getattr(spark, "sparkContext", None) if spark is not None else None
        if context is None:
            return None
        try:
            tracker = context.statusTracker()
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        except Exception:  # the job is finishing or the session is stopping: no figure this time
            return None
        infos = [i for i in infos if i is not None]
        return sum(i.numCompletedTasks for i in infos), sum(i.numTasks for i in infos)

    def _watch(self) -> None:
        while not self._stop.wait(max(self.every, 0.2)):
            elapsed = time.monotonic() - self.began
            tasks = self._tasks()
            text = f"Spark job running, elapsed {_clock(elapsed)}"
            if tasks and tasks[1]:
                done, total = tasks
                text += f", tasks {done}/{total}"
                if done:
                    text += f", ETA {_clock(elapsed * (total - done) / done)}"
            self._say(text)

    def _say(self, text: str) -> None:
        try:
            self.stream.write(f"streamledger: batch {self.pipeline}: {text}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass
