"""The SQL offset ledger: which offsets each run processed, proven from the database.

A **pipeline** is a consumer: its name (at most 256 characters) is the reference under which the
broker stores its offset. A **source** is one stream (or super-stream partition) on one broker.
A **range** is the half-open span ``[start, end)`` of one source that one run identity
(dag_id, run_id, task_id, map_index; the try_number is recorded too) processes.

Status machine: ``claimed -> committed | failed``. ``lost`` is recorded directly for a span that
retention removed when the user chose to record it rather than fail. Spans never change.

Delivery semantics (exactly):

* ``claim(pipeline, source, end_limit, run, initial_start=None)``, under a per-source lock:
  1. if ``run``'s key already holds a claimed or committed range of this source, that range is
     returned unchanged (``end_limit`` is ignored; a new ``try_number`` is recorded): reruns and
     retries are idempotent and never read further;
  2. else, if a failed range held offsets no live range covers, the lowest is claimed again, up to
     the end of that failed range or the next live range (a failed range nobody redid comes back
     exactly as it was; ``end_limit`` is ignored);
  3. else the new range is ``[tail, max(tail, end_limit))`` where ``tail`` is the end of the
     source's live (claimed, committed or lost) ranges, or ``initial_start`` for the first range
     (required then; ignored afterwards).
  An empty range (``end_limit <= tail``) is stored **already committed with 0 records**: the run
  is on record, nothing is left open, and contiguity is unaffected (it starts and ends at the tail).
* ``commit(range_id, records, first_seen, last_seen, output)`` only from ``claimed`` (an identical
  repeat returns the committed range; a different one is refused). ``records`` must fit:
  0 records means no first/last seen; otherwise ``start <= first_seen <= last_seen < end`` and
  ``records <= last_seen - first_seen + 1`` (offsets have gaps, so fewer records are normal).
* The order a runner follows is claim -> read -> write output -> ``commit`` -> store the broker
  offset (``last_seen``, inclusive) -> ``mark_offset_stored``. A crash **before commit** leaves the
  range claimed: the task's retry (same key) gets the same range and re-reads it (output is
  rewritten: at-least-once reading, exactly-once commit per span). A claim whose worker vanished is
  visible as stuck (age) and ``release_stale(older_than)`` fails it, so the next claim redoes it.
  A crash **after commit** but before the broker offset is stored is visible as broker drift.
* ``fail(range_id, reason)`` only from ``claimed`` (repeat: no-op). The span is redone as-is by the
  next claim of the source; the failed row stays as history.
* ``record_lost(...)`` records ``[start, end)`` as lost at the tail, at the start of a failed hole,
  or at the start of the range the run holds claimed (which fails; any remainder beyond ``end`` is
  left as a failed span for the next claim).

Invariants per pipeline+source, enforced by the database (migration 0002: an exclusion constraint
and a trigger on PostgreSQL, triggers on SQLite) as well as here: live ranges never overlap; each
new live range starts where the live ranges end (or inside a failed range that holds it);
committed and lost ranges are therefore contiguous. ``audit()`` re-checks all of it in SQL, plus stuck claims,
unretried failures, record counts and drift against the broker's stored offset.

Concurrency: PostgreSQL claims lock the source row (``SELECT ... FOR UPDATE``, inside the
server-side function ``streamledger_claim`` of migration 0003, so a claim is one round trip);
SQLite write transactions start with ``BEGIN IMMEDIATE`` under WAL with a 30 s busy timeout.
"""

from streamledger.ledger.errors import LedgerError, LedgerNotFound, LedgerSchemaMissing
from streamledger.ledger.findings import (
    AuditReport,
    BrokerOffsetLookup,
    Brokers,
    OffsetQuerier,
    Violation,
    ViolationKind,
)
from streamledger.ledger.store import Ledger
from streamledger.ledger.types import (
    UNRECORDED,
    ClaimRequest,
    CommitRequest,
    OffsetRange,
    RangeStatus,
    RunIdentity,
    SourcePosition,
    SourceRef,
)

__all__ = [
    "UNRECORDED",
    "AuditReport",
    "BrokerOffsetLookup",
    "Brokers",
    "ClaimRequest",
    "CommitRequest",
    "Ledger",
    "LedgerError",
    "LedgerNotFound",
    "LedgerSchemaMissing",
    "OffsetQuerier",
    "OffsetRange",
    "RangeStatus",
    "RunIdentity",
    "SourcePosition",
    "SourceRef",
    "Violation",
    "ViolationKind",
]
