"""Spark's own start-up noise kept off the CLI's stderr (docs/cli.md, "Output"); ``-v`` shows it.

Two sources, two tools. The driver's log4j lines (the default-profile notice, NativeCodeLoader, the
data sources' re-registration) are logging: the session gets our log4j2 profile
(``log4j2-quiet.properties``: warnings and errors still shown). The JVM's own "Using incubator
modules" warning (Spark always adds ``jdk.incubator.vector``) is no log line at all: while the
session starts its JVM, the JVM inherits a pipe as its stderr and a thread copies every line to
ours except that one. Only the CLI's local Spark is quieted; Airflow and Dagster keep Spark's logs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from streamledger.batch import LocalSparkRunner

PROFILE = Path(__file__).with_name("log4j2-quiet.properties")
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
JVM_NOISE = (b"WARNING: Using incubator modules:",)


def quiet_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the driver on the quiet log4j2 profile; the user's own driver options come after
    it, so a ``-Dlog4j2.configurationFile`` of theirs wins."""
    option = f"-Dlog4j2.configurationFile={PROFILE.as_uri()}"
    out = dict(conf)
    out[DRIVER_OPTIONS] = f"{option} {out[DRIVER_OPTIONS]}" if out.get(DRIVER_OPTIONS) else option
    return out


def _copy(source: int, target: int, drop: tuple[bytes, ...]) -> None:
    """Copy ``source`` to ``target`` line by line, leaving out lines that start with one of ``drop``.
    A line is held only while it may still turn out to be one of them (a live display's partial
    lines pass at once)."""
    held = b""  # the start of a line that may be noise
    mode = "start"  # start of a line, "pass" the rest of a kept line, "drop" the rest of a noise line
    try:
        while data := os.read(source, 65536):
            while data:
                cut = data.find(b"\n")
                piece, data = (data[:cut + 1], data[cut + 1:]) if cut >= 0 else (data, b"")
                ends = piece.endswith(b"\n")
                if mode == "start":
                    held += piece
                    if any(held.startswith(n) for n in drop):
                        held, mode = b"", "drop"
                    elif not ends and any(n.startswith(held) for n in drop):
                        continue  # could still be noise: wait for more
                    else:
                        os.write(target, held)
                        held, mode = b"", "pass"
                elif mode == "pass":
                    os.write(target, piece)
                if ends:
                    mode = "start"
        if held:
            os.write(target, held)
    except OSError:  # our stderr went away: nothing left to show it on
        pass
    finally:
        os.close(source)
        os.close(target)


@contextlib.contextmanager
def jvm_stderr_filtered(drop: tuple[bytes, ...] = JVM_NOISE) -> Iterator[None]:
    """Processes started in the body get a pipe as stderr, copied to ours without the ``drop`` lines."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    ours = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_copy, args=(read_end, os.dup(ours), drop), name="jvm-stderr",
                     daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(ours, 2)  # this process writes to its own stderr again; the JVM keeps the pipe
        os.close(ours)


class QuietLocalSparkRunner(LocalSparkRunner):
    """:class:`LocalSparkRunner` whose session starts without Spark's start-up noise."""

    def __init__(self, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> None:
        super().__init__(master=master, conf=quiet_conf(conf or {}))

    def session(self) -> Any:
        if self._spark is not None:
            return self._spark
        with jvm_stderr_filtered():
            return super().session()
