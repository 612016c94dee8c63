"""The columnar batch that range reads yield.

Columns rather than one object per record: the decoder fills whole lists with ``extend`` and
the Spark layer turns them into Arrow arrays without touching each record again, which is what
keeps the per-record Python cost of the hot path low.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(slots=True)
class RecordBatch:
    """Records of one stream, one list per column, all columns the same length.

    ``properties``, ``application_properties`` and ``message_annotations`` are ``None`` as whole
    columns when the batch was decoded with ``decode="raw"``; with ``decode="amqp"`` they hold one
    entry per record, ``None`` for a record without that section (or a record that is not AMQP).
    """

    stream: str
    offsets: list[int]
    chunk_timestamps: list[int]
    bodies: list[bytes]
    properties: list[dict[str, Any] | None] | None
    application_properties: list[dict[str, Any] | None] | None
    message_annotations: list[dict[str, Any] | None] | None

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def empty(cls, stream: str, decode: Literal["amqp", "raw"]) -> RecordBatch:
        """A batch with no records whose dict columns match the decode mode."""
        if decode == "raw":
            return cls(stream, [], [], [], None, None, None)
        if decode != "amqp":
            raise ValueError(f"decode must be 'amqp' or 'raw', not {decode!r}")
        return cls(stream, [], [], [], [], [], [])


#: The most body bytes one :class:`BufferBatch` holds: its body offsets are int32 (Arrow ``binary``).
MAX_BUFFER_BYTES = 2**31 - 1


@dataclass(slots=True)
class BufferBatch:
    """Records of one stream as flat buffers: no Python object per record (``layout="buffers"``).

    Why: turning per-record lists into Arrow arrays cost more than reading the records; these
    buffers *are* Arrow's layout, so the Spark layer and the CLI wrap them without a copy
    (``pyarrow.Array.from_buffers``), while this package stays free of pyarrow.

    * Offsets and timestamps come as **runs**, one per chunk: records ``run_starts[i]`` ..
      ``run_starts[i] + run_lengths[i] - 1`` all carry ``run_timestamps[i]`` (ms since the epoch).
    * ``body_data`` holds the bodies back to back; ``body_offsets`` holds ``len(self) + 1`` int32 in
      native byte order (``array('i')`` / ``memoryview.cast('i')``), the first 0 and body ``k``
      spanning ``body_data[o[k]:o[k+1]]``; at most :data:`MAX_BUFFER_BYTES` body bytes.
    * The map columns are ``None`` when every record of the batch lacks that section, or when they
      were not asked for (``maps=False``); otherwise one entry per record like :class:`RecordBatch`.
    """

    stream: str
    run_starts: list[int]
    run_lengths: list[int]
    run_timestamps: list[int]
    body_data: bytearray
    body_offsets: bytearray
    properties: list[dict[str, Any] | None] | None = None
    application_properties: list[dict[Any, Any] | None] | None = None
    message_annotations: list[dict[Any, Any] | None] | None = None
    count: int = 0

    def __len__(self) -> int:
        return self.count

    @classmethod
    def empty(cls, stream: str) -> BufferBatch:
        return cls(stream, [], [], [], bytearray(), bytearray(_ZERO32))

    def add_run(self, start: int, length: int, timestamp: int) -> None:
        """Record that the ``length`` bodies just appended have offsets ``start..`` and ``timestamp``;
        a map column that got no entries for them (see :meth:`add_maps`) is padded with nulls."""
        self.run_starts.append(start)
        self.run_lengths.append(length)
        self.run_timestamps.append(timestamp)
        self.count += length
        for column in (self.properties, self.application_properties, self.message_annotations):
            if column is not None and len(column) < self.count:
                column.extend([None] * (self.count - len(column)))

    def add_maps(
        self,
        properties: list[dict[str, Any] | None],
        application_properties: list[dict[Any, Any] | None],
        message_annotations: list[dict[Any, Any] | None],
    ) -> None:
        """Append the map entries of the records about to be added (before :meth:`add_run`); a column
        stays ``None`` (all null, O(1)) until one record has that section."""
        before = self.count
        if self.properties is not None or any(v is not None for v in properties):
            self.properties = self.properties if self.properties is not None else [None] * before
            self.properties.extend(properties)
        if self.application_properties is not None or any(v is not None for v in application_properties):
            if self.application_properties is None:
                self.application_properties = [None] * before
            self.application_properties.extend(application_properties)
        if self.message_annotations is not None or any(v is not None for v in message_annotations):
            if self.message_annotations is None:
                self.message_annotations = [None] * before
            self.message_annotations.extend(message_annotations)

    def offsets(self) -> list[int]:
        """The record offsets as a list (for tests and small batches; the hot path uses the runs)."""
        return [o for s, n in zip(self.run_starts, self.run_lengths, strict=True) for o in range(s, s + n)]

    def chunk_timestamps(self) -> list[int]:
        return [t for t, n in zip(self.run_timestamps, self.run_lengths, strict=True) for _ in range(n)]

    def bodies(self) -> list[bytes]:
        ends = memoryview(self.body_offsets).cast("i")
        data = bytes(self.body_data)
        return [data[ends[k] : ends[k + 1]] for k in range(self.count)]

    def to_record_batch(self) -> RecordBatch:
        """The same records as a :class:`RecordBatch` (``decode="amqp"`` form: dict columns filled)."""
        n = self.count
        return RecordBatch(
            self.stream, self.offsets(), self.chunk_timestamps(), self.bodies(),
            list(self.properties) if self.properties is not None else [None] * n,
            list(self.application_properties) if self.application_properties is not None else [None] * n,
            list(self.message_annotations) if self.message_annotations is not None else [None] * n,
        )


_ZERO32 = (0).to_bytes(4, sys.byteorder)
