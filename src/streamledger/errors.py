"""The root of every error streamledger raises on purpose.

Catching :class:`StreamledgerError` separates "the input, the broker or the ledger said no" (a clear,
user-facing message) from programming errors, which the CLI lets through with a traceback.
"""


class StreamledgerError(Exception):
    """Base class of all deliberate streamledger errors; ``str(err)`` is a one-line user message."""


class BatchError(StreamledgerError):
    """The batch cannot run as configured, or its result disagrees with its claim.

    Defined here, below every layer, because the runners (:mod:`streamledger.spark.runners`) raise
    it too; :mod:`streamledger.batch` exports it."""
