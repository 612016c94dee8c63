"""Is the broker's stream the one the ledger read? One rule for the batch (``BatchRun``) and the
streaming recorder (``MicroBatchRecorder``): they used to decide it apart, and the recorder knew
only two of the four signs, so a re-created stream it had refused once was read on from the old
ledger end after retention rolled the fingerprinted chunk out.

A stream deleted and re-created starts at offset 0 again: claims would come back empty (the
ledger's end lies past the new tail) or start in the middle of the new stream, and the old watermark
would be stored on it. The signs (:func:`replaced_because`): a refusal recorded on the source
before (``replaced``, kept until ``new-epoch``: the other signs can vanish as the new stream grows
and retention rolls chunks out); the committed tail below the ledger's end (a tail never shrinks);
the broker lost the offset the ledger stored on it and neither the fingerprint nor retention
explains it (:func:`stored_offset_retired`); the chunk the ledger fingerprinted at a commit is not
the broker's (``same`` False, :func:`streamledger.offsets.same_streams`).

And is the broker the one another identity's history read? One broker reached under two names (two
``broker_name`` s, or a cluster whose nodes each report their own default cluster name) has a history
under each, and the second would read again what the first committed. :func:`one_broker` finds it
by a chunk (for the audit, ``streamledger.batch.proof.check_identities``, after the fact, and for
the batch and the streaming recorder, :func:`named_twice_because`, before they claim). The chunk
goes with retention, so the finding is recorded in the ledger the first time it is made
(``SourcePosition.same_broker``, ``Ledger.record_same_broker``) and the decision rests on the record
as well as on the chunk (:func:`named_twice_because`, :func:`one_broker_groups`), as a re-created
stream's refusal rests on ``replaced``.

A chunk print cannot tell two mirrors apart: two brokers fed the same records in the same
millisecond by one producer hold chunks of one print. The cure is the operator's verdict, recorded
with the findings (``streamledger ledger distinct-brokers``, ``SameBroker.distinct``): a pair judged
two brokers is never one broker here (:func:`judged_distinct`), whatever a chunk says later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from streamledger.ledger.types import SameBroker, SourcePosition
from streamledger.offsets import ChunkPrint, same_stream

log = logging.getLogger(__name__)

__all__ = ["NamedTwice", "cures", "judged_distinct", "named_twice_because", "one_broker", "one_broker_groups",
           "replaced_because", "stored_offset_retired", "unchanged_because"]


def cures(pipeline: str, stream: str, names: Iterable[str], apart: Iterable[tuple[str, str]] = ()) -> str:
    """The two cures of a finding that ``names`` are one broker (one line, named by the batch's
    refusal and the audit alike): a chunk print cannot tell which one applies. The verdict named is
    for a pair not judged already (``apart``, :func:`judged_distinct`): names the operator judged two
    brokers yet joined through a third by records contradict the verdict, and judging the same pair
    again would change nothing."""
    group = sorted(names)
    judged = set(apart)
    pairs = [(a, b) for i, a in enumerate(group) for b in group[i + 1:]]
    a, b = next((pair for pair in pairs if pair not in judged), pairs[0] if pairs else (group[0], group[0]))
    clash = [f"{x} and {y}" for x, y in pairs if (x, y) in judged]
    conflict = (f" (the operator judged {'; '.join(clash)} two brokers, but the ledger's records join "
                f"them through {', '.join(n for n in group if all(n not in c for c in judged))}: judge that "
                "link too)") if clash else ""
    return ("if it is one broker under two names, give every URL of it one broker_name (or configure its "
            "cluster_name on every node, rabbitmqctl set_cluster_name) and move a history to it if needed "
            "(`streamledger ledger rename-broker OLD NEW`, which also clears the record of the two names); "
            "if they are two brokers fed the same records (mirrors hold chunks of one print), record that "
            f"verdict (`streamledger ledger distinct-brokers {a} {b} --pipeline {pipeline} --stream "
            f"{stream}`){conflict}")


def stored_offset_retired(broker: Any, stream: str, pipeline: str, pos: SourcePosition, same: bool | None
                          ) -> bool:
    """Whether the broker lost the offset the ledger stored on it to retention, not to a re-created
    stream: the fingerprinted chunk is still the ledger's (``same``: its verdict decides when there is
    one), or retention removed everything up to past the stored offset. The reader then goes on and
    stores the offset again."""
    if same is not None:
        return same
    assert pos.stored is not None
    first = int(broker.first_offset(stream))
    if first <= pos.stored:
        return False
    log.warning("stream %s: retention removed the offset %d the ledger stored for %s (first offset %d): "
                "storing it again", stream, pos.stored, pipeline, first)
    return True


def replaced_because(broker: Any, stream: str, pipeline: str, pos: SourcePosition, tail: int,
                     stored: int | None, same: bool | None) -> str | None:
    """Why the broker's ``stream`` is not the stream the ledger read (one line), or None when nothing
    says so. ``pos`` is the ledger's position read *before* the broker's ``tail`` and ``stored``
    offset (so a range another reader claims meanwhile never looks like a shrunken tail); ``same``
    the fingerprint's verdict (None: no print, or its chunk is gone)."""
    if pos.replaced is not None:
        return f"a batch found it replaced before ({pos.replaced})"
    if pos.end is not None and tail < pos.end:
        return f"the broker's committed tail {tail} is below the ledger's end {pos.end}"
    if pos.stored is not None and stored is None and not stored_offset_retired(broker, stream, pipeline, pos,
                                                                               same):
        return (f"the broker has no stored offset for {pipeline!r} although the ledger stored {pos.stored} "
                f"there (ledger end {pos.end}, broker tail {tail})")
    if same is False and pos.chunk is not None:
        return pos.chunk.differs(f"ledger end {pos.end}, broker tail {tail}")
    return None


def unchanged_because(broker: Any, stream: str, pipeline: str, pos: SourcePosition) -> str | None:
    """Why the broker's ``stream`` is still the stream the ledger read (one line), or None when it is
    not (a sign of :func:`replaced_because` holds, or the broker has no such stream): what
    ``new-epoch`` is refused on, so a cure never retires a live history and reads it again. The
    ``replaced`` mark is not a sign here (a batch may have set it on a false sign, e.g. a ledger end
    past the tail) unless it records another chunk at the fingerprint's offset and that offset is
    gone from the broker now (retention rolled out the evidence the batch saw: the chunk cannot be
    compared again), a fingerprinted chunk still on the broker outweighs every other sign, and a tail
    below the greatest one a batch saw (``seen_tail``) is one more (a history of empty ranges has no
    fingerprint, and what the old stream held past its end is recorded lost by the new epoch)."""
    from dataclasses import replace

    from streamledger.batch.position import log_offsets
    from streamledger.offsets import same_stream

    exists = getattr(broker, "stream_exists", None)
    if exists is not None and not exists(stream):
        return None  # deleted (and not re-created yet): nothing left to read again
    tails, stored = log_offsets(broker, [stream], pipeline)
    tail, kept = tails[stream], stored[stream]
    same = same_stream(broker, stream, pos.chunk) if pos.chunk is not None else None
    facts = f"ledger end {pos.end}, broker tail {tail}, offset stored for {pipeline!r} {kept}"
    if same is True:
        assert pos.chunk is not None
        return (f"the chunk the ledger fingerprinted at offset {pos.chunk.offset} is still on the broker "
                f"({facts})")
    if same is None and pos.chunk is not None and pos.chunk.found_different_in(pos.replaced):
        return None  # a batch saw another chunk at the print's offset; retention has rolled it out since
    if pos.seen_tail is not None and tail < pos.seen_tail:
        return None  # a tail never shrinks: a batch saw the stream hold more than it does now
    if replaced_because(broker, stream, pipeline, replace(pos, replaced=None), tail, kept, same) is not None:
        return None
    return f"no sign of a re-created stream ({facts})"


def one_broker(log: Any, stream: str, prints: Iterable[tuple[str, ChunkPrint | None]],
               own: str | None = None) -> list[str]:
    """The broker identities whose histories of ``stream`` ``log`` holds, sorted, when there are two
    or more (else none): each of ``prints`` (identity, the newest chunk fingerprint of its history)
    whose fingerprinted chunk ``log`` holds, and ``own``, the identity ``log`` was reached under. Two
    brokers with streams of one name hold each other's chunks at no offset (a chunk's timestamp and
    CRC), and a re-created stream not the old one's; neither is one broker. One chunk header each."""
    held = {name for name, chunk in prints if chunk is not None and same_stream(log, stream, chunk)}
    if own is not None:
        held.add(own)
    return sorted(held) if len(held) > 1 else []


def judged_distinct(records: Iterable[SameBroker]) -> set[tuple[str, str]]:
    """The pairs of names (both orders) the operator judged two brokers among the ledger's records:
    never one broker, by a record or by a chunk."""
    return {pair for r in records if r.distinct
            for pair in ((r.source.broker, r.other), (r.other, r.source.broker))}


def one_broker_groups(names: Iterable[str], pairs: Iterable[tuple[str, str]],
                      distinct: Iterable[tuple[str, str]] = ()) -> list[tuple[str, ...]]:
    """The identities of one stream that are one broker, as groups of two or more (sorted): ``names``
    a broker was just found to hold (:func:`one_broker`; each two of them not judged ``distinct``,
    :func:`judged_distinct`) and every recorded pair (``pairs``: the ledger's ``SameBroker`` records
    found one broker). Two names recorded with a third are one broker with each other."""
    parent: dict[str, str] = {}

    def root(n: str) -> str:
        while parent.setdefault(n, n) != n:
            n = parent[n]
        return n

    found = sorted(names)
    apart = set(distinct)
    links = [*pairs, *((a, b) for i, a in enumerate(found) for b in found[i + 1:] if (a, b) not in apart)]
    for a, b in links:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for n in parent:
        groups.setdefault(root(n), []).append(n)
    return sorted(tuple(sorted(g)) for g in groups.values() if len(g) > 1)


@dataclass(frozen=True, slots=True)
class NamedTwice:
    """Why a history under ``own`` must not be continued or begun: ``others``, identities of the same
    broker whose histories of the stream the ledger holds (by their chunk on the broker, or by the
    ledger's record); ``unrecorded`` those of them the ledger does not record yet (the caller records
    them: ``Ledger.record_same_broker``); ``why`` one line naming the stream's names and the cure."""

    own: str
    others: tuple[str, ...]
    unrecorded: tuple[str, ...]
    why: str


def named_twice_because(log: Any, stream: str, pipeline: str, own: str, pos: SourcePosition
                        ) -> NamedTwice | None:
    """Whether a history of ``stream`` under ``own`` must not be continued or begun, or None:
    ``log``, reached as ``own``, holds the stream another identity's history read
    (:func:`one_broker`), or the ledger recorded an identity that holds a history of it as this
    very broker (``pos.same_broker``: the chunk it was found by may be gone), so reading on here
    would read again offsets the other committed. A recorded identity without a history of the
    stream refuses nothing (the name that was refused before it read), nor one the operator judged
    another broker (``SameBroker.distinct``: its print is not asked about)."""
    apart = {r.other for r in pos.same_broker if r.distinct}
    recorded = {r.other for r in pos.same_broker}
    # the recorded group own belongs to (the audit's join: a name recorded with a name recorded with a
    # third is one broker with the third), and which of its names holds a live history
    every = (*pos.same_broker, *pos.same_broker_joined)
    pairs = [(r.source.broker, r.other) for r in every if not r.distinct]
    group = next((g for g in one_broker_groups((), pairs, judged_distinct(every)) if own in g), ())
    ends = {r.other: r.other_end for r in every if not r.distinct}
    kept = {n for n in group if n != own and n not in apart and ends.get(n) is not None}
    asked = [(name, chunk) for name, chunk in pos.elsewhere if name not in apart]  # judged: not asked
    held = set(one_broker(log, stream, asked, own)) - {own} if asked else set()
    others = tuple(sorted(kept | held))
    if not others:
        return None
    named = ", ".join(others)
    if held:
        seen = (f"the broker reached as {own} holds the chunks pipeline {pipeline!r} committed under broker "
                f"{named}")
    else:
        first = min(r.found_at for r in every if r.other in kept or r.source.broker in kept)
        seen = (f"the ledger recorded broker {named} as the broker reached as {own} for pipeline "
                f"{pipeline!r} (found {first.isoformat(timespec='seconds')})")
    return NamedTwice(own, others, tuple(sorted(held - recorded)), (
        f"{seen}: one broker under two names, and a history under {own} would read again what {named} "
        f"read; nothing was claimed; {cures(pipeline, stream, (own, *others))}"))
