"""The CLI starts fast: building the parser imports neither the ledger stack nor Spark."""

from __future__ import annotations

import subprocess
import sys


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys; from streamledger.cli import build_parser; build_parser(); "
        "print(','.join(m for m in ('sqlalchemy', 'alembic', 'pyspark', 'pyarrow') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stdout.strip() == ""


def test_spark_server_commands_are_registered() -> None:
    from streamledger.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["spark-server", "start", "--port", "15999", "--conf", "a=b"])
    assert (args.port, args.conf, args.master) == (15999, ["a=b"], "local[2]")
    assert parser.parse_args(["spark-server", "status"]).func.__name__ == "_status"
