"""TubeMQ (Apache InLong) master-registration client, written from ``specs/tubemq.md``.

The package face: :class:`MasterClient` registers producers and consumers with the active
master of a master list, keeps them alive with heartbeats and closes them; the typed values
and errors it returns are re-exported here. The layers underneath are one module each:
``framing`` (packets), ``rpc`` (the protobuf envelope), ``connection`` (one socket, serial-number
correlation), ``auth`` (signature and token), ``model`` (brokers, topics, partitions).
"""

from streamledger.protocol.tubemq.auth import Credentials, sign
from streamledger.protocol.tubemq.client import MasterClient, parse_masters
from streamledger.protocol.tubemq.errors import (
    CertificateFailure,
    FrameError,
    InvalidArgument,
    MasterResponseError,
    NoMasterAvailable,
    RemoteException,
    ReRegisterRequired,
    StandbyMasterError,
    TubeMQConnectionError,
    TubeMQError,
    TubeMQProtocolError,
    TubeMQTimeout,
)
from streamledger.protocol.tubemq.model import (
    BrokerInfo,
    ConsumerRegistration,
    Partition,
    ProducerRegistration,
    SubscribeInfo,
    TopicInfo,
)

__all__ = [
    "BrokerInfo",
    "CertificateFailure",
    "ConsumerRegistration",
    "Credentials",
    "FrameError",
    "InvalidArgument",
    "MasterClient",
    "MasterResponseError",
    "NoMasterAvailable",
    "Partition",
    "ProducerRegistration",
    "ReRegisterRequired",
    "RemoteException",
    "StandbyMasterError",
    "SubscribeInfo",
    "TopicInfo",
    "TubeMQConnectionError",
    "TubeMQError",
    "TubeMQProtocolError",
    "TubeMQTimeout",
    "parse_masters",
    "sign",
]
