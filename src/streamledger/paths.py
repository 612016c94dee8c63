"""Names as path components: the one rule that turns a pipeline, a broker identity, a stream or a
run's name into a single directory name, and the one rule for names no ledger or file system holds.

Names come from users, templated fields and the broker (a super stream's partitions as it lists
them); RabbitMQ takes ``../../x`` or a NUL as a stream name. Written into a path unchanged, ``..``
leaves the output root, ``/`` adds levels and two names can share a directory (``a/b`` and
``a_b`` under the old ``/`` -> ``_`` rule). :func:`encode_component` is injective and its output is
always exactly one harmless component:

* letters, digits, ``-``, ``_`` and ``.`` stay as they are (ordinary names keep their directory),
  except a leading ``.`` or ``_`` (so no component is ``.``, ``..``, hidden from Hadoop and Spark
  readers, or the batch's own ``_staging``);
* every other byte of the name's UTF-8 becomes ``~XX`` (upper-case hex), ``~`` itself included:
  ``~`` is an unreserved URI character, so ``file://``, ``s3a://`` or Hadoop paths never unquote
  or glob it (``%`` would be unquoted by ``file://`` handling; ``*?[]{}\\`` are Hadoop globs);
* the empty name is ``~``;
* a component longer than :data:`MAX_COMPONENT_BYTES` keeps a prefix and ends in ``~~`` and 32 hex
  digits of the SHA-256 of its full encoding (:func:`fit_component`). ``~~`` appears in no other
  encoding, so this stays collision-free (up to the hash), but **only this case is not reversible
  from the path alone**; the ledger keeps the names (pipeline, source) next to each range's ``output``.

:func:`decode_component` inverts it and refuses anything ``encode_component`` would not write.
"""

from __future__ import annotations

import hashlib
import string
import unicodedata

__all__ = [
    "ESCAPE", "MAX_COMPONENT_BYTES", "decode_component", "encode_component", "fit_component", "name_problem",
]

ESCAPE = "~"
MAX_COMPONENT_BYTES = 255
"""The usual limit of one directory name (ext4, XFS, APFS, HDFS's default, NTFS in UTF-16 units)."""

_HASHED = ESCAPE * 2
_DIGEST_HEX = 32
_ORDINARY = frozenset(string.ascii_letters + string.digits + "-_.")
_HEX = frozenset("0123456789ABCDEF")


def encode_component(name: str, *, limit: int = MAX_COMPONENT_BYTES, keep_dots: bool = True) -> str:
    """``name`` as one path component (see the module docstring). ``keep_dots=False`` escapes
    every ``.`` too, for parts joined by dots into one name (the staging names)."""
    raw = name.encode("utf-8")  # a lone surrogate raises here: name_problem refuses it earlier
    if not raw:
        return ESCAPE
    out = []
    for i, byte in enumerate(raw):
        ch = chr(byte)
        if ch in _ORDINARY and not (i == 0 and ch in "._") and (keep_dots or ch != "."):
            out.append(ch)
        else:
            out.append(f"{ESCAPE}{byte:02X}")
    return fit_component("".join(out), limit)


def fit_component(component: str, limit: int = MAX_COMPONENT_BYTES) -> str:
    """``component`` (an encoding, or several joined by ``.``) if it fits in ``limit`` bytes, else
    a prefix of it (never half an escape), ``~~`` and 32 hex digits of its SHA-256."""
    if len(component) <= limit:
        return component
    if limit < len(_HASHED) + _DIGEST_HEX:
        raise ValueError(f"a component limit of {limit} leaves no room for the hashed form")
    cut = limit - len(_HASHED) - _DIGEST_HEX
    escape = component.rfind(ESCAPE, max(0, cut - 2), cut)
    if escape >= 0:
        cut = escape
    digest = hashlib.sha256(component.encode()).hexdigest()[:_DIGEST_HEX]
    return component[:cut] + _HASHED + digest


def decode_component(component: str, *, keep_dots: bool = True) -> str:
    """The name :func:`encode_component` turned into ``component``. ``ValueError`` for a hashed
    (too long) component, whose name only the ledger knows, and for anything it would not write."""
    if _HASHED in component:
        raise ValueError(f"component {component[:40]!r}... is a long name's hash: the ledger holds the name")
    if component == ESCAPE:
        return ""
    raw = bytearray()
    i = 0
    while i < len(component):
        ch = component[i]
        if ch == ESCAPE:
            code = component[i + 1:i + 3]
            if len(code) != 2 or not set(code) <= _HEX:
                raise ValueError(f"component {component!r}: {ESCAPE!r} at {i} is not two hex digits' escape")
            raw.append(int(code, 16))
            i += 3
        elif ch in _ORDINARY:
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"component {component!r}: {ch!r} at {i} is never written unescaped")
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"component {component!r} does not decode to UTF-8") from None
    if encode_component(name, limit=len(component), keep_dots=keep_dots) != component:
        raise ValueError(f"component {component!r} is not an encoding streamledger writes")
    return name


def name_problem(what: str, name: object) -> str | None:
    """Why ``name`` cannot name a ``what`` (``stream``, ``pipeline``...), or None when it can.

    Refused: no string or an empty one, text that is not valid Unicode (lone surrogates, as from
    undecodable bytes: no UTF-8 exists for them), NUL (PostgreSQL's text and every file system
    refuse it) and other control characters (they break one-line logs and are never meant).
    """
    if not isinstance(name, str) or not name:
        return f"{what} name must be a non-empty string, got {name!r}"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{what} {name!r} is not valid Unicode (U+{ord(name[exc.start]):04X} has no UTF-8)"
    for ch in name:
        if ch == "\x00":
            return f"{what} {name!r} holds NUL, which no ledger or file system can hold"
        if unicodedata.category(ch) == "Cc":
            return f"{what} {name!r} holds the control character U+{ord(ch):04X}"
    return None
