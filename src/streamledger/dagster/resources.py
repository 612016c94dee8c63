"""Dagster resources for the systems a stream batch touches: the source log, the ledger, Spark (and a
non-default Iceberg catalog).

Each resource is plain configuration (so Dagster can show, validate and override it) plus a lazily
built client: the ledger is opened once per resource instance, the Spark runner once per process
(:func:`streamledger.spark.runners.runner_for`), because a SparkSession costs seconds to start and
outlives a run when runs share a process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from streamledger.errors import StreamledgerError

if TYPE_CHECKING:
    from streamledger.batch import JobRunner
    from streamledger.ledger import Ledger
    from streamledger.sources import OffsetLog


class ResourceConfigError(StreamledgerError):
    """A resource is configured in a way that cannot work (named field, never a secret)."""


_TLS_FIELDS = ("ca_file", "cert_file", "key_file", "server_hostname")


class StreamSourceResource(ConfigurableResource):  # type: ignore[type-arg]
    """The log a stream batch reads: any URL :mod:`streamledger.sources` knows, and TLS settings.

    ``url`` is ``rabbitmq-stream://user:pass@host:5552/vhost`` or ``rabbitmq-stream+tls://…:5551/``
    (a RabbitMQ stream or super stream), or ``mewbase://[user:pass@]host:port`` (a mewbase channel,
    read as ``stream=``; super streams are RabbitMQ's). Pass it as ``EnvVar("STREAMLEDGER_RABBITMQ_URL")``
    so the password stays out of the Dagster UI. The TLS fields (RabbitMQ only) are merged into the
    URL's query, because the URL is also what the Spark job's readers connect with (one description
    of the source for driver and executors).
    """

    url: str = Field(description="Source URL (rabbitmq-stream://, rabbitmq-stream+tls:// or mewbase://).")
    ca_file: str | None = Field(default=None, description="CA bundle (PEM) to verify the broker.")
    cert_file: str | None = Field(default=None, description="Client certificate (PEM) for mutual TLS.")
    key_file: str | None = Field(default=None, description="Private key (PEM) of the client certificate.")
    server_hostname: str | None = Field(default=None, description="Name to verify instead of the host.")
    verify: bool = Field(default=True, description="Verify the broker's certificate and host name.")
    timeout: float = Field(default=10.0, description="Connect and request timeout in seconds.")

    def connection_url(self) -> str:
        """The URL with the TLS fields applied; it may hold a password, so never log it."""
        from streamledger.sources import log_kind

        log_kind(self.url)  # an unknown scheme: one line naming it, never the URL
        parts = urlsplit(self.url)
        tls_set = [name for name in _TLS_FIELDS if getattr(self, name)]
        if not self.verify:
            tls_set.append("verify")
        if not parts.scheme.endswith("+tls"):
            if tls_set:
                raise ResourceConfigError(
                    f"{type(self).__name__}: {', '.join(tls_set)} given but the URL scheme is "
                    f"{parts.scheme!r}; use rabbitmq-stream+tls:// (port 5551) for TLS"
                )
            return self.url
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        for name in _TLS_FIELDS:
            value = getattr(self, name)
            if value:
                query[name] = value
        if not self.verify:
            query["verify"] = "false"
        return urlunsplit(parts._replace(query=urlencode(query)))

    def describe(self) -> str:
        """``host:port/vhost`` (RabbitMQ) or ``mewbase host:port`` for logs and metadata (no credentials)."""
        from streamledger.sources import log_kind

        kind = log_kind(self.url)
        parts = urlsplit(self.url)
        if kind.name != "rabbitmq":
            return f"{kind.name} {parts.hostname or '127.0.0.1'}:{parts.port}"
        tls = parts.scheme.endswith("+tls")
        port = parts.port or (5551 if tls else 5552)
        return f"{parts.hostname or '127.0.0.1'}:{port}/{parts.path.lstrip('/')}{' (tls)' if tls else ''}"

    @contextmanager
    def get_client(self) -> Iterator[OffsetLog]:
        """A connected log client (``StreamClient``, ``MewbaseLog``), closed when the block ends."""
        from streamledger.sources import connect_log

        with connect_log(self.connection_url(), timeout=self.timeout) as client:
            yield client


class RabbitMQStreamResource(StreamSourceResource):
    """The former name of :class:`StreamSourceResource` (it takes any source URL too)."""


class StreamLedgerResource(ConfigurableResource):  # type: ignore[type-arg]
    """The SQL offset ledger (SQLite or PostgreSQL) that decides which ranges are done.

    ``url`` ``None`` means ``$STREAMLEDGER_LEDGER_URL`` or SQLite under ``$STREAMLEDGER_HOME``.
    ``create`` runs the migrations to head on first use (safe from many processes); turn it off
    where the schema is managed separately and a missing schema should be an error.
    """

    url: str | None = Field(default=None, description="SQLAlchemy URL of the ledger database.")
    create: bool = Field(default=True, description="Create/upgrade the ledger schema on first use.")

    _ledger: Any = PrivateAttr(default=None)

    def get_ledger(self) -> Ledger:
        if self._ledger is None:
            from streamledger.ledger import Ledger

            self._ledger = Ledger(self.url or None, create=self.create)
        ledger: Ledger = self._ledger
        return ledger


class IcebergCatalogResource(ConfigurableResource):  # type: ignore[type-arg]
    """The pyiceberg catalog an Iceberg sink commits to (any catalog pyiceberg loads: REST, Glue,
    Hive, SQL...). Without one, a batch with ``sink="iceberg"`` uses a SQL catalog in the ledger's
    own database.

    ``properties`` are the catalog's plain properties (``type``, ``warehouse``...). The two that may
    hold a secret have fields of their own, so each can be an ``EnvVar`` (resolved at run time, never
    shown in the UI): ``uri`` (a REST endpoint, or a SQL catalog's database URL with its password)
    and ``credential`` (a REST catalog's ``client_id:secret``); ``secret_properties`` names further
    properties to read from environment variables at run time (``{"s3.secret-access-key":
    "AWS_SECRET_ACCESS_KEY"}``).
    """

    properties: dict[str, str] = Field(default_factory=dict, description="pyiceberg catalog properties.")
    uri: str | None = Field(default=None, description="The catalog's uri (may hold a password: EnvVar).")
    credential: str | None = Field(default=None, description="A REST catalog's credential (EnvVar).")
    secret_properties: dict[str, str] = Field(
        default_factory=dict, description="property -> name of the environment variable holding it")

    def catalog_properties(self) -> dict[str, str]:
        """The properties handed to the sink; they may hold secrets, so never log them."""
        import os

        props = dict(self.properties)
        if self.uri:
            props["uri"] = self.uri
        if self.credential:
            props["credential"] = self.credential
        for prop, env in self.secret_properties.items():
            if env not in os.environ:
                raise ResourceConfigError(f"IcebergCatalogResource: ${env} (for {prop!r}) is not set")
            props[prop] = os.environ[env]
        if not props:
            raise ResourceConfigError("IcebergCatalogResource: no catalog property given")
        return props


class StreamSparkResource(ConfigurableResource):  # type: ignore[type-arg]
    """Where the Spark job of a batch runs: an in-process local master, or a Spark Connect server.

    ``master`` (default ``local[2]``) starts Spark in the Dagster step's process; the session is kept
    for later runs in that process. ``remote`` (``sc://host:15002``) selects Spark Connect instead
    (the server's own conf applies). Both come from :func:`streamledger.spark.runners.runner_for`,
    the cache the Airflow operator uses too. ``quick_start`` only takes effect when this resource
    starts the JVM (measured in :mod:`streamledger.spark.session`: session start 26-30 s -> 13-14 s
    on 2 cores).
    """

    master: str = Field(default="local[2]", description="Spark master for an in-process session.")
    remote: str | None = Field(
        default=None, description="Spark Connect URL (sc://host:port); overrides master."
    )
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")
    quick_start: bool = Field(
        default=False,
        description="C1-only JIT + serial GC for the local driver: faster start, slower long reads.",
    )

    def get_runner(self) -> JobRunner:
        """The job runner handed to ``run_batch`` (one per configuration and process)."""
        from streamledger.spark.runners import runner_for

        if self.remote:
            if not self.remote.startswith("sc://"):
                host = urlsplit(self.remote).netloc.split(";", 1)[0]  # never the token after ";"
                raise ResourceConfigError(
                    f"StreamSparkResource.remote must be an sc:// URL, got one for {host!r}"
                )
            return runner_for(remote=self.remote)
        conf = dict(self.conf)
        if self.quick_start:
            from streamledger.spark.session import QUICK_START_JAVA_OPTIONS

            conf.setdefault("spark.driver.extraJavaOptions", QUICK_START_JAVA_OPTIONS)
        return runner_for(master=self.master, conf=conf)
