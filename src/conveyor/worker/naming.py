"""A worker's default name: what ``worker.name`` is when left unset. Its own module so that
``conveyor config show`` shows it without importing the worker."""

from __future__ import annotations

import os
import socket


def default_worker_name(pid: int | str | None = None) -> str:
    """``host-pid`` of the worker process (``pid`` given: of that one, or a placeholder)."""
    return f"{socket.gethostname()}-{os.getpid() if pid is None else pid}"
