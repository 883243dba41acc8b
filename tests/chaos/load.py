"""The load of a chaos run: one submitter requesting a mix of chaos actions at a steady
rate (through the SDK, one transaction each, retried through outages without ever
submitting twice), and a canceller cancelling executions in every state."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from conveyor.domain.errors import ConveyorError
from conveyor.sdk import Client, request_execution

from .workflows import MIX as WORKFLOW_MIX

SCHEMA = "conveyor"

# (weight, ref); parameters are drawn per request below.
MIX: list[tuple[int, str]] = [
    (55, "chaos.fast"),
    (8, "chaos.failing"),
    (6, "chaos.slow"),
    (14, "chaos.fifo"),
    (12, "chaos.pair"),
    (5, "chaos.gated"),
    *WORKFLOW_MIX,  # sequential, with items, fan-out and join (workflows.py)
]
FIFO_GROUPS = ("a", "b", "c", "d")
PAIR_GROUPS = ("x", "y", "z")


def parameters(ref: str, n: int, rng: random.Random) -> dict[str, Any]:
    if ref == "chaos.slow":
        return {"n": n, "seconds": round(rng.uniform(1.0, 3.0), 3)}
    if ref == "chaos.fifo":
        return {"group": rng.choice(FIFO_GROUPS), "n": n, "seconds": round(rng.uniform(0.02, 0.2), 3)}
    if ref == "chaos.pair":
        return {"group": rng.choice(PAIR_GROUPS), "n": n, "seconds": round(rng.uniform(0.05, 0.4), 3)}
    if ref == "chaos.gated":
        return {"n": n, "seconds": round(rng.uniform(0.1, 0.5), 3)}
    return {"n": n}


class Submitter(threading.Thread):
    """Requests ``rate`` executions a second until stopped. Each request commits with a
    row of ``public.chaos_submission`` keyed by its number, so a retry after an ambiguous
    commit (sent, then the connection died) finds it instead of submitting twice."""

    def __init__(self, url: str, rate: float, seed: int) -> None:
        super().__init__(name="chaos-submitter", daemon=True)
        self.url = url
        self.rate = rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.confirmed: dict[int, int] = {}  # submission number -> execution id
        self.by_action: Counter[str] = Counter()
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        refs = [ref for _, ref in MIX]
        weights = [w for w, _ in MIX]
        conn: psycopg.Connection[Any] | None = None
        began = time.monotonic()
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                ref = self.rng.choices(refs, weights)[0]
                params = parameters(ref, n, self.rng)
                while not self.stop.is_set():
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                        with conn.transaction():
                            row = conn.execute("SELECT execution FROM public.chaos_submission WHERE n = %s", (n,))
                            found = row.fetchone()
                            if found is None:
                                eid = request_execution(conn, ref, params, schema=SCHEMA)
                                conn.execute(
                                    "INSERT INTO public.chaos_submission (n, execution, action) VALUES (%s, %s, %s)",
                                    (n, eid, ref),
                                )
                            else:
                                eid = found[0]
                        self.confirmed[n] = eid
                        self.by_action[ref] += 1
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        self.retries += 1
                        if conn is not None:
                            conn.close()
                        self.stop.wait(0.1)
                pause = began + n / self.rate - time.monotonic()
                if pause > 0:
                    self.stop.wait(pause)
        except BaseException as exc:  # reported by the harness
            self.error = exc
        finally:
            if conn is not None:
                conn.close()


STATES = ("requested", "scheduling", "scheduled", "running")


class Canceller(threading.Thread):
    """Every ``every`` seconds, cancels a random execution found in the next state of
    ``STATES`` (through the SDK's ``Client.cancel``), and counts what came of it."""

    def __init__(self, url: str, every: float, seed: int) -> None:
        super().__init__(name="chaos-canceller", daemon=True)
        self.url = url
        self.every = every
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        # (state found in, result): result = the new status, "too late" or "none found"
        self.results: Counter[tuple[str, str]] = Counter()
        self.log: list[tuple[float, int, str, str]] = []  # (time, execution, state found in, result)
        self.error: BaseException | None = None

    def run(self) -> None:
        client: Client | None = None
        i = 0
        try:
            while not self.stop.wait(self.every):
                state = STATES[i % len(STATES)]
                i += 1
                try:
                    if client is None:
                        client = Client(self.url, SCHEMA)
                    self._cancel_one(client, state)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    self.results[(state, "database unreachable")] += 1
                    if client is not None:
                        client.close()
                    client = None
        except BaseException as exc:
            self.error = exc
        finally:
            if client is not None:
                client.close()

    def _cancel_one(self, client: Client, state: str) -> None:
        rows = client.conn.execute(
            "SELECT id FROM execution WHERE status = %s ORDER BY id DESC LIMIT 50", (state,)
        ).fetchall()
        if not rows:
            self.results[(state, "none found")] += 1
            return
        eid = int(self.rng.choice(rows)["id"])
        try:
            now = client.cancel(eid, by="chaos")
        except ConveyorError:  # finished meanwhile (409 in the API)
            now = "too late"
        self.results[(state, now)] += 1
        self.log.append((time.time(), eid, state, now))
