"""A RabbitMQ node of a test's own, for tests that stop and start the broker.

Stopping the shared broker (127.0.0.1:5672) would pull it from under every other test
running at the same time (the suite runs in parallel, pytest-xdist), so a test that
restarts a broker starts its own node: its own node name, AMQP and distribution ports,
data and log directories, no plugins. ``rabbitmqctl`` and the connection helpers of
``mq`` talk to it for the duration of the block (``mq.TARGET``).

The Debian ``rabbitmq-server`` script runs the node as the ``rabbitmq`` user, so its
directory is handed to that user; the Erlang cookie is the installation's, shared by the
CLI tools.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from acceptance import mq

_serial = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _problem() -> str | None:
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        return "rabbitmq-server/rabbitmqctl are not installed"
    return None


@contextlib.contextmanager
def private_broker(start_timeout: float = 90.0) -> Iterator[str]:
    """Start a node, yield its AMQP URL (guest/guest, loopback only), stop and remove it
    afterwards. Raises RuntimeError (with the node's log) if it does not come up."""
    problem = _problem()
    if problem:
        raise RuntimeError(problem)
    node = f"cvt{os.getpid()}x{next(_serial)}@localhost"
    port, dist = _free_port(), _free_port()
    home = Path(tempfile.mkdtemp(prefix="conveyor-rmq-"))
    shutil.chown(home, "rabbitmq", "rabbitmq")
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(home / "pid"),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),  # none: defaults, not the shared node's
    }
    saved = dict(mq.TARGET)
    subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip
    mq.TARGET.update(node=node, port=port)
    try:
        deadline = time.monotonic() + start_timeout
        while True:  # the node registers with epmd a moment after -detached returns
            try:
                mq.rabbitmqctl("await_startup", "--timeout", "30", timeout=40)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline:
                    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in (home / "log").glob("*.log"))
                    raise RuntimeError(f"private RabbitMQ node {node} did not start: {exc}\n{logs}") from exc
                time.sleep(0.5)
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            mq.rabbitmqctl("stop", timeout=60)
        mq.TARGET.clear()
        mq.TARGET.update(saved)
        shutil.rmtree(home, ignore_errors=True)
