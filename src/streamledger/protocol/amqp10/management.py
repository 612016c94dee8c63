"""RabbitMQ 4.x topology over AMQP 1.0: queues (streams), exchanges, bindings, super streams.

Each operation is one HTTP-over-AMQP request to the ``/management`` node (amqp10-management.md), with
path segments percent-encoded (a ``/`` in a name is ``%2F``; RabbitMQ decodes every segment), so any
name the broker accepts works. Non-2xx answers raise :class:`~.errors.ManagementError` subclasses
with the status and the broker's text.

Super streams are made exactly as the broker's own CreateSuperStream makes them
(``rabbit_stream_manager``): a durable ``direct`` exchange with ``x-super-stream`` = true, one stream
per partition named ``<super>-<n>`` (or ``<super>-<key>``), bound with the routing key and
``x-stream-partition-order`` = its index; so the stream protocol's Partitions/Route and
DeleteSuperStream treat them as their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote

from streamledger.protocol.amqp10.codec.types import Long
from streamledger.protocol.amqp10.connection import Amqp10Connection, Response
from streamledger.protocol.amqp10.errors import (
    Conflict,
    InvalidUrl,
    NotFound,
    PartitionsUnknown,
    management_error,
)
from streamledger.protocol.amqp10.url import Amqp10Params

_MAX_AGE: Final = re.compile(r"^[1-9][0-9]*[YMDhms]$")
LeaderLocator = Literal["client-local", "balanced"]


def segment(name: str) -> str:
    """One percent-encoded path segment (every reserved character, ``/`` included, is escaped)."""
    return quote(name, safe="")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """Stream creation arguments; ``None`` leaves the broker's default.

    ``max_age`` is RabbitMQ's duration text (``7D``, ``12h``, ``30m``; units Y M D h m s).
    """

    max_age: str | None = None
    max_length_bytes: int | None = None
    max_segment_size_bytes: int | None = None
    initial_cluster_size: int | None = None
    leader_locator: LeaderLocator | None = None
    filter_size_bytes: int | None = None

    def arguments(self) -> dict[str, Any]:
        """The queue arguments (``x-queue-type`` = stream plus the set options), validated."""
        args: dict[str, Any] = {"x-queue-type": "stream"}
        if self.max_age is not None:
            if not _MAX_AGE.match(self.max_age):
                raise InvalidUrl(
                    f"max_age {self.max_age!r} is not a RabbitMQ duration such as 7D, 12h or 30m"
                )
            args["x-max-age"] = self.max_age
        for key, value, low, high in (
            ("x-max-length-bytes", self.max_length_bytes, 1, 2**63 - 1),
            ("x-stream-max-segment-size-bytes", self.max_segment_size_bytes, 1, 3_000_000_000),
            ("x-initial-cluster-size", self.initial_cluster_size, 1, 255),
            ("x-stream-filter-size-bytes", self.filter_size_bytes, 16, 255),
        ):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidUrl(f"{key} must be an integer in {low}..{high}, not {value!r}")
            args[key] = Long(value)
        if self.leader_locator is not None:
            if self.leader_locator not in ("client-local", "balanced"):
                raise InvalidUrl(
                    f"leader locator must be client-local or balanced, not {self.leader_locator!r}"
                )
            args["x-queue-leader-locator"] = self.leader_locator
        return args


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """The broker's answer about a queue: type, arguments, counts, and for streams leader and replicas.

    ``leader`` can be ``None`` when the stream coordinator cannot answer; ``members`` lists every node
    holding a replica (the leader included), as the broker reports them.
    """

    name: str
    type: str
    durable: bool
    arguments: dict[str, Any]
    message_count: int | None
    consumer_count: int | None
    leader: str | None
    members: tuple[str, ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_body(cls, body: Any) -> QueueInfo:
        b = body if isinstance(body, dict) else {}
        replicas = b.get("replicas") or []
        return cls(
            name=str(b.get("name", "")),
            type=str(b.get("type", "")),
            durable=bool(b.get("durable", False)),
            arguments={str(k): v for k, v in (b.get("arguments") or {}).items()},
            message_count=_int_or_none(b.get("message_count")),
            consumer_count=_int_or_none(b.get("consumer_count")),
            leader=str(b["leader"]) if b.get("leader") is not None else None,
            members=tuple(str(r) for r in replicas),
            raw=dict(b),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (``--json``)."""
        return {
            "name": self.name,
            "type": self.type,
            "durable": self.durable,
            "leader": self.leader,
            "members": list(self.members),
            "message_count": self.message_count,
            "consumer_count": self.consumer_count,
            "arguments": {
                k: v if isinstance(v, (int, str, bool, float)) or v is None else str(v)
                for k, v in self.arguments.items()
            },
        }


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def partition_names(
    super_stream: str, *, partitions: int | None = None, binding_keys: Sequence[str] | None = None
) -> tuple[list[str], list[str]]:
    """(stream names, routing keys) of a super stream, named as the broker names them.

    By count: streams ``<super>-0..n-1`` with routing keys ``"0".."n-1"``; by keys: ``<super>-<key>``.
    """
    if (partitions is None) == (binding_keys is None):
        raise InvalidUrl("give either a partition count or binding keys")
    if binding_keys is not None:
        keys = [str(k) for k in binding_keys]
        if not keys or any(not k for k in keys) or len(set(keys)) != len(keys):
            raise InvalidUrl(f"binding keys must be distinct and non-empty, got {list(binding_keys)!r}")
    else:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise InvalidUrl(f"partitions must be a positive integer, not {partitions!r}")
        keys = [str(i) for i in range(partitions)]
    return [f"{super_stream}-{k}" for k in keys], keys


class Management:
    """Topology operations over one AMQP 1.0 connection (open with :meth:`connect`; a context manager)."""

    def __init__(self, connection: Amqp10Connection) -> None:
        self.connection = connection

    @classmethod
    def connect(cls, url: str | Amqp10Params, *, timeout: float = 10.0) -> Management:
        return cls(Amqp10Connection.open(url, timeout=timeout))

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Management:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(
        self, method: str, path: str, body: Any, what: str, ok: Sequence[int] = (200, 201, 204)
    ) -> Response:
        response = self.connection.request(method, path, body)
        if response.status not in ok:
            description = response.body if isinstance(response.body, str) else None
            raise management_error(
                response.status, what, " ".join(description.split()) if description else None
            )
        return response

    # ---- queues

    def declare_queue(
        self,
        name: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
    ) -> QueueInfo:
        """Declare (create or check) a queue; 409 Conflict when it exists with other arguments."""
        body = {
            "durable": durable,
            "exclusive": exclusive,
            "auto_delete": auto_delete,
            "arguments": dict(arguments or {}),
        }
        r = self._call("PUT", f"/queues/{segment(name)}", body, f"declare queue {name!r}")
        return QueueInfo.from_body(r.body)

    def declare_stream(self, name: str, options: StreamOptions | None = None) -> QueueInfo:
        """Declare a stream queue with ``options``; idempotent when the arguments are the same."""
        return self.declare_queue(name, arguments=(options or StreamOptions()).arguments())

    def get_queue(self, name: str) -> QueueInfo:
        """Type, arguments, counts and (streams) leader and members; :class:`NotFound` if absent."""
        r = self._call("GET", f"/queues/{segment(name)}", None, f"get queue {name!r}", ok=(200,))
        return QueueInfo.from_body(r.body)

    def delete_queue(self, name: str) -> int:
        """Delete a queue; returns the message count the broker reports (0 for streams).

        Idempotent, as in AMQP 0-9-1: an absent queue is not an error (the broker answers 200).
        """
        r = self._call("DELETE", f"/queues/{segment(name)}", None, f"delete queue {name!r}")
        return _message_count(r.body)

    def queue_exists(self, name: str) -> bool:
        """Whether the queue exists (a GET that maps 404 to ``False``)."""
        try:
            self.get_queue(name)
        except NotFound:
            return False
        return True

    def purge_queue(self, name: str) -> int:
        """Remove a queue's messages; returns how many (streams cannot be purged: the broker says 400)."""
        r = self._call("DELETE", f"/queues/{segment(name)}/messages", None, f"purge queue {name!r}")
        return _message_count(r.body)

    # ---- exchanges and bindings

    def declare_exchange(
        self,
        name: str,
        *,
        type: str = "direct",
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        body = {
            "type": type,
            "durable": durable,
            "auto_delete": auto_delete,
            "internal": internal,
            "arguments": dict(arguments or {}),
        }
        self._call("PUT", f"/exchanges/{segment(name)}", body, f"declare exchange {name!r}")

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange (absent: no error, as the broker answers 204 either way)."""
        self._call("DELETE", f"/exchanges/{segment(name)}", None, f"delete exchange {name!r}")

    def bind(
        self,
        source: str,
        destination: str,
        binding_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        to_exchange: bool = False,
    ) -> None:
        """Bind queue (or exchange) ``destination`` to exchange ``source`` with a key and arguments."""
        body = {
            "source": source,
            "destination_exchange" if to_exchange else "destination_queue": destination,
            "binding_key": binding_key,
            "arguments": dict(arguments or {}),
        }
        self._call(
            "POST", "/bindings", body, f"bind {destination!r} to exchange {source!r} key {binding_key!r}"
        )

    def binding_locations(
        self, source: str, destination: str, binding_key: str = "", *, to_exchange: bool = False
    ) -> list[str]:
        """Locations (``/bindings/src=…;dstq=…;key=…;args=…``) of the bindings with that key."""
        dst = "dste" if to_exchange else "dstq"
        query = f"src={segment(source)}&{dst}={segment(destination)}&key={segment(binding_key)}"
        r = self._call(
            "GET", f"/bindings?{query}", None, f"list bindings of {source!r} to {destination!r}", ok=(200,)
        )
        items = r.body if isinstance(r.body, list) else []
        return [str(b["location"]) for b in items if isinstance(b, dict) and b.get("location")]

    def unbind(
        self,
        source: str,
        destination: str,
        binding_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        to_exchange: bool = False,
    ) -> int:
        """Remove bindings; without ``arguments`` every binding with that key (any arguments) goes.

        With ``arguments`` only the binding with exactly those arguments is removed. Returns the count.
        """
        dst = "dste" if to_exchange else "dstq"
        what = f"unbind {destination!r} from exchange {source!r} key {binding_key!r}"
        query = f"src={segment(source)}&{dst}={segment(destination)}&key={segment(binding_key)}"
        r = self._call("GET", f"/bindings?{query}", None, what, ok=(200,))
        items = [b for b in (r.body if isinstance(r.body, list) else []) if isinstance(b, dict)]
        if arguments is not None:
            wanted = dict(arguments)
            items = [b for b in items if dict(b.get("arguments") or {}) == wanted]
        locations = [str(b["location"]) for b in items if b.get("location")]
        for location in locations:
            self._call("DELETE", location, None, what)
        return len(locations)

    # ---- super streams

    def create_super_stream(
        self,
        name: str,
        *,
        partitions: int | None = None,
        binding_keys: Sequence[str] | None = None,
        options: StreamOptions | None = None,
    ) -> list[str]:
        """Create a super stream as the broker's CreateSuperStream does; returns the partition streams.

        Idempotent for the same layout. On a failure part-way, what was created is removed again.
        """
        streams, keys = partition_names(name, partitions=partitions, binding_keys=binding_keys)
        args = (options or StreamOptions()).arguments()
        created: list[str] = []
        try:
            for stream in streams:
                self.declare_queue(stream, arguments=args)
                created.append(stream)
            self.declare_exchange(name, type="direct", arguments={"x-super-stream": True})
            for order, (stream, key) in enumerate(zip(streams, keys, strict=True)):
                self.bind(name, stream, key, arguments={"x-stream-partition-order": Long(order)})
        except BaseException:
            for stream in created:
                try:
                    self.delete_queue(stream)
                except Exception:
                    pass
            raise
        return streams

    def delete_super_stream(
        self,
        name: str,
        *,
        partitions: int | None = None,
        binding_keys: Sequence[str] | None = None,
        streams: Sequence[str] | None = None,
    ) -> list[str]:
        """Delete a super stream's exchange and partition streams; returns the streams deleted.

        The ``/management`` node cannot list an exchange's bindings, so the partitions are named by
        ``streams``, ``partitions`` or ``binding_keys``; with none, ``<name>-0``, ``<name>-1``, ... are
        deleted until the first that does not exist (the layout a partition count gives). When that
        finds none but the exchange exists (a keyed super stream), :class:`PartitionsUnknown` is
        raised before anything is deleted: deleting the exchange alone would leave the partition
        streams, with their data, where nothing names them any more.
        """
        if streams is not None:
            named = list(streams)
        elif partitions is None and binding_keys is None:
            named = []
            while self.queue_exists(f"{name}-{len(named)}"):
                named.append(f"{name}-{len(named)}")
            if not named and self.exchange_exists(name):
                raise PartitionsUnknown(
                    f"super stream {name!r}: its partitions are not numbered and the AMQP 1.0 "
                    "management node cannot list them; name them (binding keys)"
                )
        else:
            named = partition_names(name, partitions=partitions, binding_keys=binding_keys)[0]
        self.delete_exchange(name)
        deleted = [stream for stream in named if self.queue_exists(stream)]
        for stream in deleted:
            self.delete_queue(stream)
        return deleted

    def exchange_exists(self, name: str) -> bool:
        """Whether an exchange exists. The node has no GET for exchanges, so this declares one that
        no real exchange matches (auto-delete and internal): 409 means one of that name exists; a
        success means it did not, and the probe is deleted again."""
        try:
            self.declare_exchange(name, type="direct", auto_delete=True, internal=True,
                                  arguments={"x-streamledger-probe": True})
        except Conflict:
            return True
        self.delete_exchange(name)
        return False


def _message_count(body: Any) -> int:
    if isinstance(body, dict) and isinstance(body.get("message_count"), int):
        return int(body["message_count"])
    return 0
