"""Atomic range outputs: a job writes into a staging directory; a verified, committed range is
published by one ``rename`` to its own directory, which nothing ever deletes or rewrites.

Why commit before publish: only the holder of a claim can commit it, so a worker that lost its
claim (abandoned, taken over) is fenced out of the commit *and* of the publish that follows; a
committed range whose publish was interrupted finds its verified staging copy through the ledger
(``OffsetRange.staging``) and the retry finishes the rename without reading the stream again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"


def local_path(location: str) -> Path:
    """A local (or shared POSIX) path from ``/x`` or ``file:///x``; other schemes are refused."""
    if location.startswith("file://"):
        location = location[len("file://") :]
    if "://" in location:
        raise ValueError(f"output {location!r}: only local (or shared POSIX) paths are supported")
    return Path(location).absolute()


def write_manifest(directory: str, manifest: Mapping[str, Any]) -> None:
    """Write ``_manifest.json`` atomically (temp file + rename)."""
    path = local_path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path / MANIFEST)


def read_manifest(directory: str) -> dict[str, Any] | None:
    path = local_path(directory) / MANIFEST
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def published(final: str, range_id: int) -> bool:
    """True when ``final`` holds the published output of ledger range ``range_id``."""
    manifest = read_manifest(final)
    return manifest is not None and manifest.get("range_id") == range_id


def publish(staging: str, final: str, range_id: int) -> None:
    """Move a verified staging directory to its final place in one rename.

    A directory already at ``final`` that belongs to another range id cannot be a committed
    output of this ledger (one committed range per span); it is moved aside, never deleted.
    """
    src, dst = local_path(staging), local_path(final)
    if published(final, range_id):
        return
    if dst.exists():
        aside = dst.with_name(f"{dst.name}.superseded-{int(time.time())}")
        log.warning("%s holds no output of range %d; moving it aside to %s", dst, range_id, aside)
        os.replace(dst, aside)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dst)


def remove(location: str) -> None:
    """Delete a staging directory (best effort: a leftover is harmless, never published)."""
    shutil.rmtree(local_path(location), ignore_errors=True)
