"""The chaos run on RabbitMQ restarts its broker: it gets a node of its own
(acceptance/private_broker.py) so the shared broker, and the tests running beside this
one on it, are never touched."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from acceptance.private_broker import private_broker

from .harness import ChaosConfig, ChaosResult, Unavailable, run_chaos


def run_chaos_own_broker(config: ChaosConfig, progress: Callable[[str], None] = print) -> ChaosResult:
    if config.transport != "rabbitmq":
        return run_chaos(config, progress)
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(private_broker())
        except RuntimeError as exc:
            raise Unavailable(f"cannot start a RabbitMQ node for the chaos run: {exc}") from exc
        return run_chaos(dataclasses.replace(config, rabbitmq_url=url), progress)
    raise AssertionError("unreachable")  # ExitStack may swallow exceptions as far as mypy knows
