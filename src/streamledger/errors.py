"""The root of every error streamledger raises on purpose.

Catching :class:`StreamledgerError` separates "the input, the broker or the ledger said no" (a clear,
user-facing message) from programming errors, which the CLI lets through with a traceback.
"""

import argparse
from importlib.util import find_spec
from typing import NoReturn


class StreamledgerError(Exception):
    """Base class of all deliberate streamledger errors; ``str(err)`` is a one-line user message."""


class BatchError(StreamledgerError):
    """The batch cannot run as configured, or its result disagrees with its claim.

    Defined here, below every layer, because the runners (:mod:`streamledger.spark.runners`) raise
    it too; :mod:`streamledger.batch` exports it."""


class MissingExtra(BatchError, ValueError):
    """An optional library is not installed where it is needed; ``str(err)`` is one line naming the
    extra that installs it (docs/install.md). A ``ValueError`` like every refusal of bad input, so the
    command line exits 2 for it as for any missing optional library."""


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr (the house rule for every error) and exit status 2;
    the usage lines are left to ``--help``. Subcommand parsers inherit the class.

    Here, beside the errors, because every layer that parses a command line (the CLI, the Spark job's
    ``spark-submit`` entry point) says no the same way."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


#: A missing optional library -> the extra that installs it (docs/install.md).
EXTRAS = {
    "psycopg": "postgres", "pyspark": "spark", "deltalake": "delta", "pyiceberg": "iceberg",
    "pymongo": "mewbase", "bson": "mewbase", "lz4": "compression", "zstandard": "compression",
    "cramjam": "compression", "dagster": "dagster", "airflow": "airflow", "boto3": "s3", "botocore": "s3",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """'pip install "streamledger[X]"' advice when ``exc`` is a known optional library."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f"{top} is not installed: pip install \"streamledger[{extra}]\""


def extra_problem(module: str) -> str | None:
    """The same one line when optional library ``module`` (a key of :data:`EXTRAS`) cannot be
    imported here, else None: asked before anything is claimed, instead of a traceback later."""
    if find_spec(module) is not None:
        return None
    return missing_extra(ModuleNotFoundError(name=module))
