"""The ``rabbitmq-stream`` and ``mewbase`` schemes of the common-messaging ``MessageQueueTrigger``.

Registered through the provider's ``queues`` entry; Airflow's ProvidersManager imports it only
when ``apache-airflow-providers-common-messaging`` is installed (the import below fails otherwise
and the entry is skipped quietly). ``MessageQueueTrigger(scheme="rabbitmq-stream", **kwargs)``
then builds :class:`~streamledger.triggers.new_data.StreamDataEventTrigger` with the same kwargs;
``scheme="mewbase"`` builds the same trigger (its connection, a ``mewbase`` one, says which log it
reads: the scheme only names the provider).
"""

from __future__ import annotations

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
from airflow.triggers.base import BaseEventTrigger

from streamledger.triggers.new_data import StreamDataEventTrigger

SCHEME = "rabbitmq-stream"


class RabbitMQStreamMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme ``rabbitmq-stream``: announce new data of a stream or super stream for a pipeline.

    Keyword arguments are those of :class:`~streamledger.triggers.new_data.StreamDataEventTrigger`
    (``pipeline``, ``stream`` or ``super_stream``, ``rabbitmq_stream_conn_id``, ``ledger_conn_id``,
    ``ledger_url``, ``min_backlog``, ``poll_interval``). Only scheme dispatch is offered: the
    deprecated ``queue=`` URI form matches nothing here.
    """

    scheme = SCHEME

    def trigger_class(self) -> type[BaseEventTrigger]:
        return StreamDataEventTrigger


class MewbaseMessageQueueProvider(RabbitMQStreamMessageQueueProvider):
    """Scheme ``mewbase``: the same trigger over a mewbase channel (``stream=``, a ``mewbase``
    connection as ``rabbitmq_stream_conn_id``)."""

    scheme = "mewbase"
