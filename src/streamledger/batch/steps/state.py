"""What one batch holds while its steps run: the configuration, the ledger, broker and runner it was
given, and what each step leaves for the next (the partitions, the survey's answers, the staging
directory, the publish leases). Apart from the steps so that each step module types against the one
state they share, and so that :class:`~streamledger.batch.run.BatchRun` is only the sequence."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import plan, sinks
from streamledger.batch.config import (
    BatchConfig,
    BatchResult,
    Broker,
    JobRunner,
    PartitionResult,
    PartitionStatus,
    RunId,
    StepHook,
)
from streamledger.batch.position import LogOffsets, PipelineSource, cluster_name
from streamledger.batch.sinks import choose
from streamledger.progress import LoggedProgress, ReadProgress

if TYPE_CHECKING:
    from streamledger.batch.steps.publish import Leases
    from streamledger.ledger import Ledger, OffsetRange, SourcePosition, SourceRef


@dataclass
class Part:
    """One partition's live state inside a batch: its result row and its ledger range."""

    result: PartitionResult
    source: SourceRef
    range: OffsetRange | None = None
    staging: str | None = None


class BatchState:
    """One batch's state and the helpers every step uses (its file system, its sink, the ``on_step``
mark, the partitions it may move); the steps are mixins over it (:mod:`streamledger.batch.steps`)."""

    def __init__(
        self,
        config: BatchConfig,
        *,
        run: RunId,
        ledger: Ledger,
        broker: Broker,
        runner: JobRunner,
        holder_alive: Callable[[RunId], bool] | None = None,
        on_step: StepHook | None = None,
        progress: ReadProgress | None = None,
    ) -> None:
        self.config = config
        self.progress: ReadProgress = progress or LoggedProgress()
        self.run = run
        self.ledger = ledger
        self.broker = broker
        self.runner = runner
        self.holder_alive = holder_alive
        self.on_step = on_step
        self.transform = config.transformation()
        """What runs between read and sink per range (None: raw records)."""
        self.fingerprint = self.transform.fingerprint() if self.transform is not None else None
        self.output_schema: Any = None
        self.source = PipelineSource(config.pipeline, config.url, stream=config.stream,
                                     super_stream=config.super_stream, broker_name=config.broker_name)
        name = config.broker_name or cluster_name(broker)
        self.identity = self.source.identity(broker)
        self._legacy = plan.broker_identity(config.url) if name else None
        self.result = BatchResult(pipeline=config.pipeline, broker=self.identity,
                                  super_stream=config.super_stream)
        self.parts: list[Part] = []
        self.staging: str | None = None
        self._fs: filesystems.OutputFS | None = None
        self._sink: sinks.Sink | None = None
        self._started: datetime | None = None  # when this batch began claiming (ledger's clock)
        self.token = run.attempt_token(uuid.uuid4().hex[:8])
        """This attempt as a publish-lease holder."""
        self.epochs: dict[str, int] = {}
        self._leases: Leases | None = None  # while publish_ranges runs
        self._reread = True  # False once the broker holds another stream: never read it for the old
        self._probed: dict[str, tuple[int, int, int]] = {}  # stream -> (start, end, user records seen)
        self._seen_log: LogOffsets | None = None  # what the survey asked the log (its tails and stats)
        self._stored: dict[str, int | None] = {}  # stream -> the broker's stored offset the survey saw
        self._unchecked: dict[str, tuple[int, int | None, SourcePosition, int]] = {}
        """Settled sources whose identity check waits (:func:`plan.settled`): stream -> its tail, stored
        offset, position and the end of what it may claim unchecked (the tail: no user record
        below it past the ledger's end)."""

    @property
    def fs(self) -> filesystems.OutputFS:
        """The output root's file system: local for plain paths, else the runner's (``filesystem``,
        optional) for URIs; resolved on first use, so a batch with nothing to write needs none."""
        if self._fs is None:
            self._fs = filesystems.filesystem_for(self.config.output_root, self.runner)
        return self._fs

    @property
    def sink(self) -> sinks.Sink:
        """What publishing means for this batch (``BatchConfig.sink``); built on first use."""
        if self._sink is None:
            schema = () if self.output_schema is None else (self.output_schema,)  # what a transform writes
            self._sink = choose.make_sink(self.config, self.ledger, *schema)
        return self._sink

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name, self)

    def _source(self, stream: str) -> SourceRef:
        from streamledger.ledger import SourceRef

        return SourceRef(broker=self.identity, stream=stream, super_stream=self.config.super_stream)

    def streams(self) -> list[str]:
        return self.source.streams(self.broker)

    def _final(self, stream: str, start: int, end: int) -> str:
        """A range's published directory (one per committed range, apart per pipeline, broker and
        stream; the epoch keeps a re-created stream's ranges apart from the old stream's): where the
        sink wants it."""
        return self.sink.range_dir(self.identity, stream, start, end, self.epochs.get(stream, 0))

    def touched(self) -> list[Part]:
        """The partitions this batch may move: all but the idle ones the survey left unchecked (no user
        record past the ledger's end, nothing to publish or store: :func:`plan.settled`), which the
        batch leaves as if it had not run once their claim is settled."""
        return [p for p in self.parts if p.result.stream not in self._unchecked]

    def to_read(self) -> list[Part]:
        return [p for p in self.parts if p.result.status == PartitionStatus.CLAIMED]
