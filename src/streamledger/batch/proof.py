"""The whole proof: the ledger's audit plus what the ledger alone cannot see, the published outputs.

The ledger's audit (:meth:`streamledger.ledger.Ledger.audit`) proves the offset history is
contiguous, committed and agrees with the broker. That proof is worth nothing to a reader if a
committed range's directory was deleted, or holds another range's files. So for every committed
range with records whose output is published, the output is checked here against the ledger
(rule 9 of the audit rules in docs/ledger.md; rules 1-8 are the ledger's own audit):

* its ``_manifest.json`` exists and names the same ledger range and pipeline (else the directory
  is missing or foreign);
* the manifest's entry for the stream has the range's span, record count and first/last offsets;
* with ``deep``, the rows in the data files are counted too (Parquet footers; a full read for
  other formats).

For a pipeline with a table sink (Iceberg, Delta) the table is the third party of the proof
(:func:`check_tables`): every committed range recorded in a table is in exactly one of the
pipeline's table commits (the one the ledger recorded), the table's rows in each range's span
number the ledger's records with no ``(stream, offset)`` twice, and no commit of the pipeline in the
table names a range the ledger did not commit. After the table's snapshots were expired, the rows
alone speak for the ranges whose commit is gone.

The check lives in the batch package because the batch owns the output layout and its manifest;
the ledger never touches a file system.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from streamledger import fs as filesystems
from streamledger.batch import outputs
from streamledger.batch.rules import sink_library_problem
from streamledger.errors import MissingExtra, StreamledgerError
from streamledger.ledger.audit import AuditReport, Violation, ViolationKind
from streamledger.ledger.types import RangeStatus, SameBroker, is_retired
from streamledger.manifest import MANIFEST, ManifestError

if TYPE_CHECKING:
    from streamledger.ledger import Ledger, OffsetRange

log = logging.getLogger(__name__)

__all__ = ["audit", "check_identities", "check_output", "check_tables", "count_rows"]


def _violation(kind: ViolationKind, rng: OffsetRange, detail: str) -> Violation:
    return Violation(kind, rng.pipeline, rng.source.stream, rng.source.broker, rng.start, rng.end, rng.id,
                     detail)


def count_rows(location: str, fmt: str, fs: filesystems.OutputFS) -> int:
    """Rows in the data files of one published range directory (``_``/``.`` files are not data)."""
    dataset = _dataset(location, fmt, fs)
    return 0 if dataset is None else int(dataset.count_rows())


def read_columns(location: str, fmt: str, fs: filesystems.OutputFS, columns: list[str]) -> Any:
    """Those columns of the data files of one range directory (a pyarrow table), None without files."""
    dataset = _dataset(location, fmt, fs)
    return None if dataset is None else dataset.to_table(columns=columns)


def _dataset(location: str, fmt: str, fs: filesystems.OutputFS) -> Any:
    import pyarrow.dataset as ds

    names = outputs.data_file_names(location, fs)
    if not names:
        return None
    arrow_fs: Any = None
    if filesystems.scheme(location) in ("", "file"):
        local = filesystems.local_path(location)
        paths = [str(local / n) for n in names]
    else:
        arrow_fs, root = filesystems.arrow_filesystem(location,
                                                      access=filesystems.StoreAccess.from_environment(location))
        paths = [f"{root.rstrip('/')}/{n}" for n in names]
    return ds.dataset(paths, format=fmt, filesystem=arrow_fs)


def check_output(rng: OffsetRange, fs: filesystems.OutputFS, *, deep: bool = False) -> Violation | None:
    """Why a committed, published range's output disagrees with the ledger, or None."""
    where = rng.output
    if not where:
        return _violation(ViolationKind.OUTPUT_MISSING, rng, "committed with records but no output location")
    try:
        manifest = outputs.load_manifest(where, fs)
    except ManifestError as exc:
        return _violation(ViolationKind.OUTPUT_MISMATCH, rng, f"{where}/{MANIFEST} is unreadable: {exc}")
    except OSError as exc:
        return _violation(ViolationKind.OUTPUT_MISSING, rng, f"cannot read {where}/{MANIFEST}: {exc}")
    if manifest is None:
        return _violation(ViolationKind.OUTPUT_MISSING, rng,
                          f"no published output at {where} (the directory or its {MANIFEST} is gone)")
    if manifest.range_id != rng.id or (manifest.pipeline is not None and manifest.pipeline != rng.pipeline):
        return _violation(ViolationKind.OUTPUT_MISMATCH, rng,
                          f"{where} is foreign: its manifest names range {manifest.range_id} of pipeline "
                          f"{manifest.pipeline!r}, not range {rng.id} of {rng.pipeline!r}")
    entry = manifest.entry(rng.source.stream)
    ledger_counts = (rng.records, rng.first_seen, rng.last_seen)
    if entry is None:
        return _violation(ViolationKind.OUTPUT_MISMATCH, rng,
                          f"{where}: the manifest has no entry for stream {rng.source.stream!r}")
    if (entry.start, entry.end) != (rng.start, rng.end) or entry.counts != ledger_counts:
        return _violation(ViolationKind.OUTPUT_MISMATCH, rng,
                          f"{where}: the manifest says [{entry.start}, {entry.end}) records/first/last "
                          f"{entry.counts}, the ledger {ledger_counts}")
    transformed = _transform_problem(rng, manifest, entry)
    if transformed is not None:
        return _violation(ViolationKind.OUTPUT_MISMATCH, rng, f"{where}: {transformed}")
    if manifest.files is not None:
        found = outputs.data_file_names(where, fs)
        if found != sorted(manifest.files):
            extra = sorted(set(found) - set(manifest.files))
            gone = sorted(set(manifest.files) - set(found))
            return _violation(ViolationKind.OUTPUT_MISMATCH, rng,
                              f"{where}: its data files differ from its manifest (not in the manifest: "
                              f"{extra or 'none'}; missing: {gone or 'none'})")
    if deep and not manifest.rows_elsewhere:
        try:
            rows = count_rows(where, manifest.format or "parquet", fs)
        except Exception as exc:  # an unreadable data file is a finding, not a crash of the audit
            return _violation(ViolationKind.OUTPUT_MISMATCH, rng, f"{where}: cannot count rows: {exc}")
        want = rng.records if rng.rows_out is None else rng.rows_out
        if rows != want:
            what = "records" if rng.rows_out is None else "rows written by its transform"
            return _violation(ViolationKind.OUTPUT_MISMATCH, rng,
                              f"{where}: the data files hold {rows} rows, the ledger committed {want} {what}")
        if rng.rows_out is not None:
            problem = _deep_transform_problem(rng, where, manifest.format or "parquet", fs)
            if problem is not None:
                return _violation(ViolationKind.OUTPUT_MISMATCH, rng, f"{where}: {problem}")
    return None


def _transform_problem(rng: OffsetRange, manifest: Any, entry: Any) -> str | None:
    """Why a range's manifest disagrees with the ledger about its transform, or None."""
    if (manifest.transform, entry.rows, entry.dead_letter) == (rng.transform, rng.rows_out, rng.dead_letter):
        return None
    return (f"the manifest says transform {manifest.transform} wrote {entry.rows} rows and set aside "
            f"{entry.dead_letter} records, the ledger transform {rng.transform}, {rng.rows_out} rows, "
            f"{rng.dead_letter} set aside")


def _deep_transform_problem(rng: OffsetRange, where: str, fmt: str, fs: filesystems.OutputFS) -> str | None:
    """A transformed range's rows all carry its own lineage, and its dead letters number the ledger's."""
    from streamledger.transform import DEAD_LETTER_DIR, LINEAGE_COLUMNS

    data = read_columns(where, fmt, fs, list(LINEAGE_COLUMNS))
    if data is not None and data.num_rows:
        seen = {tuple(row.values()) for row in data.group_by(list(LINEAGE_COLUMNS)).aggregate([]).to_pylist()}
        mine = (rng.source.stream, rng.start, rng.end)
        if seen != {mine}:
            others = sorted(str(list(t)) for t in seen - {mine})
            return f"rows stamped with another range's lineage (stream, start, end): {', '.join(others)}"
    if rng.dead_letter:
        dead = filesystems.join(where, DEAD_LETTER_DIR)
        held = count_rows(dead, "parquet", fs)
        if held != rng.dead_letter:
            return f"{DEAD_LETTER_DIR} holds {held} records, the ledger set aside {rng.dead_letter}"
    return None


def check_outputs(ranges: Iterable[OffsetRange], *, deep: bool = False,
                  fs_for: Callable[[str], filesystems.OutputFS] = filesystems.filesystem_for,
                  progress: Callable[[int, int], None] | None = None) -> list[Violation]:
    """Check every committed range with records whose output is published (see :func:`check_output`).
    ``progress(checked, total)`` is called after each (one file-store read, or a scan with ``deep``)."""
    found: list[Violation] = []
    cache: dict[str, filesystems.OutputFS] = {}
    todo = [rng for rng in ranges
            if rng.status == RangeStatus.COMMITTED and rng.records and rng.published_at is not None]
    for checked, rng in enumerate(todo, 1):
        if progress is not None:
            progress(checked - 1, len(todo))
        key = filesystems.scheme(rng.output or "")
        if key not in cache:
            cache[key] = fs_for(rng.output or "")
        problem = check_output(rng, cache[key], deep=deep)
        if problem is not None:
            found.append(problem)
        if progress is not None:
            progress(checked, len(todo))
    return found


def check_tables(ledger: Ledger, ranges: list[OffsetRange], *,
                 catalog: Mapping[str, str] | None = None) -> list[Violation]:
    """Each table a pipeline's ranges were published into, checked against the ledger (one line
    per violation). ``catalog``: the pyiceberg catalog's properties when it is not the default SQL
    catalog in the ledger's database."""
    from streamledger.batch.sinks import Sink

    found: list[Violation] = []
    done = [r for r in ranges if r.status == RangeStatus.COMMITTED and r.records]
    for pipeline in sorted({r.pipeline for r in done}):
        theirs = [r for r in done if r.pipeline == pipeline]
        for table in sorted({r.sink_table for r in theirs if r.sink_table}):
            kind, _, where = table.partition(":")
            problem = sink_library_problem(kind)  # the table cannot be checked here: say why
            if problem is not None:
                raise MissingExtra(f"{kind} table {where} of pipeline {pipeline!r}: {problem}")
            sink: Sink
            if kind == "iceberg":
                from streamledger.batch.sinks.iceberg import IcebergSink

                sink = IcebergSink(pipeline=pipeline, output_root=".", table=where, catalog=catalog,
                                   ledger_url=ledger.url)
            else:
                from streamledger.batch.sinks.delta import DeltaSink

                sink = DeltaSink(pipeline=pipeline, output_root=".", table=where)
            found += sink.audit(ledger, pipeline, theirs)
    return found


def audit(ledger: Ledger, pipeline: str | None = None, *, broker: Any = None,
          stale_after: timedelta = timedelta(hours=1), outputs_too: bool = True, deep: bool = False,
          fs_for: Callable[[str], filesystems.OutputFS] = filesystems.filesystem_for,
          catalog: Mapping[str, str] | None = None,
          progress: Callable[[int, int], None] | None = None) -> AuditReport:
    """The ledger's audit and, unless ``outputs_too`` is False, the published outputs' check and
    the tables' (for pipelines with a table sink). ``progress(checked, total)``: the outputs' check,
    the long part of an audit of many ranges."""
    report = ledger.audit(pipeline, broker=broker, stale_after=stale_after)
    records = ledger.same_broker(pipeline)
    if not outputs_too:
        # not an output check: names of one broker are a finding without the outputs too, found by
        # the ledger's record or by a broker given that can read chunks (the ranges are read only
        # then: an audit without either stays a few statements)
        if not records and not _chunk_readers(broker):
            return report
        return report.with_findings(*check_identities(ledger, ledger.ranges(pipeline), broker,
                                                      records=records))
    ranges = ledger.ranges(pipeline)
    twice, twice_notes = check_identities(ledger, ranges, broker, records=records)
    findings = (check_outputs(ranges, deep=deep, fs_for=fs_for, progress=progress)
                + check_tables(ledger, ranges, catalog=catalog) + twice)
    return report.with_findings(findings, [*twice_notes, *transform_notes(ranges)], outputs_checked=True)


def transform_notes(ranges: Sequence[OffsetRange]) -> list[Violation]:
    """Which transform produced which committed ranges: one note per run of consecutive ranges of a
    source made by the same transform (by fingerprint), with the records read, rows written and
    records set aside; none for a source whose ranges are all raw."""
    by_source: dict[tuple[str, Any], list[OffsetRange]] = defaultdict(list)
    for r in ranges:
        if r.status == RangeStatus.COMMITTED and r.records:
            by_source[(r.pipeline, r.source)].append(r)
    notes: list[Violation] = []
    for (_pipeline, _source), done in sorted(by_source.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if all(r.transform is None for r in done):
            continue
        done.sort(key=lambda r: (r.start, r.id))
        runs: list[list[OffsetRange]] = []
        for r in done:
            if runs and runs[-1][-1].transform == r.transform:
                runs[-1].append(r)
            else:
                runs.append([r])
        for run in runs:
            first, last = run[0], run[-1]
            rows = sum(r.rows_out or 0 for r in run)
            dead = sum(r.dead_letter or 0 for r in run)
            read = sum(r.records or 0 for r in run)
            what = (f"transform {first.transform}: {read} records read, {rows} rows "
                    f"written, {dead} set aside" if first.transform else "raw records (no transform)")
            notes.append(Violation(ViolationKind.TRANSFORMED, first.pipeline, first.source.stream,
                                   first.source.broker, first.start, last.end, None,
                                   f"{len(run)} range(s) produced by {what}"))
    return notes


def _chunk_readers(broker: Any) -> list[Any]:
    """The brokers given to the audit (one, a mapping of them, or None) that can read a chunk's
    print, each once: those the identities can be checked by."""
    given = list(broker.values()) if isinstance(broker, Mapping) else [] if broker is None else [broker]
    return list({id(b): b for b in given if getattr(b, "chunk_at", None) is not None}.values())


def check_identities(ledger: Ledger, ranges: list[OffsetRange], broker: Any, *,
                     records: Sequence[SameBroker] | None = None) -> tuple[list[Violation], list[Violation]]:
    """Offsets of one stream committed under two broker identities of one broker: the same stream
    read twice, each identity's history whole on its own. One broker by the rule the batch refuses
    such a claim by (:mod:`streamledger.batch.identity`): a broker the audit was given holds both
    identities' fingerprinted chunks (:func:`~streamledger.batch.identity.one_broker`; the finding is
    then recorded in the ledger for both names, as the batch's refusal records it), or the ledger
    recorded them as one broker (``Ledger.same_broker``: the chunk may be gone since, rolled out by
    retention). Each range read under one name that another name's range also covers is an
    ``overlap``; two names with histories that do not overlap (a history split between them) one
    ``named_twice``; a recorded name with no history beside the one that has it a ``named_twice``
    note. How it happens: a ledger an earlier version wrote (a cluster without a configured
    ``cluster_name`` reports each node's own default name, so a URL whose node was down filed the
    pipeline under the answering node's name), or two batches under two names whose first commits
    raced. ``records``: the ledger's (``Ledger.same_broker``; read here when not given). Returns
    (violations, notes)."""
    from streamledger.batch.identity import cures, judged_distinct, one_broker, one_broker_groups

    logs = _chunk_readers(broker)
    by: dict[tuple[str, str], list[OffsetRange]] = defaultdict(list)
    for r in ranges:
        if r.status == RangeStatus.COMMITTED and r.records and not is_retired(r.source.broker):
            by[(r.pipeline, r.source.stream)].append(r)
    recorded: dict[tuple[str, str], dict[tuple[str, str], SameBroker]] = defaultdict(dict)
    judged: dict[tuple[str, str], list[SameBroker]] = defaultdict(list)
    audited = {r.pipeline for r in ranges}
    for rec in ledger.same_broker() if records is None else records:
        if rec.pipeline not in audited:
            continue
        if rec.distinct:  # the operator's verdict: two brokers, whatever a chunk says
            judged[(rec.pipeline, rec.source.stream)].append(rec)
        else:
            recorded[(rec.pipeline, rec.source.stream)][(rec.source.broker, rec.other)] = rec
    found: list[Violation] = []
    notes: list[Violation] = []
    for key in sorted(set(by) | set(recorded) | set(judged)):
        pipe, stream = key
        theirs, pairs = by.get(key, []), recorded.get(key, {})
        apart = judged_distinct(judged.get(key, []))
        notes += _verdicts_relied_on(pipe, stream, theirs, judged.get(key, []))
        sources = {r.source.broker: r.source for r in theirs}
        held: list[str] = []
        if len(sources) > 1 and logs:
            names = sorted(sources)
            prints = [pos.chunk for pos in ledger.positions(pipe, [sources[n] for n in names])]
            for log in logs:
                held = one_broker(log, stream, zip(names, prints, strict=True))
                if held:
                    break
        if any((a, b) not in pairs and (a, b) not in apart for a in held for b in held if a != b):
            _remember(ledger, pipe, stream, held)
        for group in one_broker_groups(held, pairs, apart):
            read = [r for r in theirs if r.source.broker in group]
            holders = sorted({r.source.broker for r in read})
            cure = cures(pipe, stream, group, apart)
            if set(holders) <= set(held):
                how = "a broker given to the audit holds both histories' stream"
            else:
                since = min(rec.found_at for (a, b), rec in pairs.items() if a in group and b in group)
                when = since.isoformat(timespec="seconds")
                how = f"the ledger recorded the names as one broker (found {when})"
            if len(holders) > 1:
                because = (f"{how}, read twice under two names of one broker (a cluster name each node "
                           f"reports for itself?); {cure}")
                found += _overlaps(pipe, stream, read, because) or [Violation(
                    ViolationKind.NAMED_TWICE, pipe, stream, holders[0], None, None, None,
                    f"one broker's stream has histories under {', '.join(holders)}: {how}; each history "
                    f"proves nothing about the other's offsets; {cure}")]
            else:
                others = [n for n in group if n not in holders]
                notes.append(Violation(
                    ViolationKind.NAMED_TWICE, pipe, stream, holders[0] if holders else group[0], None, None,
                    None, f"the ledger recorded {', '.join(others)} as this very broker (a batch under that "
                    f"name was refused); batches under it stay refused while this history exists; {cure}"))
    return found, notes


def _verdicts_relied_on(pipeline: str, stream: str, theirs: list[OffsetRange],
                        judged: Sequence[SameBroker]) -> list[Violation]:
    """A note per operator's verdict (``distinct-brokers``) the audit relied on: two names judged two
    brokers whose histories of the stream hold the same offsets. Not a violation (the operator said
    each broker's copy is read once), but said aloud: a mistaken verdict would hide a doubled read."""
    notes: list[Violation] = []
    seen: set[tuple[str, str]] = set()
    for rec in judged:
        a, b = sorted((rec.source.broker, rec.other))
        if (a, b) in seen:
            continue
        seen.add((a, b))
        spans = {n: [(r.start, r.end) for r in theirs if r.source.broker == n] for n in (a, b)}
        both = [(max(s1, s2), min(e1, e2)) for s1, e1 in spans[a] for s2, e2 in spans[b]
                if max(s1, s2) < min(e1, e2)]
        if not both:
            continue
        lo, hi = min(x for x, _ in both), max(y for _, y in both)
        notes.append(Violation(
            ViolationKind.NAMED_TWICE, pipeline, stream, a, lo, hi, None,
            f"offsets in [{lo}, {hi}) were read under {a} and under {b}: counted once each because the "
            f"operator judged them two brokers (verdict of {rec.found_at.isoformat(timespec='seconds')}: "
            f"{rec.why or 'no reason given'}); if they are one broker, the stream was read twice"))
    return notes


def _remember(ledger: Ledger, pipeline: str, stream: str, held: list[str]) -> None:
    """Record the audit's finding (a broker holds the chunks of these names' histories) in the
    ledger, as the batch's refusal records it: the chunk goes with retention. Best effort (the
    finding is reported either way; an audit may run with a read-only database user)."""
    try:
        ledger.record_same_broker(pipeline, stream, held, (
            f"stream {stream!r}: the audit found the chunks pipeline {pipeline!r} committed under "
            f"{', '.join(held)} on one broker: one broker under two names"))
    except StreamledgerError as exc:
        log.warning("the audit could not record that %s are one broker for stream %s: %s",
                    ", ".join(held), stream, exc)


def _overlaps(pipeline: str, stream: str, theirs: list[OffsetRange], because: str) -> list[Violation]:
    """Each range overlapping a range of another identity that begins at or before it (one line each,
    ``because`` saying why the identities are one broker)."""
    found: list[Violation] = []
    reach: dict[str, OffsetRange] = {}  # identity -> its range reaching furthest so far
    for r in sorted(theirs, key=lambda r: (r.start, r.end)):
        for other, o in sorted(reach.items()):
            if other != r.source.broker and o.end > r.start:
                why = f"committed under broker {other} too (range {o.id}): {because}"
                found.append(Violation(ViolationKind.OVERLAP, pipeline, stream, r.source.broker, r.start,
                                       min(r.end, o.end), r.id, why))
                break
        mine = reach.get(r.source.broker)
        if mine is None or r.end > mine.end:
            reach[r.source.broker] = r
    return found
