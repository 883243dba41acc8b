"""Transports: the doorbell between state changes and the processes that act on them."""

from __future__ import annotations

from conveyor.config import Settings
from conveyor.store.db import Pool
from conveyor.transport.base import Transport
from conveyor.transport.postgres import PostgresTransport


def make_transport(settings: Settings, url: str, pool: Pool, *, relay: bool, application_name: str) -> Transport:
    """The configured transport. ``relay``: this process publishes the outbox (executors)."""
    if settings.transport == "rabbitmq":
        from conveyor.transport.rabbitmq import RabbitMQTransport  # the broker client only when used

        return RabbitMQTransport(settings, url, pool, relay=relay, application_name=application_name)
    return PostgresTransport(
        url,
        settings.database.schema_name,
        application_name=application_name,
        reconnect_interval=settings.database.reconnect_interval,
    )
