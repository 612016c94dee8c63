"""Which offset-addressed log a source URL names, and how to reach it: the one table from URL scheme to
log client, Spark data source format and ledger identity.

The batch, the Spark job and the CLI treat a RabbitMQ stream (partition) and a mewbase channel alike:
both are logs addressed by increasing offsets (positions) with gaps, read in exact ``[start, end)``
ranges. Only this module knows which client serves which scheme, so a new kind of log is one more row
here. Nothing is imported until it is used: the CLI builds its parser without any protocol stack.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

from streamledger.errors import StreamledgerError

__all__ = [
    "KINDS",
    "MAX_OFFSET",
    "LogKind",
    "OffsetLog",
    "UnsupportedSource",
    "canonical_identity",
    "conn_kind",
    "connect_log",
    "find_kind",
    "log_kind",
    "require_feature",
    "server_identities",
    "server_name",
    "source_identity",
    "spark_format",
]


MAX_OFFSET = 2**63 - 1
"""The largest offset a range may name, for every kind of log: the ledger stores offsets as signed
64-bit integers (SQL ``BIGINT``) and mewbase positions are int64, so a larger one is refused as input
rather than failing half-way in a database driver."""


class UnsupportedSource(StreamledgerError, ValueError):
    """The URL's scheme names no log streamledger can read, or a feature the log does not have."""


class OffsetLog(Protocol):
    """The calls planning, the batch and the audit make of a log (``StreamClient`` and ``MewbaseLog``)."""

    def first_offset(self, name: str) -> int: ...
    def committed_tail(self, name: str) -> int: ...
    def resolve_offset(self, name: str, spec: Any) -> int: ...
    def query_offset(self, stream: str, reference: str) -> int | None: ...
    def store_offset_verified(
        self, stream: str, reference: str, offset: int, *, timeout: float = ...
    ) -> None: ...
    def partitions(self, super_stream: str) -> list[str]: ...
    def read_range(self, stream: str, start: int, end: int, *, decode: Any = ...) -> Iterator[Any]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...


@dataclass(frozen=True, slots=True)
class LogKind:
    """One kind of log: its URL schemes, client, Spark format and how the ledger names its server."""

    name: str  #: the ledger identity's scheme: ``rabbitmq`` or ``mewbase``
    schemes: tuple[str, ...]
    client: str  #: ``module:Class`` with ``connect(url, *, timeout)``, imported on first use
    spark_format: str
    unit: str  #: what one log is called in messages: ``stream`` or ``channel``
    decodes: tuple[str, ...]  #: the Spark source's ``decode`` values; the first is the default
    super_streams: bool  #: whether a name can stand for several partitions
    airflow_hook: str  #: ``module:Class`` of the Airflow hook serving a connection of this kind
    files_schema_ref: str = "streamledger.schemas:ARROW_SCHEMA"
    """``module:NAME`` of the pyarrow schema of the files the job writes from this kind of log (what
    a table sink's table must have), imported on first use."""
    files_ddl_ref: str = "streamledger.schemas:SPARK_SCHEMA_DDL"
    """``module:NAME`` of the same columns as Spark DDL (the view a transform reads, ``records``)."""

    @property
    def conn_type(self) -> str:
        """The Airflow connection type of this kind: the first scheme as Airflow spells a URI's
        scheme (``-`` as ``_``), so ``AIRFLOW_CONN_X=<url>`` gets it too."""
        return self.schemes[0].replace("-", "_")

    @property
    def default_decode(self) -> str:
        return self.decodes[0]

    def files_schema(self) -> Any:
        """The pyarrow schema of the job's files for this kind (see :attr:`files_schema_ref`)."""
        module, _, attr = self.files_schema_ref.partition(":")
        return getattr(importlib.import_module(module), attr)

    def files_ddl(self) -> str:
        """The job's raw columns for this kind as Spark DDL (see :attr:`files_ddl_ref`)."""
        module, _, attr = self.files_ddl_ref.partition(":")
        ddl: str = getattr(importlib.import_module(module), attr)
        return ddl

    def connect(self, url: str, *, timeout: float = 10.0) -> OffsetLog:
        module, _, attr = self.client.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        log: OffsetLog = cls.connect(url, timeout=timeout)
        return log

    def identity(self, url: str, name: str | None = None) -> str:
        """A credential-free, stable name for the server in the ledger (see :func:`source_identity`)."""
        parts = urlsplit(url)
        if self.name == "mewbase":  # a mewbase server has no vhost
            where = quote(name, safe="@._-") if name else f"{parts.hostname or 'localhost'}:{parts.port}"
            return canonical_identity(f"mewbase://{where}")
        vhost = parts.path[1:]  # as the client reads it: percent-encoded, empty for the default
        if name:
            return canonical_identity(f"rabbitmq://{quote(name, safe='@._-')}/{vhost}")
        host = parts.hostname or "localhost"
        port = parts.port or (5551 if parts.scheme.endswith("+tls") else 5552)
        return canonical_identity(f"rabbitmq://{host}:{port}/{vhost}")


RABBITMQ = LogKind(
    name="rabbitmq",
    schemes=("rabbitmq-stream", "rabbitmq-stream+tls"),  # protocol.rabbitmq.url SCHEME / TLS_SCHEME
    client="streamledger.protocol.rabbitmq:StreamClient",
    spark_format="rabbitmq_stream",
    unit="stream",
    decodes=("amqp", "raw"),
    super_streams=True,
    airflow_hook="streamledger.hooks.rabbitmq_stream:RabbitMQStreamHook",
)
MEWBASE = LogKind(
    name="mewbase",
    schemes=("mewbase",),  # protocol.mewbase.conventions.URL_SCHEME
    client="streamledger.protocol.mewbase:MewbaseLog",
    spark_format="mewbase",
    unit="channel",
    decodes=("bson", "raw"),
    super_streams=False,
    airflow_hook="streamledger.hooks.mewbase:MewbaseHook",
    files_schema_ref="streamledger.schemas:MEWBASE_ARROW_SCHEMA",
    files_ddl_ref="streamledger.schemas:MEWBASE_SCHEMA_DDL",
)
KINDS: tuple[LogKind, ...] = (RABBITMQ, MEWBASE)
_BY_SCHEME = {scheme: kind for kind in KINDS for scheme in kind.schemes}


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].strip().lower() if "://" in url else ""


def find_kind(url: str) -> LogKind | None:
    """The kind of log ``url`` names, or None for a scheme no kind has."""
    return _BY_SCHEME.get(_scheme(url))


def log_kind(url: str) -> LogKind:
    """The kind of log ``url`` names; :class:`UnsupportedSource` (naming only the scheme) otherwise."""
    scheme = _scheme(url)
    kind = _BY_SCHEME.get(scheme)
    if kind is None:
        known = ", ".join(f"{s}://" for s in _BY_SCHEME)
        shown = f"scheme {scheme!r}" if scheme else "no scheme"
        raise UnsupportedSource(f"source URL has {shown}; streamledger reads {known}")
    return kind


def connect_log(url: str, *, timeout: float = 10.0) -> OffsetLog:
    """A connected client of the log ``url`` names (a context manager): the batch's ``Broker``."""
    return log_kind(url).connect(url, timeout=timeout)


def conn_kind(conn_type: str | None) -> LogKind | None:
    """The kind of log an Airflow connection of type ``conn_type`` names (Airflow spells a URI's
    scheme with ``_`` for ``-``: ``rabbitmq_stream``, ``rabbitmq_stream+tls``, ``mewbase``), or None."""
    return find_kind(f"{(conn_type or '').replace('_', '-')}://")


def spark_format(url: str) -> str:
    """The Spark data source format that reads the log ``url`` names."""
    return log_kind(url).spark_format


def source_identity(url: str, name: str | None = None) -> str:
    """The ledger's name for the server: ``rabbitmq://<name>/<vhost>`` or ``mewbase://<name>``.

    ``name`` is the server's stable name (a RabbitMQ cluster name, or one the user sets); all nodes,
    DNS aliases and load balancers of one cluster share it. Without it the URL's ``host:port`` stands
    in (a batch that learns the name later adopts such rows, see ``Ledger.rename_broker``).
    """
    return log_kind(url).identity(url, name)


def shared_name_problem(url: str, reported: str | None, given: str | None) -> str | None:
    """Why a URL naming more nodes (``nodes=``) cannot be given a history here, else None.

    Which node answers then depends on which one is up, so the identity must be one the whole cluster
    shares: a name the user gives (``broker_name``), or the cluster's configured ``cluster_name``. A
    RabbitMQ cluster without one reports each node's own default, ``<prefix>@<host>``: a failover would
    file the pipeline under a second name with a history of its own and read its streams again."""
    if given or not reported or "@" not in reported or "nodes=" not in url:
        return None
    if log_kind(url).name != "rabbitmq":
        return None
    from streamledger.protocol.rabbitmq.url import parse_url

    if not parse_url(url).fallbacks:
        return None
    return (f"the broker URL names more nodes (nodes=) but the cluster name {reported!r} is RabbitMQ's "
            "per-node default (no cluster_name configured): each node would file the pipeline's history "
            "under its own name; configure the cluster's cluster_name (rabbitmqctl set_cluster_name) "
            "or give broker_name")


def _canonical_where(where: str) -> str:
    """A server's part of an identity: a quoted name stays; ``host:port`` (an unquoted ``:``, which a
    quoted name never has) gets its host lower-cased and an IPv6 address bracketed."""
    host, colon, port = where.rpartition(":")
    if not colon or not port.isdigit():
        return where
    host = host.strip("[]").lower()
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def canonical_identity(identity: str) -> str:
    """The one spelling of a ledger identity (``rabbitmq://<where>/<vhost>``, ``mewbase://<where>``,
    either with a retired epoch's ``#epoch<N>`` suffix): the vhost percent-decoded and encoded again
    (every byte but letters, digits and ``-._~`` as upper-case ``%XX``; empty is the default vhost
    ``/``, so ``%2F``), a ``host:port`` server lower-cased with IPv6 in brackets. So ``…/%2F``,
    ``…/%2f`` and ``…/`` (how URLs spell the default vhost) are one broker, as the broker sees it.
    Identities of other forms are returned unchanged. Every identity the ledger records goes through
    here (:meth:`LogKind.identity`), and recorded ones in other spellings are adopted by the next
    batch or streaming query of their pipeline (``Ledger.adopt_identity``)."""
    base, hash_, suffix = identity.partition("#")  # a quoted identity holds no raw '#'
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in {k.name for k in KINDS}:
        return identity
    where, slash, vhost = rest.partition("/")
    out = f"{scheme}://{_canonical_where(where)}"
    if scheme == RABBITMQ.name:
        out += "/" + quote(unquote(vhost) if slash and vhost else "/", safe="")
    return out + hash_ + suffix


def server_name(log: object) -> str | None:
    """The stable name a connected server reports (a RabbitMQ cluster name), None when it has none."""
    name = getattr(log, "cluster_name", None)
    return name if isinstance(name, str) and name else None


def server_identities(url: str, log: object, name: str | None = None) -> tuple[str, ...]:
    """Every identity the ledger may record sources of this server under, the own one first.

    ``log`` is connected from ``url``; ``name`` overrides the name it reports. Besides the name-based
    identity, rows of the URL's ``host:port`` form (written before the name was known, and adopted by
    the next batch of their pipeline) belong to the same server.
    """
    name = name or server_name(log)
    own = source_identity(url, name)
    legacy = source_identity(url)
    return (own,) if legacy == own else (own, legacy)


def require_feature(url: str, feature: str, *, kinds: tuple[str, ...] = ("rabbitmq",)) -> LogKind:
    """Refuse, in one line, a feature the log ``url`` names does not have (super streams, topology ...)."""
    kind = log_kind(url)
    if kind.name not in kinds:
        scheme = kind.schemes[0]
        needed = " or ".join(kinds)
        raise UnsupportedSource(
            f"{feature} is only available for {needed} sources; "
            f"a {scheme}:// URL names a {kind.name} {kind.unit}"
        )
    return kind


def super_stream_partitions(log: Any, super_stream: str, *,
                            error: type[StreamledgerError] = StreamledgerError) -> list[str]:
    """A super stream's partitions as the log lists them now; none is an error (``error`` keeps the
    caller's error type). The one place a super stream is expanded: the batch, the Spark batch and
    streaming sources and the job module call it."""
    names = list(log.partitions(super_stream))
    if not names:
        raise error(f"super stream {super_stream!r} has no partitions")
    return names
