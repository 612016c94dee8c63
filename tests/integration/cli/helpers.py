"""Run the real ``streamledger`` command as its own process, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: Variables a user's shell may have set that would change what a test means.
_CLEARED = ("STREAMLEDGER_BROKER_URL", "STREAMLEDGER_RABBITMQ_URL", "STREAMLEDGER_LEDGER_URL",
            "STREAMLEDGER_MEWBASE_URL", "STREAMLEDGER_AMQP_URL", "STREAMLEDGER_SPARK_REMOTE")


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    def one_error_line(self) -> str:
        """The single line on stderr (the dialect: one line, no traceback)."""
        lines = self.err.splitlines()
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        assert lines[0].startswith("streamledger"), self.err
        return lines[0]


def cli(*argv: str, env: dict[str, str] | None = None, home: Path | None = None, timeout: float = 300,
        stdout: int | IO[Any] | None = None, cwd: Path | None = None) -> Result:
    environ = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    if home is not None:
        environ["STREAMLEDGER_HOME"] = str(home)
    environ.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "streamledger.cli", *argv], env=environ, text=True,
                          stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, check=False, cwd=cwd)
    return Result(proc.returncode, proc.stdout or "", proc.stderr)


def tree(where: Path) -> list[str]:
    """Every path under ``where`` (to show that a command created nothing)."""
    return sorted(str(p.relative_to(where)) for p in where.rglob("*"))
