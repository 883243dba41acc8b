"""The settings of what Conveyor connects to: the database (direct and pooled), RabbitMQ and
its dead letters. Apart from config.py so that each stays readable; config.py re-exports
them, and ``Settings`` holds them as sections like the others."""

from __future__ import annotations

from typing import Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from conveyor.config.keys import mask_secrets, split_urls

# database.verb_retries's default, also the SDK client's when it is made without settings.
VERB_RETRIES = 3


class Section(BaseModel):
    """A section of the settings: an unknown key in it is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class DatabaseSettings(Section):
    url: str | None = Field(None, description="PostgreSQL URL; unset = the embedded PostgreSQL")
    schema_name: str = Field(
        "conveyor", alias="schema", pattern=r"^[a-z_][a-z0-9_]*$", description="schema holding every Conveyor object"
    )
    pool_size: int = Field(10, ge=2, description="connections per process")
    reconnect_interval: float = Field(
        0.5,
        gt=0,
        le=60,
        description="while the database cannot be reached, the longest a process waits between two attempts to "
        "reconnect its pool and its LISTEN session, and a worker between two tries to write its results: work "
        "resumes within about this long of the server answering again, however long the outage",
    )
    pool_timeout: float = Field(
        10.0,
        gt=0,
        le=300,
        description="how long a pass of the executor or worker waits for a connection from the pool before it "
        "gives up, logs it and tries again (the API waits api.database_timeout)",
    )
    verb_retries: int = Field(
        VERB_RETRIES,
        ge=0,
        le=20,
        description="how many more times a cancel, pause or resume (API, CLI, SDK) runs when the database rolled it "
        "back to break a deadlock or a serialization failure, before its caller sees the error (the API answers 503)",
    )
    direct_url: str | None = Field(
        None,
        description="PostgreSQL URL of the connections that must stay one server session: a worker's "
        "liveness lock, LISTEN, the executor's duty locks, the migration lock, the CLI; unset = database.url. "
        "Set it to the server itself when database.url goes through a connection pooler",
    )
    pooler: Literal["none", "transaction"] = Field(
        "none",
        description="what database.url goes through: 'transaction' = a pooler in transaction mode (PgBouncer "
        "pool_mode=transaction): the pool's connections send no startup options (search_path comes from the "
        "server, checked at start), carry the process tag as <tag> (not counted by the dead-worker sweep: a pooled "
        "server session serves any process), and prepare no statements (see prepared_statements)",
    )
    prepared_statements: bool | None = Field(
        None,
        description="server-side prepared statements on the pool's connections (psycopg prepares a statement "
        "run 5 times); unset = on, off when pooler is 'transaction'. true behind PgBouncer >= 1.21 with "
        "max_prepared_statements > 0",
    )

    @model_validator(mode="after")
    def _direct_url(self) -> DatabaseSettings:
        """The embedded server has no pooler in front of it: a direct URL without a URL is a
        mistake. A transaction pooler without a direct URL would carry the liveness locks and
        LISTEN, which it cannot (a lock taken in one transaction's server session stays there
        when the worker dies; a notification goes to whoever holds the session)."""
        if self.direct_url and not self.url:
            raise ValueError("database.direct_url is set but database.url is not (set both, or neither)")
        if self.pooler == "transaction" and not self.direct_url:
            raise ValueError(
                "database.pooler 'transaction' needs database.direct_url (DATABASE_DIRECT_URL): PostgreSQL "
                "itself, for the sessions a transaction pooler cannot carry (liveness locks, LISTEN)"
            )
        return self

    @property
    def prepare_threshold(self) -> int | None:
        """psycopg's prepare_threshold for the pool's connections (None: never prepare).
        Behind a transaction pooler older than PgBouncer 1.21, consecutive transactions of
        one client land on different server sessions: a statement prepared on one is
        missing on the next ("prepared statement _pg3_0 does not exist")."""
        on = self.pooler == "none" if self.prepared_statements is None else self.prepared_statements
        return 5 if on else None

    @field_validator("url", "direct_url")
    @classmethod
    def _postgresql(cls, url: str | None) -> str | None:
        """A URL psycopg cannot use would fail later, as a traceback from deep inside."""
        if url is None or not url.strip():
            return None
        scheme, sep, _ = url.partition("://")
        if sep and scheme.lower() not in ("postgresql", "postgres"):
            raise ValueError(
                f"{mask_secrets(url)!r} is not a PostgreSQL URL: it must start with postgresql:// "
                "(postgresql://user:password@host:5432/dbname) or be a key=value connection string"
            )
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise ValueError(
                f"{mask_secrets(url)!r} is neither a PostgreSQL URL (postgresql://user:password@host:5432/dbname) "
                "nor a key=value connection string (host=... dbname=...)"
            ) from None
        return url


class RabbitMQSettings(Section):
    worker_queue_ttl_ms: int = Field(
        300_000,
        ge=1,
        le=2**31 - 1,  # RabbitMQ takes a signed 32-bit x-message-ttl
        description="a dispatch not taken from a worker's queue within this is dead-lettered (both transports)",
    )
    worker_queue_expires_ms: int = Field(
        3_600_000, ge=1, le=2**31 - 1, description="a worker queue unused this long (worker gone for good) is deleted"
    )
    delivery_limit: int = Field(
        5, ge=1, description="deliveries to consumers that die or give the message back before it is dead-lettered"
    )
    prefetch: int = Field(100, ge=1, le=65535, description="unacknowledged messages per consumer")
    heartbeat: int = Field(
        10,
        ge=1,
        le=600,
        description="AMQP heartbeat seconds: the broker closes the connection of a process that stopped answering "
        "(a frozen worker) after about two of them, and its unacknowledged messages go back to their queue",
    )
    relay_batch: int = Field(500, ge=1, le=10_000, description="outbox rows published per relay transaction")
    dead_letter_strategy: Literal["at-least-once", "at-most-once"] = Field(
        "at-least-once",
        description="how worker queues dead-letter (x-dead-letter-strategy, RabbitMQ >= 3.10): at-least-once keeps "
        "an expired dispatch in its queue until the dead-letter queue confirmed it; at-most-once may lose it in a "
        "broker failure (the executors' schedule-to-start timeout then finds the execution)",
    )

    @model_validator(mode="after")
    def _expiry_outlasts_ttl(self) -> RabbitMQSettings:
        # A queue deleted while it still holds unexpired dispatches would drop them unrecorded.
        if self.worker_queue_expires_ms <= self.worker_queue_ttl_ms:
            raise ValueError("worker_queue_expires_ms must be longer than worker_queue_ttl_ms")
        return self


class MessageQueueSettings(Section):
    url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ URL (transport: rabbitmq); the nodes of a cluster as a comma-separated list of URLs, "
        "tried in a rotated order at every (re)connection",
    )
    prefix: str = Field("conveyor", pattern=r"^[A-Za-z0-9_-]+$", description="prefix of every exchange and queue name")
    reconcile_after: float = Field(
        30, gt=0, description="seconds an execution may sit requested/scheduled before its message is published again"
    )
    rabbitmq: RabbitMQSettings = Field(default_factory=RabbitMQSettings)  # type: ignore[arg-type]

    @field_validator("url")
    @classmethod
    def _amqp_urls(cls, value: str) -> str:
        urls = split_urls(value)
        if not urls:
            raise ValueError("at least one AMQP URL is needed")
        for url in urls:
            if not url.lower().startswith(("amqp://", "amqps://")):
                raise ValueError(f"{mask_secrets(url)!r} is not an AMQP URL (amqp://user:password@host:5672/vhost)")
        return value

    @property
    def urls(self) -> list[str]:
        """The broker addresses: one, or the nodes of a cluster."""
        return split_urls(self.url)


class DeadLetterSettings(Section):
    enabled: bool = Field(True, description="consume and resolve dead letters")
    exchange: str | None = Field(None, description="dead-letter exchange; default <prefix>.dlx")
    ttl_ms: int = Field(86_400_000, ge=1, le=2**31 - 1, description="dead letters are kept this long (queue and table)")
    max_deliveries: int = Field(
        5, ge=1, description="failed handlings of one message before it is dead-lettered as poison"
    )
    check_interval: float = Field(
        5, gt=0, description="seconds between expired-dispatch checks (postgres transport) and retention runs"
    )
