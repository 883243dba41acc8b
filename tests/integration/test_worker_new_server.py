"""A worker that registers again in another lifetime of the server (migration 0011's
epoch: a restart, a crash, a failover to a promoted standby, whose unlogged
``server_epoch`` starts empty) is told so -- the worker then checks what the database
says it runs (a failover to a lagging standby may have forgotten results it wrote). A
re-registration in the same lifetime is not a new server."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from conveyor.config import WorkerSettings
from conveyor.worker.liveness import Liveness
from integration.builders import SCHEMA, Conn


async def test_a_new_server_epoch_is_reported_once_and_only_then(db_url: str, conn: Conn) -> None:
    async def nothing(*_: Any) -> None:
        return None

    renewed: list[object] = []
    registration = {"name": "w-epoch", "runtimes": ["python"], "actions": [], "capabilities": Jsonb({}),
                    "capacity": 1, "host": "test", "pid": 0, "version": "test"}  # fmt: skip
    live = Liveness(db_url, SCHEMA, WorkerSettings(heartbeat_interval=1), registration, nothing, nothing,
                    on_new_server=lambda: renewed.append(live.lock_epoch))  # fmt: skip
    await live.start()
    try:
        first = live.lock_epoch
        assert renewed == []  # the process's first registration: nothing to compare with

        await live._drop_connection()  # the session dropped, the server the same
        await live._connect()
        await live._register()
        assert (live.lock_epoch, renewed) == (first, [])

        # What a promoted standby (or crash recovery) starts with: no epoch stamped.
        conn.execute("DELETE FROM server_epoch")
        await live._drop_connection()
        await live._connect()
        await live._register()
        assert live.lock_epoch != first
        assert renewed == [live.lock_epoch]
    finally:
        await live.close()
