"""The job's process imports what the job runs, nothing else (issue 32: its start-up is most of a
short job on a warm Connect server).

Checked on ``sys.modules`` of a fresh interpreter, never on timing: the job's module and what its
planning imports (the broker client) bring no ledger, no orchestrator, no table library, no Spark and
no pandas; the rest of a Connect job process (pyspark's client, which needs pandas) is pinned by
``tests/integration/spark/test_connect.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Never on the job's path: the ledger stack, the orchestrators, the table sinks' libraries, and
#: tenacity (it imports tornado and asyncio; the broker client's retries are a loop of their own).
NOT_FOR_THE_JOB = (
    "sqlalchemy", "alembic", "airflow", "dagster", "pyiceberg", "deltalake", "tenacity", "tornado",
    "streamledger.ledger", "streamledger.batch",
)


def imported_by(code: str, names: tuple[str, ...]) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {list(names)!r} if m in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True)
    return list(json.loads(proc.stdout.splitlines()[-1]))


def test_the_job_module_and_its_planning_import_no_ledger_orchestrator_spark_or_pandas() -> None:
    got = imported_by(
        "import streamledger.spark.job\nimport streamledger.protocol.rabbitmq.client\n"
        "import streamledger.spark.job as job; job.build_parser()",
        (*NOT_FOR_THE_JOB, "pyspark", "pandas"),
    )
    assert got == [], f"importing the job's module and its broker client imported {got}"


def test_a_task_s_modules_import_no_ledger_orchestrator_or_tenacity() -> None:
    """What a fresh Spark Python worker imports to unpickle a task (the writer and the reader)."""
    got = imported_by(
        "import streamledger.spark.arrow_writer, streamledger.spark.datasource, streamledger.spark.reading",
        NOT_FOR_THE_JOB,
    )
    assert got == [], f"a task's modules imported {got}"
