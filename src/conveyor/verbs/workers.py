"""Worker verbs (an operator's): cordon, uncordon and drain, each one SQL function
(``cordon_worker``, ``drain_worker``), run by ``drive.run`` (SDK, CLI) and
``drive.run_async`` (API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.domain.errors import NotFoundError
from conveyor.verbs.drive import Verb, sql


def not_found(name: str) -> NotFoundError:
    return NotFoundError(f"no worker named {name!r} (see `conveyor workers list`)")


def cordon(name: str, cordoned: bool = True) -> Verb[dict[str, Any]]:
    """Give the worker nothing new (``cordoned=False``: take work again); what it runs
    finishes there. Answers the worker's id, name, status and cordoned."""
    row = yield sql("cordon_worker", {"name": name, "cordoned": cordoned})
    return changed(name, row)


def drain(name: str) -> Verb[dict[str, Any]]:
    """Cordon the worker and hand its not-yet-started work to others; answers
    ``handed_back`` too (how many executions)."""
    row = yield sql("drain_worker", {"name": name})
    return changed(name, row)


def changed(name: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``cordon_worker`` / ``drain_worker`` answered (no row: no such worker)."""
    if row is None:
        raise not_found(name)
    return dict(row)
