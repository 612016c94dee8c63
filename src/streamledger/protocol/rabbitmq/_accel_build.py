"""Build the optional C accelerator (``_accel.c``) next to its source.

``python -m streamledger.protocol.rabbitmq._accel_build`` compiles it with the interpreter's own
compiler settings (sysconfig) and installs it atomically; without it the pure-Python loops are
used and give the same results, only slower. Returns non-zero, with the reason, when no compiler
or no Python headers are available, which callers (bootstrap, Makefile) may ignore.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_accel.c"


def target() -> Path:
    """Where the built module goes (the import system finds it there)."""
    return HERE / ("_accel" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build(*, quiet: bool = False) -> Path:
    """Compile ``_accel.c``; raise ``RuntimeError`` with the compiler's message on failure."""
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"Python headers not found in {include}")
    cc = shlex.split(str(sysconfig.get_config_var("CC") or "cc"))
    out = target()
    fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=HERE)
    os.close(fd)
    cmd = [*cc, "-O2", "-fPIC", "-shared", "-Wall", "-Werror", f"-I{include}", str(SOURCE), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{proc.stderr.strip()}")
        os.replace(tmp, out)  # atomic: a concurrent importer sees the old file or the new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if not quiet:
        print(f"built {out}")
    return out


def main() -> int:
    try:
        build()
    except (RuntimeError, OSError) as exc:
        print(f"streamledger: C accelerator not built ({exc}); the pure-Python decoder will be used",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
