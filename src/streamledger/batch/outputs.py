"""Atomic range outputs: a job writes into a staging directory; a verified, committed range is
published to its own directory, which nothing ever deletes or rewrites.

Why commit before publish: only the holder of a claim can commit it, so a worker that lost its
claim (abandoned, taken over) is fenced out of the commit *and* of the publish that follows; a
committed range whose publish was interrupted finds its verified staging copy through the ledger
(``OffsetRange.staging``) and the retry finishes the publish without reading the stream again.

Locations are plain paths or URIs, reached through :mod:`streamledger.fs` (``fs=``; local by
default). Where a directory rename is atomic (local, HDFS) the publish is that one rename. Where it
is not (object stores: a rename is a copy and a delete), the publish copies the data files, then
the manifest, then deletes staging: the manifest marks the destination complete, staging stays
whole until then, and a retry completes a partially copied destination from it. The manifest is
written create-only (``OutputFS.create_file``: an exclusive create, on S3 ``If-None-Match: *``), so
an attempt stalled past its last lease check cannot replace the manifest of the attempt that
published meanwhile: refused, it removes the files it copied that that manifest does not list and
fails (:class:`PublishedByAnother`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from streamledger.errors import BatchError
from streamledger.fs import LOCAL, OutputFS, join, local_path, name, parent
from streamledger.manifest import MANIFEST, Manifest, is_data_file

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST", "PublishedByAnother", "create_manifest", "data_file_names", "load_manifest", "local_path",
    "move_aside", "publish", "published", "read_manifest", "remove", "withdraw_leftovers", "write_manifest",
]


class PublishedByAnother(BatchError):
    """This attempt's manifest was refused at a range's final location: another attempt of the range
    published there first (its lease moved on while this one stalled), and this attempt withdrew."""


def write_manifest(directory: str, manifest: Manifest | Mapping[str, Any], fs: OutputFS = LOCAL) -> None:
    """Write ``_manifest.json`` atomically where the file system allows (temp + rename; one PUT)."""
    fs.mkdirs(directory)
    if isinstance(manifest, Manifest):
        text = manifest.to_json()
    else:
        text = (json.dumps(dict(manifest), indent=2, sort_keys=True) + "\n").encode()
    fs.write_bytes(join(directory, MANIFEST), text)


def read_manifest(directory: str, fs: OutputFS = LOCAL) -> dict[str, Any] | None:
    """The manifest in ``directory`` as plain JSON data, None when there is none."""
    raw = fs.read_bytes(join(directory, MANIFEST))
    if raw is None:
        return None
    data: dict[str, Any] = json.loads(raw)
    return data


def load_manifest(directory: str, fs: OutputFS = LOCAL) -> Manifest | None:
    """The typed manifest in ``directory``; None when there is none (ManifestError when unreadable)."""
    raw = fs.read_bytes(join(directory, MANIFEST))
    return None if raw is None else Manifest.from_json(raw)


def data_file_names(location: str, fs: OutputFS = LOCAL) -> list[str]:
    """A range directory's data files, relative and sorted (``_``/``.`` files are not data)."""
    return sorted(n for n in fs.files(location) if is_data_file(n))


def published(final: str, range_id: int, fs: OutputFS = LOCAL) -> bool:
    """True when ``final`` holds the published output of ledger range ``range_id``."""
    try:
        manifest = read_manifest(final, fs)
    except ValueError:  # a half-written or foreign file: not this range's output
        return False
    return isinstance(manifest, dict) and manifest.get("range_id") == range_id


def _unfinished_copy(staging: str, final: str, fs: OutputFS) -> bool:
    """``final`` holds only files staging also has, and no manifest: an interrupted copy of it."""
    have = set(fs.files(final))
    return MANIFEST not in have and have <= set(fs.files(staging))


def _unless_published(move: Callable[[], None], final: str, range_id: int, fs: OutputFS) -> bool:
    """Run one step of a publish (a rename, a file copied); True when it failed because another
    attempt of this range moved (or copied and deleted) the same staging copy first."""
    try:
        move()
    except Exception:
        if published(final, range_id, fs):
            return True
        raise
    return False


def publish(staging: str, final: str, range_id: int, fs: OutputFS = LOCAL,
            guard: Callable[[], None] | None = None) -> None:
    """Move a verified staging directory to its final place (idempotent).

    A directory already at ``final`` that belongs to another range id cannot be a committed
    output of this ledger (one committed range per span); it is moved aside, never deleted. On a
    file system without atomic rename, a destination that is an interrupted copy of this staging
    directory is completed instead.

    ``guard()`` runs before the rename and before every file copied (it raises when the caller no
    longer holds the range's publish lease, and renews it otherwise), so two attempts never copy
    into one directory at once: a stalled publisher stops at its next file. One paused after the
    guard, whose lease moved on meanwhile, finds this range's output in place (published, or its
    staging copy moved away by the attempt that published it) and leaves it alone. One paused inside
    its last step, the manifest write, finds it refused (the manifest is created only where none is):
    it removes the files it copied that the published manifest does not list, and raises
    :class:`PublishedByAnother` naming the range (quietly returns when that manifest is its own,
    byte for byte: both published one staging copy).
    """
    check = guard or (lambda: None)
    if published(final, range_id, fs):
        return
    check()
    atomic = fs.renames_atomically(final)
    if fs.exists(final):
        foreign = atomic or not _unfinished_copy(staging, final, fs)
        # Asked again after looking at the destination: an attempt paused after its lease check
        # finds here the output its successor published meanwhile, and leaves it alone.
        if published(final, range_id, fs):
            return
        if foreign:
            check()
            log.warning("%s holds no output of range %d; moving it aside", final, range_id)
            move_aside(final, fs, partial(published, range_id=range_id, fs=fs), f"range {range_id}")
    fs.mkdirs(parent(final))
    if atomic:
        _unless_published(partial(fs.rename, staging, final), final, range_id, fs)
        return
    names = fs.files(staging)
    mine = fs.read_bytes(join(staging, MANIFEST))  # tells the same staging copy, published by another
    copied: list[str] = []
    for rel in names:
        if rel != MANIFEST:
            check()
            if _unless_published(partial(fs.copy_file, join(staging, rel), join(final, rel)),
                                 final, range_id, fs):
                _withdraw(final, copied, fs, mine)
                return
            copied.append(rel)
    if MANIFEST in names:
        check()
        ours = fs.read_bytes(join(staging, MANIFEST))
        try:
            if ours is None:  # staging moved away meanwhile (by the attempt that published it)
                raise FileNotFoundError(f"{join(staging, MANIFEST)} is gone")
            won = create_manifest(final, ours, fs)  # create-only: never over another's manifest
        except Exception:
            if published(final, range_id, fs):
                _withdraw(final, copied, fs, mine)
                return
            raise
        if not won:
            removed = _withdraw(final, copied, fs, mine)
            raise PublishedByAnother(
                f"range {range_id}: another attempt published {final} first; this attempt's manifest was "
                f"refused there (create-only) and its {removed} file(s) not in that manifest removed, so "
                "nothing of this attempt is published")
    else:  # pragma: no cover - the batch publishes only staging copies it wrote a manifest into
        fs.mkdirs(final)
    fs.delete(staging)


def move_aside(final: str, fs: OutputFS, stays: Callable[[str], bool], what: str) -> str:
    """Move the directory at ``final`` aside (renamed ``<final>.superseded-<seconds>``: never deleted)
    before publishing there; returns where it went. An attempt stalled between its look at the
    directory and this move may move what another attempt published there meanwhile: when what moved
    ``stays(aside)``, it is put back and :class:`PublishedByAnother` names ``what``."""
    aside = f"{final.rstrip('/')}.superseded-{int(time.time())}"
    fs.rename(final, aside)
    if stays(aside):  # stalled in the move: what it moved is the winner's
        fs.rename(aside, final)
        raise PublishedByAnother(
            f"{what}: another attempt published {final} first, while this attempt was moving a foreign "
            "directory aside there; its output is back in place and nothing of this attempt is published")
    log.warning("moved %s aside to %s", final, aside)
    return aside


def create_manifest(directory: str, ours: bytes, fs: OutputFS = LOCAL, *, patience: float = 5.0) -> bool:
    """Write ``ours`` as ``directory``'s manifest only where none is (``OutputFS.create_file``: an
    exclusive create, on S3 ``If-None-Match: *``, on Hadoop ``create(overwrite=false)``): the one
    rule by which a batch's publish and a streaming micro-batch place a range's manifest.

    True when the manifest in place is ours: created now, or refused while the one in place is
    ``ours`` byte for byte (a retried PUT whose first try landed, its answer lost, is refused by the
    store; another attempt published the same staging copy); then nothing is lost and nothing is to
    be withdrawn. False when another's manifest is in place (nothing written). A refusal with nothing
    to read yet (S3's 409 while a conditional PUT of the key is in flight, perhaps our own first try)
    is asked again, the create too, for up to ``patience`` seconds; still nothing there: False."""
    target = join(directory, MANIFEST)
    deadline, pause = time.monotonic() + patience, 0.05
    while True:
        try:
            fs.create_file(target, ours)
        except FileExistsError:
            there = fs.read_bytes(target)
            if there is not None or time.monotonic() >= deadline:
                return there == ours
        else:
            return True
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def _withdraw(final: str, copied: list[str], fs: OutputFS, mine: bytes | None) -> int:
    """After another attempt published ``final`` first: delete the files this attempt copied there
    that its manifest does not list, so the directory is exactly as that attempt published it (data
    file names are distinct per job; a name it lists came from the same staging copy). A manifest
    that is this attempt's own staging manifest (``mine``) byte for byte was published from the same
    staging copy: every file copied is that attempt's too (its ``_dead_letter`` files, never listed,
    among them), so none goes. A manifest that lists no files leaves them (nothing is known to be
    foreign). Returns how many went."""
    raw = fs.read_bytes(join(final, MANIFEST))
    if raw is None or raw == mine:
        return 0
    try:
        manifest = json.loads(raw)
    except ValueError:
        manifest = None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, list):
        return 0
    keep = set(listed)
    gone = [rel for rel in copied if rel not in keep]
    for rel in gone:
        fs.delete(join(final, rel))
    if gone:
        log.warning("%s was published by another attempt; removed this attempt's %d file(s) it does not list",
                    final, len(gone))
    return len(gone)


def withdraw_leftovers(attempt: str, fs: OutputFS = LOCAL) -> int:
    """Before an earlier attempt's staging directory is swept: for each staging copy in it whose
    range is published by another attempt (the manifest at the copy's ``output`` names its range and
    is not its own), delete the files of this copy that that manifest does not list, as the attempt
    itself would have had it not died between its refused manifest and its cleanup
    (:func:`_withdraw`, the one rule: data file names are distinct per job, so a name this copy has
    and that manifest does not list is this attempt's). Returns how many went."""
    removed = 0
    for rel in fs.files(attempt):
        if name(rel) != MANIFEST or rel == MANIFEST:
            continue
        copy = join(attempt, parent(rel))
        mine = fs.read_bytes(join(copy, MANIFEST))
        try:
            manifest = json.loads(mine) if mine is not None else None
        except ValueError:
            continue
        final, range_id = (manifest.get("output"), manifest.get("range_id")) if isinstance(manifest, dict) \
            else (None, None)
        if not isinstance(final, str) or not isinstance(range_id, int) or not published(final, range_id, fs):
            continue
        there = set(fs.files(final))
        removed += _withdraw(final, [n for n in fs.files(copy) if n != MANIFEST and n in there], fs, mine)
    return removed


def remove(location: str, fs: OutputFS = LOCAL) -> None:
    """Delete a staging directory (best effort: a leftover is harmless, never published)."""
    try:
        fs.delete(location)
    except Exception as exc:  # a leftover is never published; the next sweep tries again
        log.warning("could not remove %s: %s", location, exc)
