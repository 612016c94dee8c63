"""A batch's progress while its job runs, the same for every front door: the offsets planned once the
claims are settled, the Spark job's tasks every few seconds while it runs, then the records read and
their rate. By default these are log lines of ``streamledger.batch`` (what Airflow's task log, Dagster's
run log and ``batch run`` without a terminal show); a front door may pass its own :class:`ReadProgress`
(``batch run`` on a terminal draws them live). A reporter's failure never fails the batch."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

log = logging.getLogger("streamledger.batch")

ENV = "STREAMLEDGER_PROGRESS_SECONDS"
DEFAULT_SECONDS = 5.0


def every_seconds(default: float = DEFAULT_SECONDS) -> float:
    """How often a progress line is written: ``$STREAMLEDGER_PROGRESS_SECONDS``, else ``default``."""
    try:
        return max(0.0, float(os.environ.get(ENV, default)))
    except ValueError:
        return default


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass(frozen=True, slots=True)
class Planned:
    """One partition's range the job reads."""

    stream: str
    start: int
    end: int

    @property
    def offsets(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Tasks:
    """The running job's tasks, as the runner reports them (local Spark's status tracker)."""

    done: int
    total: int


class ReadProgress(Protocol):
    def planned(self, pipeline: str, parts: Sequence[Planned]) -> None: ...
    def running(self, pipeline: str, elapsed: float, tasks: Tasks | None) -> None: ...
    def finished(self, pipeline: str, records: int, elapsed: float) -> None: ...


def eta(elapsed: float, tasks: Tasks | None) -> float | None:
    """Seconds left at the rate the job's tasks finished so far (None before the first one)."""
    if tasks is None or not tasks.done or tasks.total <= tasks.done:
        return None
    return elapsed * (tasks.total - tasks.done) / tasks.done


class LoggedProgress:
    """The lines, as log records of ``streamledger.batch``."""

    def planned(self, pipeline: str, parts: Sequence[Planned]) -> None:
        log.info("batch %s: reading %d partition(s), %s offsets planned", pipeline, len(parts),
                 f"{sum(p.offsets for p in parts):,}")

    def running(self, pipeline: str, elapsed: float, tasks: Tasks | None) -> None:
        text = f"Spark job running, elapsed {clock(elapsed)}"
        if tasks is not None and tasks.total:
            text += f", tasks {tasks.done}/{tasks.total}"
            left = eta(elapsed, tasks)
            if left is not None:
                text += f", ETA {clock(left)}"
        log.info("batch %s: %s", pipeline, text)

    def finished(self, pipeline: str, records: int, elapsed: float) -> None:
        log.info("batch %s: read %s records in %s (%s records/s)", pipeline, f"{records:,}", clock(elapsed),
                 f"{records / max(elapsed, 1e-9):,.0f}")


def runner_tasks(runner: object) -> Tasks | None:
    """The runner's running job's tasks, if it can tell (``job_tasks()``; a Spark Connect runner cannot)."""
    probe: Callable[[], tuple[int, int] | None] | None = getattr(runner, "job_tasks", None)
    if not callable(probe):
        return None
    try:
        found = probe()
    except Exception:  # the job is finishing or the session stopping: no figure this time
        return None
    return Tasks(*found) if found else None


class JobWatch:
    """While the job runs (a ``with`` block), reports its tasks every ``every`` seconds."""

    def __init__(self, pipeline: str, runner: object, reporter: ReadProgress, every: float) -> None:
        self.pipeline, self.runner, self.reporter, self.every = pipeline, runner, reporter, every
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="streamledger-progress", daemon=True)

    def __enter__(self) -> JobWatch:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def _watch(self) -> None:
        while not self._stop.wait(max(self.every, 0.05)):
            try:
                self.reporter.running(self.pipeline, self.elapsed, runner_tasks(self.runner))
            except Exception:  # progress is never worth failing the batch for
                log.debug("progress reporter failed", exc_info=True)
