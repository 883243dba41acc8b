"""A three-node RabbitMQ cluster of a test's own, on this machine.

Like ``private_broker.py`` (own node names, AMQP and distribution ports, data and log
directories, no plugins, the installation's Erlang cookie), times three: the nodes are
started at once, then the second and third join the first (``stop_app``,
``join_cluster``, ``start_app``, both at once). A node can be SIGKILLed (its Erlang VM)
and started again on the same data directory: it rejoins the cluster by itself.

Ports: AMQP 5701-5703, distribution 25701-25703, nodes ``cvr1@localhost`` ... (this
test's allotment; the shared broker on 5672 is never touched).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptance import mq


@dataclass
class Node:
    name: str
    port: int
    dist: int
    home: Path
    os_pid: int | None = field(default=None)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist),
            "RABBITMQ_MNESIA_BASE": str(self.home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.home / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.home / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.home / "pid"),
            "RABBITMQ_CONFIG_FILE": str(self.home / "rabbitmq"),  # none: defaults, not the shared node's
        }

    def logs(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in (self.home / "log").glob("*.log"))


def ctl(node: Node, *args: str, timeout: float = 60.0) -> str:
    done = subprocess.run(["rabbitmqctl", "-n", node.name, *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"rabbitmqctl -n {node.name} {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
        )
    return done.stdout


def _all(steps: Sequence[Sequence[str]], nodes: Sequence[Node], timeout: float) -> None:
    """Run ``rabbitmqctl -n NODE step`` for each step in turn, on every node at once (each
    call starts an Erlang VM: about a second)."""
    scripts = [" && ".join(" ".join(["rabbitmqctl", "-n", n.name, *step]) for step in steps) for n in nodes]
    running = [
        subprocess.Popen(
            ["sh", "-ec", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for script in scripts
    ]
    failed = []
    for node, proc in zip(nodes, running, strict=True):
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            failed.append(f"{node.name}: {out.strip()}\n{node.logs()}")
    if failed:
        raise RuntimeError("\n".join(failed))


def start(nodes: Sequence[Node], timeout: float = 90.0) -> None:
    """Start these nodes (at once) and wait until each is up; note their OS pids."""
    for node in nodes:
        subprocess.run(["rabbitmq-server", "-detached"], env=node.env(), check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:  # a node registers with epmd a moment after -detached returns
        try:
            _all([["await_startup", "--timeout", "60"]], pending, timeout=90)
            pending = []
        except (RuntimeError, subprocess.TimeoutExpired):
            if time.monotonic() > deadline:
                raise
            pending = [n for n in pending if not _up(n)]
            time.sleep(0.5)
    for node in nodes:
        node.os_pid = int(ctl(node, "eval", "os:getpid().").strip().strip('"'))


def _up(node: Node) -> bool:
    try:
        ctl(node, "await_startup", "--timeout", "5", timeout=20)
        return True
    except (RuntimeError, subprocess.TimeoutExpired):
        return False


def kill(node: Node) -> None:
    """SIGKILL the node's Erlang VM: no goodbye to its peers or clients."""
    assert node.os_pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(node.os_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _running(node.os_pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # dead in milliseconds (a zombie until its parent reaps it)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def running_nodes(node: Node) -> set[str]:
    status = json.loads(ctl(node, "cluster_status", "--formatter", "json"))
    return set(status.get("running_nodes", []))


def quorum_queues(node: Node, prefix: str) -> dict[str, dict[str, Any]]:
    """Quorum queues named ``prefix.*``: name -> {leader, members}."""
    out = ctl(node, "list_queues", "-q", "--formatter", "json", "name", "type", "leader", "members").strip()
    return {
        str(q["name"]): {"leader": q.get("leader"), "members": sorted(q.get("members") or [])}
        for q in (json.loads(out) if out else [])
        if str(q["name"]).startswith(f"{prefix}.") and q.get("type") == "quorum"
    }


# The queues whose dead letters a node moves at least once: RabbitMQ runs one
# rabbit_fifo_dlx_worker per such quorum queue (on its leader), and none when it fell back
# to at-most-once (e.g. without x-overflow: reject-publish). Internal API, as of 3.10-3.13.
_AT_LEAST_ONCE = """
Names = [element(4, element(2, sys:get_state(P)))
         || {_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup), is_pid(P)],
io:format("~s~n", [rabbit_json:encode(Names)]).
"""


def at_least_once_queues(node: Node) -> set[str]:
    """Names of the quorum queues led by ``node`` that dead-letter at least once."""
    return set(json.loads(ctl(node, "eval", _AT_LEAST_ONCE).strip().splitlines()[0]))


def connected_node(nodes: Sequence[Node], pid: int) -> Node | None:
    """The node a process holds an AMQP connection to (None: none)."""
    return next((n for n in nodes if mq.broker_client_ports([pid], port=n.port)), None)


def _problem() -> str | None:
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        return "rabbitmq-server/rabbitmqctl are not installed"
    return None


@contextlib.contextmanager
def cluster(size: int = 3, first: int = 1) -> Iterator[list[Node]]:
    """Start a cluster of ``size`` nodes, ``cvr<first>@localhost`` (AMQP port 5700 +
    first) on; stop and remove it afterwards. RuntimeError (with the nodes' logs) if it
    cannot be formed."""
    problem = _problem()
    if problem:
        raise RuntimeError(problem)
    nodes = []
    for i in range(first, first + size):
        home = Path(tempfile.mkdtemp(prefix=f"conveyor-cvr{i}-"))
        shutil.chown(home, "rabbitmq", "rabbitmq")
        nodes.append(Node(f"cvr{i}@localhost", 5700 + i, 25700 + i, home))
    try:
        start(nodes)
        if nodes[1:]:
            _all([["stop_app"], ["join_cluster", nodes[0].name], ["start_app"]], nodes[1:], timeout=120)
        names = {n.name for n in nodes}
        deadline = time.monotonic() + 60
        while (found := running_nodes(nodes[0])) != names:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not formed: running {found}\n" + "\n".join(n.logs() for n in nodes))
            time.sleep(0.2)
        yield nodes
    finally:
        for node in nodes:  # stopped hard: the data goes with them
            if node.os_pid is not None:
                kill(node)
            else:  # it failed to start, or we never learnt its pid
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    ctl(node, "stop", timeout=30)
        for node in nodes:
            shutil.rmtree(node.home, ignore_errors=True)


@contextlib.contextmanager
def own_nodes(size: int, first: int) -> Iterator[list[Node]]:
    """:func:`cluster` for a test: ``mq``'s rabbitmqctl helpers talk to its first node for
    the block; skipped when it cannot start, failed when CI=true."""
    import pytest

    try:
        with cluster(size, first) as nodes:
            saved = dict(mq.TARGET)
            mq.TARGET.update(node=nodes[0].name, port=nodes[0].port)
            try:
                yield nodes
            finally:
                mq.TARGET.clear()
                mq.TARGET.update(saved)
    except RuntimeError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{exc} (CI=true: a missing service fails the run)")
        pytest.skip(str(exc))
