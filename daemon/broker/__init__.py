# The AMQP broker client the collector publishes through and takes from (RabbitMQ via aiormq on
# an asyncio thread of its own), as plain trio functions.
#
# Why a package: one job per module, and what may run only on the asyncio thread is set apart:
# - client.py: the trio side, one connection kept alive, batches published and confirmed;
# - aio.py and publish.py: the asyncio side (aio.py one call per unit of work; publish.py a
#   window of publishes as one write);
# - asyncio_thread.py: the asyncio loop in a thread, driven from trio;
# - rules.py: settings, messages, URLs, backoff and the confirm window as plain values;
# - oneshot.py: one call over a connection of its own (probe, delete a queue).
# Callers import the names below from `daemon.broker`.
from __future__ import annotations

from daemon.broker.aio import route_client_logs
from daemon.broker.client import AmqpBroker, Publishing, open_amqp_broker
from daemon.broker.oneshot import delete_queue, probe
from daemon.broker.rules import (
    BrokerError,
    BrokerSettings,
    BrokerUnavailable,
    OutgoingMessage,
    PublishFailed,
    ReceivedMessage,
    amqp_url,
    backoff,
    declare_arguments,
    message_properties,
    redact_url,
    split_password,
    unique_by_message_id,
)

__all__ = [
    "AmqpBroker",
    "BrokerError",
    "BrokerSettings",
    "BrokerUnavailable",
    "OutgoingMessage",
    "PublishFailed",
    "Publishing",
    "ReceivedMessage",
    "amqp_url",
    "backoff",
    "declare_arguments",
    "delete_queue",
    "message_properties",
    "open_amqp_broker",
    "probe",
    "redact_url",
    "route_client_logs",
    "split_password",
    "unique_by_message_id",
]
