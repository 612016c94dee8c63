"""The output file of a ``read`` command (``streamledger read``, ``streamledger mewbase read``): one rule
for which files are accepted and how they appear, so a reader never sees a half-written file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

SUFFIXES = (".parquet", ".jsonl")

T = TypeVar("T")


def checked_output(arg: str, error: type[Exception]) -> Path:
    """``--output`` as a path ending in .parquet or .jsonl whose directory exists, else ``error``."""
    output = Path(arg)
    if output.suffix.lower() not in SUFFIXES:
        raise error(f"--output {arg}: the file name must end in .parquet or .jsonl")
    if not output.parent.exists():
        raise error(f"--output {arg}: directory {output.parent} does not exist")
    return output


def write_atomically(output: Path, write: Callable[[Path], T]) -> T:
    """``write`` into ``<output>.part``, then rename it into place; a failed write leaves no file."""
    tmp = output.with_name(output.name + ".part")
    try:
        result = write(tmp)
        os.replace(tmp, output)
        return result
    finally:
        if tmp.exists():
            tmp.unlink()
