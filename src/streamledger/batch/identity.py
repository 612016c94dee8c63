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
under each, and the second would read again what the first committed. :func:`one_broker` decides it
for the audit (``streamledger.batch.proof.check_identities``, after the fact) and for the batch and
the streaming recorder (:func:`named_twice_because`, before they claim).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from streamledger.ledger.types import SourcePosition
from streamledger.offsets import ChunkPrint, same_stream

log = logging.getLogger(__name__)

__all__ = ["named_twice_because", "one_broker", "replaced_because", "stored_offset_retired"]


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


def named_twice_because(log: Any, stream: str, pipeline: str, own: str, pos: SourcePosition) -> str | None:
    """Why a history of ``stream`` under ``own`` must not be continued or begun (one line), or None:
    ``log``, reached as ``own``, holds the stream another identity's history read
    (:func:`one_broker`), so reading on here would read again offsets the other committed."""
    if not pos.elsewhere:
        return None
    names = one_broker(log, stream, pos.elsewhere, own)
    if not names:
        return None
    others = ", ".join(n for n in names if n != own)
    return (f"the broker reached as {own} holds the chunks pipeline {pipeline!r} committed under broker "
            f"{others}: one broker under two names, and a history under {own} would read again what "
            f"{others} read; nothing was claimed; give every URL of this broker one broker_name (or "
            "configure its cluster_name on every node, rabbitmqctl set_cluster_name) and move a history "
            "to it by hand if needed (`streamledger ledger rename-broker OLD NEW`)")
