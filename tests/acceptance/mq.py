"""Helpers for RabbitMQ acceptance tests: what the broker says (through ``rabbitmqctl``),
the AMQP connections of given processes, a broker restart that is always undone, and a
raw client to publish what Conveyor never would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The broker's AMQP port, to tell our processes' connections to it (same default as the
# ``rabbitmq_url`` fixture).
AMQP_PORT = urlsplit(os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")).port or 5672


def rabbitmqctl_problem() -> str | None:
    """Why ``rabbitmqctl`` cannot be used here (None when it can)."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed"
    try:
        done = subprocess.run(["rabbitmqctl", "-q", "status"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"rabbitmqctl status: {exc}"
    if done.returncode != 0:
        return f"rabbitmqctl status failed: {done.stderr.strip() or done.stdout.strip()}"
    return None


# The broker ``rabbitmqctl`` and the connection helpers talk to: the shared one unless a
# test made its own (:func:`private_broker.private_broker` sets these for its block; tests
# run one at a time in a process, so a module global is enough).
TARGET: dict[str, Any] = {"node": None, "port": AMQP_PORT}


def _ctl(*args: str) -> list[str]:
    node = TARGET["node"]
    return ["rabbitmqctl", *(("-n", node) if node else ()), *args]


def rabbitmqctl(*args: str, timeout: float = 60.0) -> str:
    done = subprocess.run(
        _ctl(*args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _listing(command: str, *columns: str) -> list[dict[str, Any]]:
    out = rabbitmqctl(command, "-q", "--formatter", "json", *columns).strip()
    return list(json.loads(out)) if out else []


def arguments(raw: Any) -> dict[str, Any]:
    """``rabbitmqctl``'s ``[[key, type, value], ...]`` as ``{key: value}``."""
    if isinstance(raw, dict):
        return dict(raw)
    return {item[0]: item[-1] for item in raw or []}


def queues(prefix: str) -> dict[str, dict[str, Any]]:
    """Queues whose names start with ``prefix.``: name -> {arguments, messages, consumers, type}."""
    found = {}
    for q in _listing("list_queues", "name", "arguments", "messages", "consumers", "type"):
        if str(q["name"]).startswith(f"{prefix}."):
            q["arguments"] = arguments(q.get("arguments"))
            found[q["name"]] = q
    return found


def exchanges(prefix: str) -> dict[str, str]:
    """Exchanges whose names start with ``prefix.``: name -> type."""
    return {
        str(e["name"]): str(e["type"])
        for e in _listing("list_exchanges", "name", "type")
        if str(e["name"]).startswith(f"{prefix}.")
    }


def bindings(prefix: str) -> set[tuple[str, str, str]]:
    """(source, destination, routing key) of the bindings from ``prefix.*`` exchanges."""
    return {
        (str(b["source_name"]), str(b["destination_name"]), str(b["routing_key"]))
        for b in _listing("list_bindings", "source_name", "destination_name", "routing_key")
        if str(b["source_name"]).startswith(f"{prefix}.")
    }


# What ``list_queues`` says about a quorum queue's messages and consumers is a statistic
# refreshed every ``collect_statistics_interval`` (5 s): a stale 0 could pass for "drained".
# The queue's own state machine answers at once; asked through ``eval`` (internal API, as
# of RabbitMQ 3.8-3.13), with ``list_queues`` as the fallback.
_LIVE_QUEUES = """
P = <<"%s.">>,
Rows = [begin
    {resource, _, queue, N} = amqqueue:get_name(Q),
    {ok, {_, O}, _} = ra:local_query(amqqueue:get_pid(Q), fun rabbit_fifo:overview/1),
    #{name => N, messages => maps:get(num_messages, O), ready => maps:get(num_ready_messages, O),
      unacked => maps:get(num_checked_out, O), consumers => maps:get(num_consumers, O)}
 end || Q <- rabbit_amqqueue:list(<<"/">>),
        amqqueue:get_type(Q) =:= rabbit_quorum_queue,
        binary:longest_common_prefix([element(4, amqqueue:get_name(Q)), P]) =:= byte_size(P)],
io:format("~s~n", [rabbit_json:encode(Rows)]).
"""


def live_queues(prefix: str) -> dict[str, dict[str, int]]:
    """Quorum queues named ``prefix.*`` -> {messages (ready + unacknowledged), ready,
    unacked, consumers}, as the queues know them now."""
    try:
        out = rabbitmqctl("eval", _LIVE_QUEUES % prefix)
        rows = json.loads(out.strip().splitlines()[0])
    except (RuntimeError, ValueError, IndexError):
        return {
            name: {"messages": int(q.get("messages") or 0), "consumers": int(q.get("consumers") or 0)}
            for name, q in queues(prefix).items()
        }
    return {str(r.pop("name")): {k: int(v) for k, v in r.items()} for r in rows}


def depths(prefix: str) -> dict[str, int]:
    """Messages (ready + unacknowledged) per ``prefix.*`` queue, as of now."""
    return {name: q["messages"] for name, q in live_queues(prefix).items()}


# -- the AMQP connections of given processes ------------------------------------------------


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def broker_client_ports(pids: Iterable[int], port: int | None = None) -> set[int]:
    """Local ports of the established TCP connections to the broker's port held by ``pids``."""
    port = int(TARGET["port"]) if port is None else port
    ports: set[int] = set()
    for pid in pids:
        inodes = _socket_inodes(pid)
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
                for line in lines:
                    fields = line.split()
                    local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                    if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in inodes:
                        ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def connections_of(pids: Iterable[int]) -> list[dict[str, Any]]:
    """The broker's view of the connections these processes hold (matched on the
    client's port): name, peer_port, connection_name and the Erlang ``pid`` that
    ``close_connection`` takes (plain output: the JSON formatter mangles it)."""
    ports = broker_client_ports(pids)
    erlang_pids = {}
    for line in rabbitmqctl("list_connections", "-q", "--no-table-headers", "peer_port", "pid").splitlines():
        port, _, erlang_pid = line.partition("\t")
        if port.strip().isdigit():
            erlang_pids[int(port)] = erlang_pid.strip()
    found = []
    for c in _listing("list_connections", "name", "peer_port", "client_properties"):
        port = int(c["peer_port"])
        if port in ports and port in erlang_pids:
            c["connection_name"] = arguments(c.get("client_properties")).get("connection_name")
            c["pid"] = erlang_pids[port]
            found.append(c)
    return found


def close_connections(found: list[dict[str, Any]], reason: str = "test") -> list[str]:
    """Close (broker side) these connections (from :func:`connections_of`); return the
    names of those closed."""
    # All at once (each rabbitmqctl call takes most of a second).
    running = [
        subprocess.Popen(
            _ctl("close_connection", str(c["pid"]), reason),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for c in found
    ]
    codes = [p.wait(60) for p in running]
    return [str(c["name"]) for c, code in zip(found, codes, strict=True) if code == 0]


# -- the broker going away ------------------------------------------------------------------


def start_broker() -> None:
    rabbitmqctl("start_app", timeout=120)
    rabbitmqctl("await_startup", timeout=120)


@contextlib.contextmanager
def broker_stopped() -> Iterator[None]:
    """``rabbitmqctl stop_app`` for the duration of the block; the broker is started
    again (and awaited) whatever happens inside."""
    try:
        rabbitmqctl("stop_app", timeout=120)
        yield
    finally:
        start_broker()


# -- a raw client ---------------------------------------------------------------------------


def publish_raw(
    url: str,
    messages: Iterable[tuple[str, str, bytes, Mapping[str, Any]]],
) -> None:
    """Publish ``(exchange, routing_key, body, properties)`` messages with publisher
    confirms; exchange "" is the default exchange (routing key = queue name)."""
    import aio_pika

    async def send() -> None:
        connection = await aio_pika.connect(url, timeout=10)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            for exchange_name, routing_key, body, properties in messages:
                exchange = (
                    channel.default_exchange
                    if exchange_name == ""
                    else await channel.get_exchange(exchange_name, ensure=False)
                )
                message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, **properties)
                await exchange.publish(message, routing_key=routing_key, mandatory=True)

    asyncio.run(send())
