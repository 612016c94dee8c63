"""The ledger's one deliberate error type.

Every refusal of the ledger (an illegal state transition, a range that would break contiguity, a
schema that is not at head, a database that cannot be reached) surfaces as :class:`LedgerError`
with a one-line message naming the pipeline, stream, range and reason, and never a password.
"""

from __future__ import annotations

from streamledger.errors import StreamledgerError


class LedgerError(StreamledgerError):
    """The ledger refused an operation or could not reach its database; ``str(err)`` says why."""


class LedgerNotFound(LedgerError):
    """A ledger opened for reading is not there (a SQLite file that does not exist); nothing was created."""


class LedgerSchemaMissing(LedgerError):
    """The database answered but holds no ledger schema yet (a new, empty database): a writing command
    or ``Ledger(url, create=True)`` migrates it."""
