"""The ``_manifest.json`` record: what a read job wrote, and what a published range holds.

One typed record crosses three rooms: the Spark job writes it next to its files, the batch checks
it against its claims (and writes the range's own copy into the published directory), and the
audit compares a published copy with the ledger. Reading it by hand in each room gave three
slightly different readings; here it is parsed and checked once, with one-line errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamledger.errors import StreamledgerError

MANIFEST = "_manifest.json"
"""The file name of the manifest in a job's output and in every published range directory."""


def is_data_file(relative: str) -> bool:
    """Whether a file of a range directory (its path relative to the directory) holds the range's
    data: no part of the path starts with ``_`` or ``.`` (the manifest, Spark's markers and checksums,
    a transform's ``_dead_letter`` directory are not data)."""
    return not any(part.startswith(("_", ".")) for part in relative.split("/"))


class ManifestError(StreamledgerError):
    """A manifest that is missing a field, has a field of the wrong type, or is not JSON."""


def _int(data: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> int | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"{where}: {key!r} must be an integer, got {value!r}")
    return value


def _str(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ManifestError(f"{where}: {key!r} must be a string, got {value!r}")
    return value


def _files(value: Any, where: str = "manifest") -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{where}: 'files' must be a list of names, got {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One stream's part of a job: the span asked for, what was written, and where."""

    start: int
    end: int
    records: int
    first_offset: int | None
    last_offset: int | None
    path: str | None = None
    read_start: int | None = None
    lost: tuple[tuple[int, int], ...] = ()
    files: tuple[str, ...] | None = None
    """The data files that count (relative to ``path``), in a job's manifest written by the Arrow
    writer; None where the writer does not list them (the JVM writer)."""
    rows: int | None = None
    """With a transform: the rows it wrote for the range (``records`` stays the records read)."""
    dead_letter: int | None = None
    """With a transform decoding bodies and ``on_bad_record="dead_letter"``: records set aside."""

    @classmethod
    def from_dict(cls, stream: str, data: Any) -> StreamEntry:
        where = f"manifest entry of stream {stream!r}"
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where} is not an object")
        lost_raw = data.get("lost") or ()
        try:
            lost = tuple((int(a), int(b)) for a, b in lost_raw)
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: 'lost' must be a list of [start, end] pairs") from exc
        return cls(
            start=_int(data, "start", where) or 0,
            end=_int(data, "end", where) or 0,
            records=_int(data, "records", where) or 0,
            first_offset=_int(data, "first_offset", where, optional=True),
            last_offset=_int(data, "last_offset", where, optional=True),
            path=_str(data, "path", where),
            read_start=_int(data, "read_start", where, optional=True),
            lost=lost,
            files=_files(data.get("files"), where),
            rows=_int(data, "rows", where, optional=True),
            dead_letter=_int(data, "dead_letter", where, optional=True),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "start": self.start,
            "end": self.end,
            "records": self.records,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
        }
        if self.path is not None:
            out["path"] = self.path
        if self.read_start is not None:
            out["read_start"] = self.read_start
        if self.lost:
            out["lost"] = [list(span) for span in self.lost]
        if self.files is not None:
            out["files"] = list(self.files)
        if self.rows is not None:
            out["rows"] = self.rows
        if self.dead_letter is not None:
            out["dead_letter"] = self.dead_letter
        return out

    @property
    def counts(self) -> tuple[int, int | None, int | None]:
        """``(records, first_offset, last_offset)``: what the ledger commits for the range."""
        return (self.records, self.first_offset, self.last_offset)


@dataclass(frozen=True, slots=True)
class Manifest:
    """A job's manifest; a published range's copy also names its pipeline, broker and ledger range."""

    streams: dict[str, StreamEntry]
    output: str | None = None
    format: str | None = None
    decode: str | None = None
    splits: int | None = None
    written_at: str | None = None
    pipeline: str | None = None
    broker: str | None = None
    range_id: int | None = None
    files: tuple[str, ...] | None = None
    """A published range's data files (relative names): the audit compares the directory with it, so
    a file deleted, added or copied there is found without reading any data."""
    transform: str | None = None
    """The fingerprint of the transform that wrote the rows (``Transform.fingerprint``); None: raw."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know (kept, so a newer writer's fields survive a rewrite)."""

    _KNOWN = ("streams", "output", "format", "decode", "splits", "written_at", "pipeline", "broker",
              "range_id", "files", "transform")

    @property
    def rows_elsewhere(self) -> bool:
        """A streaming micro-batch's range (``extra["streaming"]``, the recorder's): its rows are in the
        query's own sink, its directory holds this manifest only, so no row count is compared."""
        return "streaming" in self.extra

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, Mapping):
            raise ManifestError("manifest is not a JSON object")
        streams = data.get("streams")
        if not isinstance(streams, Mapping):
            raise ManifestError("manifest has no 'streams' object")
        return cls(
            streams={str(s): StreamEntry.from_dict(str(s), e) for s, e in streams.items()},
            output=_str(data, "output", "manifest"),
            format=_str(data, "format", "manifest"),
            decode=_str(data, "decode", "manifest"),
            splits=_int(data, "splits", "manifest", optional=True),
            written_at=_str(data, "written_at", "manifest"),
            pipeline=_str(data, "pipeline", "manifest"),
            broker=_str(data, "broker", "manifest"),
            range_id=_int(data, "range_id", "manifest", optional=True),
            files=_files(data.get("files")),
            transform=_str(data, "transform", "manifest"),
            extra={k: v for k, v in data.items() if k not in cls._KNOWN},
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out["streams"] = {s: e.to_dict() for s, e in self.streams.items()}
        for key in ("output", "format", "decode", "splits", "written_at", "pipeline", "broker", "range_id",
                    "transform"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.files is not None:
            out["files"] = list(self.files)
        return out

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode()

    def entry(self, stream: str) -> StreamEntry | None:
        return self.streams.get(stream)

    def entry_path(self, stream: str, output: str) -> str:
        """Where the job wrote ``stream``'s records (a job of one stream may write flat into output)."""
        entry = self.streams.get(stream)
        if entry is not None and entry.path:
            return entry.path
        if len(self.streams) == 1:
            return output
        raise ManifestError(f"the job's manifest gives no path for stream {stream!r}")

    def for_range(self, stream: str, *, pipeline: str, broker: str, range_id: int, output: str,
                  files: Sequence[str] | None = None) -> Manifest:
        """The published copy for one range: only its stream, named by pipeline, broker and range id."""
        entry = self.streams[stream]
        return replace(self, streams={stream: replace(entry, path=None, files=None)}, pipeline=pipeline,
                       broker=broker, range_id=range_id, output=output,
                       files=None if files is None else tuple(sorted(files)))
