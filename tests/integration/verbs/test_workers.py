"""The worker verbs (cordon, uncordon, drain) through both drivers: the same answers,
the same refusal."""

from __future__ import annotations

from conveyor.domain.errors import NotFoundError
from conveyor.store.db import Conn, Pool
from conveyor.store.queries import Q
from conveyor.verbs import workers
from integration.builders import add_worker, request
from integration.verbs.both_drivers import both, both_refuse


async def test_cordon_and_uncordon(conn: Conn, pool: Pool) -> None:
    worker = add_worker(conn, "w-a")
    cordoned = {"id": worker, "name": "w-a", "status": "active", "cordoned": True}
    assert await both(conn, pool, lambda: workers.cordon("w-a")) == (cordoned, cordoned)
    uncordoned = {**cordoned, "cordoned": False}
    assert await both(conn, pool, lambda: workers.cordon("w-a", False)) == (uncordoned, uncordoned)
    assert conn.execute("SELECT cordoned FROM worker WHERE id = %s", (worker,)).fetchone() == {"cordoned": False}


async def test_drain_hands_back_what_has_not_started(conn: Conn, pool: Pool) -> None:
    worker = add_worker(conn, "w-a")
    [eid] = request(conn)
    # Dispatched to w-a (scheduled, not started), as the scheduler leaves it.
    conn.execute("UPDATE execution SET status = 'scheduling', executor = 't' WHERE id = %s", (eid,))
    assert len(conn.execute(Q["assign"], {"ids": [eid], "workers": [worker], "executor": "t"}).fetchall()) == 1
    synchronous, asynchronous = await both(conn, pool, lambda: workers.drain("w-a"))
    drained = {"id": worker, "name": "w-a", "status": "active", "cordoned": True, "handed_back": 1}
    assert synchronous == drained
    assert asynchronous == {**drained, "handed_back": 0}  # nothing left to hand back
    row = conn.execute("SELECT status, worker FROM execution WHERE id = %s", (eid,)).fetchone()
    assert row == {"status": "requested", "worker": None}


async def test_no_such_worker(conn: Conn, pool: Pool) -> None:
    for verb in (
        lambda: workers.cordon("nobody"),
        lambda: workers.cordon("nobody", False),
        lambda: workers.drain("nobody"),
    ):
        message = await both_refuse(conn, pool, verb, NotFoundError)
        assert message == "no worker named 'nobody' (see `conveyor workers list`)"
