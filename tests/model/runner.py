"""Replay a scenario, judge after every operation and after the final drain, shrink the first
disagreement to a minimal operation list, and report.

The judgement, per pipeline (the oracle's side from :mod:`tests.model.oracle`, the audit's from
``streamledger.batch.proof.audit`` with the broker and ``stale_after`` 0, as ``streamledger ledger
audit`` runs it):

* after every operation, the audit must not be CLEAN while the data shows an id twice in the
  outputs, an unreadable output, a file outside the output roots, or a record seen on the broker
  missing from the outputs at or below the broker's stored offset or below the ledger's watermark
  unless excused: inside a ``lost`` range and no longer on the broker, inside a deliberately
  skipped range the model itself chose not to read, or taken by retention before a pipeline
  starting at ``first`` (not at its origin) first ran; a lost range holding records the broker
  still has, or a skipped one holding records the model never chose to skip, is a problem of its
  own;
* after the final drain (epochs started where the test re-created the stream, stale claims
  released first if the epoch is refused for them, failed runs cleared, batches run until idle; a
  pinned pipeline's scheduler does not catch up on intervals before the first it ever ran, as with
  ``catchup=False``, and the operator records the span before it as skipped), a run that still
  fails on every retry is a ``stall`` whatever the audit says; every record the oracle saw on the
  stream (still there, or taken by retention since) must be in the outputs exactly once or so
  excused, a record of an incarnation a re-create deleted, below the end of the retired history of
  that epoch or below the greatest tail a batch of the pipeline saw on it, in the outputs or lost
  in it (the epoch that held the incarnation, if the pipeline had one of its own), and the audit
  must be CLEAN exactly when that holds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.model.ops import Batch, NewEpoch, Op, Pair, ReleaseStale, Scenario, Tick, describe
from tests.model.oracle import broker_records, covered, predict, range_rows, read_outputs, stray_files, unseen
from tests.model.world import Figures, Servers, World, world


@dataclass(frozen=True)
class Excuses:
    """The current history's ranges that excuse a record missing from the outputs, split by why:
    ``lost`` (the batch found retention had taken it) and ``skipped`` (deliberately not read, audit
    rule 6: a ``lost`` range held by ``streamledger/skip-…``). Neither is taken on the ledger's word:
    a lost range excuses only records the broker no longer holds, a skipped one only records the
    model itself chose not to read."""

    lost: list[tuple[int, int]]
    skipped: list[tuple[int, int]]


def _excuses(w: World, name: str) -> Excuses:
    lost: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []
    for r in w.ledger.ranges(name):
        if r.status.value != "lost" or r.source.stream != w.stream or "#epoch" in r.source.broker:
            continue
        (skipped if r.skipped else lost).append((r.start, r.end))
    return Excuses(lost, skipped)


def _retired_excuses(w: World, name: str) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """Epoch number -> the end of the pipeline's retired history on the stream (the end of its live
    ranges) and its lost (or skipped) spans."""
    out: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    for r in w.ledger.ranges(name):
        head, sep, epoch = r.source.broker.rpartition("#epoch")
        if not (sep and head and epoch.isdigit() and r.source.stream == w.stream):
            continue
        end, lost = out.get(int(epoch), (0, []))
        if r.status.value in ("claimed", "committed", "lost"):
            end = max(end, r.end)
        if r.status.value == "lost":
            lost.append((r.start, r.end))
        out[int(epoch)] = (end, lost)
    return out


def _seq(record_id: str) -> int:
    return int(record_id.rsplit("-", 1)[1])


@dataclass(frozen=True)
class Disagreement:
    """The oracle and the audit disagree: ``at`` is the operation's index (-1: after the final drain)."""

    kind: str
    pipe: int | None
    at: int
    oracle: str
    audit: str

    def same(self, other: Disagreement) -> bool:
        return (self.kind, self.pipe) == (other.kind, other.pipe) and (self.at < 0) == (other.at < 0)

    def line(self) -> str:
        where = "after the final drain" if self.at < 0 else f"after op {self.at}"
        who = "" if self.pipe is None else f" p{self.pipe}"
        return f"{self.kind}{who} {where}: oracle: {self.oracle}; audit: {self.audit}"


@dataclass
class Outcome:
    scenario: Scenario
    disagreements: list[Disagreement] = field(default_factory=list)
    figures: Figures = field(default_factory=Figures)
    lines: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)


def _sample(ids: list[str], n: int = 3) -> str:
    return f"{len(ids)} (e.g. {', '.join(ids[:n])})"


def _audit_text(report: Any) -> str:
    if report is None:
        return "raised"
    if report.clean:
        return "CLEAN"
    kinds = sorted({str(getattr(v.kind, "value", v.kind)) for v in report.violations})
    return f"{len(report.violations)} violation(s): {', '.join(kinds)}"


def judge(w: World, at: int, *, final: bool) -> list[Disagreement]:
    """The oracle against the audit, for every pipeline of the world, now."""
    found: list[Disagreement] = []
    w.figures.checks += 1
    on_broker = broker_records(w.client, w.stream)
    w.seen.update(on_broker)
    present = {o for o, _i in on_broker}
    known = sorted(w.seen.items())  # what is on the broker, and what retention took since it was seen
    # what retention took before the oracle ever saw it: offsets known only within bounds
    vanished = unseen(w.seen, w.ids(w.first_seq, w.seq), w.client.committed_tail(w.stream))
    for pipe, what in w.refusals:  # a composition the product refuses, not refused cleanly
        found.append(Disagreement("refusal", pipe, at, "a query on a history pinned to data intervals must "
                                  "be refused, nothing claimed or written", what))
    w.refusals.clear()
    for pipe, what in w.cure_defects:  # a wrong cure the product accepted, or refused after writing
        found.append(Disagreement("cure", pipe, at, "a wrong cure request is refused, nothing written", what))
    w.cure_defects.clear()
    stray = stray_files(w.home, w.allowed())
    if stray:
        try:
            everyone = w.ledger.audit(None)
            clean = everyone.clean
        except Exception:
            clean = False
        if clean or final:
            found.append(Disagreement("outside-root", None, at, f"{len(stray)} file(s) outside the output "
                                      f"roots: {', '.join(stray[:3])}", "CLEAN" if clean else "not clean"))
    for k, spec in enumerate(w.scenario.pipelines):
        read = read_outputs(spec, w.root(k), w.catalog(k))
        w.figures.records_checked += len(known) + sum(read.ids.values())
        ex = _excuses(w, spec.name)
        skip_below = w.skip_below.get(k, 0)
        born = w.born.get(k, 0)

        def excused(o: int, i: str, ex: Excuses = ex, skip_below: int = skip_below, born: int = born) -> bool:
            """Taken by retention before a pipeline starting at ``first`` first ran, or inside a lost
            range; or meant to be skipped inside a skipped one."""
            return (o not in present and (o < born or any(s <= o < e for s, e in ex.lost))) or (
                _seq(i) < skip_below and any(s <= o < e for s, e in ex.skipped))

        def excuses(i: str, ex: Excuses = ex, skip_below: int = skip_below, born: int = born
                    ) -> list[tuple[int, int]]:
            """The spans where a record retention took (id ``i``) is excused: :func:`excused`'s."""
            return [(0, born), *ex.lost, *(ex.skipped if _seq(i) < skip_below else [])]

        def missing(limit: int, read: Any = read, excused: Any = excused, excuses: Any = excuses,
                    ) -> list[str]:
            """Ids seen on the broker at offsets below ``limit`` that no output holds and no range
            excuses; and ids retention took before the oracle saw them, certainly below ``limit``,
            no offset of whose bounds any range excuses."""
            return [i for o, i in known if o < limit and not read.has(i) and not excused(o, i)] + [
                i for lo, hi, i in vanished
                if hi <= limit and not read.has(i) and covered(lo, hi, excuses(i)) == "none"]

        # a vanished id whose bounds are partly excused: the data cannot tell, so no verdict either way
        undecided = [i for lo, hi, i in vanished
                     if not read.has(i) and covered(lo, hi, excuses(i)) == "some"]

        problems: dict[str, str] = {}
        if read.doubled:
            problems["doubled"] = "ids twice in the outputs: " + _sample(sorted(read.doubled))
        if k not in w.needs_epoch:  # a lost or skipped range is not taken on the ledger's word
            dropped = [i for o, i in known if o in present and not read.has(i)
                       and any(s <= o < e for s, e in ex.lost)]
            if dropped:
                problems["lost-on-broker"] = ("records the broker still holds, recorded lost and never in "
                                              "the outputs: " + _sample(dropped))
            unmeant = [i for o, i in known if _seq(i) >= skip_below and not read.has(i)
                       and any(s <= o < e for s, e in ex.skipped)]
            if unmeant:
                problems["skipped-unmeant"] = ("records the model never chose to skip inside a skipped "
                                               "range, not in the outputs: " + _sample(unmeant))
        if read.unreadable:
            problems["unreadable"] = "outputs a reader cannot read: " + "; ".join(read.unreadable[:2])
        if read.filtered_present:
            problems["filtered-present"] = ("ids the transform's filter drops found in the outputs: "
                                            + _sample(read.filtered_present))
        if spec.transform is not None:
            wrong = _range_problems(w, k, vanished)
            if wrong:
                problems["range-rows"] = wrong
        stored = w.client.query_offset(w.stream, spec.name)
        if stored is not None:
            gone = missing(stored + 1)
            if gone:
                problems["missing-below-stored"] = (f"records at or below the stored offset {stored} not in "
                                                    "the outputs: " + _sample(gone))
        ends = [m.end for m in (w.ledger.watermark(spec.name, src) for src in w.current_sources(k))
                if m.end is not None]
        if ends and k not in w.needs_epoch:
            done = max(ends)
            gone = missing(done)
            if gone:
                problems["missing-below-done"] = (f"records below the ledger's watermark {done} not in the "
                                                  "outputs: " + _sample(gone))
        stalled = sorted(run for pipe, run in w.unfinished if pipe == k)
        last = w.drain_errors.get(k, "?")
        refused = spec.on_data_loss == "fail" and "retention removed everything below" in last
        if final and stalled and not refused:  # drained until idle: a pipeline that cannot move is
            # stalled, unless it is on_data_loss="fail" refusing a loss (documented: the operator acts)
            found.append(Disagreement("stall", k, at, f"run(s) {', '.join(stalled)} fail on every retry: "
                                      f"{last[:200]}", _audit_text(w.audit(k))))
        if final:  # an earlier incarnation's records: read, or lost/skipped in its retired history
            epochs = _retired_excuses(w, spec.name)
            # incarnation -> its retired history: the epoch its batches claimed in; that epoch's end
            # counts only if no later incarnation was claimed in it too (a re-create nobody could
            # notice, nothing read yet: the history goes on on the next stream), its lost spans always
            later = [set().union(*(c.get(k, set()) for c in [*w.retired_claimed[n + 1:], w.claimed]))
                     for n in range(len(w.retired_claimed))]
            old: dict[int, tuple[int, list[tuple[int, int]]]] = {}
            for n, held in enumerate(w.retired_claimed):
                if held.get(k):
                    e = max(held[k])
                    end, lost = epochs.get(e, (0, []))
                    old[n] = (0 if e in later[n] else end, lost)
            # owed: what the retired history claims to have covered, and what a batch of the
            # pipeline saw the old stream hold (below the tail it saw when it claimed). Records
            # published after the last batch saw the tail were deleted unknown to the pipeline:
            # nobody could read or record them.
            owed = [max(old.get(n, (0, []))[0], w.retired_tails[n].get(k, 0)) for n in range(len(w.retired))]
            # (what retention took before a pipeline starting at ``first`` first ran on it excused)
            born_at = [w.retired_born[n].get(k, 0) for n in range(len(w.retired))]
            gone_before = [i for n, seen in enumerate(w.retired) for o, i in sorted(seen.items())
                           if not read.has(i) and born_at[n] <= o < owed[n]
                           and not any(s <= o < e for s, e in old.get(n, (0, []))[1])]
            for n, (first, end, tail) in enumerate(w.retired_ids):
                for lo, hi, i in unseen(w.retired[n], w.ids(first, end), tail):
                    cover = covered(lo, hi, [(0, born_at[n]), *old.get(n, (0, []))[1]])
                    if read.has(i) or lo >= owed[n] or cover == "all":
                        continue
                    if hi <= owed[n] and cover == "none":
                        gone_before.append(i)
                    else:
                        undecided.append(i)
            if gone_before:
                problems["missing-before-recreate"] = (
                    "records of the stream before it was re-created never in the outputs nor in a lost "
                    "range of that epoch: " + _sample(gone_before))
            gone = missing(1 << 62)
            if gone:
                problems["missing"] = ("records seen on the broker never in the outputs nor in a lost range: "
                                       + _sample(gone))
        try:
            report = w.audit(k)
        except Exception as exc:
            report = None
            w.log(f"    audit of p{k} raised {type(exc).__name__}: {str(exc)[:200]}")
        cli = w.cli_verdict
        if cli is not None and cli == (k, True) and problems:
            for kind, text in problems.items():
                found.append(Disagreement(f"{kind} (CLI)", k, at, text, "streamledger ledger audit: CLEAN"))
        clean = report is not None and report.clean
        if clean and problems:
            for kind, text in problems.items():
                found.append(Disagreement(kind, k, at, text, "CLEAN"))
        elif final and not problems and not clean and not undecided:
            detail = "raised" if report is None else "; ".join(
                v.detail[:160] for v in report.violations[:2])
            found.append(Disagreement("false-alarm", k, at, "every record exactly once",
                                      f"{_audit_text(report)}: {detail}"))
        if report is None and not final and not problems:
            found.append(Disagreement("audit-raised", k, at, "no problem in the data", "raised"))
    return found


def _range_problems(w: World, k: int, vanished: list[tuple[int, int, str]]) -> str | None:
    """A transform pipeline's rows, range by range, against the oracle's prediction: every group of
    rows stamped with a range of the current incarnation of the stream (its epoch, start and end) must
    be a range the ledger committed, hold exactly :func:`predict`'s rows for the records the oracle
    read on the broker between the range's first and last offset, and number the range's
    ``rows_out``; a published range whose prediction has rows must have them. A range holding
    offsets of records retention took before the oracle saw them is not predicted (it cannot be)."""
    spec = w.scenario.pipelines[k]
    assert spec.transform is not None
    groups, bad = range_rows(spec, w.root(k), w.catalog(k))
    found: list[str] = [f"unreadable: {b}" for b in bad[:2]]
    retired = set().union(*(c.get(k, set()) for c in w.retired_claimed))
    committed: dict[tuple[int, int, int], Any] = {}
    for src in w.current_sources(k):
        (pos,) = w.ledger.positions(spec.name, [src])
        epoch = int(pos.epoch)
        if epoch in retired or epoch not in w.claimed.get(k, set()):
            continue  # an epoch that held another incarnation too: its offsets are ambiguous
        for r in w.ledger.ranges(spec.name):
            if r.source == src and r.status.value == "committed" and r.records:
                committed[(epoch, r.start, r.end)] = r
    epochs = {key[0] for key in committed}
    for key in sorted(set(groups) | set(committed)):
        if key[0] not in epochs:
            continue
        rows, r = sorted(groups.get(key, [])), committed.get(key)
        where = f"[{key[1]},{key[2]}) epoch {key[0]}"
        if r is None:
            if rows:
                found.append(f"{where}: {len(rows)} row(s) of a range the ledger did not commit")
            continue
        if r.transform is None and key not in groups:
            continue  # recorded by a streaming query of the pipeline: its rows are raw, in its own sink
        if key in groups and r.rows_out != len(rows):
            found.append(f"{where}: {len(rows)} row(s) in the output, rows_out {r.rows_out} in the ledger")
        lo, hi = int(r.first_seen), int(r.last_seen) + 1
        if any(a < hi and lo < b for a, b, _i in vanished):
            continue
        want = predict(spec.transform, [(o, i) for o, i in w.seen.items() if lo <= o < hi])
        if key not in groups and (r.published_at is None or not want):
            continue  # not visible yet (committed, not published), or nothing to write
        w.figures.ranges_predicted += 1
        if rows != want:
            extra = [x for x in rows if x not in want][:2]
            gone = [x for x in want if x not in rows][:2]
            found.append(f"{where}: {len(rows)} row(s), the oracle predicts {len(want)} "
                         f"(unexpected {extra}, missing {gone})")
    return "; ".join(found[:3]) if found else None


def _ledger_state(w: World) -> list[tuple[int, str, int | None, bool]]:
    """Every range of the scenario's pipelines: id, status, records and whether it is published."""
    return sorted((r.id, r.status.value, r.records, r.published_at is not None)
                  for p in w.scenario.pipelines for r in w.ledger.ranges(p.name))


def drain(w: World, log: Callable[[str], None]) -> list[str]:
    """What an operator does at the end: new epochs where asked, failed runs cleared, batches until idle."""
    done: list[str] = []

    def do(op: Op) -> str:
        out = w.apply(op)
        if isinstance(op, Batch) and not out.startswith(("ok", "interval not closed")):
            w.drain_errors[op.pipe] = out
        done.append(f"{describe(op)} -> {out}")
        log(f"  drain {describe(op)} -> {out}")
        return out

    n = len(w.scenario.pipelines)
    do(Tick())
    for rnd in range(4):
        for k in sorted(w.needs_epoch):
            if do(NewEpoch(k)).startswith("refused"):  # open claims of killed runs: release, then again
                do(ReleaseStale())
                do(NewEpoch(k))
        before = _ledger_state(w)
        for pipe, run in sorted(w.unfinished):
            attempt = w.last_attempt.get((pipe, run), 0) + 1
            interval = int(run[2:]) if run.startswith("iv") else None
            do(Batch(pipe, run, attempt, interval=interval))
        for k in range(n):
            spec = w.scenario.pipelines[k]
            if spec.pinned:  # a scheduler without catch-up: from the first interval it ever ran on
                ran = [int(r[2:]) for (pipe, r) in w.last_attempt if pipe == k and r.startswith("iv")]
                last = len(w.boundaries) - 2
                for i in range(min(ran) if ran else last, last + 1):
                    run = f"iv{i}"
                    do(Batch(k, run, w.last_attempt.get((k, run), 0) + 1, interval=i))
            else:
                do(Batch(k, f"drain{rnd}", 1))
        # idle once a round changed nothing in the ledger (a retry handing back a range it already
        # committed reports its records again, but reads nothing)
        if _ledger_state(w) == before and not w.unfinished:
            break
    for k, spec in enumerate(w.scenario.pipelines):
        ran = [int(r[2:]) for (pipe, r) in w.last_attempt if pipe == k and r.startswith("iv")]
        if not spec.pinned or not ran or min(ran) == 0 or k in w.needs_epoch:
            continue
        # the intervals before the first one the scheduler ran are nobody's: the operator records the
        # span before the first range read as deliberately skipped (audit rule 6), naming the broker
        # in another spelling; the oracle excuses only ids published before that interval
        w.skip_below[k] = w.tick_seq[min(ran)]
        for src in w.current_sources(k):
            rows = [r for r in w.ledger.ranges(spec.name) if r.source == src]
            origin = min(r.start for r in rows)
            read = [r.start for r in rows if r.status.value in ("claimed", "committed") and not r.empty]
            # where the covered history stops: retention's head may be recorded lost from the origin
            # (a pinned history whose head went before any interval claimed it, on_data_loss="record")
            stop = origin
            for r in sorted((r for r in rows if r.status.value == "lost" and not r.empty),
                            key=lambda r: r.start):
                if r.start == stop:
                    stop = r.end
            if read and stop < min(read):
                out = w.skip_cli(k, src, stop, min(read), "/%2f")
                done.append(f"ledger skip p{k} [{stop},{min(read)}) -> {out}")
                log(f"  drain ledger skip p{k} [{stop},{min(read)}) -> {out}")
    return done


def run_scenario(servers: Servers, scenario: Scenario, home: Path, *, log: Callable[[str], None] = print,
                 stop_at_first: bool = True, keep: bool = False) -> Outcome:
    """Apply every operation, judging after each; then drain and judge the end state."""
    result = Outcome(scenario)
    with world(servers, scenario, home, log) as w:
        result.figures = w.figures
        for i, op in enumerate(scenario.ops):
            try:
                out = w.apply(op)
            except Exception as exc:  # an operation the product refused by raising (kept going)
                out = f"raised {type(exc).__name__}: {str(exc)[:300]}"
            line = f"[{i}] {describe(op)} -> {out}"
            result.lines.append(line)
            log("  " + line)
            found = judge(w, i, final=False)
            for d in found:
                log("  DISAGREEMENT " + d.line())
            result.disagreements += found
            if found and stop_at_first:
                break
        else:
            result.drained = drain(w, log)
            found = judge(w, -1, final=True)
            for d in found:
                log("  DISAGREEMENT " + d.line())
            result.disagreements += found
    if not keep and not result.disagreements:
        shutil.rmtree(home, ignore_errors=True)
    return result


def shrink(servers: Servers, scenario: Scenario, target: Disagreement, base: Path, *, budget_s: float,
           log: Callable[[str], None] = print) -> tuple[Scenario, int]:
    """The smallest operation list found within ``budget_s`` that still shows ``target``'s kind of
    disagreement: the failing prefix, then chunks of operations dropped (halves down to single
    operations, last first, as in delta debugging), then pairs split into one of their batches."""
    ops: list[Op] = list(scenario.ops[: target.at + 1] if target.at >= 0 else scenario.ops)
    started, tries = time.monotonic(), 0

    def fails(cand: list[Op]) -> bool:
        nonlocal tries
        tries += 1
        where = base / f"shrink-{tries}"
        res = run_scenario(servers, scenario.with_ops(cand), where, log=lambda _m: None)
        shutil.rmtree(where, ignore_errors=True)
        return any(d.same(target) for d in res.disagreements)

    def left() -> bool:
        return time.monotonic() - started < budget_s

    size = max(1, len(ops) // 2)
    while size >= 1 and left():
        end = len(ops)
        while end > 0 and left():
            cand = ops[:max(0, end - size)] + ops[end:]
            if cand != ops and fails(cand):
                ops = cand
                log(f"  shrink: {len(ops)} op(s) still disagree")
            end -= size
        size //= 2
    for i in range(len(ops) - 1, -1, -1):
        pair = ops[i]
        if not isinstance(pair, Pair) or not left():
            continue
        for one in (pair.a, pair.b):
            cand = [*ops[:i], one, *ops[i + 1:]]
            if fails(cand):
                ops = cand
                log(f"  shrink: pair {i} split, still disagrees")
                break
    return scenario.with_ops(ops), tries


def report(outcome: Outcome, minimal: Scenario | None = None) -> str:
    f = outcome.figures
    lines = [f"model check seed={outcome.scenario.seed}: {f.ops} op(s), {f.batches} batch(es), "
             f"{f.streams} streaming quer(ies), "
             f"{f.kills} kill(s) ({f.kills - f.sigkills} at a step, {f.sigkills} SIGKILL), "
             f"{f.failures} failed batch(es) ({f.injected} injected at a step), "
             f"{f.published} record(s) published, "
             f"{f.checks} check(s), {f.records_checked} record check(s), {f.audits} audit(s), "
             f"{f.transformed} batch(es) with a transform, {f.ranges_predicted} range output(s) predicted, "
             f"{len(outcome.disagreements)} disagreement(s)"]
    lines += [f"  pipeline p{k}: {p}" for k, p in enumerate(outcome.scenario.pipelines)]
    for d in outcome.disagreements:
        lines.append("  DISAGREEMENT " + d.line())
    if minimal is not None:
        lines.append(reproduction(minimal))
    return "\n".join(lines)


def reproduction(minimal: Scenario) -> str:
    """The minimal operation list, readable and replayable."""
    lines = [f"  minimal reproduction ({len(minimal.ops)} op(s), then the drain if it disagreed after it):"]
    lines += [f"    p{k}: {p}" for k, p in enumerate(minimal.pipelines)]
    lines += [f"    {describe(op)}" for op in minimal.ops]
    lines.append("  replay: python -m tests.model --replay '" + minimal.to_json() + "'")
    return "\n".join(lines)
