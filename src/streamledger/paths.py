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

A broker identity gets a directory a person can read (:func:`broker_component`): the server's name
as the ledger records it, a RabbitMQ cluster's ``rabbit~40host`` or ``host~3A5552`` (``@`` and ``:``
escaped like any byte outside the ordinary set: ``file://`` URIs quote an ``@`` and pyiceberg would not
find the file again; Hadoop takes a ``:`` for a scheme), then ``~v<vhost>`` only for a vhost other
than ``/``; a mewbase server's ends in ``~m``; an identity of no known form is ``~u`` and its escaped
text. ``~`` followed by a lower-case letter is written by no escape, so the markers are unambiguous:
the component is reversible (:func:`decode_broker_component`, the canonical identity) and injective,
and never one the layout before it wrote (``rabbitmq~3A~2F~2F…``; ranges published there keep their
recorded paths).
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from urllib.parse import quote, unquote_to_bytes

__all__ = [
    "ESCAPE", "MAX_COMPONENT_BYTES", "broker_component", "decode_broker_component", "decode_component",
    "encode_component", "fit_component", "name_problem",
]

ESCAPE = "~"
MAX_COMPONENT_BYTES = 255
"""The usual limit of one directory name (ext4, XFS, APFS, HDFS's default, NTFS in UTF-16 units)."""

_HASHED = ESCAPE * 2
_DIGEST_HEX = 32
_ORDINARY = frozenset(string.ascii_letters + string.digits + "-_.")
_NO_DOTS = _ORDINARY - {"."}
# After a server's name, markers no escape writes (an escape is ``~`` and two upper-case hex digits):
_VHOST = ESCAPE + "v"  # a vhost other than the default follows
_MEWBASE = ESCAPE + "m"  # a mewbase server (no vhost)
_OTHER = ESCAPE + "u"  # an identity of no known form, escaped whole
_HEX = frozenset("0123456789ABCDEF")


def _escape(text: str, ordinary: frozenset[str], *, first: bool) -> str:
    """``text``'s UTF-8 with every byte outside ``ordinary`` as ``~XX``; ``first``: it begins a
    component, so a leading ``.`` or ``_`` is escaped too."""
    out = []
    for i, byte in enumerate(text.encode("utf-8")):  # a lone surrogate raises: name_problem refuses it
        ch = chr(byte)
        if ch in ordinary and not (first and i == 0 and ch in "._"):
            out.append(ch)
        else:
            out.append(f"{ESCAPE}{byte:02X}")
    return "".join(out)


def _unescape(text: str, ordinary: frozenset[str]) -> str:
    """The text :func:`_escape` turned into ``text`` (``ValueError`` for what it never writes, but
    without the leading-character rule, which callers check by encoding again)."""
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ESCAPE:
            code = text[i + 1:i + 3]
            if len(code) != 2 or not set(code) <= _HEX:
                raise ValueError(f"component {text!r}: {ESCAPE!r} at {i} is not two hex digits' escape")
            raw.append(int(code, 16))
            i += 3
        elif ch in ordinary:
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"component {text!r}: {ch!r} at {i} is never written unescaped")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"component {text!r} does not decode to UTF-8") from None


def encode_component(name: str, *, limit: int = MAX_COMPONENT_BYTES, keep_dots: bool = True) -> str:
    """``name`` as one path component (see the module docstring). ``keep_dots=False`` escapes
    every ``.`` too, for parts joined by dots into one name (the staging names)."""
    if not name:
        return ESCAPE
    return fit_component(_escape(name, _ORDINARY if keep_dots else _NO_DOTS, first=True), limit)


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
    name = _unescape(component, _ORDINARY)
    if encode_component(name, limit=len(component), keep_dots=keep_dots) != component:
        raise ValueError(f"component {component!r} is not an encoding streamledger writes")
    return name


def broker_component(identity: str, *, limit: int = MAX_COMPONENT_BYTES) -> str:
    """The directory of a log server's ranges, from its ledger identity (any spelling: the one rule,
    :func:`streamledger.sources.canonical_identity`, makes it canonical first). See the module
    docstring; :func:`decode_broker_component` gives the canonical identity back."""
    from streamledger.sources import canonical_identity

    canonical = canonical_identity(identity)
    component = _readable_broker(canonical)
    if component is None or _broker_of(component) != canonical:  # by construction the name is reversible
        component = _OTHER + _escape(canonical, _ORDINARY, first=False)
    return fit_component(component, limit)


def _readable_broker(canonical: str) -> str | None:
    """``<server>`` / ``<server>~v<vhost>`` / ``<server>~m``, or None for another form of identity."""
    scheme, sep, rest = canonical.partition("://")
    if not sep or "#" in canonical:  # a retired epoch's identity names no directory of its own
        return None
    if scheme == "rabbitmq":
        where, _, vhost = rest.partition("/")
        try:
            name = unquote_to_bytes(vhost).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not where or not name:
            return None
        server = _escape(where, _ORDINARY, first=True)
        return server if name == "/" else server + _VHOST + _escape(name, _ORDINARY, first=False)
    if scheme == "mewbase" and rest and "/" not in rest:
        return _escape(rest, _ORDINARY, first=True) + _MEWBASE
    return None


def _broker_of(component: str) -> str:
    if component.startswith(_OTHER):
        return _unescape(component[len(_OTHER):], _ORDINARY)
    if component.endswith(_MEWBASE):
        return "mewbase://" + _unescape(component[:-len(_MEWBASE)], _ORDINARY)
    server, sep, vhost = component.partition(_VHOST)
    name = _unescape(vhost, _ORDINARY) if sep else "/"
    return f"rabbitmq://{_unescape(server, _ORDINARY)}/{quote(name, safe='')}"


def decode_broker_component(component: str) -> str:
    """The canonical identity :func:`broker_component` turned into ``component`` (``ValueError`` for a
    long identity's hash and anything it would not write)."""
    if _HASHED in component:
        raise ValueError(f"component {component[:40]!r}... is a long name's hash: the ledger holds the name")
    identity = _broker_of(component)
    if broker_component(identity, limit=len(component)) != component:
        raise ValueError(f"component {component!r} is not a broker directory streamledger writes")
    return identity


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
