"""One scenario's world: a fresh stream, ledger and output roots, and the driving of each operation
through the public API (``run_batch``, ``BatchConfig``, ``Ledger``, the CLI), as a user would."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from streamledger.batch import BatchConfig, InjectedCrash, LocalSparkRunner, RunId, run_batch
from streamledger.ledger import Ledger, SourceRef
from streamledger.protocol.rabbitmq import StreamClient
from tests.model.ops import (
    AuditCli,
    Batch,
    Cure,
    NewEpoch,
    Op,
    Pair,
    PipelineSpec,
    Publish,
    Recreate,
    ReleaseStale,
    Scenario,
    Stream,
    Tick,
    describe,
)
from tests.model.oracle import STREAMING, make_body
from tests.model.streaming import NAMESPACE, QueryJob, run_query

#: The open defect a streaming query before a pinned pipeline's first interval run meets: not drawn
#: into the world until fixed (its test is xfail(strict=True)).
KNOWN_PINNED_AFTER_QUERY = ("tests/integration/spark/test_streaming_pinned.py::"
                            "test_a_pinned_batch_on_a_history_a_streaming_query_recorded_is_refused_before_any_claim")
#: The pipelines' transforms (issue 42) as the user's SQL over the view ``records``: each body is
#: ``<tag>-<sequence number>|<pad>``. The oracle predicts their rows in plain Python
#: (:func:`tests.model.oracle.predict`), never from this text.
_ID = "substring_index(CAST(body AS STRING), '|', 1)"
_SEQ = f"CAST(substring_index({_ID}, '-', -1) AS INT)"
TRANSFORM_SQL = {
    "filter": f"SELECT {_ID} AS id, offset FROM records WHERE pmod({_SEQ}, 3) <> 0",
    "explode": f"SELECT {_ID} AS id, offset, item FROM records "
               f"LATERAL VIEW explode(sequence(1, pmod({_SEQ}, 3) + 1)) x AS item",
    "aggregate": f"SELECT pmod({_SEQ}, 4) AS bucket, count(*) AS n, sort_array(collect_list({_ID})) AS ids, "
                 f"min(offset) AS first FROM records GROUP BY pmod({_SEQ}, 4)",
}
#: Retention small enough that a few padded publishes drop the oldest segments.
RETENTION: dict[str, Any] = {"max_length_bytes": 60_000, "max_segment_size_bytes": 15_000}
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Servers:
    """What every scenario shares: the broker (base URL ending in ``/``), local Spark, and a maker of
    fresh ledger URLs (``ledger(dir)``: SQLite in ``dir`` or a new PostgreSQL database)."""

    url: str
    spark: Any
    ledger: Callable[[Path], str]
    ledger_kind: str


def spelled(url: str, spelling: str) -> str:
    """The broker URL with the default vhost written as ``spelling`` (``/``, ``/%2F`` or ``/%2f``)."""
    base = url.rstrip("/")
    head, _, tail = base.partition("://")
    host, _, _vhost = tail.partition("/")
    return f"{head}://{host}{spelling}"


def batch_config(spec: PipelineSpec, op: Batch, *, url: str, stream: str, root: str,
                 boundaries: list[datetime]) -> BatchConfig | None:
    """The batch's configuration, or None when its interval is not closed yet (pinned pipelines)."""
    kw: dict[str, Any] = {
        "pipeline": spec.name, "url": spelled(url, op.spelling), "output_root": root, "stream": stream,
        "sink": spec.sink, "on_data_loss": spec.on_data_loss, "store_offset": op.store_offset,
        "heartbeat_interval": 1.0, "claim_timeout": 5.0,
    }
    if spec.pinned:
        i = op.interval if op.interval is not None else -1
        if i < 0 or i + 1 >= len(boundaries):
            return None
        kw.update(interval_start=boundaries[i], interval_end=boundaries[i + 1], bound_by_interval=True,
                  interval_grace=0.0, origin=boundaries[0], initial_position=spec.initial_position)
    else:
        kw["max_offsets"] = spec.max_offsets
    if spec.transform is not None:
        kw["sql"] = TRANSFORM_SQL[spec.transform]
    return BatchConfig(**kw)


def run_id(op: Batch) -> RunId:
    return RunId("model", op.run, f"p{op.pipe}", try_number=op.attempt)


@dataclass
class Figures:
    ops: int = 0
    batches: int = 0
    kills: int = 0
    sigkills: int = 0
    failures: int = 0
    streams: int = 0  # streaming queries run (available-now)
    injected: int = 0  # of the failures, the ordinary exceptions the model raised at a step (fail@)
    published: int = 0
    checks: int = 0
    records_checked: int = 0
    audits: int = 0
    transformed: int = 0  # batches of pipelines with a transform
    ranges_predicted: int = 0  # range outputs of a transform compared with the oracle's prediction


@dataclass
class World:
    """The live state of one scenario (everything under ``home``)."""

    servers: Servers
    scenario: Scenario
    home: Path
    log: Callable[[str], None] = print
    figures: Figures = field(default_factory=Figures)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.stream = f"model-{self.tag}"
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "ledger").mkdir(exist_ok=True)
        self.ledger_url = self.servers.ledger(self.home / "ledger")
        self.ledger = Ledger(self.ledger_url, create=True)
        self.client = StreamClient.connect(self.servers.url)
        self.client.create_stream(self.stream, **(RETENTION if self.scenario.retention else {}))
        self.boundaries: list[datetime] = [datetime.now(UTC) - timedelta(milliseconds=5)]
        time.sleep(0.02)
        self.seq = 0
        #: the publish count at each boundary: ids below ``tick_seq[i]`` were published before boundary i
        self.tick_seq: list[int] = [0]
        #: pipe -> ids below this publish count the model deliberately does not read (``ledger skip``)
        self.skip_below: dict[int, int] = {}
        #: pipe -> the stream's first offset when a pipeline starting at ``first`` first ran on this
        #: incarnation of the stream: what retention took before that was never the pipeline's
        self.born: dict[int, int] = {}
        #: pipe -> the first offset when a batch of a pipeline without history started: its ``born``
        #: once a batch claimed (the ledger holds a range), dropped when none did (a batch killed
        #: before its claim begins no history: the next batch's first run decides, as the product's)
        self.unborn: dict[int, int] = {}
        self.drain_errors: dict[int, str] = {}  # pipe -> the last failure of a drain retry
        self.running: set[tuple[str, str]] = set()
        self.last_attempt: dict[tuple[int, str], int] = {}
        self.unfinished: set[tuple[int, str]] = set()
        self.needs_epoch: set[int] = set()
        self.outcomes: list[str] = []
        #: offset -> id of every record the oracle ever saw on this incarnation of the stream (the
        #: records retention removed later are still known, so their loss can be told).
        self.seen: dict[int, str] = {}
        #: ``seen`` of every earlier incarnation of the stream, oldest first (the one a re-create deleted)
        self.retired: list[dict[int, str]] = []
        #: the publish count where this incarnation of the stream began; ``retired_ids`` holds each
        #: earlier incarnation's ``(first publish count, end publish count, tail when deleted)``
        self.first_seq = 0
        self.retired_ids: list[tuple[int, int, int]] = []
        #: pipe -> the greatest committed tail of this incarnation a batch of it saw when it claimed
        #: (the broker's tail just before a batch that reached its ``claimed`` step): what the
        #: pipeline knew the stream held. ``retired_tails``: the same of each earlier incarnation.
        self.tails: dict[int, int] = {}
        self.retired_tails: list[dict[int, int]] = []
        self.retired_born: list[dict[int, int]] = []  # ``born`` of each earlier incarnation
        #: pipe -> the epochs of its history its batches claimed in on this incarnation (one history
        #: may reach over two incarnations when a re-create went unnoticed: nothing was read yet);
        #: ``retired_claimed``: the same of each earlier incarnation
        self.claimed: dict[int, set[int]] = {}
        self.retired_claimed: list[dict[int, set[int]]] = []
        self.cli_verdict: tuple[int, bool] | None = None  # (pipe, CLEAN?) of this op's CLI audit
        self.queries: dict[int, int] = {}  # pipe -> its streaming queries so far (the last one reusable)
        #: (pipe, what went wrong) of compositions the product must refuse and did not refuse cleanly
        self.refusals: list[tuple[int, str]] = []
        #: (pipe, what went wrong) of cures the product accepted although the request was wrong, or
        #: refused after writing
        self.cure_defects: list[tuple[int, str]] = []

    # -- places ----------------------------------------------------------------------------------

    def root(self, pipe: int) -> Path:
        """Two levels below ``home``, so a name escaping by ``../..`` still lands inside ``home``."""
        return self.home / "a" / "b" / f"out-{pipe}"

    def allowed(self) -> list[Path]:
        return [self.root(k) for k in range(len(self.scenario.pipelines))] + [self.home / "ledger"]

    def catalog(self, pipe: int) -> dict[str, str]:
        from streamledger.batch.sinks.iceberg import catalog_properties

        return catalog_properties(None, ledger_url=self.ledger_url, output_root=str(self.root(pipe)))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.delete_stream(self.stream, missing_ok=True)
        with contextlib.suppress(Exception):
            self.client.close()
        with contextlib.suppress(Exception):
            self.ledger.close()

    # -- operations ------------------------------------------------------------------------------

    def apply(self, op: Op) -> str:
        self.figures.ops += 1
        self.cli_verdict = None
        if isinstance(op, Publish):
            return self.publish(op.n, op.pad)
        if isinstance(op, Tick):
            time.sleep(0.01)
            self.boundaries.append(datetime.now(UTC))
            self.tick_seq.append(self.seq)
            time.sleep(0.01)
            return f"interval {len(self.boundaries) - 2} closed"
        if isinstance(op, Batch):
            if op.how == "sigkill" and op.kill_at is None:
                return self.batch_subprocess(op)
            return self.batch(op)
        if isinstance(op, Pair):
            return self.pair(op)
        if isinstance(op, Stream):
            return self.stream_query(op)
        if isinstance(op, Recreate):
            self.retired_claimed.append(self.claimed)
            self.claimed = {}
            self.retired_ids.append((self.first_seq, self.seq, self.client.committed_tail(self.stream)))
            self.first_seq = self.seq
            self.client.delete_stream(self.stream)
            self.client.create_stream(self.stream, **(RETENTION if self.scenario.retention else {}))
            self.needs_epoch = set(range(len(self.scenario.pipelines)))
            self.retired.append(self.seen)
            self.seen = {}
            self.retired_tails.append(self.tails)
            self.tails = {}
            self.retired_born.append(self.born)
            self.born = {}
            return "stream deleted and re-created"
        if isinstance(op, NewEpoch):
            return self.new_epoch(op.pipe)
        if isinstance(op, ReleaseStale):
            released = self.ledger.release_stale(timedelta(0))
            return f"released {len(released)} claim(s)"
        if isinstance(op, Cure):
            return self.cure(op)
        if isinstance(op, AuditCli):
            clean = self.audit_cli(op.pipe, op.spelling)
            self.cli_verdict = (op.pipe, clean)
            return "CLI audit " + ("CLEAN" if clean else "not clean")
        raise TypeError(f"unknown operation {op!r}")

    def publish(self, n: int, pad: int) -> str:
        ids = self.ids(self.seq, self.seq + n)
        self.seq += n
        result = self.client.publish(self.stream, [make_body(i, pad) for i in ids], batch_size=50)
        assert result.confirmed == n, result
        self.figures.published += n
        return f"published {ids[0]}..{ids[-1]}" if ids else "published nothing"

    def ids(self, first: int, end: int) -> list[str]:
        """The ids published from publish count ``first`` up to ``end``, in order."""
        return [f"{self.tag}-{q:06d}" for q in range(first, end)]

    def holder_alive(self, run: RunId) -> bool:
        return (run.run_id, run.task_id) in self.running

    def _config(self, op: Batch) -> BatchConfig | None:
        return batch_config(self.scenario.pipelines[op.pipe], op, url=self.servers.url, stream=self.stream,
                            root=str(self.root(op.pipe)), boundaries=self.boundaries)

    def _first_run(self, pipe: int) -> None:
        spec = self.scenario.pipelines[pipe]
        if spec.initial_position == "first" and pipe not in self.born and pipe not in self.unborn:
            assert threading.current_thread() is threading.main_thread(), "a pair asks before its threads"
            self.unborn[pipe] = self.client.first_offset(self.stream)  # else its history has an origin

    def _settle_born(self) -> None:
        """After batches ran: a pipeline whose batch claimed began its history where ``_first_run``
        saw the stream start; one with no range yet has no history (its next batch decides)."""
        for pipe, first in list(self.unborn.items()):
            del self.unborn[pipe]
            if self.current_sources(pipe):
                self.born[pipe] = first

    def batch(self, op: Batch) -> str:
        cfg = self._config(op)
        if cfg is None:
            return "interval not closed: skipped"
        self._first_run(op.pipe)
        runner = LocalSparkRunner()
        runner._spark = self.servers.spark
        key = (op.run, f"p{op.pipe}")

        tail = -1

        def hook(step: str, batch: Any) -> None:
            if step == "claimed":  # it saw the stream hold everything below ``tail``, in this epoch
                self.tails[op.pipe] = max(self.tails.get(op.pipe, 0), tail)
                epoch = batch.epochs.get(self.stream)
                if epoch is not None:
                    self.claimed.setdefault(op.pipe, set()).add(int(epoch))
            if step == op.kill_at:
                if op.how == "fail":
                    raise RuntimeError(f"model: failure injected after {step}")
                raise InjectedCrash(f"model: killed after {step}")

        self.figures.batches += 1
        self.figures.transformed += self.scenario.pipelines[op.pipe].transform is not None
        self.last_attempt[(op.pipe, op.run)] = max(op.attempt, self.last_attempt.get((op.pipe, op.run), 0))
        self.running.add(key)
        try:  # a connection of its own, as each task process has (a client is not shared by threads)
            with StreamClient.connect(self.servers.url) as client:
                tail = client.committed_tail(self.stream)  # nothing is published while a batch runs
                res = run_batch(cfg, run=run_id(op), ledger=self.ledger, broker=client, runner=runner,
                                holder_alive=self.holder_alive, on_step=hook)
        except InjectedCrash as exc:
            self.figures.kills += 1
            self.unfinished.add((op.pipe, op.run))
            return f"killed ({exc})"
        except Exception as exc:
            self.figures.failures += 1
            self.figures.injected += str(exc).startswith("model: failure injected")
            self.unfinished.add((op.pipe, op.run))
            return f"error: {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            self.running.discard(key)
            if threading.current_thread() is threading.main_thread():  # a pair settles after both
                self._settle_born()
        self.unfinished.discard((op.pipe, op.run))
        return f"ok: {res.records} record(s) " + " ".join(
            f"[{p.start},{p.end}){p.status}" for p in res.partitions)

    def batch_subprocess(self, op: Batch) -> str:
        """A real SIGKILL: the batch runs in a child process (its own Spark), killed ``op.delay`` s in."""
        cfg = self._config(op)
        if cfg is None:
            return "interval not closed: skipped"
        self._first_run(op.pipe)
        spec = self.scenario.pipelines[op.pipe]
        job = {"spec": spec.__dict__, "op": op.__dict__, "url": self.servers.url, "stream": self.stream,
               "root": str(self.root(op.pipe)), "boundaries": [b.isoformat() for b in self.boundaries],
               "ledger": self.ledger_url}
        self.figures.batches += 1
        self.last_attempt[(op.pipe, op.run)] = max(op.attempt, self.last_attempt.get((op.pipe, op.run), 0))
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with tempfile.TemporaryDirectory(prefix="model-child-") as scratch, \
                tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.model.child"], stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, cwd=scratch, env=env, start_new_session=True)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job).encode())  # the URLs may hold passwords: never on argv
            proc.stdin.close()
            try:
                proc.wait(timeout=op.delay)
                killed = False
            except subprocess.TimeoutExpired:
                killed = True
                os.killpg(proc.pid, signal.SIGKILL)  # the child's session: it and its Spark JVM
            proc.wait(timeout=120)
            self._settle_born()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        if killed:
            self.figures.kills += 1
            self.figures.sigkills += 1
            self.unfinished.add((op.pipe, op.run))
            return f"SIGKILLed after {op.delay:.1f} s"
        if proc.returncode != 0:
            self.figures.failures += 1
            self.unfinished.add((op.pipe, op.run))
            return f"child failed: {stderr.strip().splitlines()[-1:]}"
        self.unfinished.discard((op.pipe, op.run))
        return "ok (child): " + stdout.strip()[-200:]

    def stream_query(self, op: Stream) -> str:
        """The pipeline's streaming query, run to the end of an available-now trigger
        (:mod:`tests.model.streaming`): a new query leaves ``startingOffsets`` unset once the pipeline
        has a history (it starts where the ledger ends) and reads from the first offset without one;
        its rows go to ``<root>/_streaming/q<n>/`` in a sink of the pipeline's kind. With ``kill_at``
        it runs in a child process that SIGKILLs itself (and its Spark) mid-batch, and is then
        restarted from its checkpoint here, as docs/spark.md says a crashed query must be."""
        spec = self.scenario.pipelines[op.pipe]
        ranges = self.ledger.ranges(spec.name)
        before = {r.id for r in ranges}
        # a pipeline whose history is pinned to data intervals refuses every query (docs/spark.md)
        live = self.current_sources(op.pipe)
        pinned = sorted(r.id for r in ranges if r.interval is not None and r.source in live)
        if spec.pinned and not pinned:
            return (f"not run: a query before the pinned pipeline's first interval run is the known open "
                    f"defect ({KNOWN_PINNED_AFTER_QUERY})")
        n = self.queries.get(op.pipe, 0)
        if op.checkpoint == "new" or not n:
            n += 1
            self.queries[op.pipe] = n
        where = self.root(op.pipe) / STREAMING / f"q{n}"
        fresh = not (where / "checkpoint").exists()
        born: int | None = None
        if fresh and not self.current_sources(op.pipe):  # no history: from the first offset, as ``first``
            born = self.client.first_offset(self.stream)
        job = QueryJob(url=spelled(self.servers.url, op.spelling), stream=self.stream,
                       ledger_url=self.ledger_url, pipeline=spec.name, root=str(self.root(op.pipe)),
                       where=str(where), sink=spec.sink,
                       table=f"{NAMESPACE}.p{op.pipe}_q{n}", catalog=self.catalog(op.pipe),
                       max_offsets=op.max_offsets, fail_on_data_loss=op.fail_on_data_loss,
                       earliest=born is not None, fail_at=op.fail_at)
        tail = self.client.committed_tail(self.stream)
        self.figures.streams += 1
        killed = ""
        if op.kill_at is not None:
            killed = self._query_subprocess(replace(job, kill_at=op.kill_at, kill_when=op.kill_when,
                                                    fail_at=None))
        error = run_query(self.servers.spark, job)  # after a kill: restarted from its checkpoint
        after = self.ledger.ranges(spec.name)
        mine = [r for r in after if r.id not in before]
        if pinned:
            self._check_refused(op.pipe, error, [(r.id, r.status) for r in ranges],
                                [(r.id, r.status) for r in after], where)
        if mine:  # it claimed: what it saw the stream hold, in the epoch it claimed in
            if born is not None and op.pipe not in self.born:  # its history began there (not if it
                self.born[op.pipe] = born  # died before claiming: the next reader's first run decides)
            self.tails[op.pipe] = max(self.tails.get(op.pipe, 0), tail)
            for src in {r.source for r in mine if "#epoch" not in r.source.broker}:
                (pos,) = self.ledger.positions(spec.name, [src])
                self.claimed.setdefault(op.pipe, set()).add(int(pos.epoch))
        spans = " ".join(f"[{r.start},{r.end}){r.status.value}" for r in sorted(mine, key=lambda r: r.start))
        if error is not None:
            self.figures.failures += 1
            self.figures.injected += "model: query dies" in error
            first = _error_line(error)
            return f"{killed}query q{n} failed: {first.strip()[:300]} {spans}".rstrip()
        return f"{killed}query q{n} ok: {spans or 'nothing new'}"

    def _check_refused(self, pipe: int, error: str | None, before: list[Any], after: list[Any], where: Path
                       ) -> None:
        """A query on a history pinned to data intervals must fail, having claimed nothing and written
        nothing (its checkpoint aside): with the line saying so, or refused earlier for another reason
        (retention took its start, ``failOnDataLoss``); else a refusal problem the judge reports."""
        wrote = sorted(str(p.relative_to(where)) for p in where.rglob("*")
                       if p.is_file() and p.relative_to(where).parts[0] != "checkpoint")
        problems = []
        if error is None:
            problems.append("not refused")
        if before != after:
            problems.append("the ledger's ranges changed")
        if wrote:
            problems.append(f"it wrote {len(wrote)} file(s): {', '.join(wrote[:3])}")
        if problems:
            self.refusals.append((pipe, "; ".join(problems)))

    def _query_subprocess(self, job: QueryJob) -> str:
        """The query in a child process (its own Spark) that SIGKILLs itself at micro-batch
        ``job.kill_at``; one line on what happened to it."""
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with tempfile.TemporaryDirectory(prefix="model-child-") as scratch, \
                tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.model.child"], stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, cwd=scratch, env=env, start_new_session=True)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"query": job.to_json()}).encode())  # never on argv
            proc.stdin.close()
            try:
                proc.wait(timeout=420)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left (its JVM)
            proc.wait(timeout=120)
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if proc.returncode == -signal.SIGKILL:
            self.figures.kills += 1
            self.figures.sigkills += 1
            return f"SIGKILLed at micro-batch {job.kill_at} {job.kill_when.replace('_', ' ')}, restarted: "
        why = f": {_error_line(stderr)[:200]}" if proc.returncode else ""
        return f"child ended (exit {proc.returncode}{why}), restarted: "

    def pair(self, op: Pair) -> str:
        results: list[str] = ["", ""]
        for b in (op.a, op.b):  # the world's own client is not shared by the threads
            if self._config(b) is not None:
                self._first_run(b.pipe)

        def go(i: int, b: Batch) -> None:
            try:
                results[i] = self.batch(b)
            except BaseException as exc:  # reported as the op's outcome
                results[i] = f"thread died: {type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=go, args=(i, b)) for i, b in enumerate((op.a, op.b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        self._settle_born()
        return f"A: {results[0]} | B: {results[1]}"

    def current_sources(self, pipe: int) -> list[SourceRef]:
        """The pipeline's sources on this stream in the current history (not a retired epoch)."""
        name = self.scenario.pipelines[pipe].name
        found = {r.source for r in self.ledger.ranges(name)
                 if r.source.stream == self.stream and "#epoch" not in r.source.broker}
        return sorted(found, key=lambda s: s.broker)

    def new_epoch(self, pipe: int) -> str:
        """``ledger new-epoch`` of each current source, as the operator runs it (checked on the broker:
        a history that already reads the re-created stream, the re-create unnoticed because nothing
        was read yet, is refused, and goes on on the new stream)."""
        name = self.scenario.pipelines[pipe].name
        done: list[str] = []
        for src in self.current_sources(pipe):
            code, line = self.cli(["ledger", "new-epoch", "--pipeline", name, "--stream", src.stream,
                                   "--broker", src.broker, "--reason", "model: stream re-created"])
            if code == 2 and "still holds the stream" in line:
                done.append(f"{src.broker} kept (the broker holds the stream it read)")
            elif code != 0:
                return f"refused: {line}"
            else:
                done.append(f"{src.broker} {line.split(': ')[-1][:80]}")
        self.needs_epoch.discard(pipe)
        return "new epoch: " + (", ".join(done) or "no history yet")

    def skip_cli(self, pipe: int, src: SourceRef, start: int, end: int, spelling: str) -> str:
        """``streamledger ledger skip`` in process, naming the broker in ``spelling``; its one line."""
        broker = spelled(src.broker, spelling) if "://" in src.broker else src.broker
        return self.cli(["ledger", "skip", "--pipeline", self.scenario.pipelines[pipe].name, "--stream",
                         src.stream, "--broker", broker, "--start", str(start), "--end", str(end), "--reason",
                         "model: the scheduler does not catch up"])[1]

    def cli(self, argv: list[str]) -> tuple[int, str]:
        """A ``streamledger`` command in process on the world's ledger and broker: its exit status and
        its output as one line."""
        from streamledger.cli import main

        argv = [*argv, "--db", self.ledger_url]
        out, err = io.StringIO(), io.StringIO()
        # the broker a cure is checked on: the environment's, as an operator's shell gives it
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _environ(
                STREAMLEDGER_BROKER_URL=self.servers.url):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        text = (out.getvalue() + err.getvalue()).strip().replace("\n", " ")
        return int(code or 0), f"exit {code}: {text[:300]}"

    def cure(self, op: Cure) -> str:
        """One of the operator's cures through the CLI (:data:`tests.model.ops.CURES`). A wrong request
        must be refused with nothing written; a right ``new-epoch`` (the stream was re-created since
        the history began) may go through (or be refused: open claims, unpublished ranges)."""
        name = self.scenario.pipelines[op.pipe].name
        sources = self.current_sources(op.pipe)
        if not sources:
            return "no history yet: nothing to cure"
        src = sources[0]
        broker = spelled(src.broker, op.spelling) if "://" in src.broker else src.broker
        where = ["--pipeline", name]
        wrong = True
        if op.what == "skip_past_tail":
            start = self.ledger.last_end(name, src) or 0
            end = max(start, self.client.committed_tail(self.stream)) + op.extra
            argv = ["ledger", "skip", *where, "--stream", src.stream, "--broker", broker, "--start",
                    str(start), "--end", str(end), "--reason", "model: past the tail"]
        elif op.what == "skip_overlap":
            held = sorted((r for r in self.ledger.ranges(name) if r.source == src and not r.empty
                           and r.status.value in ("claimed", "committed")), key=lambda r: r.start)
            if not held:
                return "nothing read to overlap"
            argv = ["ledger", "skip", *where, "--stream", src.stream, "--broker", broker, "--start",
                    str(held[0].start), "--end", str(held[0].end), "--reason", "model: over a read range"]
        elif op.what == "new_epoch_cli":
            wrong = op.pipe not in self.needs_epoch
            argv = ["ledger", "new-epoch", *where, "--stream", src.stream, "--broker", broker, "--reason",
                    "model: new epoch by the CLI"]
        else:
            command = "distinct-brokers" if op.what == "distinct_spellings" else "rename-broker"
            argv = ["ledger", command, spelled(src.broker, "/"), spelled(src.broker, "/%2f"), *where]
        before = self._cure_state(name)
        code, line = self.cli(argv)
        if wrong and code == 0:
            self.cure_defects.append((op.pipe, f"{describe(op)} was accepted: {line}"))
        elif wrong and self._cure_state(name) != before:
            self.cure_defects.append((op.pipe, f"{describe(op)} was refused but changed the ledger: {line}"))
        elif op.what == "new_epoch_cli" and code == 0 and len(sources) == 1:
            self.needs_epoch.discard(op.pipe)
        return line

    def _cure_state(self, name: str) -> list[tuple[Any, ...]]:
        ranges = ((r.id, r.status.value, r.start, r.end, r.source.broker) for r in self.ledger.ranges(name))
        records = ((-1, x.source.broker, x.other, x.distinct, x.stream)
                   for x in self.ledger.same_broker(name))
        return sorted([*ranges, *records], key=repr)

    def audit(self, pipe: int) -> Any:
        from streamledger.batch.proof import audit

        self.figures.audits += 1
        name = self.scenario.pipelines[pipe].name
        return audit(self.ledger, name, broker=self.client, stale_after=timedelta(0), deep=True,
                     catalog=None)

    def audit_cli(self, pipe: int, spelling: str) -> bool:
        """``streamledger ledger audit`` in process; True when it printed CLEAN (exit 0)."""
        from streamledger.cli import main

        self.figures.audits += 1
        argv = ["ledger", "audit", "--db", self.ledger_url, "--pipeline", self.scenario.pipelines[pipe].name,
                "--broker-url", spelled(self.servers.url, spelling), "--stale-after", "0", "--deep"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                return main(argv) == 0
            except SystemExit as exc:
                return exc.code == 0
            except Exception:
                return False


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _error_line(text: str) -> str:
    """The line of a query's failure (a Spark trace with a Python one inside) that says why."""
    lines = [ln.strip() for ln in text.splitlines()]
    python = [ln for ln in lines
              if re.match(r"[\w.]*(Error|Exception): ", ln) and not ln.startswith(("org.", "java."))]
    return next(iter(python), next((ln for ln in lines if "model:" in ln), text[:200]))


@contextlib.contextmanager
def world(servers: Servers, scenario: Scenario, home: Path, log: Callable[[str], None] = print,
          ) -> Iterator[World]:
    w = World(servers, scenario, home, log)
    try:
        yield w
    finally:
        w.close()
