"""Several RabbitMQ addresses (the nodes of a cluster) in ``message_queue.url``, the order
a process tries them in, and the worker queues' dead-lettering arguments."""

from __future__ import annotations

import aio_pika
import pytest

from conveyor.config import Settings, load_settings
from conveyor.config.keys import mask_secrets, split_urls
from conveyor.domain.errors import ConveyorError
from conveyor.transport.rabbitmq import RabbitMQTransport, node_of, rotated

A, B, C = "amqp://u:p@a:5701/", "amqp://u:p@b:5702/", "amqps://u:p@c/vh"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("CONVEYOR") or key == "DATABASE_URL":
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("text", "urls"),
    [
        (A, [A]),
        (f"{A},{B},{C}", [A, B, C]),
        (f" {A} , {B} ,", [A, B]),
        # A comma inside a password or a query is not a separator: no scheme follows it.
        ("amqp://u:p,w@a/,amqp://u:p@b/?x=1,2", ["amqp://u:p,w@a/", "amqp://u:p@b/?x=1,2"]),
    ],
)
def test_a_url_list_is_split_at_commas_before_a_scheme(text: str, urls: list[str]) -> None:
    assert split_urls(text) == urls


def test_the_single_url_still_works_and_a_list_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().settings.message_queue.urls == ["amqp://guest:guest@127.0.0.1:5672/"]
    monkeypatch.setenv("CONVEYOR__MESSAGE_QUEUE__URL", f"{A},{B},{C}")
    assert load_settings().settings.message_queue.urls == [A, B, C]


@pytest.mark.parametrize("text", ["", " , ", "http://a/", f"{A},redis://b/"])
def test_anything_but_amqp_urls_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("CONVEYOR__MESSAGE_QUEUE__URL", text)
    with pytest.raises(ConveyorError, match=r"message_queue\.url"):
        load_settings()


def test_every_password_of_a_list_is_masked() -> None:
    assert mask_secrets("amqp://u:s1@a:1/,amqps://v:s2@b:2/vh") == "amqp://u:***@a:1/,amqps://v:***@b:2/vh"
    # A PostgreSQL multi-host URL is one URL.
    assert mask_secrets("postgresql://u:s@h1,h2/db") == "postgresql://u:***@h1,h2/db"


def test_rotation_starts_anywhere_and_visits_every_node_once() -> None:
    nodes = ["a", "b", "c"]
    assert rotated(nodes, 0) == ["a", "b", "c"]
    assert rotated(nodes, 1) == ["b", "c", "a"]
    assert rotated(nodes, 5) == ["c", "a", "b"]  # start is taken modulo the number of nodes
    assert rotated([], 3) == []
    for start in range(7):
        assert sorted(rotated(nodes, start)) == nodes


async def test_connecting_tries_the_nodes_from_the_next_one_and_skips_those_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVEYOR__MESSAGE_QUEUE__URL", f"{A},{B},{C}")
    transport = _transport(load_settings().settings)
    down: set[str] = set()
    tried: list[str] = []

    async def connect(url: str, **_: object) -> str:
        tried.append(url)
        if url in down:
            raise ConnectionRefusedError(111, "Connection refused")
        return f"connection to {url}"

    monkeypatch.setattr(aio_pika, "connect", connect)
    transport._next = 1  # where the last session's node (A) left it
    assert await transport._connect() == (f"connection to {B}", 1)
    down.add(B)  # B dies: after it, C is tried first, then A
    tried.clear()
    transport._next = 2
    assert await transport._connect() == (f"connection to {C}", 2)
    assert tried == [C]
    down.update({C})
    tried.clear()
    assert await transport._connect() == (f"connection to {A}", 0)
    assert tried == [C, A]
    down.add(A)  # none answers: the last error, for the caller's backoff
    with pytest.raises(ConnectionRefusedError):
        await transport._connect()


def test_processes_start_at_random_nodes() -> None:
    settings = Settings.model_validate({"message_queue": {"url": f"{A},{B},{C}"}})
    starts = {_transport(settings)._next for _ in range(200)}
    assert starts == {0, 1, 2}


def test_node_names_in_logs_carry_no_credentials() -> None:
    assert node_of(A) == "a:5701"
    assert node_of(C) == "c:5671"
    assert node_of("amqp://guest:guest@127.0.0.1/") == "127.0.0.1:5672"


def _transport(settings: Settings) -> RabbitMQTransport:
    return RabbitMQTransport(settings, "postgresql://x/y", None, relay=False, application_name="t")  # type: ignore[arg-type]


def test_worker_queues_dead_letter_at_least_once_by_default() -> None:
    settings = load_settings().settings
    args = _transport(settings).worker_queue_args()
    assert args["x-dead-letter-strategy"] == "at-least-once"
    assert args["x-overflow"] == "reject-publish"  # without it RabbitMQ falls back to at-most-once
    assert args["x-delivery-limit"] == settings.message_queue.rabbitmq.delivery_limit  # never RabbitMQ 4's default 20
    settings.message_queue.rabbitmq.dead_letter_strategy = "at-most-once"
    args = _transport(settings).worker_queue_args()
    assert "x-dead-letter-strategy" not in args
    assert "x-overflow" not in args
