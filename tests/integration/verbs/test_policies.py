"""The admission policy verbs (set, delete) through both drivers: the same answers, the
same refusals; a policy that cannot be stored is refused before any statement."""

from __future__ import annotations

from typing import Any

from conveyor.domain.errors import InvalidPolicyError, NotFoundError
from conveyor.store.db import Conn, Pool
from conveyor.verbs import policies
from conveyor.verbs.drive import run
from integration.verbs.both_drivers import both, both_refuse, checked_first

STABLE = ("target", "scope", "concurrency", "parameters", "method", "source", "held", "waiting")


def stable(policy: dict[str, Any]) -> dict[str, Any]:
    """A policy without its timestamps (each set replaces it: ``updated`` moves)."""
    return {k: policy[k] for k in STABLE}


async def test_set_creates_then_replaces(conn: Conn, pool: Pool) -> None:
    synchronous, asynchronous = await both(conn, pool, lambda: policies.set_policy("core.echo", 2, ["message"]))
    assert (
        stable(synchronous)
        == stable(asynchronous)
        == {
            "target": "core.echo",
            "scope": "action",
            "concurrency": 2,
            "parameters": ["message"],
            "method": "enqueue",
            "source": "operator",
            "held": 0,
            "waiting": 0,
        }
    )
    assert asynchronous["created"] == synchronous["created"]  # replaced, not made again
    got = await both(conn, pool, lambda: policies.get("core.echo"))
    assert got == (asynchronous, asynchronous)


async def test_delete(conn: Conn, pool: Pool) -> None:
    synchronous, asynchronous = await both(
        conn, pool, lambda: policies.delete_policy("core"), before=lambda: run(conn, policies.set_policy("core", 4))
    )
    assert synchronous == asynchronous == {"target": "core", "source": "operator", "released": 0, "restored": None}
    assert conn.execute("SELECT count(*)::int AS n FROM admission_policy").fetchone() == {"n": 0}


async def test_refusals(conn: Conn, pool: Pool) -> None:
    message = await both_refuse(conn, pool, lambda: policies.delete_policy("core.echo"), NotFoundError)
    assert message == "no admission policy for 'core.echo' (see `conveyor policies list`)"
    for impossible in ("bad target!", "x" * 300):  # names nothing: not found, before any statement
        assert checked_first(policies.delete_policy(impossible), NotFoundError).startswith("no admission policy")
        assert checked_first(policies.get(impossible), NotFoundError).startswith("no admission policy")
    assert checked_first(policies.set_policy("core.echo", 0), InvalidPolicyError).startswith(
        "invalid policy for core.echo: concurrency must be between 1"
    )
    assert checked_first(policies.set_policy("a.", 1), InvalidPolicyError).startswith("invalid policy target 'a.'")
