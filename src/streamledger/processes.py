"""Which process a recorded pid names.

Why a start time beside every recorded pid: pids are recycled (``pid_max`` is 32768 on small
machines, and a test suite or a busy scheduler starts tens of thousands of processes), so a record
holding a pid alone names some other process once the recorded one died. Believing it made a dead
broker or Connect server look alive, and a stop signalled a stranger's process group.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import NoReturn


def alive(pid: int) -> bool:
    """``pid`` runs and is not a zombie (an exited child nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/PID/stat``); ``None``
    when it does not run. With the pid it names one process for the machine's uptime."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """The process recorded as ``(pid, started)`` still runs (``started=None``: only that it runs)."""
    return alive(pid) and (started is None or process_start(pid) == started)


def exit_now(code: int) -> NoReturn:
    """End this process without tearing its interpreter down module by module: the work is done,
    and unloading pyspark's Connect client, pandas, numpy and pyarrow took 0.3-1.1 s of wall time
    (measured), as long as a small job. The output is flushed and the exit handlers (logging's,
    pyspark's) run first. For a process's own entry point only, never a library call."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)
