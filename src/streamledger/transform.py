"""The user's own logic inside a proven batch: what a pipeline declares (:class:`Transform`) and the
lineage columns its output carries. Pure data, no Spark: the spec, the ledger's records, the job and
the audit all read this one record.

A transform runs **once per range** (per partition of a batch, on exactly the records of that range,
read back from the job's verified raw landing), so each output row belongs to exactly one ledger
range and the output of a range is a function of the range's records only: an aggregate is per
range, a retry recomputes it from the same records, and the proof stays per range. Three forms, one
at a time: ``sql`` over a view named ``records``, ``function`` (``"package.module:function"``,
``DataFrame -> DataFrame``), or decoding alone (``body_format="json"`` with ``body_schema``), which
also runs before either of the others.

Why import paths and not pickled callables: a path reaches a spark-submit job, a Connect server and
cluster executors alike, and it has a stable name to record; a callable object is accepted where the
job runs in this process (local Spark, a Connect client) and is recorded by its qualified name and
the hash of its source.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamledger.errors import StreamledgerError

__all__ = [
    "BAD_RECORD_MODES", "BODY_FORMATS", "CORRUPT_COLUMN", "DEAD_LETTER_DIR", "LINEAGE_COLUMNS",
    "Transform", "TransformError",
]

BODY_FORMATS = ("raw", "json")
BAD_RECORD_MODES = ("fail", "null", "dead_letter")
CORRUPT_COLUMN = "_corrupt_record"
"""With ``on_bad_record="null"``: the body of a record that did not decode (else null)."""
DEAD_LETTER_DIR = "_dead_letter"
"""With ``on_bad_record="dead_letter"``: the directory, inside the range's own, holding the records
that did not decode, as read (raw columns). ``_`` keeps it out of the range's data files and tables."""

LINEAGE_COLUMNS = ("streamledger_stream", "streamledger_start", "streamledger_end")
"""The columns the job appends to every row a transform writes, after the user's code: the range
``[start, end)`` of ``stream`` the row came from. With the table sinks' ``broker`` and ``epoch``
they name the ledger range, so the audit counts each range's rows in the output without trusting
the user's code, and a downstream pipeline can take exactly the ranges an upstream one published."""

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
BAD_RECORD_MARK = "streamledger bad record:"
"""How a failing bad record names itself inside a Spark error (the job turns it into one line)."""


class TransformError(StreamledgerError, ValueError):
    """A transform that cannot run (one line): refused before anything is claimed where it can be."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transform:
    """What runs between the read and the sink for each range. ``sql``: a query over ``records``;
    ``function``: an import path (or, in-process only, a callable); ``body_format``/``body_schema``
    (Spark DDL): the body decoded into typed columns first; ``on_bad_record``: what a body that does
    not decode does (``fail`` the batch naming stream and offset; ``null`` columns with the body in
    ``_corrupt_record``; ``dead_letter``: the raw record to the range's ``_dead_letter``)."""

    sql: str | None = None
    function: str | Callable[[Any], Any] | None = None
    body_format: str = "raw"
    body_schema: str | None = None
    on_bad_record: str = "fail"

    def problem(self) -> str | None:
        """Why this transform cannot run, as far as it shows without Spark, or None."""
        if self.sql is not None and self.function is not None:
            return "give sql or transform, not both"
        if self.sql is not None and not self.sql.strip():
            return "sql is empty"
        if isinstance(self.function, str) and not _IMPORT_PATH.match(self.function):
            return f"transform must be an import path 'package.module:function', got {self.function!r}"
        if self.function is not None and not isinstance(self.function, str) and not callable(self.function):
            return f"transform must be an import path or a callable, got {type(self.function).__name__}"
        if self.body_format not in BODY_FORMATS:
            return f"body_format must be one of {', '.join(BODY_FORMATS)}, got {self.body_format!r}"
        if self.body_format == "json" and not (self.body_schema or "").strip():
            return "body_format 'json' needs body_schema (Spark DDL, e.g. 'id STRING, amount DECIMAL(12,2)')"
        if self.body_format == "raw" and self.body_schema is not None:
            return "body_schema needs body_format 'json'"
        if self.on_bad_record not in BAD_RECORD_MODES:
            return f"on_bad_record must be one of {', '.join(BAD_RECORD_MODES)}, got {self.on_bad_record!r}"
        return None

    @property
    def active(self) -> bool:
        """Whether anything runs between read and sink (else the job lands raw records)."""
        return self.sql is not None or self.function is not None or self.body_format != "raw"

    @property
    def decodes(self) -> bool:
        return self.body_format != "raw"

    @property
    def dead_letters(self) -> bool:
        """Whether records that do not decode are set aside (and counted) rather than kept or failed."""
        return self.decodes and self.on_bad_record == "dead_letter"

    def load_function(self) -> Callable[[Any], Any]:
        """The function (imported from its path); one-line :class:`TransformError` when it cannot."""
        if self.function is None:
            raise TransformError("no transform function given")
        if not isinstance(self.function, str):
            return self.function
        module_name, _, attr = self.function.partition(":")
        try:
            found: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                found = getattr(found, part)
        except Exception as exc:  # ImportError, AttributeError, or the module's own error at import
            raise TransformError(f"transform {self.function!r} does not import: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                                 ) from None
        if not callable(found):
            raise TransformError(f"transform {self.function!r} is not callable")
        return found  # type: ignore[no-any-return]

    @property
    def function_name(self) -> str | None:
        """The function's import path (a callable: its module and qualified name)."""
        if self.function is None or isinstance(self.function, str):
            return self.function
        return f"{getattr(self.function, '__module__', '?')}:{getattr(self.function, '__qualname__', '?')}"

    def fingerprint(self) -> str:
        """A short stable hash of what decides the output: the SQL text; the function's name, the hash
        of its whole module's source (a changed function, or a constant or helper of its module,
        changes it) and its distribution's version; the decoding. Recorded per range. What it cannot
        see: a change in another module the function calls, or in data it reads."""
        code = version = None
        if self.function is not None:
            try:
                code, version = _code_of(self.load_function())
            except TransformError:  # refused before any claim (the batch's check): no fingerprint needed
                code = version = None
        data = {"sql": self.sql, "function": self.function_name, "code": code, "version": version,
                "body_format": self.body_format, "body_schema": self.body_schema,
                "on_bad_record": self.on_bad_record}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for status and the audit: which transform produced a range."""
        parts = []
        if self.decodes:
            parts.append(f"{self.body_format} body ({self.on_bad_record} on bad records)")
        if self.sql is not None:
            parts.append("sql " + " ".join(self.sql.split())[:80])
        if self.function is not None:
            parts.append(f"transform {self.function_name}")
        return ", ".join(parts) or "raw records"

    def to_dict(self) -> dict[str, Any]:
        """The JSON a submitted job takes (``--transform``); a callable cannot cross a process."""
        if self.function is not None and not isinstance(self.function, str):
            raise TransformError("a transform given as a callable runs only in this process: give its import "
                                 "path 'package.module:function' for a spark-submit job")
        return {"sql": self.sql, "function": self.function, "body_format": self.body_format,
                "body_schema": self.body_schema, "on_bad_record": self.on_bad_record}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Transform:
        known = {"sql", "function", "body_format", "body_schema", "on_bad_record"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TransformError(f"unknown transform settings {unknown}")
        made = cls(**{k: v for k, v in data.items() if v is not None})
        problem = made.problem()
        if problem is not None:
            raise TransformError(problem)
        return made


def _code_of(function: Callable[[Any], Any]) -> tuple[str | None, str | None]:
    """The hash of the source of the module defining ``function`` (its own source when the module's
    cannot be read) and the version of the distribution that module belongs to, if installed."""
    module = inspect.getmodule(function)
    try:
        source = inspect.getsource(module) if module is not None else inspect.getsource(function)
    except (OSError, TypeError):
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            source = None
    code = hashlib.sha256(source.encode()).hexdigest() if source is not None else None
    top = (getattr(module, "__name__", "") or "").split(".")[0]
    return code, _version_of(top) if top else None


@functools.cache
def _version_of(top: str) -> str | None:
    """The version of the installed distribution holding top-level package ``top`` (None: none), once
    per process: finding it scans every installed distribution's metadata."""
    from importlib import metadata

    try:
        names = metadata.packages_distributions().get(top) or []
        return metadata.version(names[0]) if names else None
    except Exception:  # metadata unreadable: the source hash still speaks
        return None


def lineage_problem(columns: list[str], reserved: tuple[str, ...] = ()) -> str | None:
    """Why a transform's output columns clash with the lineage the job (and a table sink) appends."""
    clash = [c for c in columns if c in LINEAGE_COLUMNS or c in reserved]
    if clash:
        return (f"the transform's output has column(s) {', '.join(clash)}, which the batch appends itself "
                "(lineage): rename them")
    return None
