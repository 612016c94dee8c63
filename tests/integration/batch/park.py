"""A child process for SIGKILL tests: ``streamledger batch run`` parked at one step of the batch.

``python -m tests.integration.batch.park STEP MARKER -- <streamledger argv>`` runs the real command
line in this process; right after the batch's step ``STEP`` (an ``on_step`` mark: ``read``,
``committed``, ``table_committed``, ``published``...) it writes ``MARKER`` and sleeps until the test
SIGKILLs it, so the kill lands exactly there and nothing of the batch's own clean-up runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    step, marker, sep, *cli_argv = argv
    assert sep == "--", "usage: park STEP MARKER -- <streamledger argv>"
    from streamledger.batch.run import BatchRun
    from streamledger.cli import main as cli

    marked = BatchRun._step

    def parked(self: BatchRun, name: str) -> None:
        marked(self, name)
        if name == step:
            Path(marker).write_text(name)
            while True:  # until SIGKILL
                time.sleep(60)

    BatchRun._step = parked  # type: ignore[method-assign]
    return cli(cli_argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
