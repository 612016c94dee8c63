"""Streams and super streams on a RabbitMQ broker, whichever transport manages them.

One interface (:class:`Topology`) with two implementations: :class:`StreamTopology` over the stream
protocol (:class:`~streamledger.protocol.rabbitmq.StreamClient`) and :class:`Amqp10Topology` over
RabbitMQ 4's AMQP 1.0 ``/management`` node (:class:`~streamledger.protocol.amqp10.Management`).
The Airflow operators and the ``stream``/``superstream`` commands of the CLI call it and never ask
which transport is behind it; what differs between the two lives in the two classes below.

The rules both keep:

* "Already exists" with the same shape is success (``exists_ok``); another shape is a
  :class:`StreamShapeMismatch` naming what differs, and re-creating a stream with other arguments
  is :class:`StreamExistsWithOtherArguments` (one line, the broker's reason as the detail).
* Deleting a super stream deletes its partition streams. The stream protocol's DeleteSuperStream
  does that on the broker; the management node cannot list an exchange's bindings, so
  :class:`Amqp10Topology` names the partitions (given, asked of the same broker's stream port, or
  numbered and probed) and refuses rather than delete the exchange alone.

Clients are imported when a topology is opened, so the CLI's ``--help`` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from streamledger.errors import StreamledgerError

if TYPE_CHECKING:
    from streamledger.protocol.amqp10 import Management
    from streamledger.protocol.rabbitmq import StreamClient

TRANSPORTS = ("stream", "amqp10")


class StreamShapeMismatch(StreamledgerError):
    """The stream or super stream exists, but not in the requested shape."""


class StreamExistsWithOtherArguments(StreamShapeMismatch):
    """A stream of that name exists with other arguments (retention, segment size, ...)."""

    def __init__(self, name: str, detail: str | None = None) -> None:
        self.stream = name
        super().__init__(f"stream {name!r} already exists with other arguments"
                         + (f" (broker said: {detail})" if detail else ""))


class TopologyError(StreamledgerError):
    """A topology request that cannot be carried out as asked (named stream, one line)."""


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """A stream's arguments. The last three exist over AMQP 1.0 only (the stream protocol's Create
    of this client takes the first three)."""

    max_age: str | None = None
    max_length_bytes: int | None = None
    max_segment_size_bytes: int | None = None
    initial_cluster_size: int | None = None
    leader_locator: Literal["client-local", "balanced"] | None = None
    filter_size_bytes: int | None = None

    def amqp10_only(self) -> list[str]:
        """The arguments set here that only the AMQP 1.0 transport can apply."""
        names = ("initial_cluster_size", "leader_locator", "filter_size_bytes")
        return [name for name in names if getattr(self, name) is not None]


def expected_partitions(name: str, partitions: int | None, binding_keys: Sequence[str] | None) -> list[str]:
    """Partition names RabbitMQ derives for a super stream: ``<name>-<i>`` or ``<name>-<key>``."""
    if binding_keys:
        return [f"{name}-{key}" for key in binding_keys]
    if partitions is None:
        raise TopologyError(f"super stream {name!r}: give a partition count or binding keys")
    return [f"{name}-{i}" for i in range(partitions)]


def open_topology(transport: str, *, url: str, amqp_url: str | None = None,
                  timeout: float = 10.0) -> StreamTopology | Amqp10Topology:
    """A connected topology: ``stream`` over ``url`` (the stream protocol), or ``amqp10`` over
    ``amqp_url`` with ``url`` as the same broker's stream endpoint (to list partitions)."""
    if transport == "amqp10":
        if not amqp_url:
            raise TopologyError("transport amqp10 needs an AMQP 1.0 URL (amqp[s]://user:pass@host:5672/vhost)")
        return Amqp10Topology.connect(amqp_url, stream_url=url, timeout=timeout)
    if transport != "stream":
        raise TopologyError(f"topology transport {transport!r}: use stream or amqp10")
    return StreamTopology.connect(url, timeout=timeout)


class Topology(Protocol):
    """What the operators and the CLI ask of a broker's topology (a context manager)."""

    transport: str

    def stream_exists(self, name: str) -> bool: ...

    def create_stream(self, name: str, settings: StreamSettings, *, exists_ok: bool = True) -> bool:
        """Create a stream; True when created, False when it existed with these arguments."""
        ...

    def delete_stream(self, name: str, *, missing_ok: bool = True) -> bool:
        """Delete a stream; True when it existed."""
        ...

    def placement(self, name: str) -> dict[str, Any] | None:
        """Leader, members and arguments where the transport reports them (else None)."""
        ...

    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams in order; a :class:`StreamledgerError` when it does not exist."""
        ...

    def create_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        settings: StreamSettings | None = None, exists_ok: bool = True,
    ) -> tuple[list[str], bool]:
        """Create a super stream; (its partitions, whether this call created it)."""
        ...

    def delete_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        missing_ok: bool = True,
    ) -> list[str]:
        """Delete a super stream and its partition streams; returns the partitions deleted."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Topology: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class _Closing:
    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class StreamTopology(_Closing):
    """The topology over the stream protocol: the broker's Create/Delete(SuperStream) commands."""

    transport = "stream"

    def __init__(self, client: StreamClient) -> None:
        self.client = client

    @classmethod
    def connect(cls, url: str, *, timeout: float = 10.0) -> StreamTopology:
        from streamledger.protocol.rabbitmq import StreamClient

        return cls(StreamClient.connect(url, timeout=timeout))

    def close(self) -> None:
        self.client.close()

    def stream_exists(self, name: str) -> bool:
        return self.client.stream_exists(name)

    def _arguments(self, name: str, settings: StreamSettings) -> dict[str, Any]:
        only = settings.amqp10_only()
        if only:
            raise TopologyError(f"stream {name!r}: {', '.join(only)} can only be set over AMQP 1.0 "
                                "(transport amqp10)")
        return {"max_length_bytes": settings.max_length_bytes, "max_age": settings.max_age,
                "max_segment_size_bytes": settings.max_segment_size_bytes}

    def create_stream(self, name: str, settings: StreamSettings, *, exists_ok: bool = True) -> bool:
        from streamledger.protocol.rabbitmq import PreconditionFailed

        arguments = self._arguments(name, settings)
        existed = self.client.stream_exists(name)
        try:
            self.client.create_stream(name, **arguments, exists_ok=exists_ok)
        except PreconditionFailed as exc:
            if existed:  # else the name itself was refused: the broker's error says so
                raise StreamExistsWithOtherArguments(name) from exc
            raise
        return not existed

    def delete_stream(self, name: str, *, missing_ok: bool = True) -> bool:
        existed = self.client.stream_exists(name) if missing_ok else True
        self.client.delete_stream(name, missing_ok=missing_ok)
        return existed

    def placement(self, name: str) -> dict[str, Any] | None:
        return None

    def partitions(self, super_stream: str) -> list[str]:
        return list(self.client.partitions(super_stream))

    def create_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        settings: StreamSettings | None = None, exists_ok: bool = True,
    ) -> tuple[list[str], bool]:
        from streamledger.protocol.rabbitmq import StreamError

        wanted = expected_partitions(name, partitions, binding_keys)
        arguments = self._arguments(name, settings or StreamSettings())
        if exists_ok:
            try:
                existing = self.partitions(name)
            except StreamError:
                existing = []
            if existing:
                if existing != wanted:
                    raise StreamShapeMismatch(
                        f"super stream {name!r} already exists with partitions {existing}, "
                        f"not the requested {wanted}"
                    )
                return existing, False
        keys = list(binding_keys) if binding_keys else None
        self.client.create_super_stream(
            name, partitions=None if keys else partitions, binding_keys=keys,
            arguments={k: v for k, v in arguments.items() if v is not None} or None,
            exists_ok=exists_ok,
        )
        created = self.partitions(name)
        if created != wanted:
            raise StreamShapeMismatch(f"super stream {name!r} was created with partitions {created}, "
                                      f"expected {wanted}")
        return created, True

    def delete_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        missing_ok: bool = True,
    ) -> list[str]:
        from streamledger.protocol.rabbitmq import StreamError

        try:
            named = self.partitions(name)
        except StreamError:  # absent, or a broker without Partitions: DeleteSuperStream says which
            named = []
        self.client.delete_super_stream(name, missing_ok=missing_ok)
        return named


class Amqp10Topology(_Closing):
    """The topology over AMQP 1.0 (RabbitMQ 4+): queue, exchange and binding requests, building
    super streams exactly as the broker's CreateSuperStream does.

    ``stream_url`` is the same broker's stream endpoint, if known: the management node cannot list
    a super stream's partitions, the stream protocol's Partitions can. It is used only when it
    reaches the same cluster (the cluster names the two connections report agree).
    """

    transport = "amqp10"

    def __init__(self, management: Management, *, stream_url: str | None = None,
                 timeout: float = 10.0) -> None:
        self.management = management
        self.stream_url = stream_url
        self.timeout = timeout

    @classmethod
    def connect(cls, url: str, *, stream_url: str | None = None, timeout: float = 10.0) -> Amqp10Topology:
        from streamledger.protocol.amqp10 import Management

        return cls(Management.connect(url, timeout=timeout), stream_url=stream_url, timeout=timeout)

    def close(self) -> None:
        self.management.close()

    def stream_exists(self, name: str) -> bool:
        return self.management.queue_exists(name)

    @staticmethod
    def _options(settings: StreamSettings | None) -> Any:
        from streamledger.protocol.amqp10 import StreamOptions

        s = settings or StreamSettings()
        return StreamOptions(max_age=s.max_age, max_length_bytes=s.max_length_bytes,
                             max_segment_size_bytes=s.max_segment_size_bytes,
                             initial_cluster_size=s.initial_cluster_size, leader_locator=s.leader_locator,
                             filter_size_bytes=s.filter_size_bytes)

    def create_stream(self, name: str, settings: StreamSettings, *, exists_ok: bool = True) -> bool:
        from streamledger.protocol.amqp10 import Conflict

        options = self._options(settings)
        existed = self.management.queue_exists(name)
        if existed and not exists_ok:
            raise TopologyError(f"stream {name!r} already exists")
        try:
            self.management.declare_stream(name, options)
        except Conflict as exc:
            raise StreamExistsWithOtherArguments(name, exc.description) from exc
        return not existed

    def delete_stream(self, name: str, *, missing_ok: bool = True) -> bool:
        existed = self.management.queue_exists(name)
        if not existed and not missing_ok:
            raise TopologyError(f"stream {name!r} does not exist")
        self.management.delete_queue(name)
        return existed

    def placement(self, name: str) -> dict[str, Any] | None:
        return self.management.get_queue(name).as_dict()

    def _listed(self, super_stream: str) -> list[str] | None:
        """The partitions as the same broker's stream protocol lists them; None when it cannot be
        asked (no URL, unreachable, another cluster)."""
        if not self.stream_url:
            return None
        from streamledger.protocol.rabbitmq import StreamClient, StreamError, StreamNotFound

        try:
            with StreamClient.connect(self.stream_url, timeout=self.timeout) as client:
                cluster = self.management.connection.server_properties.get("cluster_name")
                if not cluster or client.cluster_name != cluster:
                    return None
                try:
                    return list(client.partitions(super_stream))
                except StreamNotFound:
                    return []
        except StreamError:
            return None

    def partitions(self, super_stream: str) -> list[str]:
        listed = self._listed(super_stream)
        if listed is None:
            listed = []
            while self.management.queue_exists(f"{super_stream}-{len(listed)}"):
                listed.append(f"{super_stream}-{len(listed)}")
            if not listed and self.management.exchange_exists(super_stream):
                from streamledger.protocol.amqp10 import PartitionsUnknown

                raise PartitionsUnknown(
                    f"super stream {super_stream!r}: its partitions are not numbered and the AMQP 1.0 "
                    "management node cannot list them; give its binding keys"
                )
        if not listed:
            raise TopologyError(f"super stream {super_stream!r} does not exist")
        return listed

    def create_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        settings: StreamSettings | None = None, exists_ok: bool = True,
    ) -> tuple[list[str], bool]:
        from streamledger.protocol.amqp10 import Conflict

        wanted = expected_partitions(name, partitions, binding_keys)
        m = self.management
        existing = [p for p in wanted if m.queue_exists(p)]
        if existing and not exists_ok:
            raise TopologyError(f"super stream {name!r} already exists")
        if partitions is not None and m.queue_exists(f"{name}-{partitions}"):
            raise StreamShapeMismatch(f"super stream {name!r} already has more than {partitions} partitions")
        try:
            created = m.create_super_stream(name, partitions=partitions,
                                            binding_keys=list(binding_keys) if binding_keys else None,
                                            options=self._options(settings))
        except Conflict as exc:
            raise StreamShapeMismatch(f"super stream {name!r} exists in another shape "
                                      f"(broker said: {exc.description})") from exc
        return created, len(existing) < len(wanted)

    def delete_super_stream(
        self, name: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None,
        missing_ok: bool = True,
    ) -> list[str]:
        if partitions is not None or binding_keys:
            return self.management.delete_super_stream(
                name, partitions=partitions, binding_keys=list(binding_keys) if binding_keys else None)
        try:
            named = self.partitions(name)
        except TopologyError:  # nothing of that name (PartitionsUnknown is no TopologyError)
            if missing_ok:
                self.management.delete_exchange(name)
                return []
            raise
        return self.management.delete_super_stream(name, streams=named)
